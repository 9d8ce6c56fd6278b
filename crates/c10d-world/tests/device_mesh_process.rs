//! DeviceMesh with ranks as processes: this test binary starts again as 4 and as 8 ranks of an
//! env:// job (the store hosted by the parent, as under c10drun). Each rank calls
//! `init_device_mesh` *without* initialising the world first (the mesh does it, as PyTorch's
//! does), then checks 1-, 2- and 3-D meshes: coordinate, each dimension's members against the
//! grid, and an all_reduce along each dimension by value.

mod mesh_common;
use c10d_testing::world as world_common;

use c10d_core::Tensor;
use c10d_store::{ServerOptions, TcpStoreServer};
use c10d_world as dist;
use mesh_common::{coord, line};
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_DEVICE_MESH_PROCESS_CHILD";

fn check(rank: usize, shape: &[usize]) {
    let names: Vec<String> = (0..shape.len()).map(|d| format!("d{d}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let m = dist::init_device_mesh("cpu", shape, Some(&names)).unwrap();
    assert_eq!(m.get_coordinate(), Some(coord(rank, shape)), "{m}");
    for d in 0..shape.len() {
        let g = m.get_group(d).unwrap();
        let want = line(rank, shape, d);
        assert_eq!(dist::get_process_group_ranks(g.group()).unwrap(), want);
        let t = Tensor::from_vec(vec![(rank * rank) as i64; 5]);
        dist::all_reduce(&t).group(&g).run().unwrap();
        let sum: usize = want.iter().map(|r| r * r).sum();
        assert_eq!(
            t.to_vec::<i64>().unwrap(),
            vec![sum as i64; 5],
            "{m} dim {d}"
        );
    }
}

fn child_main() {
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    let world: usize = std::env::var("WORLD_SIZE").unwrap().parse().unwrap();
    let shapes: &[&[usize]] = match world {
        4 => &[&[4], &[2, 2], &[2, 1, 2]],
        _ => &[&[8], &[2, 4], &[2, 2, 2]],
    };
    for s in shapes {
        check(rank, s);
    }
    assert!(
        dist::is_initialized(),
        "init_device_mesh initialised the world"
    );
    println!("MESHOK rank={rank}");
    // c10d-gloo can fail a peer's last op when a rank shuts down right after it (see world_gloo.rs)
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), "end", world, Duration::from_secs(60)).unwrap();
    dist::destroy_process_group(None).unwrap();
}

fn run_job(world: usize) {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let test = "meshes_on_4_and_8_processes";
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            world_common::rank_command(test, CHILD, srv.port(), r, world, "mesh-test")
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(180)
        && kids.iter_mut().any(|k| k.try_wait().unwrap().is_none())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (r, mut k) in kids.into_iter().enumerate() {
        let _ = k.kill();
        let o = k.wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(
            o.status.success(),
            "{world} ranks: rank {r} failed: {out}\n{err}"
        );
        assert!(
            out.contains(&format!("MESHOK rank={r}")),
            "rank {r}: {out}\n{err}"
        );
    }
}

#[test]
fn meshes_on_4_and_8_processes() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    run_job(4);
    run_job(8);
}
