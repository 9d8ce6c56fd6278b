//! The world layer over the real gloo backend: ranks as threads over a HashStore or a
//! `file://` init method.
//!
//! Ranks meet in a store barrier before `destroy_process_group`: c10d-gloo (at the time of
//! writing) can fail a peer's last collective with "connection ... closed by peer" when a rank
//! shuts down right after finishing it while other groups are busy in the same process (seen with
//! plain `ProcessGroupGloo`s too); the barrier keeps these world-layer tests independent of that.

use c10d_testing::world as world_common;

use c10d_core::{DType, DebugLevel, ReduceOp, Tensor};
use c10d_world::{GroupOptions, InitOptions, Rank, SplitOptions, World};
use std::sync::Arc;
use std::time::Duration;
use world_common::{run_gloo, store};

#[test]
fn gloo_world_collectives_and_groups() {
    assert!(c10d_world::is_gloo_available());
    let out = run_gloo(
        3,
        |_| {},
        |w, r| {
            assert_eq!(w.get_backend(None).unwrap(), "gloo");
            assert_eq!(w.get_backend_config(None).unwrap(), "cpu:gloo,cuda:gloo");
            let t = Tensor::from_vec(vec![(r + 1) as f32; 8]);
            w.all_reduce(&t).run().unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![6.0; 8]);
            let g = w.new_group(Some(&[0, 2]), GroupOptions::default()).unwrap();
            if r != 1 {
                let x = Tensor::from_vec(vec![r as i64]);
                w.all_reduce(&x).op(ReduceOp::Max).group(&g).run().unwrap();
                assert_eq!(x.to_vec::<i64>().unwrap(), vec![2]);
            }
            let s = w
                .split_group(None, &[vec![2, 1], vec![0]], SplitOptions::default())
                .unwrap();
            let y = Tensor::from_vec(vec![r as i32]);
            w.broadcast(&y, Rank::Group(0)).group(&s).run().unwrap();
            w.monitored_barrier()
                .timeout(Duration::from_secs(10))
                .wait_all_ranks(true)
                .run()
                .unwrap();
            // gather into one tensor: disjoint views of one storage as gather outputs
            let gt = Tensor::zeros(DType::I64, &[3, 2]);
            let mine = Tensor::from_vec(vec![r as i64; 2]);
            let gather = w.gather_single(&mine).dst(2);
            let gather = if r == 2 {
                gather.gather_tensor(&gt)
            } else {
                gather
            };
            gather.run().unwrap();
            if r == 2 {
                assert_eq!(gt.to_vec::<i64>().unwrap(), vec![0, 0, 1, 1, 2, 2]);
            }
            let objs: Vec<String> = w.all_gather_object(&format!("rank{r}")).run().unwrap();
            assert_eq!(objs, vec!["rank0", "rank1", "rank2"]);
            w.barrier().run().unwrap();
            y.to_vec::<i32>().unwrap()[0]
        },
    );
    assert_eq!(out, vec![0, 2, 2]);
}

#[test]
fn gloo_detail_mode_uses_a_gloo_helper() {
    let out = run_gloo(
        2,
        |w| w.set_debug_level(DebugLevel::Detail),
        |w, r| {
            let t = Tensor::from_vec(vec![1.0f32; 2]);
            w.all_reduce(&t).run().unwrap();
            let bad = if r == 0 {
                Tensor::zeros(DType::F32, &[2])
            } else {
                Tensor::zeros(DType::F32, &[3])
            };
            w.all_reduce(&bad).run().unwrap_err().to_string()
        },
    );
    assert!(
        out[0].contains("Detected mismatch between collectives on ranks. Rank 0"),
        "{}",
        out[0]
    );
    assert!(out[0].contains("Tensor Tensor shapes: 2vs 3"), "{}", out[0]);
    assert!(out[1].contains("Tensor Tensor shapes: 3vs 2"), "{}", out[1]);
}

