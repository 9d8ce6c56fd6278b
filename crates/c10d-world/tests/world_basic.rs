//! init_process_group, free-style collectives and the default-group rules.

use c10d_testing::world as world_common;

use c10d_core::{DType, ErrorKind, Tensor};
use c10d_world::{GroupMember, GroupOptions, World};
use std::time::Duration;
use world_common::*;

#[test]
fn init_all_reduce_broadcast_barrier() {
    let out = run(3, |w, r| {
        assert_eq!(w.get_rank(None).unwrap(), r as i64);
        assert_eq!(w.get_world_size(None).unwrap(), 3);
        assert!(w.is_initialized());
        let t = Tensor::from_vec(vec![(r + 1) as f32; 4]);
        w.all_reduce(&t).run().unwrap();
        let b = Tensor::from_vec(vec![r as i64 * 10; 2]);
        let work = w.broadcast(&b, 2).start().unwrap();
        work.wait().unwrap();
        w.barrier().run().unwrap();
        (t.to_vec::<f32>().unwrap(), b.to_vec::<i64>().unwrap())
    });
    for (t, b) in out {
        assert_eq!(t, vec![6.0; 4]);
        assert_eq!(b, vec![20, 20]);
    }
}

#[test]
fn init_twice_and_not_initialized_errors() {
    let w = World::new();
    let e = w.get_rank(None).unwrap_err();
    assert!(
        e.to_string()
            .contains("Default process group has not been initialized"),
        "{e}"
    );
    let t = Tensor::zeros(DType::F32, &[1]);
    assert!(w.all_reduce(&t).run().is_err());
    register();
    let s = store();
    w.init_process_group(opts(&s, 0, 1)).unwrap();
    let e = w.init_process_group(opts(&s, 0, 1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "trying to initialize the default process group twice!"
    );
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    w.all_reduce(&t).run().unwrap();
    w.destroy_process_group(None).unwrap();
    assert!(!w.is_initialized());
    let e = w.all_reduce(&t).run().unwrap_err();
    assert!(e.to_string().contains("has not been initialized"), "{e}");
    // re-init with a fresh store works, counter reset: WORLD is "0" again.
    let s2 = store();
    w.init_process_group(opts(&s2, 0, 1)).unwrap();
    assert_eq!(w.world_group().unwrap().group_name(), "0");
    assert_eq!(w.world_group().unwrap().group_desc(), "default_pg");
    w.destroy_process_group(None).unwrap();
}

#[test]
fn init_argument_errors() {
    register();
    let w = World::new();
    let s = store();
    let mut o = opts(&s, 0, 1);
    o.init_method = Some("tcp://127.0.0.1:1".into());
    let e = w.init_process_group(o).unwrap_err();
    assert_eq!(e.to_string(), "Cannot specify both init_method and store.");
    let mut o = opts(&s, 0, 1);
    o.world_size = None;
    assert_eq!(
        w.init_process_group(o).unwrap_err().to_string(),
        "world_size must be positive if using store"
    );
    let mut o = opts(&s, 0, 1);
    o.rank = None;
    assert_eq!(
        w.init_process_group(o).unwrap_err().to_string(),
        "rank must be non-negative if using store"
    );
    let mut o = opts(&s, 0, 1);
    o.backend = Some("nccl".into());
    let e = w.init_process_group(o).unwrap_err();
    assert!(e.to_string().contains("nccl is not available"), "{e}");
    assert!(!w.is_initialized());
    let mut o = opts(&s, 0, 1);
    o.backend = Some("bogus".into());
    assert!(w
        .init_process_group(o)
        .unwrap_err()
        .to_string()
        .contains("Unknown backend"));
    let mut o = opts(&s, 0, 1);
    o.backend = Some("cpu:store,".into());
    assert!(w
        .init_process_group(o)
        .unwrap_err()
        .to_string()
        .contains("Invalid device:backend pairing"));
    // failed inits do not consume group names
    w.init_process_group(opts(&s, 0, 1)).unwrap();
    assert_eq!(w.world_group().unwrap().group_name(), "0");
    w.destroy_process_group(None).unwrap();
}

#[test]
fn mixed_backend_config_registers_one_backend_per_device() {
    use c10d_core::DeviceType;
    let out = run(2, |w, r| {
        let g = w
            .new_group(
                None,
                GroupOptions {
                    backend: Some("CPU:store,CUDA:storex".into()),
                    ..Default::default()
                },
            )
            .unwrap()
            .into_group()
            .unwrap();
        assert_eq!(
            w.get_backend_config(Some(&g.clone().into())).unwrap(),
            "cpu:store,cuda:storex"
        );
        assert_eq!(
            w.get_backend(Some(&g.clone().into())).unwrap(),
            "cpu:store,cuda:storex"
        );
        // the accelerator's backend is the default of a mixed group
        assert_eq!(g.default_device_type(), DeviceType::Cuda);
        assert_eq!(g.backend(DeviceType::Cpu).unwrap().name(), "store");
        assert_eq!(g.backend(DeviceType::Cuda).unwrap().name(), "storex");
        // CPU tensors go to the cpu backend
        let t = Tensor::from_vec(vec![r as u8 + 1]);
        w.all_reduce(&t)
            .group(&GroupMember::from(g.clone()))
            .run()
            .unwrap();
        t.to_vec::<u8>().unwrap()[0]
    });
    assert_eq!(out, vec![3, 3]);
}

#[test]
fn default_timeouts_and_backend_queries() {
    let out = run(2, |w, _r| {
        let pg = w.world_group().unwrap();
        let t = pg.default_backend().unwrap().timeout();
        (
            t,
            w.get_backend(None).unwrap(),
            w.get_backend_config(None).unwrap(),
        )
    });
    for (t, b, c) in out {
        assert_eq!(t, Duration::from_secs(20));
        assert_eq!(b, "store");
        assert_eq!(c, "cpu:store");
    }
    // Without a timeout: 30 minutes.
    register();
    let w = World::new();
    let s = store();
    let mut o = opts(&s, 0, 1);
    o.timeout = None;
    w.init_process_group(o).unwrap();
    assert_eq!(
        w.world_group()
            .unwrap()
            .default_backend()
            .unwrap()
            .timeout(),
        Duration::from_secs(1800)
    );
    w.set_timeout(Duration::from_secs(5), None).unwrap();
    assert_eq!(
        w.world_group()
            .unwrap()
            .default_backend()
            .unwrap()
            .timeout(),
        Duration::from_secs(5)
    );
    w.destroy_process_group(None).unwrap();
    let _ = GroupOptions::default();
}
