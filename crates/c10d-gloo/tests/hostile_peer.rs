//! A hostile group member: a raw socket that completes the mesh handshake as rank 1, then
//! answers rank 0's all_reduce with a bad frame. Each bad frame fails rank 0's op with an error
//! naming rank 1 and the problem, promptly, never a hang, a crash or a write past the buffer
//! (the frame's length is checked against the receive before a byte is copied: the class of
//! Gloo's 2026 out-of-bounds write cannot happen); another group of the same process is
//! unaffected. The same raw rank 1 checks what rank 0 sends it: a cause passed on from another
//! rank is told again at shutdown as passed on; strangers connecting to rank 0 (random bytes,
//! a taken rank, silence) hold up no member.

mod common;
use c10d_core::{AllreduceOptions, Backend, Collectives, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u32 = 0x61F0_C10D;
const HDR: usize = 64;

/// The head of a mesh hello: magic, rank, group size, length of the group name.
fn hello_head(rank: u64, size: u64, name_len: u32) -> Vec<u8> {
    let mut h = HELLO_MAGIC.to_le_bytes().to_vec();
    h.extend_from_slice(&rank.to_le_bytes());
    h.extend_from_slice(&size.to_le_bytes());
    h.extend_from_slice(&name_len.to_le_bytes());
    h
}

/// A whole hello: its head, then the group name.
fn hello(rank: u64, size: u64, name: &[u8]) -> Vec<u8> {
    let mut h = hello_head(rank, size, name.len() as u32);
    h.extend_from_slice(name);
    h
}

/// Turns the header rank 0 sent into rank 1's bad answer, and sends it.
type BadAnswer = Box<dyn FnOnce(&mut [u8; HDR], &mut TcpStream)>;

/// Rank 0 of a group of 2 whose rank 1 is the returned socket (handshake done).
fn group_with_a_raw_rank1() -> (Arc<ProcessGroupGloo>, TcpStream) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let s0 = store.clone();
    let o = GlooOptions {
        timeout: Duration::from_secs(10),
        local_unix_sockets: false,
        ..opts()
    };
    let rank0 = std::thread::spawn(move || ProcessGroupGloo::new(s0, 0, 2, o).unwrap());
    store
        .wait_timeout(&["gloo/addr/0"], Duration::from_secs(30))
        .unwrap();
    let addr = String::from_utf8(store.get("gloo/addr/0").unwrap()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello(1, 2, b"0")).unwrap();
    let mut reply = [0u8; 6];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[4..], b"OK");
    (rank0.join().unwrap(), s)
}

/// A group with a raw rank 1, rank 0's async all_reduce of 4 floats started, and the frame it
/// sent rank 1 read: the group (kept alive), the tensor, the work, the header, the socket.
fn all_reduce_towards_raw_rank1() -> (
    Arc<ProcessGroupGloo>,
    Tensor,
    c10d_core::Work,
    [u8; HDR],
    TcpStream,
) {
    let (pg, mut s) = group_with_a_raw_rank1();
    let t = Tensor::from_vec(vec![1.0f32; 4]);
    let opts = AllreduceOptions {
        async_op: true,
        ..Default::default()
    };
    let w = pg.all_reduce(std::slice::from_ref(&t), &opts).unwrap();
    let mut hdr = [0u8; HDR];
    s.read_exact(&mut hdr).unwrap();
    let n = u64::from_le_bytes(hdr[40..48].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; n];
    s.read_exact(&mut payload).unwrap();
    (pg, t, w, hdr, s)
}

/// Starts rank 0's all_reduce of 4 floats, reads the frame it sends rank 1 (header + 16
/// bytes), lets `bad` turn that header into the reply, and returns rank 0's error.
fn answer_with(bad: impl FnOnce(&mut [u8; HDR], &mut TcpStream)) -> String {
    let (_pg, t, w, mut hdr, mut s) = all_reduce_towards_raw_rank1();
    let t0 = Instant::now();
    bad(&mut hdr, &mut s);
    let e = w.wait().expect_err("a bad frame must fail the op");
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(t.to_vec::<f32>().unwrap().len(), 4);
    drop(s);
    e.to_string()
}

