//! Real processes: this test binary re-runs itself as 3 ranks that use the free functions
//! (the process-wide World) with `init_process_group()` defaulting to `env://`, as under
//! c10drun/torchrun (agent TcpStore hosted by the parent, `TORCHELASTIC_USE_AGENT_STORE=True`).

use c10d_core::Tensor;
use c10d_testing::world as world_common;
use c10d_world as dist;
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_WORLD_PROCESS_CHILD";

fn child_main() {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    })
    .unwrap();
    assert!(dist::is_torchelastic_launched());
    let r = dist::get_rank(None).unwrap();
    let n = dist::get_world_size(None).unwrap();
    let t = Tensor::from_vec(vec![(r + 1) as f32; 1000]);
    dist::all_reduce(&t).run().unwrap();
    let objs: Vec<(i64, String)> =
        dist::all_gather_object(&(r, format!("pid{}", std::process::id())))
            .run()
            .unwrap();
    let g = dist::new_group(Some(&[0, 2]), dist::GroupOptions::default()).unwrap();
    if let Some(pg) = g.group() {
        let x = Tensor::from_vec(vec![r]);
        dist::broadcast(&x, 2).group(&g).run().unwrap();
        assert_eq!(x.to_vec::<i64>().unwrap(), vec![2]);
        assert_eq!(pg.group_name(), "1");
    }
    dist::barrier().run().unwrap();
    println!(
        "RESULT rank={r} size={n} sum={} objs={}",
        t.to_vec::<f32>().unwrap()[999],
        objs.len()
    );
    // c10d-gloo can fail a peer's last op when a rank shuts down right after it (see world_gloo.rs)
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), "end", n as usize, Duration::from_secs(60)).unwrap();
    dist::destroy_process_group(None).unwrap();
}

#[test]
fn three_processes_over_env_init() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    let srv = world_common::store_server();
    let mut kids: Vec<_> = (0..3)
        .map(|r| {
            world_common::rank_command(
                "three_processes_over_env_init",
                CHILD,
                srv.port(),
                r,
                3,
                "world-test",
            )
            .spawn()
            .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut done = [None; 3];
    while done.iter().any(|d| d.is_none()) && start.elapsed() < Duration::from_secs(120) {
        for (i, k) in kids.iter_mut().enumerate() {
            if done[i].is_none() {
                done[i] = k.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut outs = Vec::new();
    for mut k in kids {
        let _ = k.kill();
        let o = k.wait_with_output().unwrap();
        outs.push((
            o.status,
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        ));
    }
    for (r, (st, out, err)) in outs.iter().enumerate() {
        assert!(st.success(), "rank {r} failed: {out}\n{err}");
        assert!(
            out.contains(&format!("RESULT rank={r} size=3 sum=6 objs=3")),
            "rank {r}: {out}\n{err}"
        );
    }
}
