//! Byte-exact wire vectors of `shared/docs/store-protocol.md` §8, both directions:
//! our client against a scripted fake server (captured bytes compared), and a raw socket client
//! against our server (replies compared).

use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    assert!(s.len().is_multiple_of(2), "odd hex {s}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)
        .unwrap_or_else(|e| panic!("reading {n} bytes: {e}"));
    v
}

/// (client bytes expected, server reply) pairs after the handshake.
fn script() -> Vec<(&'static str, &'static str)> {
    vec![
        // ADD "init/" 1
        ("04 0500000000000000 696e69742f 0100000000000000", "0100000000000000"),
        // set("a","b")
        ("01 0200000000000000 2f61 0100000000000000 62", ""),
        // add("counter",5)
        ("04 0800000000000000 2f636f756e746572 0500000000000000", "0500000000000000"),
        // get("a"): WAIT then GET
        ("06 0100000000000000 0200000000000000 2f61", "00"),
        ("03 0200000000000000 2f61", "0100000000000000 62"),
        // wait(["nokey"], 200ms): WAIT, silence, CANCEL_WAIT
        ("06 0100000000000000 0600000000000000 2f6e6f6b6579", ""),
        ("0c", "01"),
        // compare_set x3
        ("02 0300000000000000 2f6373 0000000000000000 0200000000000000 7631", "0200000000000000 7631"),
        ("02 0300000000000000 2f6373 0100000000000000 78 0200000000000000 7632", "0200000000000000 7631"),
        ("02 0800000000000000 2f6d697373696e67 0100000000000000 78 0200000000000000 7632", "0100000000000000 78"),
        // check(["a","zz"])
        ("05 0200000000000000 0200000000000000 2f61 0300000000000000 2f7a7a", "01"),
        // num_keys
        ("07", "0300000000000000"),
        // delete_key("a")
        ("08 0200000000000000 2f61", "0100000000000000"),
        // multi_set
        ("0b 0200000000000000 0300000000000000 2f6d31 0100000000000000 31 0300000000000000 2f6d32 0200000000000000 3232", ""),
        // queue_len("q")
        ("10 0200000000000000 2f71", "0100000000000000"),
        // queue_pop("q"): WAIT then QUEUE_POP
        ("06 0100000000000000 0200000000000000 2f71", "00"),
        ("0f 0200000000000000 2f71", "0100000000000000 0400000000000000 6974656d"),
        // list_keys
        ("11", "0100000000000000 0500000000000000 696e69742f"),
        // barrier("bar",1)
        ("12 0400000000000000 2f626172 0100000000000000", "00"),
    ]
}

#[test]
fn client_bytes_match_pytorch() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert_eq!(read_n(&mut s, 5), hex("00 cef7853c"), "VALIDATE");
        let ping = read_n(&mut s, 5);
        assert_eq!(ping[0], 0x0d, "PING command");
        assert_eq!(&ping[1..], &std::process::id().to_le_bytes(), "nonce = pid");
        s.write_all(&ping[1..]).unwrap();
        for (i, (c, r)) in script().into_iter().enumerate() {
            let want = hex(c);
            let got = read_n(&mut s, want.len());
            assert_eq!(got, want, "client bytes of step {i} ({c})");
            if c.starts_with("06 0100000000000000 0600") {
                // The timed-out wait: nothing more must arrive before the client's CANCEL.
                continue;
            }
            s.write_all(&hex(r)).unwrap();
        }
        // Nothing else was sent.
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut b = [0u8; 1];
        assert!(
            !matches!(s.read(&mut b), Ok(1)),
            "unexpected extra byte {b:?}"
        );
    });
    let st = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            world_size: Some(2),
            timeout: Duration::from_secs(30),
            ..Default::default()
        },
    )
    .unwrap();
    st.set("a", b"b").unwrap();
    assert_eq!(st.add("counter", 5).unwrap(), 5);
    assert_eq!(st.get("a").unwrap(), b"b");
    let t0 = Instant::now();
    let e = st
        .wait_timeout(&["nokey"], Duration::from_millis(200))
        .unwrap_err();
    assert!(t0.elapsed() >= Duration::from_millis(190));
    assert!(e.is_store_error());
    assert_eq!(e.to_string(), "wait timeout after 200ms, keys: /nokey");
    assert_eq!(st.compare_set("cs", b"", b"v1").unwrap(), b"v1");
    assert_eq!(st.compare_set("cs", b"x", b"v2").unwrap(), b"v1");
    assert_eq!(st.compare_set("missing", b"x", b"v2").unwrap(), b"x");
    assert!(!st.check(&["a", "zz"]).unwrap());
    assert_eq!(st.num_keys().unwrap(), 3);
    assert!(st.delete_key("a").unwrap());
    st.multi_set(&["m1", "m2"], &[b"1", b"22"]).unwrap();
    assert_eq!(st.queue_len("q").unwrap(), 1);
    assert_eq!(st.queue_pop("q", true).unwrap(), b"item");
    assert_eq!(st.list_keys().unwrap(), Vec::<String>::new());
    st.barrier("bar", 1, Duration::from_secs(5)).unwrap();
    drop(st);
    fake.join().unwrap();
}

