//! Smoke test: all_reduce, broadcast, barrier over threads.
mod common;
use c10d_core::*;
use common::*;

#[test]
fn allreduce_broadcast_barrier_small_worlds() {
    for (n, unix) in [
        (1usize, true),
        (2, true),
        (3, true),
        (4, true),
        (2, false),
        (3, false),
    ] {
        let o = c10d_gloo::GlooOptions {
            local_unix_sockets: unix,
            ..opts()
        };
        let res = run_world(n, o, move |r, pg| {
            let t = Tensor::from_vec(vec![(r + 1) as f32; 1000]);
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let b = Tensor::from_vec(vec![r as f64; 10]);
            pg.broadcast(
                std::slice::from_ref(&b),
                &BroadcastOptions {
                    root_rank: n - 1,
                    ..Default::default()
                },
            )
            .unwrap()
            .wait()
            .unwrap();
            pg.barrier(&BarrierOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            (f32s(&t), b.to_vec::<f64>().unwrap())
        });
        for (a, b) in res {
            assert!(
                a.iter().all(|x| *x == (n * (n + 1) / 2) as f32),
                "n={n}: {:?}",
                &a[..4]
            );
            assert!(b.iter().all(|x| *x == (n - 1) as f64));
        }
    }
}
