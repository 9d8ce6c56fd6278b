//! Faults and argument checks: mismatches, timeouts, dead/aborted peers, monitored barrier,
//! lazy init, handshake checks, PyTorch's error substrings.

mod common;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use common::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn err_text(r: Result<Work>) -> String {
    match r {
        Ok(w) => w.wait().expect_err("op should fail").to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn mismatched_collectives_name_both_ranks_and_ops() {
    let res = run_world(2, opts(), |r, pg| {
        let t = Tensor::full(1.0f32, &[16]);
        if r == 0 {
            err_text(pg.all_reduce(&[t], &AllreduceOptions::default()))
        } else {
            let _ = pg
                .broadcast(
                    &[t],
                    &BroadcastOptions {
                        root_rank: 1,
                        ..Default::default()
                    },
                )
                .unwrap()
                .wait();
            String::new()
        }
    });
    let e = &res[0];
    assert!(
        e.contains("rank 0 is running ALLREDUCE (seq 0, Float, 64 bytes)"),
        "{e}"
    );
    assert!(
        e.contains("rank 1 sent BROADCAST (seq 0, Float, 64 bytes)"),
        "{e}"
    );
}

#[test]
fn mismatched_dtype_and_size_are_detected() {
    let res = run_world(2, opts(), |r, pg| {
        let t = if r == 0 {
            Tensor::full(1.0f32, &[16])
        } else {
            Tensor::full(1i32, &[16])
        };
        err_text(pg.all_reduce(&[t], &AllreduceOptions::default()))
    });
    assert!(
        res.iter()
            .any(|e| e.contains("Float") && e.contains("Int") && e.contains("mismatch")),
        "{res:?}"
    );
    let res = run_world(2, opts(), |r, pg| {
        let t = Tensor::full(1.0f32, &[16 + r]);
        err_text(pg.all_reduce(&[t], &AllreduceOptions::default()))
    });
    assert!(
        res.iter()
            .all(|e| e.contains("64 bytes") && e.contains("68 bytes")),
        "{res:?}"
    );
}

#[test]
fn op_timeout_names_op_seq_rank_and_silent_peer() {
    let res = run_world(3, opts(), |r, pg| {
        if r == 2 {
            std::thread::sleep(Duration::from_millis(600));
            return String::new();
        }
        let t = Tensor::full(1.0f32, &[4]);
        let start = Instant::now();
        let e = err_text(pg.all_reduce(
            &[t],
            &AllreduceOptions {
                timeout: Some(Duration::from_millis(200)),
                ..Default::default()
            },
        ));
        assert!(start.elapsed() < Duration::from_secs(5));
        e
    });
    for (r, text) in res.iter().take(2).enumerate() {
        assert!(
            text.contains(&format!(
                "Timed out waiting 200ms for ALLREDUCE (seq 0) on rank {r}; no data from rank(s) 2"
            )),
            "{text}"
        );
    }
    assert!(
        res[0].contains(" Timed out "),
        "PyTorch's tests match ' (Timed out|closed|timeout) '"
    );
    // After a time-out the group stays usable: the late rank's frames of the failed op are
    // dropped as stale and the next collective matches again.
    run_world(2, opts(), |r, pg| {
        // (A first op sets the shared-memory segment up: the late rank's op below then finds
        // rank 0's data of the timed-out op there, as it would in the sockets.)
        let t = Tensor::full(1.0f32, &[1000]);
        pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        if r == 0 {
            let o = AllreduceOptions {
                timeout: Some(Duration::from_millis(100)),
                ..Default::default()
            };
            assert!(err_text(pg.all_reduce(&[t], &o)).contains("Timed out"));
        } else {
            std::thread::sleep(Duration::from_millis(1500));
            pg.all_reduce(&[t], &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
        }
        for i in 0..3 {
            let t = Tensor::full((r + i) as f32, &[1000]);
            pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(f32s(&t), vec![(1 + 2 * i) as f32; 1000]);
        }
    });
    // set_timeout applies to later ops; barrier too.
    let res = run_world(2, opts(), |r, pg| {
        if r == 1 {
            std::thread::sleep(Duration::from_millis(500));
            return String::new();
        }
        pg.set_timeout(Duration::from_millis(100));
        err_text(pg.barrier(&BarrierOptions::default()))
    });
    assert!(
        res[0].contains("Timed out waiting 100ms for BARRIER (seq 0) on rank 0"),
        "{}",
        res[0]
    );
}

#[test]
fn p2p_recv_times_out() {
    let res = run_world(2, opts(), |r, pg| {
        if r == 1 {
            std::thread::sleep(Duration::from_millis(400));
            return String::new();
        }
        pg.set_timeout(Duration::from_millis(150));
        err_text(pg.recv(&[Tensor::zeros(DType::F32, &[2])], 1, 0))
    });
    assert!(
        res[0]
            .contains("Timed out waiting 150ms for RECV (seq 0) on rank 0; no data from rank(s) 1"),
        "{}",
        res[0]
    );
}

#[test]
fn abort_unblocks_waiters_and_names_the_dead_rank() {
    let pgs = make_world(3, opts());
    let victim = pgs[2].clone();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        victim.abort();
        t0
    });
    let res = run_on(pgs[..2].to_vec(), |_r, pg| {
        let t = Tensor::full(1.0f32, &[1 << 16]);
        let e = pg
            .all_reduce(&[t], &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap_err();
        let at = Instant::now();
        let later =
            err_text(pg.all_reduce(&[Tensor::full(1.0f32, &[2])], &AllreduceOptions::default()));
        (e.to_string(), later, at)
    });
    let aborted_at = killer.join().unwrap();
    for (e, later, at) in res {
        assert!(e.contains("rank 2") && e.contains("lost"), "{e}");
        assert!(later.contains("rank 2"), "{later}");
        assert!(
            at.duration_since(aborted_at) < Duration::from_secs(1),
            "took {:?}",
            at.duration_since(aborted_at)
        );
    }
    // Own abort: a pending op on the aborting rank fails promptly.
    let pgs = make_world(2, opts());
    let pg0 = pgs[0].clone();
    let w = pg0
        .all_reduce(&[Tensor::full(1.0f32, &[4])], &AllreduceOptions::default())
        .unwrap();
    let t0 = Instant::now();
    pg0.abort();
    let e = w.wait().unwrap_err().to_string();
    assert!(e.contains("aborted"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(err_text(pg0.barrier(&BarrierOptions::default())).contains("aborted"));
    pgs[1].shutdown();
    assert!(err_text(pgs[1].barrier(&BarrierOptions::default())).contains("shut down"));
}

#[test]
fn monitored_barrier_texts() {
    run_world(3, opts(), |_r, pg| {
        pg.monitored_barrier(
            &BarrierOptions {
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            },
            false,
        )
        .unwrap();
        pg.monitored_barrier(
            &BarrierOptions {
                timeout: Some(Duration::from_secs(20)),
                ..Default::default()
            },
            true,
        )
        .unwrap();
    });
    let res = run_world(2, opts(), |r, pg| {
        if r == 1 {
            std::thread::sleep(Duration::from_millis(800));
            return String::new();
        }
        pg.monitored_barrier(
            &BarrierOptions {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            false,
        )
        .unwrap_err()
        .to_string()
    });
    assert!(
        res[0].contains("Rank 1 failed to pass monitoredBarrier in 300 ms"),
        "{}",
        res[0]
    );
    let res = run_world(3, opts(), |r, pg| {
        if r != 0 {
            std::thread::sleep(Duration::from_millis(800));
            return String::new();
        }
        pg.monitored_barrier(
            &BarrierOptions {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            true,
        )
        .unwrap_err()
        .to_string()
    });
    assert!(
        res[0].contains("Ranks 1, 2 failed to pass monitoredBarrier in 300 ms"),
        "{}",
        res[0]
    );
    let res = run_world(2, opts(), |r, pg| {
        if r == 0 {
            std::thread::sleep(Duration::from_millis(800));
            return String::new();
        }
        pg.monitored_barrier(
            &BarrierOptions {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            false,
        )
        .unwrap_err()
        .to_string()
    });
    assert!(res[1].contains("Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0"), "{}", res[1]);
    assert!(res[1].contains("Please check rank 0 logs for faulty rank"));
}

#[test]
fn lazy_init_connects_at_first_op() {
    let o = GlooOptions {
        lazy_init: true,
        ..opts()
    };
    let pgs = make_world(3, o);
    assert!(pgs.iter().all(|p| !p.is_initialized()));
    run_on(pgs, |r, pg| {
        let t = Tensor::full(r as i64, &[3]);
        pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), vec![3; 3]);
        assert!(pg.is_initialized());
    });
}

#[test]
fn handshake_rejects_other_group_or_size() {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let s = store.clone();
            std::thread::spawn(move || {
                let o = GlooOptions {
                    group_name: format!("g{r}"),
                    timeout: Duration::from_secs(3),
                    ..Default::default()
                };
                ProcessGroupGloo::new(s, r, 2, o)
                    .map(|_| ())
                    .unwrap_err()
                    .to_string()
            })
        })
        .collect();
    let errs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        errs[0].contains("handshake mismatch")
            && errs[0].contains("'g1'")
            && errs[0].contains("'g0'"),
        "{errs:?}"
    );
    assert!(
        errs[1].contains("refused") || errs[1].contains("handshake"),
        "{errs:?}"
    );
    assert!(ProcessGroupGloo::new(Arc::new(HashStore::new()), 2, 2, opts()).is_err());
}

#[test]
fn argument_checks_use_pytorch_texts() {
    run_world(2, opts(), |r, pg| {
        let f = Tensor::full(1.0f32, &[4]);
        let d = Tensor::full(1.0f64, &[4]);
        let f3 = Tensor::full(1.0f32, &[3]);
        let has = |res: Result<Work>, s: &str| {
            let e = res.expect_err("must be refused synchronously");
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains(s), "{e} does not contain {s}");
            assert!(e.to_string().starts_with("ProcessGroupGloo::"), "{e}");
        };
        let bo = |root_rank, root_tensor| BroadcastOptions {
            root_rank,
            root_tensor,
            ..Default::default()
        };
        has(
            pg.broadcast(std::slice::from_ref(&f), &bo(2, 0)),
            "invalid root rank",
        );
        has(
            pg.broadcast(std::slice::from_ref(&f), &bo(0, 1)),
            "invalid root tensor",
        );
        has(pg.broadcast(&[], &bo(0, 0)), "invalid root tensor");
        has(
            pg.broadcast(&[f.clone(), d.clone()], &bo(0, 0)),
            "invalid tensor type",
        );
        has(
            pg.broadcast(&[f.clone(), f3.clone()], &bo(0, 0)),
            "invalid tensor size",
        );
        has(
            pg.all_reduce(&[], &AllreduceOptions::default()),
            "requires non-empty tensor list",
        );
        has(
            pg.all_reduce(&[f.clone(), d.clone()], &AllreduceOptions::default()),
            "invalid tensor type",
        );
        has(
            pg.all_reduce(
                std::slice::from_ref(&f),
                &AllreduceOptions {
                    reduce_op: ReduceOp::Band,
                    ..Default::default()
                },
            ),
            "Cannot use ReduceOp.BAND with non-integral dtype",
        );
        let c = Tensor::full(c32 { re: 1.0, im: 0.0 }, &[2]);
        has(
            pg.all_reduce(
                &[c],
                &AllreduceOptions {
                    reduce_op: ReduceOp::Max,
                    ..Default::default()
                },
            ),
            "does not support",
        );
        has(
            pg.all_reduce_coalesced(&[f.clone(), d.clone()], &AllreduceOptions::default()),
            "tensors must all have the same type",
        );
        has(
            pg.reduce(&[f.clone(), f.clone()], &ReduceOptions::default()),
            "requires a single-element tensor list",
        );
        has(
            pg.reduce(
                std::slice::from_ref(&f),
                &ReduceOptions {
                    root_rank: 5,
                    ..Default::default()
                },
            ),
            "invalid root rank",
        );
        has(
            pg.all_gather(&[], &[], &AllgatherOptions::default()),
            "requires non-empty input tensor list",
        );
        has(
            pg.all_gather(
                &[vec![f.clone(), f.clone()]],
                &[f.clone(), f.clone()],
                &AllgatherOptions::default(),
            ),
            "requires input/output tensor lists to have the same length",
        );
        has(
            pg.all_gather(
                &[vec![f.clone()]],
                std::slice::from_ref(&f),
                &AllgatherOptions::default(),
            ),
            "invalid output tensor list",
        );
        has(
            pg.all_gather(
                &[vec![f.clone(), f.clone(), f.clone()]],
                std::slice::from_ref(&f),
                &AllgatherOptions::default(),
            ),
            "invalid output tensor list",
        );
        has(
            pg.all_gather_coalesced(
                &[vec![f.clone()]],
                std::slice::from_ref(&f),
                &AllgatherOptions::default(),
            ),
            "output lists should be equal to world size",
        );
        has(
            pg.all_gather_coalesced(
                &[vec![f3.clone()], vec![f.clone()]],
                std::slice::from_ref(&f),
                &AllgatherOptions::default(),
            ),
            "invalid size of output tensor at index 0",
        );
        has(
            pg.all_gather_coalesced(
                &[vec![d.clone()], vec![f.clone()]],
                std::slice::from_ref(&f),
                &AllgatherOptions::default(),
            ),
            "invalid tensor type at index 0",
        );
        let so = |root_rank| ScatterOptions {
            root_rank,
            ..Default::default()
        };
        has(
            pg.scatter(&[], &[], &so(0)),
            "requires a single-element output tensor list",
        );
        let go = |root_rank| GatherOptions {
            root_rank,
            ..Default::default()
        };
        has(
            pg.gather(&[], &[], &go(0)),
            "requires a single-element input tensor list",
        );
        if r == 0 {
            has(
                pg.scatter(std::slice::from_ref(&f), &[], &so(0)),
                "requires a single-element input list",
            );
            has(
                pg.scatter(std::slice::from_ref(&f), &[vec![f.clone()]], &so(0)),
                "Incorrect input list size 1. Input list size should be 2",
            );
            has(
                pg.gather(&[], std::slice::from_ref(&f), &go(0)),
                "requires a single-element output list",
            );
            has(
                pg.gather(&[vec![f.clone()]], std::slice::from_ref(&f), &go(0)),
                "Incorrect output list size 1. Output list size should be 2",
            );
        } else {
            has(
                pg.scatter(
                    std::slice::from_ref(&f),
                    &[vec![f.clone(), f.clone()]],
                    &so(0),
                ),
                "requires empty input on non-root",
            );
            has(
                pg.gather(
                    &[vec![f.clone(), f.clone()]],
                    std::slice::from_ref(&f),
                    &go(0),
                ),
                "requires empty output on non-root",
            );
        }
        has(
            pg.all_to_all(
                std::slice::from_ref(&f),
                &[f.clone(), f.clone()],
                &AllToAllOptions::default(),
            ),
            "does not match world size",
        );
        has(
            pg.all_to_all(
                &[f.clone(), d.clone()],
                &[f.clone(), f.clone()],
                &AllToAllOptions::default(),
            ),
            "input and output tensors must have the same type",
        );
        has(
            pg.all_gather_into_tensor(&f, &f, &AllgatherOptions::default()),
            "output tensor size must be equal to world_size times input tensor size",
        );
        has(
            pg.reduce_scatter_tensor(&f, &f, &ReduceScatterOptions::default()),
            "input tensor must be the same size as output size times world size",
        );
        has(
            pg.send(std::slice::from_ref(&f), r, 0),
            "invalid destination rank",
        );
        has(
            pg.recv(std::slice::from_ref(&f), 7, 0),
            "invalid source rank",
        );
        // A tensor in use by an in-flight op is refused, not raced.
        let busy = Tensor::full(1.0f32, &[2]);
        if r == 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        let w = pg
            .all_reduce(std::slice::from_ref(&busy), &AllreduceOptions::default())
            .unwrap();
        if r == 0 {
            // Rank 1 has not joined yet, so the op is certainly still in flight.
            let e = pg
                .all_reduce(std::slice::from_ref(&busy), &AllreduceOptions::default())
                .unwrap_err();
            assert!(e.to_string().contains("in-flight"), "{e}");
        }
        w.wait().unwrap();
        // Argument errors do not consume sequence numbers, so the ranks stay in step.
        pg.barrier(&BarrierOptions::default())
            .unwrap()
            .wait()
            .unwrap();
    });
}

#[test]
fn messages_from_a_peer_that_left_can_still_be_received() {
    let pgs = make_world(2, opts());
    let mut it = pgs.into_iter();
    let (pg0, pg1) = (it.next().unwrap(), it.next().unwrap());
    pg1.send(&[Tensor::full(5i32, &[3])], 0, 5)
        .unwrap()
        .wait()
        .unwrap();
    pg1.send(&[Tensor::full(6i32, &[3])], 0, 6)
        .unwrap()
        .wait()
        .unwrap();
    drop(pg1); // orderly: a bye frame follows the data
    let b = Tensor::zeros(DType::I32, &[3]);
    pg0.recv(std::slice::from_ref(&b), 1, 6)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(b.to_vec::<i32>().unwrap(), vec![6; 3]);
    std::thread::sleep(Duration::from_millis(100));
    pg0.recv(std::slice::from_ref(&b), 1, 5)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(b.to_vec::<i32>().unwrap(), vec![5; 3]);
    let e = err_text(pg0.recv(std::slice::from_ref(&b), 1, 7));
    assert!(e.contains("rank 1 has shut down"), "{e}");
    let e = err_text(pg0.all_reduce(std::slice::from_ref(&b), &AllreduceOptions::default()));
    assert!(e.contains("rank 1 has shut down"), "{e}");
}

/// Ranks that disagree on the size of a broadcast or all_reduce may pick different algorithms
/// (tree vs chain, direct vs all-pairs); every combination must still end in a prompt mismatch
/// error on every rank (at the latest on its next op), never in the op timeout.
#[test]
fn size_mismatches_across_algorithm_thresholds_fail_promptly() {
    let small = 1024usize; // f32 elements: 4 KiB, below every threshold
    let big = 256 * 1024; // 1 MiB, above every threshold
    let patterns: &[&[usize]] = &[
        &[big, small],
        &[small, big],
        &[big, small, small],
        &[small, big, big],
        &[big, big, small],
        &[small, small, big, small],
        &[big, small, big, small],
        &[small, big, big, big],
    ];
    for (pi, sizes) in patterns.iter().enumerate() {
        for op in ["broadcast", "all_reduce"] {
            for root in [0, sizes.len() - 1] {
                if op == "all_reduce" && root != 0 {
                    continue;
                }
                let sizes: Vec<usize> = sizes.to_vec();
                let o = GlooOptions {
                    timeout: Duration::from_secs(20),
                    ..Default::default()
                };
                let t0 = Instant::now();
                let res = run_world(sizes.len(), o, move |r, pg| {
                    let t = Tensor::full(1.0f32, &[sizes[r]]);
                    let w = if op == "broadcast" {
                        pg.broadcast(
                            &[t],
                            &BroadcastOptions {
                                root_rank: root,
                                ..Default::default()
                            },
                        )
                    } else {
                        pg.all_reduce(&[t], &AllreduceOptions::default())
                    };
                    // A rank whose part is only to send (a broadcast root) may finish before
                    // the mismatch is found; its next op must then fail with it.
                    match w.and_then(|w| w.wait().map(|_| ())) {
                        Err(e) => e.to_string(),
                        Ok(()) => format!(
                            "op succeeded; then: {}",
                            err_text(pg.barrier(&BarrierOptions::default()))
                        ),
                    }
                });
                let took = t0.elapsed();
                for (r, e) in res.iter().enumerate() {
                    assert!(
                        !e.contains("Timed out"),
                        "pattern {pi} {op} root {root}: rank {r} timed out: {e}"
                    );
                    assert!(
                        e.contains("mismatch") || e.contains("reported"),
                        "pattern {pi} {op} root {root}: rank {r}: {e}"
                    );
                }
                assert!(took < Duration::from_secs(10), "{op} {pi}: {took:?}");
            }
        }
    }
}

/// The error of a failed op, as a value.
fn op_error(r: Result<Work>) -> DistError {
    match r {
        Ok(w) => w.wait().expect_err("op should fail"),
        Err(e) => e,
    }
}

#[test]
fn errors_carry_context_a_program_can_read() {
    // A silent peer: both waiting ranks blame rank 2, for their ALLREDUCE number 0.
    let res = run_world(3, opts(), |r, pg| {
        if r == 2 {
            std::thread::sleep(Duration::from_millis(600));
            return None;
        }
        let o = AllreduceOptions {
            timeout: Some(Duration::from_millis(200)),
            ..Default::default()
        };
        let e = op_error(pg.all_reduce(&[Tensor::full(1.0f32, &[4])], &o));
        Some((pg.group_name().to_string(), e))
    });
    for (r, got) in res.iter().take(2).enumerate() {
        let (group, e) = got.as_ref().unwrap();
        let ctx = e.context().unwrap_or_else(|| panic!("no context: {e}"));
        assert_eq!(ctx.group.as_deref(), Some(group.as_str()), "{e}");
        assert_eq!(ctx.rank, Some(r));
        assert_eq!(ctx.op, Some(OpType::Allreduce));
        assert_eq!(ctx.seq, Some(0));
        assert_eq!(ctx.peers, vec![2], "{e}");
    }
    // A mismatch blames the rank that ran the other op.
    let res = run_world(2, opts(), |r, pg| {
        let t = Tensor::full(1.0f32, &[16]);
        if r == 0 {
            return Some(op_error(pg.all_reduce(&[t], &AllreduceOptions::default())));
        }
        let b = BroadcastOptions {
            root_rank: 1,
            ..Default::default()
        };
        let _ = pg.broadcast(&[t], &b).unwrap().wait();
        None
    });
    let e = res[0].as_ref().unwrap();
    let ctx = e.context().unwrap_or_else(|| panic!("no context: {e}"));
    assert_eq!((ctx.op, ctx.rank), (Some(OpType::Allreduce), Some(0)));
    assert_eq!(ctx.peers, vec![1], "{e}");
    // Argument errors are not about an op that ran: no context.
    let res = run_world(1, opts(), |_, pg| {
        let b = BroadcastOptions {
            root_rank: 5,
            ..Default::default()
        };
        op_error(pg.broadcast(&[Tensor::full(1.0f32, &[1])], &b))
    });
    assert!(res[0].context().is_none(), "{}", res[0]);
}

#[test]
fn a_late_rank_learns_that_the_shared_memory_set_up_was_abandoned() {
    // The first small op of a same-host group sets its segment up. Rank 0 times out there;
    // rank 1 arrives late and must fail at once with a text that says what happened (not a
    // time-out of its own), and the group must stay usable.
    let res = run_world(2, opts(), |r, pg| {
        let t = Tensor::full(1.0f32, &[256]);
        let first = if r == 0 {
            let o = AllreduceOptions {
                timeout: Some(Duration::from_millis(200)),
                ..Default::default()
            };
            err_text(pg.all_reduce(std::slice::from_ref(&t), &o))
        } else {
            std::thread::sleep(Duration::from_millis(1000));
            let t0 = std::time::Instant::now();
            let e = err_text(pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()));
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            e
        };
        let t = Tensor::full((r + 1) as f32, &[256]);
        pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(f32s(&t), vec![3.0; 256]);
        first
    });
    assert!(
        res[0].contains("Timed out waiting 200ms for ALLREDUCE (seq 0) on rank 0"),
        "{}",
        res[0]
    );
    assert!(
        res[1].contains(
            "ALLREDUCE (seq 0) abandoned: the other ranks timed out waiting for rank(s) 1"
        ),
        "{}",
        res[1]
    );
}