#[test]
fn bad_frames_fail_the_op_naming_the_peer_and_the_problem() {
    let cases: Vec<(&str, BadAnswer)> = vec![
        (
            "a payload length far past the receive (1 TiB)",
            Box::new(|h, s| {
                h[40..48].copy_from_slice(&(1u64 << 40).to_le_bytes());
                s.write_all(h).unwrap();
                let _ = s.write_all(&[0u8; 4096]);
            }),
        ),
        (
            "an unknown op code",
            Box::new(|h, s| {
                h[5] = 0xEE;
                s.write_all(h).unwrap();
            }),
        ),
        (
            "a frame of another stream (bad magic)",
            Box::new(|h, s| {
                h[0] ^= 0xFF;
                s.write_all(h).unwrap();
            }),
        ),
        (
            "a truncated frame, then the connection closes",
            Box::new(|h, s| {
                s.write_all(&h[..30]).unwrap();
                let _ = s.shutdown(std::net::Shutdown::Both);
            }),
        ),
        (
            "a frame of a collective that does not exist yet",
            Box::new(|h, s| {
                h[16..24].copy_from_slice(&7u64.to_le_bytes());
                s.write_all(h).unwrap();
                let _ = s.write_all(&[0u8; 16]);
            }),
        ),
    ];
    let problems = [
        "frame step 0 of 1099511627776 bytes where step 0 of 16 bytes was expected",
        "unknown op code 238",
        "bad frame magic",
        "connection closed by peer",
        "collective #7 where #0 was expected",
    ];
    for ((what, bad), problem) in cases.into_iter().zip(problems) {
        let e = answer_with(bad);
        assert!(
            e.contains("rank 1"),
            "{what}: the error does not name rank 1: {e}"
        );
        assert!(
            e.contains(problem),
            "{what}: the error does not say {problem:?}: {e}"
        );
    }
    // Another group of this process is unaffected.
    let ranks = make_world(2, opts());
    let ts: Vec<Tensor> = (0..2).map(|_| Tensor::from_vec(vec![2.0f32; 3])).collect();
    all_reduce_each(&ranks, &ts);
    assert_eq!(f32s(&ts[0]), vec![4.0; 3]);
}

/// A small seeded generator (xorshift64*): the same cases on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_frames_end_the_op_cleanly() {
    // 40 answers mutated at random (header bytes flipped, payloads of random length, frames
    // cut short): each op either completes (a flip in a byte the receive does not check) with
    // its tensor intact, or fails promptly naming rank 1. Never a crash, a hang or a write
    // past the 4-float buffer.
    let mut rng = Rng(0x00C1_0D5E_ED00_0026);
    let (mut completed, mut failed) = (0, 0);
    for case in 0..40 {
        let flips: Vec<(usize, u8)> = (0..1 + rng.below(4))
            .map(|_| (rng.below(HDR as u64) as usize, 1 + rng.below(255) as u8))
            .collect();
        let payload = rng.below(64) as usize;
        let cut = (rng.below(4) == 0).then(|| rng.below(HDR as u64) as usize);
        let (_pg, t, w, mut hdr, mut s) = all_reduce_towards_raw_rank1();
        for (i, x) in &flips {
            hdr[*i] ^= x;
        }
        let t0 = Instant::now();
        let _ = match cut {
            Some(c) => s.write_all(&hdr[..c]),
            None => s
                .write_all(&hdr)
                .and_then(|()| s.write_all(&vec![7u8; payload])),
        };
        let _ = s.shutdown(std::net::Shutdown::Write);
        match w.wait() {
            Ok(()) => completed += 1,
            Err(e) => {
                failed += 1;
                let e = e.to_string();
                assert!(e.contains("rank 1"), "case {case} {flips:?}: {e}");
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(9),
            "case {case}: took {:?}",
            t0.elapsed()
        );
        assert_eq!(t.to_vec::<f32>().unwrap().len(), 4);
    }
    assert!(
        failed > 0,
        "no mutation failed an op ({completed} completed)"
    );
}

/// Rank 0 of a group of 2 accepting on a thread (TCP, 30 s), a function that joins the real
/// rank 1, and rank 0's address for strangers to connect to first.
fn rank0_accepting() -> (
    std::thread::JoinHandle<Arc<ProcessGroupGloo>>,
    impl FnOnce() -> Arc<ProcessGroupGloo>,
    String,
) {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let s0 = store.clone();
    let o = GlooOptions {
        timeout: Duration::from_secs(30),
        local_unix_sockets: false,
        ..opts()
    };
    let o1 = o.clone();
    let rank0 = std::thread::spawn(move || ProcessGroupGloo::new(s0, 0, 2, o).unwrap());
    store
        .wait_timeout(&["gloo/addr/0"], Duration::from_secs(30))
        .unwrap();
    let addr = String::from_utf8(store.get("gloo/addr/0").unwrap()).unwrap();
    let join1 = move || ProcessGroupGloo::new(store, 1, 2, o1).unwrap();
    (rank0, join1, addr)
}

/// Joins rank 0 (accepting) and `rank1`, all-reduces `len` floats (rank r gives r + 1) and
/// returns what rank 0 got: 3.0 each when the group works.
fn reduce_on(
    rank0: std::thread::JoinHandle<Arc<ProcessGroupGloo>>,
    rank1: Arc<ProcessGroupGloo>,
    len: usize,
) -> Vec<f32> {
    let pgs = vec![rank0.join().unwrap(), rank1];
    let ts: Vec<Tensor> = (0..2)
        .map(|r| Tensor::from_vec(vec![(r + 1) as f32; len]))
        .collect();
    all_reduce_each(&pgs, &ts);
    f32s(&ts[0])
}