struct Raw(TcpStream);

impl Raw {
    fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Raw(s)
    }
    fn xchg(&mut self, c: &str, r: &str) {
        self.0.write_all(&hex(c)).unwrap();
        let want = hex(r);
        let got = read_n(&mut self.0, want.len());
        assert_eq!(got, want, "server reply to {c}");
    }
    fn silent(&mut self, ms: u64) {
        self.0
            .set_read_timeout(Some(Duration::from_millis(ms)))
            .unwrap();
        let mut b = [0u8; 1];
        let r = self.0.read(&mut b);
        assert!(r.is_err(), "expected silence, got {r:?} {b:?}");
        self.0
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
    }
}

#[test]
fn server_replies_match_pytorch() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let mut c = Raw::connect(srv.port());
    c.xchg("00 cef7853c 0d 39300000", "39300000");
    c.xchg(
        "04 0500000000000000 696e69742f 0100000000000000",
        "0100000000000000",
    );
    c.xchg("11", "0100000000000000 0500000000000000 696e69742f");
    c.xchg("01 0200000000000000 2f61 0100000000000000 62", "");
    c.xchg(
        "04 0800000000000000 2f636f756e746572 0500000000000000",
        "0500000000000000",
    );
    c.xchg("07", "0300000000000000");
    c.xchg("06 0100000000000000 0200000000000000 2f61", "00");
    c.xchg("03 0200000000000000 2f61", "0100000000000000 62");
    c.xchg("06 0100000000000000 0600000000000000 2f6e6f6b6579", "");
    c.silent(200);
    c.xchg("0c", "01");
    c.xchg(
        "02 0300000000000000 2f6373 0000000000000000 0200000000000000 7631",
        "0200000000000000 7631",
    );
    c.xchg(
        "02 0300000000000000 2f6373 0100000000000000 78 0200000000000000 7632",
        "0200000000000000 7631",
    );
    c.xchg(
        "02 0800000000000000 2f6d697373696e67 0100000000000000 78 0200000000000000 7632",
        "0100000000000000 78",
    );
    // The "lying" compare_set did not create the key.
    c.xchg(
        "05 0100000000000000 0800000000000000 2f6d697373696e67",
        "01",
    );
    c.xchg(
        "05 0200000000000000 0200000000000000 2f61 0300000000000000 2f7a7a",
        "01",
    );
    c.xchg("05 0100000000000000 0200000000000000 2f61", "00");
    c.xchg("08 0200000000000000 2f61", "0100000000000000");
    c.xchg("08 0200000000000000 2f61", "0000000000000000");
    c.xchg("0b 0200000000000000 0300000000000000 2f6d31 0100000000000000 31 0300000000000000 2f6d32 0200000000000000 3232", "");
    c.xchg(
        "0a 0300000000000000 0300000000000000 2f6d31 0300000000000000 2f6d32 0200000000000000 2f7a",
        "0100000000000000 31 0200000000000000 3232 0000000000000000",
    );
    c.xchg("0e 0200000000000000 2f71 0400000000000000 6974656d", "");
    c.xchg("10 0200000000000000 2f71", "0100000000000000");
    c.xchg("06 0100000000000000 0200000000000000 2f71", "00");
    c.xchg(
        "0f 0200000000000000 2f71",
        "0100000000000000 0400000000000000 6974656d",
    );
    c.xchg("0f 0200000000000000 2f71", "0000000000000000");
    c.xchg("12 0400000000000000 2f626172 0100000000000000", "00");
    // APPEND then GET; ADD parses the appended decimal.
    c.xchg("09 0200000000000000 2f6e 0100000000000000 34", "");
    c.xchg("09 0200000000000000 2f6e 0100000000000000 32", "");
    c.xchg(
        "04 0200000000000000 2f6e 0000000000000000",
        "2a00000000000000",
    );
    // WAIT with zero keys answers at once; PING any time after validation.
    c.xchg("06 0000000000000000", "00");
    c.xchg("0d 01020304", "01020304");
}

