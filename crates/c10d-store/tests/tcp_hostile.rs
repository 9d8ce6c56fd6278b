//! Hostile input against the TcpStore server: only the offending connection is dropped, other
//! clients keep working, and the decoder never allocates from a length field.

use c10d_store::tcp::protocol::{Decoder, Limits, Request};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_testing::wire as wire_common;
use proptest::prelude::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use wire_common::{closed_by_server, HELLO};

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn healthy(good: &TcpStore, tag: &str) {
    good.set(tag, b"ok").unwrap();
    assert_eq!(
        good.get(tag).unwrap(),
        b"ok",
        "server unhealthy after {tag}"
    );
}

#[test]
fn bad_input_drops_only_that_connection() {
    let srv = TcpStoreServer::bind(ServerOptions {
        max_payload: 4096,
        ..Default::default()
    })
    .unwrap();
    let port = srv.port();
    let good = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    good.set("before", b"1").unwrap();

    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad magic", vec![0x00, 0xde, 0xad, 0xbe, 0xef, 0x07]),
        ("ping first", vec![0x0d, 1, 2, 3, 4]),
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
    ];
    let mut v = HELLO.to_vec();
    v.push(19);
    cases.push(("unknown command", v));
    let mut v = HELLO.to_vec();
    v.push(0x01);
    v.extend_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("huge key length", v));
    let mut v = HELLO.to_vec();
    v.extend_from_slice(&[0x01, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'a']);
    v.extend_from_slice(&(1u64 << 40).to_le_bytes());
    cases.push(("huge value length", v));
    let mut v = HELLO.to_vec();
    v.extend_from_slice(&[0x01, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'a']);
    v.extend_from_slice(&4097u64.to_le_bytes());
    cases.push(("value over max_payload", v));
    let mut v = HELLO.to_vec();
    v.push(0x06);
    v.extend_from_slice(&(1u64 << 50).to_le_bytes());
    cases.push(("huge key count", v));
    let mut v = HELLO.to_vec();
    v.extend_from_slice(&[0x00, 1, 2, 3, 4]);
    cases.push(("second VALIDATE with wrong magic", v));
    let mut v = HELLO.to_vec();
    // ADD on a non-integer value.
    v.extend_from_slice(&[
        0x01, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b's', 1, 0, 0, 0, 0, 0, 0, 0, b'x',
    ]);
    v.extend_from_slice(&[
        0x04, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b's', 1, 0, 0, 0, 0, 0, 0, 0,
    ]);
    cases.push(("add on garbage", v));

    for (name, bytes) in cases {
        let t0 = Instant::now();
        let mut s = raw(port);
        s.write_all(&bytes).unwrap();
        assert!(closed_by_server(&mut s), "{name}: connection not closed");
        assert!(t0.elapsed() < Duration::from_secs(15), "{name}: slow close");
        healthy(&good, name);
    }
    // Truncated frames followed by a disconnect, many times; the server must not keep them.
    let fds = || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let base = fds();
    for cut in 1..30 {
        let mut v = HELLO.to_vec();
        v.extend_from_slice(&[
            0x02, 3, 0, 0, 0, 0, 0, 0, 0, b'/', b'c', b's', 1, 0, 0, 0, 0, 0, 0, 0, b'x', 1, 0, 0,
            0, 0, 0, 0, 0, b'y',
        ]);
        let mut s = raw(port);
        s.write_all(&v[..v.len() - cut]).unwrap();
        drop(s);
    }
    healthy(&good, "truncated");
    let t0 = Instant::now();
    while fds() > base && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        fds() <= base,
        "server leaked connections: {} fds, baseline {base}",
        fds()
    );
    assert_eq!(good.get("before").unwrap(), b"1");
}

#[test]
fn random_bytes_never_kill_the_server() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let good = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..40 {
        let mut s = raw(port);
        let mut v = if round % 2 == 0 {
            HELLO.to_vec()
        } else {
            Vec::new()
        };
        let n = (next() % 4096) as usize;
        v.extend((0..n).map(|_| next() as u8));
        let _ = s.write_all(&v);
        drop(s);
    }
    healthy(&good, "random");
}

#[test]
fn slow_reader_does_not_block_others() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let good = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    good.set("big", &vec![7u8; 1 << 20]).unwrap();
    let mut s = raw(port);
    s.set_nonblocking(true).unwrap();
    let mut req = HELLO.to_vec();
    let get = [0x03, 4, 0, 0, 0, 0, 0, 0, 0, b'/', b'b', b'i', b'g'];
    // 5000 GETs of 1 MiB = 5 GB of replies if the server buffered them all.
    for _ in 0..5000 {
        req.extend_from_slice(&get);
    }
    let rss = || {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    let rss0 = rss();
    // Writes 200 GETs of a 1 MiB value and never reads the replies.
    let mut off = 0;
    let t0 = Instant::now();
    while off < req.len() && t0.elapsed() < Duration::from_secs(5) {
        match s.write(&req[off..]) {
            Ok(n) => off += n,
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    healthy(&good, "slow reader");
    let grown_mb = rss().saturating_sub(rss0) / 1024;
    assert!(
        grown_mb < 400,
        "server memory grew by {grown_mb} MiB for a reader that never reads"
    );
    drop(s);
    healthy(&good, "slow reader gone");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    /// The frame decoder never panics on arbitrary input, in arbitrary splits, and never buffers
    /// more than the request cap.
    #[test]
    fn decoder_random_bytes(data in proptest::collection::vec(any::<u8>(), 0..4096), split in 1usize..300) {
        let limits = Limits { max_key_len: 64, max_payload: 256, max_keys: 16, max_request: 4096 };
        let mut d = Decoder::new(limits);
        'outer: for chunk in data.chunks(split) {
            let mut input = chunk;
            loop {
                match d.decode(&mut input) {
                    Ok(Some(_)) => continue,
                    Ok(None) => break,
                    Err(_) => break 'outer,
                }
            }
            prop_assert!(input.is_empty());
            prop_assert!(d.buffered() <= 4096 + 8 * 17);
        }
    }

    /// Valid request streams decode to the same requests however they are split.
    #[test]
    fn decoder_roundtrip(keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20), 1..6),
                         val in proptest::collection::vec(any::<u8>(), 0..100), n in any::<i64>(), split in 1usize..50) {
        let reqs = vec![
            Request::Set(keys[0].clone(), val.clone()),
            Request::Add(keys[0].clone(), n),
            Request::Wait(keys.clone()),
            Request::MultiSet(keys.iter().map(|k| (k.clone(), val.clone())).collect()),
            Request::CompareSet(keys[0].clone(), val.clone(), vec![]),
            Request::Ping(n as u32),
        ];
        let stream: Vec<u8> = reqs.iter().flat_map(|r| r.encode()).collect();
        let mut d = Decoder::new(Limits::default());
        let mut got = Vec::new();
        for chunk in stream.chunks(split) {
            let mut input = chunk;
            while let Some(r) = d.decode(&mut input).unwrap() {
                got.push(r);
            }
        }
        prop_assert_eq!(got, reqs);
    }
}
