//! Regression tests from the correctness review: hostile/garbled peer frames, all-to-all
//! argument edge cases. A fake rank speaks the wire protocol over a raw TCP socket.

mod common;
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

const FRAME_MAGIC: u32 = 0xC10D_61F0;
const HELLO_MAGIC: u32 = 0x61F0_C10D;

/// Rank 0 is a real group of 2; rank 1 is this fake, connected over TCP and past the handshake.
fn real_and_fake() -> (Arc<ProcessGroupGloo>, TcpStream) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let o = GlooOptions {
        timeout: Duration::from_secs(30),
        local_unix_sockets: false,
        group_name: "review".into(),
        ..Default::default()
    };
    let s2 = store.clone();
    let h = std::thread::spawn(move || ProcessGroupGloo::new(s2, 0, 2, o).expect("rank 0"));
    store
        .wait_timeout(&["gloo/addr/0"], Duration::from_secs(30))
        .unwrap();
    let addr = String::from_utf8(store.get("gloo/addr/0").unwrap()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&1u64.to_le_bytes());
    hello.extend_from_slice(&2u64.to_le_bytes());
    hello.extend_from_slice(&6u32.to_le_bytes());
    hello.extend_from_slice(b"review");
    s.write_all(&hello).unwrap();
    let mut reply = [0u8; 6];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..], b"OK");
    (h.join().unwrap(), s)
}

#[allow(clippy::too_many_arguments)]
fn header(kind: u8, op: OpType, dtype: DType, coll_seq: u64, nbytes: u64, tag: i64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    b[4] = kind;
    b[5] = op.code();
    b[6] = dtype.code();
    b[16..24].copy_from_slice(&coll_seq.to_le_bytes());
    b[32..40].copy_from_slice(&nbytes.to_le_bytes());
    b[40..48].copy_from_slice(&nbytes.to_le_bytes());
    b[48..56].copy_from_slice(&tag.to_le_bytes());
    b
}

/// A pending async receive on the real rank (so its worker drives the socket), then `frame`.
fn recv_while_peer_sends(frame: &[u8]) -> String {
    let (pg, mut fake) = real_and_fake();
    let t = Tensor::zeros(DType::F32, &[4]);
    let w = pg.recv(&[t], 1, 7).unwrap();
    fake.write_all(frame).unwrap();
    let e = w
        .wait_timeout(Duration::from_secs(60))
        .expect_err("the group must fail");
    let text = e.to_string();
    assert!(
        !text.contains("in wait()"),
        "the receive never completed (engine died?): {text}"
    );
    drop(fake);
    text
}

#[test]
fn huge_unexpected_p2p_length_fails_the_group_instead_of_panicking() {
    let h = header(2, OpType::Send, DType::U8, 0, u64::MAX, 99);
    let text = recv_while_peer_sends(&h);
    assert!(text.contains("rank 1"), "{text}");
}

#[test]
fn huge_early_collective_length_fails_the_group_instead_of_aborting() {
    // A frame for a later collective (kept in the early queue) claiming 4 EiB.
    let h = header(1, OpType::Allreduce, DType::F32, 5, 1 << 62, 0);
    let text = recv_while_peer_sends(&h);
    assert!(text.contains("rank 1"), "{text}");
}

#[test]
fn long_error_frame_from_peer_fails_the_group_with_its_text() {
    // Error texts are kept up to 1 MiB; a longer one must be truncated, not crash the reader.
    let n = (2 << 20) + 1000;
    let mut frame = header(3, OpType::Unknown, DType::U8, 0, n as u64, 0).to_vec();
    let mut text = b"boom: peer failed".to_vec();
    text.resize(n, b'x');
    frame.extend_from_slice(&text);
    let e = recv_while_peer_sends(&frame);
    assert!(e.contains("boom: peer failed"), "{e}");
}