#[test]
fn server_handles_split_and_coalesced_requests() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let mut c = Raw::connect(srv.port());
    let mut all = hex("00 cef7853c 0d 39300000");
    all.extend(hex("01 0200000000000000 2f61 0100000000000000 62"));
    all.extend(hex("03 0200000000000000 2f61"));
    all.extend(hex("07"));
    for b in &all {
        c.0.write_all(std::slice::from_ref(b)).unwrap();
        c.0.flush().unwrap();
    }
    let want = hex("39300000 0100000000000000 62 0100000000000000");
    assert_eq!(read_n(&mut c.0, want.len()), want);
    // Coalesced: three requests in one write.
    let mut many = Vec::new();
    for _ in 0..3 {
        many.extend(hex("04 0200000000000000 2f63 0100000000000000"));
    }
    c.0.write_all(&many).unwrap();
    assert_eq!(
        read_n(&mut c.0, 24),
        hex("0100000000000000 0200000000000000 0300000000000000")
    );
}

#[test]
fn waiters_are_woken_by_other_connections() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let mut w = Raw::connect(srv.port());
    w.xchg("00 cef7853c 0d 01000000", "01000000");
    // WAIT on two keys, one of them twice (counts twice).
    w.xchg(
        "06 0200000000000000 0200000000000000 2f78 0200000000000000 2f79",
        "",
    );
    let mut s = Raw::connect(srv.port());
    s.xchg("00 cef7853c 0d 02000000", "02000000");
    s.xchg("01 0200000000000000 2f78 0100000000000000 31", "");
    w.silent(100);
    s.xchg("01 0200000000000000 2f79 0100000000000000 31", "");
    assert_eq!(read_n(&mut w.0, 1), vec![0]);
    // Queue push wakes exactly one blocked popper.
    let mut w2 = Raw::connect(srv.port());
    w2.xchg("00 cef7853c 0d 03000000", "03000000");
    w.xchg("06 0100000000000000 0300000000000000 2f7171", "");
    w2.xchg("06 0100000000000000 0300000000000000 2f7171", "");
    s.xchg("0e 0300000000000000 2f7171 0100000000000000 41", "");
    assert_eq!(read_n(&mut w.0, 1), vec![0]);
    w2.silent(100);
    s.xchg("0e 0300000000000000 2f7171 0100000000000000 42", "");
    assert_eq!(read_n(&mut w2.0, 1), vec![0]);
    // Barrier of 2 over two connections.
    w.xchg("12 0200000000000000 2f62 0200000000000000", "");
    w.silent(50);
    s.xchg("12 0200000000000000 2f62 0200000000000000", "00");
    assert_eq!(read_n(&mut w.0, 1), vec![0]);
    // CANCEL_WAIT racing a wake-up yields 00 01.
    w.xchg("06 0100000000000000 0200000000000000 2f7a", "");
    s.xchg("01 0200000000000000 2f7a 0100000000000000 31", "");
    std::thread::sleep(Duration::from_millis(50));
    w.xchg("0c", "00 01");
}
