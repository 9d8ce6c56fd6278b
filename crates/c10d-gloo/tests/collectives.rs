//! Every collective × dtype × ReduceOp over threads (HashStore), worlds 1, 2, 3, 4 and 7,
//! checked against references computed locally with the core kernels.

mod common;
use c10d_core::reduce::{finalize, prescale, reduce_into};
use c10d_core::*;
use c10d_gloo::{AllreduceAlgorithm, BroadcastAlgorithm, GlooOptions};
use common::*;

const WORLDS: [usize; 5] = [1, 2, 3, 4, 7];

const OPS: [ReduceOp; 9] = [
    ReduceOp::Sum,
    ReduceOp::Avg,
    ReduceOp::Product,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Band,
    ReduceOp::Bor,
    ReduceOp::Bxor,
    ReduceOp::PremulSum(0.5),
];

/// Small integer-valued data, exact in every dtype and independent of combination order.
fn value(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Product => ((r + i) % 2 + 1) as i64,
        _ => {
            ((r * 7 + i * 3) % 11) as i64
                + if matches!(op, ReduceOp::Min | ReduceOp::Max) {
                    i as i64 % 5
                } else {
                    0
                }
        }
    }
}

fn tensor_of(dtype: DType, vals: &[i64]) -> Tensor {
    let t = Tensor::zeros(dtype, &[vals.len()]);
    t.write_bytes(|b| {
        let es = dtype.size();
        for (i, v) in vals.iter().enumerate() {
            let d = &mut b[i * es..(i + 1) * es];
            let v = *v;
            match dtype {
                DType::F32 => d.copy_from_slice(&(v as f32).to_ne_bytes()),
                DType::F64 => d.copy_from_slice(&(v as f64).to_ne_bytes()),
                DType::F16 => d.copy_from_slice(&half::f16::from_f32(v as f32).to_ne_bytes()),
                DType::BF16 => d.copy_from_slice(&half::bf16::from_f32(v as f32).to_ne_bytes()),
                DType::I8 => d.copy_from_slice(&(v as i8).to_ne_bytes()),
                DType::U8 => d.copy_from_slice(&(v as u8).to_ne_bytes()),
                DType::I16 => d.copy_from_slice(&(v as i16).to_ne_bytes()),
                DType::I32 => d.copy_from_slice(&(v as i32).to_ne_bytes()),
                DType::I64 => d.copy_from_slice(&v.to_ne_bytes()),
                DType::Bool => d[0] = (v % 2) as u8,
                DType::Complex64 => {
                    d[..4].copy_from_slice(&(v as f32).to_ne_bytes());
                    d[4..].copy_from_slice(&((v + 1) as f32).to_ne_bytes());
                }
                DType::Complex128 => {
                    d[..8].copy_from_slice(&(v as f64).to_ne_bytes());
                    d[8..].copy_from_slice(&((v + 1) as f64).to_ne_bytes());
                }
            }
        }
    })
    .unwrap();
    t
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.read_bytes(|b| b.to_vec()).unwrap()
}

fn contribution(dtype: DType, op: ReduceOp, r: usize, len: usize) -> Tensor {
    tensor_of(
        dtype,
        &(0..len).map(|i| value(op, r, i)).collect::<Vec<_>>(),
    )
}

/// op over ranks of the contributions, in rank order, with prescale/finalize.
fn reference(
    dtype: DType,
    op: ReduceOp,
    n: usize,
    len: usize,
    contrib: impl Fn(usize) -> Tensor,
) -> Vec<u8> {
    let mut acc: Option<Vec<u8>> = None;
    for r in 0..n {
        let mut c = bytes(&contrib(r));
        prescale(op, dtype, &mut c).unwrap();
        match &mut acc {
            None => acc = Some(c),
            Some(a) => reduce_into(op.combine_op(), dtype, a, &c).unwrap(),
        }
    }
    let _ = len;
    let mut a = acc.unwrap();
    finalize(op, dtype, &mut a, n).unwrap();
    a
}

fn allowed(op: ReduceOp, dtype: DType) -> bool {
    op.check_dtype(dtype).is_ok()
}

fn algo_opts(ar: AllreduceAlgorithm) -> GlooOptions {
    GlooOptions {
        allreduce_algorithm: ar,
        pipeline_chunk_bytes: 64,
        ..opts()
    }
}

#[test]
fn all_reduce_every_dtype_and_op() {
    for n in WORLDS {
        for ar in [
            AllreduceAlgorithm::Direct,
            AllreduceAlgorithm::Ring,
            AllreduceAlgorithm::AllPairs,
        ] {
            let fails = run_world(n, algo_opts(ar), move |r, pg| {
                let mut fails = Vec::new();
                for dtype in DType::ALL {
                    for op in OPS {
                        if !allowed(op, dtype) {
                            let t = contribution(dtype, op, r, 3);
                            let e = pg
                                .all_reduce(
                                    &[t],
                                    &AllreduceOptions {
                                        reduce_op: op,
                                        ..Default::default()
                                    },
                                )
                                .unwrap_err();
                            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
                            continue;
                        }
                        for len in [0usize, 1, 5, 37, 300] {
                            let t = contribution(dtype, op, r, len);
                            pg.all_reduce(
                                std::slice::from_ref(&t),
                                &AllreduceOptions {
                                    reduce_op: op,
                                    ..Default::default()
                                },
                            )
                            .unwrap()
                            .wait()
                            .unwrap();
                            let want =
                                reference(dtype, op, n, len, |q| contribution(dtype, op, q, len));
                            if bytes(&t) != want {
                                fails.push(format!("n={n} {ar:?} {dtype} {op} len={len}"));
                            }
                        }
                    }
                }
                fails
            });
            let fails: Vec<String> = fails.into_iter().flatten().collect();
            assert!(fails.is_empty(), "{fails:#?}");
        }
    }
}

