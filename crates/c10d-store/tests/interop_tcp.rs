//! Interop with real PyTorch (gated on C10D_TORCH_PYTHON = path to a python with torch):
//! - PyTorch's TCPStore client drives every op against our server;
//! - our client drives every op against PyTorch's server (libuv and legacy backends).
//!
//! The `c10d-store` command line against PyTorch: c10d-tools' `interop_store_cli.rs`.

use c10d_core::ErrorKind;
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_testing::interop as interop_common;
use interop_common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn pytorch_client_drives_our_server() {
    let Some(py) = torch_python() else { return };
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let child = Command::new(&py)
        .args([
            &script("tcp_client_ops.py"),
            "127.0.0.1",
            &srv.port().to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, out, err) = finish(Guard(child), Duration::from_secs(180));
    assert!(
        ok && out.contains("OK"),
        "python client failed\nstdout:\n{out}\nstderr:\n{err}"
    );
}

fn drive_all_ops(s: &TcpStore, queues: bool) {
    assert_eq!(s.num_keys().unwrap(), 1, "init/ key");
    for d in [1, 2, 3] {
        s.add("key", d).unwrap();
    }
    s.set("key0", b"value0").unwrap();
    s.add("key3", 1).unwrap();
    s.set("key1", b"value1").unwrap();
    s.add("key3", 2).unwrap();
    s.set("key2", b"value2").unwrap();
    for d in 3..=6 {
        s.add("key3", d).unwrap();
    }
    assert_eq!(s.get("key").unwrap(), b"6");
    assert_eq!(s.get("key3").unwrap(), b"21");
    assert_eq!(s.get("key1").unwrap(), b"value1");
    assert_eq!(s.num_keys().unwrap(), 6);
    assert!(s.check(&["key3"]).unwrap());
    assert!(!s.check(&["Randomkey3"]).unwrap());
    assert!(s.delete_key("key2").unwrap());
    assert!(!s.delete_key("key2").unwrap());
    assert_eq!(s.num_keys().unwrap(), 5);
    assert_eq!(s.compare_set("cs", b"x", b"y").unwrap(), b"x");
    assert!(!s.check(&["cs"]).unwrap());
    assert_eq!(s.compare_set("cs", b"", b"v").unwrap(), b"v");
    assert_eq!(s.compare_set("cs", b"no", b"w").unwrap(), b"v");
    assert_eq!(s.compare_set("cs", b"v", b"w").unwrap(), b"w");
    let e = s
        .wait_timeout(&["bad_key"], Duration::from_millis(200))
        .unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 200ms, keys: /bad_key");
    s.wait_timeout(&["key"], Duration::from_secs(10)).unwrap();
    s.set("foo", b"po").unwrap();
    s.append("foo", b"tato").unwrap();
    assert_eq!(s.get("foo").unwrap(), b"potato");
    s.multi_set(&["m1", "m2"], &[b"1", b"22"]).unwrap();
    assert_eq!(
        s.multi_get(&["m2", "m1"]).unwrap(),
        vec![b"22".to_vec(), b"1".to_vec()]
    );
    let big: Vec<u8> = (0..(2 << 20)).map(|i| (i % 253) as u8).collect();
    s.set("big", &big).unwrap();
    assert_eq!(s.get("big").unwrap(), big);
    let mut keys = s.list_keys().unwrap();
    keys.sort();
    assert!(
        keys.contains(&"key".to_string()) && !keys.iter().any(|k| k.starts_with("init")),
        "{keys:?}"
    );
    s.barrier("bar", 1, Duration::from_secs(10)).unwrap();
    let e = s
        .barrier("bar2", 2, Duration::from_millis(100))
        .unwrap_err();
    assert_eq!(e.to_string(), "barrier timeout after 100ms, key: bar2");
    // A second connection wakes a waiter.
    let c = s.clone_store().unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        c.set("late", b"1").unwrap();
    });
    s.wait_timeout(&["late"], Duration::from_secs(30)).unwrap();
    h.join().unwrap();
    if queues {
        assert_eq!(s.queue_len("q").unwrap(), 0);
        s.queue_push("q", b"1").unwrap();
        s.queue_push("q", b"2").unwrap();
        assert!(s.check(&["q"]).unwrap());
        assert_eq!(s.queue_len("q").unwrap(), 2);
        assert_eq!(s.queue_pop("q", true).unwrap(), b"1");
        assert_eq!(s.queue_pop("q", false).unwrap(), b"2");
        assert_eq!(
            s.queue_pop("q", false).unwrap_err().kind(),
            ErrorKind::QueueEmpty
        );
    }
}

fn our_client_on_pytorch_server(backend: &str) {
    let Some(py) = torch_python() else { return };
    let (_g, port) = pytorch_server(&py, backend);
    let s = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            world_size: Some(1),
            timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .unwrap();
    drive_all_ops(&s, backend == "libuv");
}

#[test]
fn our_client_drives_pytorch_libuv_server() {
    our_client_on_pytorch_server("libuv");
}

#[test]
fn our_client_drives_pytorch_legacy_server() {
    our_client_on_pytorch_server("legacy");
}

/// Runs `tcp_large_ops.py` (PyTorch's client) with `cases` against `port`; returns its stdout.
fn large_ops(py: &str, port: u16, cases: &[&str]) -> String {
    let child = Command::new(py)
        .arg(script("tcp_large_ops.py"))
        .args(["127.0.0.1", &port.to_string()])
        .args(cases)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (ok, out, err) = finish(Guard(child), Duration::from_secs(180));
    assert!(
        ok && out.ends_with("OK\n"),
        "tcp_large_ops.py {cases:?} failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

/// PyTorch's client at the store's limits gets the same results from our server as from
/// PyTorch's: a 72 MiB MULTI_SET and MULTI_GET and a 72 MB CHECK (compared with PyTorch's legacy
/// server: its libuv server re-parses a request from its start on every read and needs minutes
/// for these), and the key/value/key-count limits (compared with PyTorch's libuv server).
#[test]
fn pytorch_client_at_the_limits_same_results_as_pytorchs_server() {
    let Some(py) = torch_python() else { return };
    let ours = TcpStoreServer::bind(ServerOptions::default()).unwrap();

    let big = ["multi", "check"];
    let on_ours = large_ops(&py, ours.port(), &big);
    let (legacy, port) = pytorch_server(&py, "legacy");
    let on_pytorch = large_ops(&py, port, &big);
    drop(legacy);
    assert_eq!(on_ours, on_pytorch, "large requests: ours vs PyTorch's");
    assert!(
        on_ours.contains("check 10 long keys, set: True"),
        "{on_ours}"
    );

    let on_ours = large_ops(&py, ours.port(), &["limits"]);
    let (libuv, port) = pytorch_server(&py, "libuv");
    let on_pytorch = large_ops(&py, port, &["limits"]);
    drop(libuv);
    assert_eq!(on_ours, on_pytorch, "limits: ours vs PyTorch's");
    for line in [
        "key of 8192 bytes: ok",
        "key of 8193 bytes: error",
        "value of 8 MiB + 1: error",
        "multi_get of 131073 keys: error",
        "server alive: ok True",
    ] {
        assert!(on_ours.contains(line), "missing {line:?} in\n{on_ours}");
    }
}
