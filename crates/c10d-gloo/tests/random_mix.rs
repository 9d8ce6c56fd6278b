//! A seeded random mix of collectives, sizes, algorithms, async/blocking calls and p2p on the
//! same group, every result checked: exercises frame matching (early frames, redirects,
//! interleaved p2p) far more than the per-op tests.

mod common;
use c10d_core::*;
use c10d_gloo::{AllreduceAlgorithm, BroadcastAlgorithm, GlooOptions};
use common::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

fn run(n: usize, seed: u64, o: GlooOptions) {
    run_world(n, o, move |r, pg| {
        let mut rng = Rng(seed);
        // Pending checks: (work, tensor, expected values).
        let mut pending: Vec<(Work, Tensor, Vec<f32>)> = Vec::new();
        for step in 0..100 {
            let len = [0usize, 1, 7, 100, 3000, 70_000][rng.below(6)];
            let blocking = rng.below(3) == 0;
            let kind = rng.below(6);
            let jitter = rng.below(4) == 0 && r == step % n;
            if jitter {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            match kind {
                0 | 1 => {
                    let t = Tensor::from_vec(
                        (0..len).map(|i| ((i + r) % 5) as f32).collect::<Vec<f32>>(),
                    );
                    let want: Vec<f32> = (0..len)
                        .map(|i| (0..n).map(|q| ((i + q) % 5) as f32).sum())
                        .collect();
                    let w = pg
                        .all_reduce(
                            std::slice::from_ref(&t),
                            &AllreduceOptions {
                                async_op: !blocking,
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    pending.push((w, t, want));
                }
                2 => {
                    let root = rng.below(n as u64);
                    let t = Tensor::full((r * 10 + step) as f32, &[len]);
                    let w = pg
                        .broadcast(
                            std::slice::from_ref(&t),
                            &BroadcastOptions {
                                root_rank: root,
                                async_op: !blocking,
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    pending.push((w, t, vec![(root * 10 + step) as f32; len]));
                }
                3 => {
                    let inp = Tensor::full((r + step) as f32, &[len]);
                    let out = Tensor::zeros(DType::F32, &[len * n]);
                    let w = pg
                        .all_gather_into_tensor(
                            &out,
                            &inp,
                            &AllgatherOptions {
                                async_op: !blocking,
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    let want = (0..n).flat_map(|q| vec![(q + step) as f32; len]).collect();
                    pending.push((w, out, want));
                }
                4 => {
                    let inp = Tensor::from_vec(
                        (0..len * n)
                            .map(|i| (i / len.max(1) + r) as f32)
                            .collect::<Vec<f32>>(),
                    );
                    let out = Tensor::zeros(DType::F32, &[len]);
                    let w = pg
                        .reduce_scatter_tensor(
                            &out,
                            &inp,
                            &ReduceScatterOptions {
                                async_op: !blocking,
                                ..Default::default()
                            },
                        )
                        .unwrap();
                    let want = vec![(0..n).map(|q| (r + q) as f32).sum::<f32>(); len];
                    pending.push((w, out, want));
                }
                _ => {
                    // A ring of p2p messages with a step-specific tag, interleaved with collectives.
                    if n > 1 {
                        let to = (r + 1) % n;
                        let from = (r + n - 1) % n;
                        let b = Tensor::zeros(DType::F32, &[len]);
                        let wr = pg
                            .recv(std::slice::from_ref(&b), from, step as i64)
                            .unwrap();
                        let s = Tensor::full((r * 1000 + step) as f32, &[len]);
                        let ws = pg.send(std::slice::from_ref(&s), to, step as i64).unwrap();
                        pending.push((ws, s, vec![(r * 1000 + step) as f32; len]));
                        pending.push((wr, b, vec![(from * 1000 + step) as f32; len]));
                    }
                }
            }
            if rng.below(5) == 0 {
                for (w, t, want) in pending.drain(..) {
                    w.wait().unwrap();
                    assert_eq!(f32s(&t), want, "seed {seed} step {step} rank {r}");
                }
            }
        }
        for (w, t, want) in pending.drain(..) {
            w.wait().unwrap();
            assert_eq!(f32s(&t), want, "seed {seed} rank {r}");
        }
        pg.barrier(&BarrierOptions::default())
            .unwrap()
            .wait()
            .unwrap();
    });
}

#[test]
fn random_mixes_of_ops() {
    for (i, n) in [2usize, 3, 4, 7].into_iter().enumerate() {
        for (j, ar) in [
            AllreduceAlgorithm::Auto,
            AllreduceAlgorithm::Ring,
            AllreduceAlgorithm::AllPairs,
        ]
        .into_iter()
        .enumerate()
        {
            let o = GlooOptions {
                allreduce_algorithm: ar,
                broadcast_algorithm: if j == 1 {
                    BroadcastAlgorithm::Chain
                } else {
                    BroadcastAlgorithm::Auto
                },
                pipeline_chunk_bytes: 8192,
                small_allreduce_bytes: 4096,
                local_unix_sockets: i % 2 == 0,
                lazy_init: j == 2,
                ..opts()
            };
            run(n, 0x9E37_79B9_7F4A_7C15 ^ (i * 31 + j) as u64, o);
        }
    }
}