#[test]
fn random_hellos_are_dropped_and_the_members_connect() {
    // 100 connections to rank 0 that send random bytes (random lengths, some starting with the
    // hello magic and a random rank, size and name length): each is dropped without failing
    // the set-up, and the real rank 1 then joins.
    let (rank0, join1, addr) = rank0_accepting();
    let mut rng = Rng(0x0000_4E11_0C10_D026);
    for _ in 0..100 {
        let mut s = TcpStream::connect(&addr).unwrap();
        let mut b: Vec<u8> = (0..rng.below(40)).map(|_| rng.next() as u8).collect();
        if rng.below(2) == 0 {
            // No such rank, any size and name length.
            let mut h = hello_head(2 + rng.below(1 << 20), rng.next(), rng.next() as u32);
            h.append(&mut b);
            b = h;
        }
        let _ = s.write_all(&b);
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    assert_eq!(reduce_on(rank0, join1(), 5), vec![3.0; 5]);
}

#[test]
fn a_connection_claiming_a_taken_rank_is_refused_and_the_members_connect() {
    // A connection with the group's name and size that claims rank 0 (the accepting rank's
    // own): it gets the refusal naming the problem, rank 0 keeps accepting, the real rank 1
    // joins and the group reduces correctly.
    let (rank0, join1, addr) = rank0_accepting();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Rank 0: the accepting rank's own.
    s.write_all(&hello(0, 2, b"0")).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply[4.min(reply.len())..]).to_string();
    assert!(
        text.contains("unexpected connection claiming rank 0"),
        "the impostor was told {text:?}"
    );
    assert_eq!(reduce_on(rank0, join1(), 3), vec![3.0; 3]);
}

#[test]
fn silent_connections_hold_up_no_member() {
    // Three connections to rank 0 that never say a word (a port scanner, a health check) and
    // stay open past the 10 s each is given for its hello: rank 0 checks them apart, so the
    // real rank 1 joins and the group reduces at once, not after 3 x 10 s (by then the 30 s
    // set-up would have failed).
    let (rank0, join1, addr) = rank0_accepting();
    let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let got = reduce_on(rank0, join1(), 4);
    let took = t.elapsed();
    assert_eq!(got, vec![3.0; 4]);
    assert!(
        took < Duration::from_secs(8),
        "rank 1 joined and reduced after {took:?}: a silent connection held it up"
    );
    drop(silent);
}

/// Reads frames from `s` up to a bye frame (or the end of the stream): every error frame's
/// step and text.
fn error_frames_until_bye(s: &mut TcpStream) -> Vec<(u32, String)> {
    let mut errors = Vec::new();
    let mut hdr = [0u8; HDR];
    while s.read_exact(&mut hdr).is_ok() {
        let n = u64::from_le_bytes(hdr[40..48].try_into().unwrap()) as usize;
        let mut payload = vec![0u8; n];
        s.read_exact(&mut payload).unwrap();
        match hdr[4] {
            3 => errors.push((
                u32::from_le_bytes(hdr[8..12].try_into().unwrap()),
                String::from_utf8_lossy(&payload).into_owned(),
            )),
            4 => break,
            _ => {}
        }
    }
    errors
}

#[test]
fn a_passed_on_cause_is_told_again_at_shutdown_as_passed_on() {
    // Rank 1 passes on a third rank's error text (step 1: not its own failure). Rank 0 fails
    // with it, naming rank 1 as the one that reported it; when rank 0 then shuts down it tells
    // rank 1 the cause again, still as passed on and unchanged: a peer whose own connection
    // broke meanwhile must name its own other end, not fail at once with a text wrapped as
    // rank 0's.
    let (pg, _t, w, mut hdr, mut s) = all_reduce_towards_raw_rank1();
    let text = "ProcessGroupGloo (group 0, rank 2): connection to rank 3 lost";
    hdr[4] = 3; // error text
    hdr[8..12].copy_from_slice(&1u32.to_le_bytes()); // passed on
    hdr[40..48].copy_from_slice(&(text.len() as u64).to_le_bytes());
    s.write_all(&hdr).unwrap();
    s.write_all(text.as_bytes()).unwrap();
    let e = w
        .wait()
        .expect_err("a passed-on error fails the op")
        .to_string();
    assert!(e.contains(&format!("rank 1 reported: {text}")), "{e}");
    pg.shutdown();
    assert_eq!(error_frames_until_bye(&mut s), vec![(1, text.to_string())]);
}