#[test]
fn all_reduce_pytorch_patterns_and_multi_tensor() {
    for n in WORLDS {
        run_world(n, opts(), move |r, pg| {
            let w = n as f32;
            let check = |op: ReduceOp, want: f32| {
                let t = Tensor::full((r + 1) as f32, &[4]);
                pg.all_reduce(
                    std::slice::from_ref(&t),
                    &AllreduceOptions {
                        reduce_op: op,
                        ..Default::default()
                    },
                )
                .unwrap()
                .wait()
                .unwrap();
                assert_eq!(f32s(&t), vec![want; 4], "{op} n={n}");
            };
            check(ReduceOp::Sum, w * (w + 1.0) / 2.0);
            check(ReduceOp::Product, (1..=n).product::<usize>() as f32);
            check(ReduceOp::Min, 1.0);
            check(ReduceOp::Max, w);
            check(ReduceOp::Avg, (w + 1.0) / 2.0);
            check(ReduceOp::PremulSum(3.0), 3.0 * w * (w + 1.0) / 2.0);
            // Multi-tensor inputs: 2r, 2r+1 -> W(2W-1) in every tensor.
            let a = Tensor::full((2 * r) as i64, &[3]);
            let b = Tensor::full((2 * r + 1) as i64, &[3]);
            pg.all_reduce(&[a.clone(), b.clone()], &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let want = (n * (2 * n - 1)) as i64;
            assert_eq!(a.to_vec::<i64>().unwrap(), vec![want; 3]);
            assert_eq!(b.to_vec::<i64>().unwrap(), vec![want; 3]);
            // Bitwise on int32: r | (1 << i).
            let t = Tensor::from_vec((0..5).map(|i| (r as i32) | (1 << i)).collect::<Vec<i32>>());
            pg.all_reduce(
                std::slice::from_ref(&t),
                &AllreduceOptions {
                    reduce_op: ReduceOp::Band,
                    ..Default::default()
                },
            )
            .unwrap()
            .wait()
            .unwrap();
            let mut want: Vec<i32> = (0..5).map(|i| 1 << i).collect();
            for q in 0..n {
                for (i, w) in want.iter_mut().enumerate() {
                    *w &= (q as i32) | (1 << i);
                }
            }
            assert_eq!(t.to_vec::<i32>().unwrap(), want);
            // Complex SUM.
            let c = Tensor::from_vec(vec![
                c32 {
                    re: r as f32,
                    im: 1.0
                };
                2
            ]);
            pg.all_reduce(std::slice::from_ref(&c), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let s = (n * (n - 1) / 2) as f32;
            assert_eq!(c.to_vec::<c32>().unwrap(), vec![c32 { re: s, im: w }; 2]);
        });
    }
}

#[test]
fn all_reduce_coalesced_and_large_ring() {
    for n in [2usize, 3, 4] {
        for ar in [AllreduceAlgorithm::Ring, AllreduceAlgorithm::AllPairs] {
            run_world(
                n,
                GlooOptions {
                    pipeline_chunk_bytes: 4096,
                    allreduce_algorithm: ar,
                    ..opts()
                },
                move |r, pg| {
                    let a = Tensor::full((r + 1) as f32, &[5]);
                    let b = Tensor::full((r + 1) as f32, &[2, 3]);
                    pg.all_reduce_coalesced(&[a.clone(), b.clone()], &AllreduceOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    let s = (n * (n + 1) / 2) as f32;
                    assert_eq!(f32s(&a), vec![s; 5]);
                    assert_eq!(f32s(&b), vec![s; 6]);
                    let e = pg
                        .all_reduce_coalesced(
                            &[a.clone(), Tensor::full(1.0f64, &[2])],
                            &AllreduceOptions::default(),
                        )
                        .unwrap_err();
                    assert!(
                        e.to_string()
                            .contains("tensors must all have the same type"),
                        "{e}"
                    );
                    // 1 MiB + odd size: ring with many chunks; element i of rank r is (i % 13) + r.
                    let len = (1 << 18) + 7;
                    let t = Tensor::from_vec(
                        (0..len)
                            .map(|i| ((i % 13) + r) as f32)
                            .collect::<Vec<f32>>(),
                    );
                    pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    let v = f32s(&t);
                    for (i, x) in v.iter().enumerate() {
                        let want = (n * (i % 13) + n * (n - 1) / 2) as f32;
                        assert_eq!(*x, want, "index {i}");
                    }
                },
            );
        }
    }
}

#[test]
fn broadcast_every_root_algorithm_and_tensor_count() {
    for n in WORLDS {
        for algo in [BroadcastAlgorithm::Tree, BroadcastAlgorithm::Chain] {
            run_world(
                n,
                GlooOptions {
                    broadcast_algorithm: algo,
                    pipeline_chunk_bytes: 100,
                    ..opts()
                },
                move |r, pg| {
                    for root in 0..n {
                        for len in [0usize, 1, 1000] {
                            let ts: Vec<Tensor> = (0..3)
                                .map(|k| Tensor::full((r * 10 + k) as i32, &[len]))
                                .collect();
                            let opts = BroadcastOptions {
                                root_rank: root,
                                root_tensor: if r == root { 1 } else { 0 },
                                ..Default::default()
                            };
                            pg.broadcast(&ts, &opts).unwrap().wait().unwrap();
                            for t in &ts {
                                assert_eq!(
                                    t.to_vec::<i32>().unwrap(),
                                    vec![(root * 10 + 1) as i32; len],
                                    "root {root} n {n} {algo:?}"
                                );
                            }
                        }
                    }
                },
            );
        }
    }
}

#[test]
fn reduce_every_root_and_op() {
    for (n, scratch) in WORLDS.into_iter().flat_map(|n| [(n, 1usize << 22), (n, 0)]) {
        // scratch 0: always the segmented (reduce-scatter + gather) algorithm.
        run_world(
            n,
            GlooOptions {
                small_reduce_scratch_bytes: scratch,
                ..opts()
            },
            move |r, pg| {
                for root in 0..n {
                    for dtype in [DType::F32, DType::I64, DType::BF16, DType::Complex64] {
                        for op in OPS {
                            if !allowed(op, dtype) {
                                continue;
                            }
                            let t = contribution(dtype, op, r, 9);
                            let before = bytes(&t);
                            pg.reduce(
                                std::slice::from_ref(&t),
                                &ReduceOptions {
                                    reduce_op: op,
                                    root_rank: root,
                                    ..Default::default()
                                },
                            )
                            .unwrap()
                            .wait()
                            .unwrap();
                            if r == root {
                                assert_eq!(
                                    bytes(&t),
                                    reference(dtype, op, n, 9, |q| contribution(dtype, op, q, 9)),
                                    "{dtype} {op}"
                                );
                            } else {
                                assert_eq!(bytes(&t), before, "non-root input must stay unchanged");
                            }
                        }
                    }
                }
            },
        );
    }
}

#[test]
fn all_gather_variants() {
    for n in WORLDS {
        run_world(n, opts(), move |r, pg| {
            // List form with two tensors per rank, plus an empty one.
            for len in [0usize, 3] {
                let ins = [
                    Tensor::full(r as i64, &[len]),
                    Tensor::full((100 + r) as i64, &[len]),
                ];
                let outs: Vec<Vec<Tensor>> = (0..2)
                    .map(|_| (0..n).map(|_| Tensor::zeros(DType::I64, &[len])).collect())
                    .collect();
                pg.all_gather(&outs, &ins, &AllgatherOptions::default())
                    .unwrap()
                    .wait()
                    .unwrap();
                for (i, o) in outs.iter().enumerate() {
                    for (p, t) in o.iter().enumerate() {
                        assert_eq!(t.to_vec::<i64>().unwrap(), vec![(i * 100 + p) as i64; len]);
                    }
                }
            }
            // Into tensor, input being a chunk of the output (in-place style).
            let out = Tensor::zeros(DType::F32, &[n * 2]);
            let inp = out.narrow(r * 2, 2).unwrap();
            inp.write(|s: &mut [f32]| s.fill(r as f32 + 0.5)).unwrap();
            pg.all_gather_into_tensor(&out, &inp, &AllgatherOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let want: Vec<f32> = (0..n).flat_map(|p| [p as f32 + 0.5; 2]).collect();
            assert_eq!(f32s(&out), want);
            // Coalesced: outputs[p][i] = rank p's inputs[i]; 0-element tensors accepted.
            let ins = [
                Tensor::full(r as u8, &[2]),
                Tensor::zeros(DType::U8, &[0]),
                Tensor::full((r * 2) as u8, &[1]),
            ];
            let outs: Vec<Vec<Tensor>> = (0..n)
                .map(|_| {
                    ins.iter()
                        .map(|t| Tensor::zeros(DType::U8, t.shape()))
                        .collect()
                })
                .collect();
            pg.all_gather_coalesced(&outs, &ins, &AllgatherOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            for (p, o) in outs.iter().enumerate() {
                assert_eq!(o[0].to_vec::<u8>().unwrap(), vec![p as u8; 2]);
                assert_eq!(o[2].to_vec::<u8>().unwrap(), vec![(p * 2) as u8]);
            }
            // Into-tensor coalesced: per-tensor dim-0 concat.
            let ins = [
                Tensor::full(r as i16, &[1]),
                Tensor::full(-(r as i16), &[3]),
            ];
            let outs = [
                Tensor::zeros(DType::I16, &[n]),
                Tensor::zeros(DType::I16, &[3 * n]),
            ];
            pg.all_gather_into_tensor_coalesced(&outs, &ins, &AllgatherOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(
                outs[0].to_vec::<i16>().unwrap(),
                (0..n as i16).collect::<Vec<_>>()
            );
            assert_eq!(
                outs[1].to_vec::<i16>().unwrap(),
                (0..n as i16).flat_map(|p| [-p; 3]).collect::<Vec<_>>()
            );
        });
    }
}

#[test]
fn gather_and_scatter_every_root() {
    for n in WORLDS {
        run_world(n, opts(), move |r, pg| {
            for root in 0..n {
                let inp = Tensor::full(r as f64 * 2.0, &[4]);
                let outs: Vec<Vec<Tensor>> = if r == root {
                    vec![(0..n).map(|_| Tensor::zeros(DType::F64, &[4])).collect()]
                } else {
                    vec![]
                };
                pg.gather(
                    &outs,
                    &[inp],
                    &GatherOptions {
                        root_rank: root,
                        ..Default::default()
                    },
                )
                .unwrap()
                .wait()
                .unwrap();
                if r == root {
                    for (p, t) in outs[0].iter().enumerate() {
                        assert_eq!(t.to_vec::<f64>().unwrap(), vec![p as f64 * 2.0; 4]);
                    }
                }
                let out = Tensor::zeros(DType::I32, &[3]);
                let ins: Vec<Vec<Tensor>> = if r == root {
                    vec![(0..n)
                        .map(|p| Tensor::full((p * 10 + root) as i32, &[3]))
                        .collect()]
                } else {
                    vec![]
                };
                pg.scatter(
                    std::slice::from_ref(&out),
                    &ins,
                    &ScatterOptions {
                        root_rank: root,
                        ..Default::default()
                    },
                )
                .unwrap()
                .wait()
                .unwrap();
                assert_eq!(
                    out.to_vec::<i32>().unwrap(),
                    vec![(r * 10 + root) as i32; 3]
                );
            }
        });
    }
}

#[test]
fn reduce_scatter_list_tensor_coalesced() {
    for n in WORLDS {
        run_world(n, opts(), move |r, pg| {
            for op in [
                ReduceOp::Sum,
                ReduceOp::Avg,
                ReduceOp::Min,
                ReduceOp::Max,
                ReduceOp::Product,
                ReduceOp::PremulSum(2.0),
            ] {
                // Chunk i on rank r holds r+i+1 -> output on rank r = op over k of (k+r+1).
                let want = {
                    let c = |q: usize| Tensor::full((q + r + 1) as f64, &[5]);
                    reference(DType::F64, op, n, 5, c)
                };
                let ro = ReduceScatterOptions {
                    reduce_op: op,
                    ..Default::default()
                };
                let out = Tensor::zeros(DType::F64, &[5]);
                let ins: Vec<Tensor> = (0..n)
                    .map(|i| Tensor::full((r + i + 1) as f64, &[5]))
                    .collect();
                pg.reduce_scatter(std::slice::from_ref(&out), &[ins], &ro)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(bytes(&out), want, "list {op}");
                let flat = Tensor::from_vec(
                    (0..n)
                        .flat_map(|i| [(r + i + 1) as f64; 5])
                        .collect::<Vec<f64>>(),
                );
                let out = Tensor::zeros(DType::F64, &[5]);
                pg.reduce_scatter_tensor(&out, &flat, &ro)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(bytes(&out), want, "tensor {op}");
                let flat2 = flat.deep_clone().unwrap();
                let outs = [
                    Tensor::zeros(DType::F64, &[5]),
                    Tensor::zeros(DType::F64, &[5]),
                ];
                pg.reduce_scatter_tensor_coalesced(&outs, &[flat, flat2], &ro)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(bytes(&outs[0]), want, "coalesced {op}");
                assert_eq!(bytes(&outs[1]), want, "coalesced {op}");
            }
        });
    }
}

#[test]
fn all_to_all_routing_and_uneven_single() {
    for n in WORLDS {
        run_world(n, opts(), move |r, pg| {
            // List: rank i sends i*100+j to j -> output[j] = j*100+i.
            let ins: Vec<Tensor> = (0..n)
                .map(|j| Tensor::full((r * 100 + j) as i64, &[2]))
                .collect();
            let outs: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::I64, &[2])).collect();
            pg.all_to_all(&outs, &ins, &AllToAllOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            for (j, o) in outs.iter().enumerate() {
                assert_eq!(o.to_vec::<i64>().unwrap(), vec![(j * 100 + r) as i64; 2]);
            }
            // Even single.
            let inp = Tensor::from_vec((0..n).map(|j| (r * 100 + j) as f32).collect::<Vec<f32>>());
            let out = Tensor::zeros(DType::F32, &[n]);
            pg.all_to_all_single(&out, &inp, &[], &[], &AllToAllOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(
                f32s(&out),
                (0..n).map(|j| (j * 100 + r) as f32).collect::<Vec<_>>()
            );
            // Uneven: in_splits=[g+1 for g], out_splits=[rank+1]*W -> j's value repeated rank+1 times.
            let in_splits: Vec<usize> = (0..n).map(|g| g + 1).collect();
            let rows: usize = in_splits.iter().sum();
            let inp = Tensor::from_vec_shaped(vec![r as i32; rows * 2], &[rows, 2]).unwrap();
            let out = Tensor::zeros(DType::I32, &[(r + 1) * n, 2]);
            pg.all_to_all_single(
                &out,
                &inp,
                &vec![r + 1; n],
                &in_splits,
                &AllToAllOptions::default(),
            )
            .unwrap()
            .wait()
            .unwrap();
            let want: Vec<i32> = (0..n).flat_map(|j| vec![j as i32; (r + 1) * 2]).collect();
            assert_eq!(out.to_vec::<i32>().unwrap(), want);
        });
    }
}

#[test]
fn send_recv_tags_and_any_source() {
    for n in [2usize, 3, 4, 7] {
        run_world(n, opts(), move |r, pg| {
            // Full-mesh exchange: recv(src, tag=src) matches send(tag=rank).
            let mut works = Vec::new();
            let recvd: Vec<Tensor> = (0..n).map(|_| Tensor::zeros(DType::F32, &[3])).collect();
            for p in (0..n).filter(|p| *p != r) {
                works.push(pg.recv(&[recvd[p].clone()], p, p as i64).unwrap());
            }
            for p in (0..n).filter(|p| *p != r) {
                works.push(
                    pg.send(&[Tensor::full((r * 10 + p) as f32, &[3])], p, r as i64)
                        .unwrap(),
                );
            }
            for w in works {
                w.wait().unwrap();
            }
            for p in (0..n).filter(|p| *p != r) {
                assert_eq!(f32s(&recvd[p]), vec![(p * 10 + r) as f32; 3]);
            }
            // Any source on rank 0: W-1 senders x 2 -> 2(W-1) receipts.
            if r == 0 {
                let mut seen = vec![0; n];
                for _ in 0..2 * (n - 1) {
                    let t = Tensor::zeros(DType::I64, &[1]);
                    let w = pg.recv_anysource(std::slice::from_ref(&t), 7).unwrap();
                    w.wait().unwrap();
                    let src = w.source_rank().expect("source rank set");
                    assert_eq!(t.to_vec::<i64>().unwrap(), vec![src as i64]);
                    seen[src] += 1;
                }
                assert_eq!(seen[1..], vec![2; n - 1][..]);
            } else {
                for _ in 0..2 {
                    pg.send(&[Tensor::full(r as i64, &[1])], 0, 7)
                        .unwrap()
                        .wait()
                        .unwrap();
                }
            }
            pg.barrier(&BarrierOptions::default())
                .unwrap()
                .wait()
                .unwrap();
        });
    }
}

#[test]
fn p2p_does_not_deadlock_against_collectives() {
    run_world(2, opts(), |r, pg| {
        let t = Tensor::full(1.0f32, &[4]);
        if r == 0 {
            let buf = Tensor::zeros(DType::F32, &[8]);
            let rw = pg.recv(std::slice::from_ref(&buf), 1, 3).unwrap();
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            rw.wait().unwrap();
            assert_eq!(f32s(&buf), vec![9.0; 8]);
        } else {
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            pg.send(&[Tensor::full(9.0f32, &[8])], 0, 3)
                .unwrap()
                .wait()
                .unwrap();
        }
        assert_eq!(f32s(&t), vec![2.0; 4]);
        // Sends before the matching receive is posted land in the unexpected queue.
        if r == 1 {
            pg.send(&[Tensor::full(5i32, &[2])], 0, 11)
                .unwrap()
                .wait()
                .unwrap();
            pg.send(&[Tensor::full(6i32, &[2])], 0, 12)
                .unwrap()
                .wait()
                .unwrap();
        }
        pg.barrier(&BarrierOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        if r == 0 {
            let b = Tensor::zeros(DType::I32, &[2]);
            pg.recv(std::slice::from_ref(&b), 1, 12)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(b.to_vec::<i32>().unwrap(), vec![6, 6]);
            pg.recv(std::slice::from_ref(&b), 1, 11)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(b.to_vec::<i32>().unwrap(), vec![5, 5]);
        }
    });
}

#[test]
fn thousand_async_ops_in_flight_complete_in_order() {
    run_world(8, opts(), |r, pg| {
        let mut ts = Vec::new();
        let mut ws = Vec::new();
        for i in 0..1000usize {
            let t = Tensor::full((r + i) as i64, &[4]);
            ws.push(
                pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                    .unwrap(),
            );
            ts.push(t);
        }
        for (i, (w, t)) in ws.iter().zip(&ts).enumerate() {
            w.wait().unwrap();
            assert_eq!(w.sequence_number(), i as u64);
            // Issue order: every earlier work is complete too.
            assert!(ws[..i].iter().all(|x| x.is_completed()));
            assert_eq!(t.to_vec::<i64>().unwrap(), vec![(28 + 8 * i) as i64; 4]);
        }
    });
}

#[test]
fn concurrent_groups_from_eight_threads() {
    // 8 independent 2-rank groups, each driven by its own pair of threads, 125 async ops each.
    let hs: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(|| {
                run_world(2, opts(), |r, pg| {
                    let ts: Vec<Tensor> = (0..125)
                        .map(|i| Tensor::full((r * i) as i32, &[16]))
                        .collect();
                    let ws: Vec<Work> = ts
                        .iter()
                        .map(|t| {
                            pg.all_reduce(std::slice::from_ref(t), &AllreduceOptions::default())
                                .unwrap()
                        })
                        .collect();
                    for (i, (w, t)) in ws.iter().zip(&ts).enumerate() {
                        w.wait().unwrap();
                        assert_eq!(t.to_vec::<i32>().unwrap(), vec![i as i32; 16]);
                    }
                })
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn sequence_numbers_like_pytorch() {
    run_world(3, opts(), |r, pg| {
        assert_eq!(pg.sequence_number(), 0);
        pg.all_reduce(&[Tensor::full(1.0f32, &[1])], &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(pg.sequence_number(), 1);
        if r != 0 && r != 2 {
            // unreachable for 3 ranks except rank 1: an extra p2p-free local op is not possible,
            // so use send/recv between 1 and itself's peer below.
        }
        if r == 1 {
            pg.send(&[Tensor::full(1.0f32, &[1])], 2, 0)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(pg.sequence_number(), 2);
        }
        if r == 2 {
            let t = Tensor::zeros(DType::F32, &[1]);
            pg.recv(&[t], 1, 0).unwrap().wait().unwrap();
            assert_eq!(pg.sequence_number(), 2);
        }
        // Collectives keep matching even though the counters now differ.
        let t = Tensor::full(1.0f32, &[1]);
        let w = pg
            .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap();
        w.wait().unwrap();
        assert_eq!(f32s(&t), vec![3.0]);
        assert_eq!(w.sequence_number(), if r == 0 { 1 } else { 2 });
    });
}

#[test]
fn works_report_results_and_source() {
    run_world(2, opts(), |_r, pg| {
        let t = Tensor::full(1.0f32, &[2]);
        let w = pg
            .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap();
        w.wait().unwrap();
        assert!(w.is_success());
        assert_eq!(w.op_type(), OpType::Allreduce);
        assert_eq!(w.result().len(), 1);
        assert!(w.result()[0].shares_storage_with(&t));
    });
}

#[test]
fn blocking_calls_run_inline_and_mix_with_async_ops() {
    for n in [1usize, 2, 3, 4] {
        run_world(n, opts(), move |r, pg| {
            let sync = AllreduceOptions {
                async_op: false,
                ..Default::default()
            };
            for i in 0..200usize {
                // Alternate: some async ops left in flight, then a blocking one behind them.
                let a = Tensor::full((r + i) as i64, &[8]);
                let wa = pg
                    .all_reduce(std::slice::from_ref(&a), &AllreduceOptions::default())
                    .unwrap();
                let b = Tensor::full(1i64, &[3]);
                let wb = pg.all_reduce(std::slice::from_ref(&b), &sync).unwrap();
                wb.wait().unwrap();
                assert!(wa.is_completed(), "earlier async op completes first");
                wa.wait().unwrap();
                assert_eq!(b.to_vec::<i64>().unwrap(), vec![n as i64; 3]);
                assert_eq!(
                    a.to_vec::<i64>().unwrap(),
                    vec![(n * i + n * (n - 1) / 2) as i64; 8]
                );
            }
            let t = Tensor::full(r as f32, &[5]);
            pg.broadcast(
                std::slice::from_ref(&t),
                &BroadcastOptions {
                    root_rank: n - 1,
                    async_op: false,
                    ..Default::default()
                },
            )
            .unwrap()
            .wait()
            .unwrap();
            assert_eq!(f32s(&t), vec![(n - 1) as f32; 5]);
            pg.barrier(&BarrierOptions {
                async_op: false,
                ..Default::default()
            })
            .unwrap()
            .wait()
            .unwrap();
        });
    }
    // Blocking collectives on one thread while another thread of the same rank does p2p.
    run_world(2, opts(), |r, pg| {
        let pg2 = pg.clone();
        let h = std::thread::spawn(move || {
            for i in 0..100i32 {
                let t = Tensor::full(i, &[4]);
                if r == 0 {
                    pg2.send(&[t], 1, 5).unwrap().wait().unwrap();
                } else {
                    let b = Tensor::zeros(DType::I32, &[4]);
                    pg2.recv(std::slice::from_ref(&b), 0, 5)
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(b.to_vec::<i32>().unwrap(), vec![i; 4]);
                }
            }
        });
        for _ in 0..100 {
            let t = Tensor::full(1.0f32, &[64]);
            pg.all_reduce(
                std::slice::from_ref(&t),
                &AllreduceOptions {
                    async_op: false,
                    ..Default::default()
                },
            )
            .unwrap()
            .wait()
            .unwrap();
            assert_eq!(f32s(&t), vec![2.0; 64]);
        }
        h.join().unwrap();
    });
}

#[test]
fn frames_arriving_before_their_receive_is_posted() {
    // Rank 1 posts late, so rank 0's frames arrive early (whole or while being read) and are
    // copied or redirected into the buffer posted afterwards.
    for ar in [
        AllreduceAlgorithm::Direct,
        AllreduceAlgorithm::Ring,
        AllreduceAlgorithm::AllPairs,
    ] {
        run_world(
            3,
            GlooOptions {
                allreduce_algorithm: ar,
                pipeline_chunk_bytes: 1 << 16,
                ..opts()
            },
            move |r, pg| {
                for round in 0..6usize {
                    if r == (round % 3) {
                        std::thread::sleep(std::time::Duration::from_millis(30));
                    }
                    let len = 1 << (10 + 2 * (round % 3));
                    let t = Tensor::from_vec(
                        (0..len).map(|i| ((i % 7) + r) as f32).collect::<Vec<f32>>(),
                    );
                    pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    let v = f32s(&t);
                    for (i, x) in v.iter().enumerate() {
                        assert_eq!(
                            *x,
                            (3 * (i % 7) + 3) as f32,
                            "{ar:?} round {round} index {i}"
                        );
                    }
                }
            },
        );
    }
}

/// Whether this process may use `process_vm_readv` at all (a seccomp profile can forbid it):
/// ranks that are threads of one process then agree on cross-memory attach. Where it cannot,
/// the CMA tests still check that the group agreed on sockets and computed the same bits.
fn cma_possible() -> bool {
    let src = 0x5eed_u64;
    let mut dst = 0u64;
    let local = libc::iovec {
        iov_base: (&mut dst as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: (&src as *const u64 as *mut u64).cast(),
        iov_len: 8,
    };
    // SAFETY: both iovecs describe live 8-byte locals of this process; only `dst` is written.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    let ok = n == 8 && dst == src;
    if !ok {
        eprintln!("note: process_vm_readv is not permitted here; CMA tests check the fallback");
    }
    ok
}

/// A tensor of `len` elements of `dtype` whose values depend on rank and index (not integral,
/// so that the fold order shows in float results).
fn varied(dtype: DType, r: usize, len: usize) -> Tensor {
    let t = Tensor::zeros(dtype, &[len]);
    let v = |i: usize| ((i * 31 + r * 7919) % 1009) as f64 / 37.0 - 13.0;
    t.write_bytes(|b| {
        let es = dtype.size();
        for i in 0..len {
            let x = v(i);
            let e: Vec<u8> = match dtype {
                DType::F32 => (x as f32).to_le_bytes().to_vec(),
                DType::F64 => x.to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f64(x).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f64(x).to_le_bytes().to_vec(),
                DType::I64 => ((x * 1000.0) as i64).to_le_bytes().to_vec(),
                DType::Complex64 => {
                    [(x as f32).to_le_bytes(), (-x as f32 * 0.5).to_le_bytes()].concat()
                }
                _ => unreachable!(),
            };
            b[i * es..(i + 1) * es].copy_from_slice(&e);
        }
    })
    .unwrap();
    t
}

/// Every float flavour, a few integer and complex ones, with the reductions whose fold order
/// shows in the bits: what the paths that replace a socket algorithm must reproduce exactly.
const BIT_FOR_BIT_CASES: &[(DType, &[ReduceOp])] = &[
    (DType::F32, &[ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg]),
    (DType::BF16, &[ReduceOp::Sum, ReduceOp::PremulSum(0.5)]),
    (DType::F16, &[ReduceOp::Sum]),
    (DType::F64, &[ReduceOp::Product]),
    (DType::I64, &[ReduceOp::Sum, ReduceOp::Min]),
    (DType::Complex64, &[ReduceOp::Sum, ReduceOp::Avg]),
];

/// Same-host all_reduce through cross-memory attach (process_vm_readv; here the ranks are
/// threads of one process) must give every rank the bits the all-pairs socket algorithm gives
/// (same fold order), for every float flavour, AVG / PREMUL_SUM, odd sizes and segments that
/// are empty (fewer elements than ranks).
#[test]
fn cma_all_reduce_matches_the_socket_path_bit_for_bit() {
    let cases = BIT_FOR_BIT_CASES;
    for n in [2usize, 3, 4, 7] {
        let run = |cma: bool| {
            let o = GlooOptions {
                allreduce_algorithm: if cma {
                    AllreduceAlgorithm::Auto
                } else {
                    AllreduceAlgorithm::AllPairs
                },
                cma_min_bytes: if cma { 0 } else { usize::MAX },
                pipeline_chunk_bytes: 64 << 10,
                // This test is about cross-memory attach (shared memory has its own below).
                shared_memory: false,
                ..opts()
            };
            run_world(n, o, move |r, pg| {
                let mut out = Vec::new();
                for (dtype, ops) in cases {
                    // Fewer elements than ranks, a little, and > 1 MiB with an odd count.
                    for len in [n - 1, 1000, (300_000 / dtype.size()) * 4 + 3] {
                        for op in ops.iter() {
                            let t = varied(*dtype, r, len);
                            let o = AllreduceOptions {
                                reduce_op: *op,
                                ..Default::default()
                            };
                            pg.all_reduce(std::slice::from_ref(&t), &o)
                                .unwrap()
                                .wait()
                                .unwrap();
                            out.push(t.read_bytes(|b| b.to_vec()).unwrap());
                        }
                    }
                }
                out
            })
        };
        let with = run(true);
        let without = run(false);
        for r in 0..n {
            assert!(
                with[r] == with[0],
                "n={n}: rank {r} differs from rank 0 (cma)"
            );
            for (i, (a, b)) in with[r].iter().zip(&without[r]).enumerate() {
                if a != b {
                    let k = a
                        .iter()
                        .zip(b.iter())
                        .position(|(x, y)| x != y)
                        .unwrap_or(0);
                    panic!(
                        "n={n} rank {r} case {i}: cma and all-pairs differ at byte {k} of {} ({:?} vs {:?})",
                        a.len(),
                        &a[k - k % 4..(k - k % 4 + 8).min(a.len())],
                        &b[k - k % 4..(k - k % 4 + 8).min(b.len())]
                    );
                }
            }
        }
    }
}

/// Same-host all_reduce through the shared-memory segment must give the bits of the socket
/// path it replaces (the direct exchange for small messages, all-pairs for medium ones), for
/// every float flavour and reduction and for sizes on both sides of the threshold, and
/// broadcasts (every root), all-gathers and reduce-scatters the same data; one rank that refuses shared memory
/// keeps the whole group on sockets. No segment name is left in /dev/shm.
#[test]
fn shm_all_reduce_matches_the_socket_path_bit_for_bit() {
    let cases = BIT_FOR_BIT_CASES;
    let leftovers = || {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("c10d-shm-{}-", std::process::id()))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    for n in [2usize, 3, 4, 7] {
        // `off`: ranks that refuse shared memory (all: the socket path).
        let run = |off: &'static [usize]| {
            let o = GlooOptions {
                cma_min_bytes: usize::MAX,
                ..opts()
            };
            let pgs = make_world_with(n, move |r| GlooOptions {
                shared_memory: !off.contains(&r) && !off.contains(&usize::MAX),
                ..o.clone()
            });
            run_on(pgs, move |r, pg| {
                let mut out = Vec::new();
                // Three rounds so that both slots are reused, small and medium ops mixed.
                for _ in 0..3 {
                    for (dtype, ops) in cases {
                        let es = dtype.size();
                        for len in [
                            1,
                            n + 1,
                            1000,
                            (64 << 10) / es,
                            (64 << 10) / es + 1,
                            (300 << 10) / es + 3,
                        ] {
                            for op in ops.iter() {
                                let t = varied(*dtype, r, len);
                                let o = AllreduceOptions {
                                    reduce_op: *op,
                                    ..Default::default()
                                };
                                pg.all_reduce(std::slice::from_ref(&t), &o)
                                    .unwrap()
                                    .wait()
                                    .unwrap();
                                out.push(t.read_bytes(|b| b.to_vec()).unwrap());
                            }
                        }
                    }
                }
                // Broadcasts from every root and all-gathers, small and medium.
                for (dtype, _) in cases {
                    let es = dtype.size();
                    for len in [1, 1000, (64 << 10) / es + 1, (300 << 10) / es + 3] {
                        for root in 0..n {
                            let t = varied(*dtype, r, len);
                            let o = BroadcastOptions {
                                root_rank: root,
                                ..Default::default()
                            };
                            pg.broadcast(std::slice::from_ref(&t), &o)
                                .unwrap()
                                .wait()
                                .unwrap();
                            out.push(t.read_bytes(|b| b.to_vec()).unwrap());
                        }
                        let mine = varied(*dtype, r, len);
                        let outs: Vec<Tensor> =
                            (0..n).map(|_| Tensor::zeros(*dtype, &[len])).collect();
                        pg.all_gather(
                            std::slice::from_ref(&outs),
                            &[mine],
                            &AllgatherOptions::default(),
                        )
                        .unwrap()
                        .wait()
                        .unwrap();
                        for o in &outs {
                            out.push(o.read_bytes(|b| b.to_vec()).unwrap());
                        }
                        for op in [ReduceOp::Sum, ReduceOp::Avg] {
                            if *dtype == DType::I64 && op == ReduceOp::Avg {
                                continue;
                            }
                            let input = varied(*dtype, r, len * n);
                            let o = Tensor::zeros(*dtype, &[len]);
                            let opts = ReduceScatterOptions {
                                reduce_op: op,
                                ..Default::default()
                            };
                            pg.reduce_scatter_tensor(&o, &input, &opts)
                                .unwrap()
                                .wait()
                                .unwrap();
                            out.push(o.read_bytes(|b| b.to_vec()).unwrap());
                        }
                    }
                }
                (out, pg.shared_memory())
            })
        };
        let shm = run(&[]);
        let sockets = run(&[usize::MAX]);
        let refused = run(&[1]);
        for r in 0..n {
            assert_eq!(
                shm[r].1,
                Some(true),
                "n={n}: rank {r}: shared memory not set up"
            );
            assert_eq!(
                refused[r].1,
                Some(false),
                "n={n}: rank {r}: one refusal must keep sockets"
            );
            assert!(
                shm[r].0 == sockets[r].0,
                "n={n}: rank {r}: shared memory and sockets differ"
            );
            assert!(
                refused[r].0 == sockets[r].0,
                "n={n}: rank {r}: the refused group differs"
            );
        }
        assert_eq!(
            leftovers(),
            0,
            "a c10d-shm segment name was left in /dev/shm"
        );
    }
}

/// Cross-memory attach is agreed by the whole group: one rank that does not allow it (as if
/// it could not read its peers' memory) makes every rank use sockets, with correct results;
/// below the threshold nothing is probed; with every rank allowing it, every rank uses it.
#[test]
fn cma_is_agreed_by_every_rank_or_by_none() {
    for refuser in [None, Some(0), Some(2)] {
        let pgs = make_world_with(3, |r| GlooOptions {
            cma_min_bytes: 1 << 20,
            cross_memory_attach: Some(r) != refuser,
            ..opts()
        });
        let res = run_on(pgs, |r, pg| {
            let small = Tensor::full(r as f32, &[1000]);
            pg.all_reduce(std::slice::from_ref(&small), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let before = pg.cross_memory_attach();
            let t = varied(DType::F32, r, 300_001);
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            (before, pg.cross_memory_attach(), f32s(&small), f32s(&t))
        });
        for (r, (before, after, small, t)) in res.iter().enumerate() {
            assert_eq!(*before, None, "rank {r}: probed below the threshold");
            assert_eq!(
                *after,
                Some(refuser.is_none() && cma_possible()),
                "rank {r}, refuser {refuser:?}"
            );
            assert!(small.iter().all(|x| *x == 3.0));
            assert!(t == &res[0].3, "rank {r} differs from rank 0");
            for i in [0usize, 150_000, 300_000] {
                let want: f32 = (0..3).map(|q| f32s(&varied(DType::F32, q, i + 1))[i]).sum();
                assert!(
                    (t[i] - want).abs() < 1e-3,
                    "rank {r} [{i}]: {} vs {want}",
                    t[i]
                );
            }
        }
    }
}

/// all_gather (list, into-tensor, in place, coalesced) and reduce_scatter (list, tensor,
/// PREMUL_SUM, AVG) through cross-memory attach give the bits the socket algorithms give, on
/// worlds of 2, 3 and 4 ranks, with sizes from empty to > 1 MiB.
#[test]
fn cma_all_gather_and_reduce_scatter_match_the_socket_path() {
    for n in [2usize, 3, 4] {
        let run = |cma: bool| {
            let o = GlooOptions {
                cma_min_bytes: if cma { 0 } else { usize::MAX },
                ..opts()
            };
            run_world(n, o, move |r, pg| {
                let mut out: Vec<Vec<u8>> = Vec::new();
                let bytes = |t: &Tensor| t.read_bytes(|b| b.to_vec()).unwrap();
                for len in [0usize, 3, 70_001] {
                    // all_gather, list form, two dtypes.
                    for dtype in [DType::F32, DType::BF16] {
                        let inp = varied(dtype, r, len);
                        let outs: Vec<Tensor> =
                            (0..n).map(|_| Tensor::zeros(dtype, &[len])).collect();
                        pg.all_gather(
                            std::slice::from_ref(&outs),
                            &[inp],
                            &AllgatherOptions::default(),
                        )
                        .unwrap()
                        .wait()
                        .unwrap();
                        out.extend(outs.iter().map(bytes));
                    }
                    // all_gather_into_tensor, in place (input is this rank's slot of the output).
                    let whole = Tensor::zeros(DType::F32, &[n * len]);
                    whole
                        .narrow(r * len, len)
                        .unwrap()
                        .copy_from(&varied(DType::F32, r, len))
                        .unwrap();
                    let mine = whole.narrow(r * len, len).unwrap();
                    pg.all_gather_into_tensor(&whole, &mine, &AllgatherOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    out.push(bytes(&whole));
                    // Coalesced into tensors: two inputs of different sizes.
                    let ins = [
                        varied(DType::I64, r, len),
                        varied(DType::F64, r, len / 2 + 1),
                    ];
                    let outs = [
                        Tensor::zeros(DType::I64, &[n * len]),
                        Tensor::zeros(DType::F64, &[n * (len / 2 + 1)]),
                    ];
                    pg.all_gather_into_tensor_coalesced(&outs, &ins, &AllgatherOptions::default())
                        .unwrap()
                        .wait()
                        .unwrap();
                    out.extend(outs.iter().map(bytes));
                    // reduce_scatter, list form and tensor form.
                    for op in [
                        ReduceOp::Sum,
                        ReduceOp::Avg,
                        ReduceOp::PremulSum(0.25),
                        ReduceOp::Max,
                    ] {
                        let o = ReduceScatterOptions {
                            reduce_op: op,
                            ..Default::default()
                        };
                        let blocks: Vec<Tensor> =
                            (0..n).map(|p| varied(DType::F32, r * n + p, len)).collect();
                        let res = Tensor::zeros(DType::F32, &[len]);
                        pg.reduce_scatter(std::slice::from_ref(&res), &[blocks], &o)
                            .unwrap()
                            .wait()
                            .unwrap();
                        out.push(bytes(&res));
                        let input = varied(DType::BF16, r, n * len);
                        let res = Tensor::zeros(DType::BF16, &[len]);
                        pg.reduce_scatter_tensor(&res, &input, &o)
                            .unwrap()
                            .wait()
                            .unwrap();
                        out.push(bytes(&res));
                    }
                }
                (out, pg.cross_memory_attach())
            })
        };
        let with = run(true);
        let without = run(false);
        for r in 0..n {
            assert_eq!(
                with[r].1,
                Some(cma_possible()),
                "n={n} rank {r}: cma verdict"
            );
            assert_eq!(without[r].1, None, "n={n} rank {r}: cma probed while off");
            assert_eq!(with[r].0.len(), without[r].0.len());
            for (i, (a, b)) in with[r].0.iter().zip(&without[r].0).enumerate() {
                assert!(a == b, "n={n} rank {r} result {i}: cma and sockets differ");
            }
        }
    }
}

/// Ranks whose options make them fold one shared-memory all-reduce differently (here
/// `small_allreduce_bytes`: the direct fold on one rank, all-pairs on the other) fail with a
/// mismatch naming the other rank, as the socket path would, instead of reading each other's
/// half-written slots.
#[test]
fn shared_memory_folds_that_differ_across_ranks_are_a_mismatch() {
    let pgs = make_world_with(2, |r| GlooOptions {
        small_allreduce_bytes: if r == 0 { 64 << 10 } else { 1 << 10 },
        ..opts()
    });
    if pgs[0].shared_memory() != Some(true) {
        println!("skipped: no shared memory here");
        return;
    }
    let res = run_on(pgs, |_, pg| {
        let t = Tensor::full(1.0f32, &[4096]);
        match pg.all_reduce(&[t], &AllreduceOptions::default()) {
            Ok(w) => w.wait().err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    });
    for (r, e) in res.iter().enumerate() {
        let e = e
            .as_deref()
            .unwrap_or_else(|| panic!("rank {r}: the all-reduce succeeded"));
        assert!(e.contains("mismatch"), "rank {r}: {e}");
    }
}