#[test]
fn file_init_method() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rdv");
    let url = format!("file://{}", path.display());
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let url = url.clone();
            std::thread::spawn(move || {
                let w = World::new();
                w.init_process_group(InitOptions {
                    backend: Some("gloo".into()),
                    init_method: Some(url.clone()),
                    world_size: Some(2),
                    rank: Some(r),
                    timeout: Some(Duration::from_secs(30)),
                    ..Default::default()
                })
                .unwrap();
                assert_eq!(w.init_method().as_deref(), Some(url.as_str()));
                let t = Tensor::from_vec(vec![r as f64 + 1.0]);
                w.all_reduce(&t).run().unwrap();
                let ds = w.default_store().unwrap();
                c10d_store::store_barrier(ds.as_ref(), "end", 2, Duration::from_secs(60)).unwrap();
                w.destroy_process_group(None).unwrap();
                t.to_vec::<f64>().unwrap()[0]
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), 3.0);
    }
}

#[test]
fn gloo_detail_names_a_rank_that_never_arrives() {
    let s = store();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = World::new();
                w.set_debug_level(DebugLevel::Detail);
                w.init_process_group(InitOptions {
                    backend: Some("gloo".into()),
                    store: Some(s),
                    world_size: Some(2),
                    rank: Some(r),
                    timeout: Some(Duration::from_secs(3)),
                    ..Default::default()
                })
                .unwrap();
                let out = if r == 0 {
                    let t = Tensor::from_vec(vec![1.0f32; 2]);
                    Some(w.all_reduce(&t).run().unwrap_err().to_string())
                } else {
                    std::thread::sleep(Duration::from_secs(6));
                    None
                };
                let _ = w.abort_process_group(None);
                out
            })
        })
        .collect();
    let outs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let e = outs[0].as_ref().unwrap();
    assert!(e.contains("ProcessGroupWrapper: Monitored Barrier encountered error running collective: CollectiveFingerPrint("), "{e}");
    assert!(e.contains("OpType=ALLREDUCE"), "{e}");
    assert!(e.contains("1 failed to pass monitoredBarrier"), "{e}");
}

#[test]
fn sequence_numbers_advance_per_collective() {
    let out = run_gloo(
        3,
        |_| {},
        |w, r| {
            assert_eq!(w.get_sequence_number_for_group(None).unwrap(), 0);
            let t = Tensor::from_vec(vec![1u8]);
            w.all_reduce(&t).run().unwrap();
            if r != 0 && r != 2 {
                // one extra async all_reduce that ranks 0 and 2 never join (aborted at destroy)
                let _pending = w.all_reduce(&Tensor::from_vec(vec![1u8])).start().unwrap();
            }
            w.get_sequence_number_for_group(None).unwrap()
        },
    );
    assert_eq!(out, vec![1, 2, 1]);
}

#[test]
fn env_init_method_with_agent_store() {
    use c10d_store::{ServerOptions, TcpStoreServer};
    use std::collections::HashMap;
    // As under c10drun/torchrun: a TcpStore server hosted outside the ranks, every rank a client.
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let port = srv.port();
    let hs: Vec<_> = (0..3)
        .map(|r| {
            std::thread::spawn(move || {
                let vars: HashMap<&str, String> = [
                    ("MASTER_ADDR", "127.0.0.1".to_string()),
                    ("MASTER_PORT", port.to_string()),
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "3".to_string()),
                    ("TORCHELASTIC_USE_AGENT_STORE", "True".to_string()),
                ]
                .into_iter()
                .collect();
                let w = World::new();
                w.init_process_group(InitOptions {
                    backend: Some("gloo".into()),
                    timeout: Some(Duration::from_secs(30)),
                    env: Some(Arc::new(move |k: &str| vars.get(k).cloned())),
                    ..Default::default()
                })
                .unwrap();
                assert_eq!(w.init_method().as_deref(), Some("env://"));
                assert_eq!(w.rank().unwrap(), r);
                let t = Tensor::from_vec(vec![1i32 << r]);
                w.all_reduce(&t).op(ReduceOp::Bor).run().unwrap();
                // the rendezvous store is wrapped in PrefixStore("default_pg")
                let ds = w.default_store().unwrap();
                ds.set("k", b"v").unwrap();
                c10d_store::store_barrier(ds.as_ref(), "end", 3, Duration::from_secs(60)).unwrap();
                w.destroy_process_group(None).unwrap();
                t.to_vec::<i32>().unwrap()[0]
            })
        })
        .collect();
    for h in hs {
        assert_eq!(h.join().unwrap(), 7);
    }
    let client = c10d_store::TcpStore::new(
        "127.0.0.1",
        port,
        c10d_store::TcpStoreOptions {
            wait_for_workers: false,
            ..Default::default()
        },
    )
    .unwrap();
    use c10d_store::Store;
    assert!(client.check(&["default_pg/0//k"]).unwrap());
}

