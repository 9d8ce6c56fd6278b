//! The same-host paths (cross-memory attach and the shared-memory segment) against the socket
//! path: the same bits for every dtype and op, agreement across ranks, and mismatches found.

mod common;
use c10d_core::*;
use c10d_gloo::{AllreduceAlgorithm, GlooOptions};
use common::*;

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
