//! The free functions on the process-wide World (one rank, gloo), and the `[rank{N}]:` panic
//! prefix (checked in a child process running this test binary).

use c10d_core::{DType, Tensor};
use c10d_store::{HashStore, Store};
use c10d_world as dist;
use std::sync::Arc;
use std::time::Duration;

fn init_single() {
    let s: Arc<dyn Store> = Arc::new(HashStore::new());
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        store: Some(s),
        world_size: Some(1),
        rank: Some(0),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn free_functions_on_the_global_world() {
    if std::env::var_os("C10D_WORLD_PANIC_CHILD").is_some() {
        return;
    }
    assert!(!dist::is_initialized());
    init_single();
    assert!(dist::is_initialized());
    assert_eq!(dist::get_rank(None).unwrap(), 0);
    assert_eq!(dist::get_world_size(None).unwrap(), 1);
    assert_eq!(dist::get_backend(None).unwrap(), "gloo");
    let t = Tensor::from_vec(vec![2.5f32; 3]);
    dist::all_reduce(&t).run().unwrap();
    dist::broadcast(&t, 0).run().unwrap();
    dist::barrier().run().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.5; 3]);
    let g = dist::new_group(Some(&[0]), dist::GroupOptions::default()).unwrap();
    assert_eq!(g.group().unwrap().group_name(), "1");
    assert!(dist::resolve_process_group("1")
        .unwrap()
        .ptr_eq(g.group().unwrap()));
    let out = Tensor::zeros(DType::F32, &[3]);
    dist::all_gather_into_tensor(&out, &t)
        .group(&g)
        .run()
        .unwrap();
    assert_eq!(
        dist::all_gather_object(&"hi".to_string()).run().unwrap(),
        vec!["hi".to_string()]
    );
    assert_eq!(dist::get_pg_count(), 2);
    dist::destroy_process_group(None).unwrap();
    assert!(!dist::is_initialized());
    assert_eq!(dist::get_pg_count(), 0);
}

#[test]
fn panic_messages_get_the_rank_prefix() {
    if std::env::var_os("C10D_WORLD_PANIC_CHILD").is_some() {
        init_single();
        panic!("boom in the child\nsecond line");
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "panic_messages_get_the_rank_prefix",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("C10D_WORLD_PANIC_CHILD", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("[rank0]: boom in the child"), "{err}");
    assert!(err.contains("[rank0]: second line"), "{err}");
    assert!(err.contains("[rank0]: thread '"), "{err}");
}
