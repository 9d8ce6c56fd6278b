//! The TcpStore server at PyTorch's limits (key 8192 bytes, value 8 MiB, 131072 keys a request):
//! requests over 64 MiB and replies over 256 MiB are served with bounded memory, and what is
//! over a limit is refused by closing only that connection.
//!
//! The large cases run one after another in one test, so the binary's peak memory stays at a
//! few hundred MB.

use c10d_store::tcp::protocol::{cmd, put_bytes, put_u64};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_testing::wire as wire_common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use wire_common::{closed_by_server, HELLO};

const MIB: usize = 1 << 20;

fn client(port: u16) -> TcpStore {
    TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .unwrap()
}

/// A validated raw connection (PING answered).
fn raw(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&HELLO).unwrap();
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(b, [1, 0, 0, 0]);
    s
}

fn read_u64(s: &mut TcpStream) -> u64 {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// Value `i` of the large cases: 8 MiB, distinct per `i`.
fn value(i: usize) -> Vec<u8> {
    (0..8 * MIB)
        .map(|j| ((j * 7 + i * 13) % 251) as u8)
        .collect()
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        / 1024
}

#[test]
fn requests_over_64_mib_and_replies_over_256_mib_are_served() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let s = client(port);
    let t0 = Instant::now();

    // MULTI_SET of 9 values of 8 MiB: a 72 MiB request.
    {
        let keys: Vec<String> = (0..9).map(|i| format!("big{i}")).collect();
        let vals: Vec<Vec<u8>> = (0..9).map(value).collect();
        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
        let v: Vec<&[u8]> = vals.iter().map(Vec::as_slice).collect();
        s.multi_set(&k, &v).unwrap();
        drop(vals);
        for (i, key) in keys.iter().enumerate() {
            assert!(s.get(key).unwrap() == value(i), "value of {key}");
        }
        // Back to back with a small request on the same connection: order kept.
        s.set("after", b"x").unwrap();
        assert_eq!(s.get("after").unwrap(), b"x");
    }

    // CHECK of 9,000 keys of 8,000 bytes: a 72 MB request (the keys are stored first by a
    // MULTI_SET just as large).
    {
        let keys: Vec<String> = (0..9000)
            .map(|i| format!("{i:08}{}", "k".repeat(7992)))
            .collect();
        let k: Vec<&str> = keys.iter().map(String::as_str).collect();
        let empty: Vec<&[u8]> = vec![b""; k.len()];
        assert!(!s.check(&k).unwrap());
        s.multi_set(&k, &empty).unwrap();
        assert!(s.check(&k).unwrap());
        let mut with_missing = k.clone();
        with_missing.push("missing");
        assert!(!s.check(&with_missing).unwrap());
        assert_eq!(s.num_keys().unwrap(), 9 + 1 + 9000);
        for key in &keys {
            s.delete_key(key).unwrap();
        }
    }

    // MULTI_GET with a 264 MiB reply (one 8 MiB value asked 33 times), read as it streams.
    {
        let rss0 = rss_mib();
        let mut r = raw(port);
        let mut req = vec![cmd::MULTI_GET];
        put_u64(&mut req, 34);
        for _ in 0..33 {
            put_bytes(&mut req, b"/big4");
        }
        put_bytes(&mut req, b"/after");
        r.write_all(&req).unwrap();
        let want = value(4);
        let mut buf = vec![0u8; 8 * MIB];
        for i in 0..33 {
            assert_eq!(read_u64(&mut r), (8 * MIB) as u64, "length of item {i}");
            r.read_exact(&mut buf).unwrap();
            assert!(buf == want, "item {i} differs");
        }
        assert_eq!(read_u64(&mut r), 1);
        let mut x = [0u8; 1];
        r.read_exact(&mut x).unwrap();
        assert_eq!(&x, b"x");
        let grown = rss_mib().saturating_sub(rss0);
        assert!(
            grown < 128,
            "a 264 MiB reply grew the process by {grown} MiB"
        );
        // The connection is still usable.
        r.write_all(&[cmd::PING, 7, 0, 0, 0]).unwrap();
        let mut p = [0u8; 4];
        r.read_exact(&mut p).unwrap();
        assert_eq!(p, [7, 0, 0, 0]);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn limits_are_pytorchs_and_what_exceeds_them_is_refused() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let s = client(port);

    // At the limits: accepted.
    let key = "k".repeat(8191); // 8192 bytes on the wire with the leading '/'
    s.set(&key, b"v").unwrap();
    assert_eq!(s.get(&key).unwrap(), b"v");
    let val = vec![3u8; 8 * MIB];
    s.set("eight_mib", &val).unwrap();
    assert!(s.get("eight_mib").unwrap() == val);
    drop(val);
    let many: Vec<String> = (0..131_072).map(|i| format!("m{i}")).collect();
    let m: Vec<&str> = many.iter().map(String::as_str).collect();
    let ones: Vec<&[u8]> = vec![b"1"; m.len()];
    s.multi_set(&m, &ones).unwrap();
    assert!(s.check(&m).unwrap());
    let got = s.multi_get(&m).unwrap();
    assert!(got.len() == 131_072 && got.iter().all(|v| v == b"1"));

    // Over the limits: that connection is closed, the server serves the others.
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut v = vec![cmd::SET];
    put_bytes(&mut v, &vec![b'k'; 8193]);
    put_bytes(&mut v, b"v");
    cases.push(("key of 8193 bytes", v));
    let mut v = vec![cmd::SET];
    put_bytes(&mut v, b"/v");
    put_u64(&mut v, (8 * MIB + 1) as u64);
    cases.push(("value of 8 MiB + 1", v));
    let mut v = vec![cmd::MULTI_GET];
    put_u64(&mut v, 131_073);
    cases.push(("131073 keys", v));
    for (name, bytes) in cases {
        let t0 = Instant::now();
        let mut r = raw(port);
        r.write_all(&bytes).unwrap();
        assert!(closed_by_server(&mut r), "{name}: connection not closed");
        assert!(t0.elapsed() < Duration::from_secs(10), "{name}: slow close");
        assert_eq!(s.get(&key).unwrap(), b"v", "server unhealthy after {name}");
    }

    // Through the client: a clear error naming the limit, and the store stays usable.
    let e = s.set(&"k".repeat(8192), b"v").unwrap_err().to_string();
    assert!(
        e.contains("8193") && e.contains("8192"),
        "unclear error for a long key: {e}"
    );
    let e = s
        .set("too_big", &vec![0u8; 8 * MIB + 1])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&(8 * MIB + 1).to_string()) && e.contains(&(8 * MIB).to_string()),
        "unclear error for a large value: {e}"
    );
    assert_eq!(s.get(&key).unwrap(), b"v");
}