#[test]
fn all_to_all_single_with_different_input_sizes_per_rank() {
    // Rank r sends r+1 rows to every rank: inputs differ in size between ranks (legal in
    // PyTorch), outputs receive g+1 rows from rank g.
    for n in [2usize, 3] {
        run_world(n, opts(), move |r, pg| {
            let inp = Tensor::from_vec_shaped(vec![r as i32; (r + 1) * n], &[(r + 1) * n]).unwrap();
            let out_splits: Vec<usize> = (0..n).map(|g| g + 1).collect();
            let rows: usize = out_splits.iter().sum();
            let out = Tensor::zeros(DType::I32, &[rows]);
            pg.all_to_all_single(
                &out,
                &inp,
                &out_splits,
                &vec![r + 1; n],
                &AllToAllOptions::default(),
            )
            .unwrap()
            .wait()
            .unwrap();
            let want: Vec<i32> = (0..n).flat_map(|g| vec![g as i32; g + 1]).collect();
            assert_eq!(out.to_vec::<i32>().unwrap(), want);
            // The list form with tensors of different sizes per peer.
            let ins: Vec<Tensor> = (0..n).map(|_| Tensor::full(r as i64, &[r + 1])).collect();
            let outs: Vec<Tensor> = (0..n)
                .map(|g| Tensor::zeros(DType::I64, &[g + 1]))
                .collect();
            pg.all_to_all(&outs, &ins, &AllToAllOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            for (g, o) in outs.iter().enumerate() {
                assert_eq!(o.to_vec::<i64>().unwrap(), vec![g as i64; g + 1]);
            }
        });
    }
}

#[test]
fn all_to_all_bad_splits_are_argument_errors_and_the_group_stays_usable() {
    run_world(2, opts(), |r, pg| {
        if r == 0 {
            let inp = Tensor::zeros(DType::F32, &[4]);
            let out = Tensor::zeros(DType::F32, &[4]);
            // Split sizes whose sum overflows usize.
            let e = pg
                .all_to_all_single(&out, &inp, &[usize::MAX, 5], &[2, 2], &Default::default())
                .expect_err("overflowing split sizes");
            assert!(e.to_string().contains("split sizes"), "{e}");
            // Own block: 1 row out, 2 rows in.
            let e = pg
                .all_to_all_single(&out, &inp, &[1, 3], &[2, 2], &Default::default())
                .expect_err("own block sizes differ");
            assert!(e.to_string().contains("alltoall"), "{e}");
            let ins = vec![
                Tensor::zeros(DType::F32, &[2]),
                Tensor::zeros(DType::F32, &[2]),
            ];
            let outs = vec![
                Tensor::zeros(DType::F32, &[3]),
                Tensor::zeros(DType::F32, &[2]),
            ];
            let e = pg
                .all_to_all(&outs, &ins, &Default::default())
                .expect_err("own block sizes differ");
            assert!(e.to_string().contains("alltoall"), "{e}");
        }
        let t = Tensor::full(1.0f32, &[3]);
        pg.all_reduce(std::slice::from_ref(&t), &Default::default())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(f32s(&t), vec![2.0; 3]);
    });
}

#[test]
fn ops_queued_behind_a_failure_complete_when_the_group_is_aborted() {
    // Rank 0 of 2 with lazy init: its first op blocks the engine while connecting to a rank
    // that never comes and then fails the group. An op queued meanwhile and an abort arrive
    // together; the queued op must still complete (it used to stay pending forever).
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let o = GlooOptions {
        timeout: Duration::from_secs(3),
        lazy_init: true,
        ..Default::default()
    };
    let pg = ProcessGroupGloo::new(store, 0, 2, o).unwrap();
    let async_op = BarrierOptions {
        async_op: true,
        ..Default::default()
    };
    let first = pg.barrier(&async_op).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let queued = pg.barrier(&async_op).unwrap();
    pg.abort();
    assert!(first.wait_timeout(Duration::from_secs(30)).is_err());
    let e = queued
        .wait_timeout(Duration::from_secs(30))
        .expect_err("the queued op must fail");
    assert!(!e.to_string().contains("in wait()"), "never completed: {e}");
}

#[test]
fn huge_timeouts_mean_no_deadline_instead_of_panicking() {
    // `Duration::MAX` ("never time out") used to overflow `Instant + Duration` and panic, in
    // the constructor, on the worker (leaving the op pending forever) or in the caller.
    let o = GlooOptions {
        timeout: Duration::MAX,
        ..opts()
    };
    run_world(2, o, |r, pg| {
        let t = Tensor::full(1.0f32, &[3]);
        pg.all_reduce(std::slice::from_ref(&t), &Default::default())
            .unwrap()
            .wait_timeout(Duration::from_secs(60))
            .unwrap();
        assert_eq!(f32s(&t), vec![2.0; 3]);
        let w = if r == 0 {
            pg.send(std::slice::from_ref(&t), 1, 3).unwrap()
        } else {
            pg.recv(std::slice::from_ref(&t), 0, 3).unwrap()
        };
        w.wait_timeout(Duration::from_secs(60)).unwrap();
        let b = BarrierOptions {
            timeout: Some(Duration::MAX),
            ..Default::default()
        };
        pg.monitored_barrier(&b, true).unwrap();
        pg.barrier(&b)
            .unwrap()
            .wait_timeout(Duration::from_secs(60))
            .unwrap();
    });
}

#[test]
fn abort_during_lazy_connect_returns_promptly() {
    // The first op of a lazily initialised group connects on the engine; abort() joins the
    // engine and used to wait for the whole set-up timeout (30 min by default).
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let o = GlooOptions {
        timeout: Duration::from_secs(120),
        lazy_init: true,
        ..Default::default()
    };
    let pg = ProcessGroupGloo::new(store, 1, 2, o).unwrap();
    let w = pg
        .barrier(&BarrierOptions {
            async_op: true,
            ..Default::default()
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    pg.abort();
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "abort took {:?}",
        t0.elapsed()
    );
    let e = w.wait_timeout(Duration::from_secs(30)).unwrap_err();
    assert!(e.to_string().contains("abort"), "{e}");
}