#[test]
fn set_timeout_and_recv_from_any_source() {
    let out = run_gloo(
        3,
        |_| {},
        |w, r| {
            // recv without src returns the sender's global rank
            let got = if r == 0 {
                let mut senders = Vec::new();
                for _ in 0..2 {
                    let t = Tensor::zeros(DType::I32, &[1]);
                    let from = w.recv(&t).tag(5).run().unwrap();
                    assert_eq!(t.to_vec::<i32>().unwrap()[0] as i64, from * 10);
                    senders.push(from);
                }
                senders.sort_unstable();
                senders
            } else {
                w.send(&Tensor::from_vec(vec![r as i32 * 10]), 0)
                    .tag(5)
                    .run()
                    .unwrap();
                Vec::new()
            };
            // dist.set_timeout on a live group: only rank 0 calls all_reduce and times out quickly
            let err = if r == 0 {
                w.set_timeout(Duration::from_millis(50), None).unwrap();
                let t = Tensor::from_vec(vec![1.0f32]);
                Some(w.all_reduce(&t).run().unwrap_err().to_string())
            } else {
                None
            };
            (got, err)
        },
    );
    assert_eq!(out[0].0, vec![1, 2]);
    let e = out[0].1.as_ref().unwrap();
    assert!(e.contains("Timed out waiting 50ms"), "{e}");
}

/// A memo bomb (ten levels of ten references: 10^9 values once expanded) from group rank 1
/// (global rank 2) of the group {0, 2}, sent with the wire pattern of `send_object_list`:
/// rank 0's `recv_object_list` fails naming the sender and the bound, without expanding it;
/// the group still works afterwards.
#[test]
fn a_hostile_pickle_fails_the_receiving_op_naming_the_sender() {
    let mut bomb = vec![0x80, 2, b']', b'q', 0];
    for i in 1..=10u8 {
        bomb.extend([b']', b'q', i, b'(']);
        for _ in 0..10 {
            bomb.extend([b'h', i - 1]);
        }
        bomb.push(b'e');
    }
    bomb.push(b'.');
    let out = run_gloo(
        3,
        |_| {},
        move |w, r| {
            let g = w.new_group(Some(&[0, 2]), GroupOptions::default()).unwrap();
            let mut msg = String::new();
            if r == 2 {
                let len = Tensor::from_vec(vec![bomb.len() as i64]);
                w.send(&len, 0).group(&g).run().unwrap();
                w.send(&Tensor::from_vec(bomb.clone()), 0)
                    .group(&g)
                    .run()
                    .unwrap();
            } else if r == 0 {
                let mut objs: Vec<Vec<String>> = vec![Vec::new()];
                let t = std::time::Instant::now();
                let e = w.recv_object_list(&mut objs).group(&g).run().unwrap_err();
                assert!(t.elapsed() < Duration::from_secs(10));
                msg = e.to_string();
            }
            if r != 1 {
                let x = Tensor::from_vec(vec![1i64]);
                w.all_reduce(&x).group(&g).run().unwrap();
                assert_eq!(x.to_vec::<i64>().unwrap(), vec![2]);
            }
            w.barrier().run().unwrap();
            msg
        },
    );
    assert!(
        out[0].contains("recv_object_list: refused the object from rank 1 (global rank 2)")
            && out[0].contains("pickle expands past the 64 MiB bound"),
        "{}",
        out[0]
    );
}
