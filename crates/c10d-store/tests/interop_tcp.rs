//! Interop with real PyTorch (gated on C10D_TORCH_PYTHON = path to a python with torch):
//! - PyTorch's TCPStore client drives every op against our server;
//! - our client drives every op against PyTorch's server (libuv and legacy backends);
//! - two PyTorch ranks run `init_process_group("gloo")` + all_reduce through `env://` with
//!   `TORCHELASTIC_USE_AGENT_STORE=True` against our `c10d-store serve`.

use c10d_core::ErrorKind;
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn torch_python() -> Option<String> {
    match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            None
        }
    }
}

fn script(name: &str) -> String {
    format!("{}/tests/py/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Kills the child on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` up to `limit`; returns (success, stdout, stderr). Kills it on timeout.
fn finish(mut g: Guard, limit: Duration) -> (bool, String, String) {
    let mut out = g.0.stdout.take();
    let mut err = g.0.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let start = Instant::now();
    let ok = loop {
        if let Some(st) = g.0.try_wait().unwrap() {
            break st.success();
        }
        if start.elapsed() > limit {
            let _ = g.0.kill();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = g.0.wait();
    (ok, t_out.join().unwrap(), t_err.join().unwrap())
}

/// Reads the first stdout line of `child` with a time limit.
fn first_line(child: &mut Child, limit: Duration) -> String {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut l = String::new();
        let _ = r.read_line(&mut l);
        let _ = tx.send(l);
        // Keep draining so the child never blocks on a full pipe.
        let mut sink = Vec::new();
        let _ = r.read_to_end(&mut sink);
    });
    rx.recv_timeout(limit)
        .expect("child printed nothing in time")
}

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
    let mut child = Command::new(&py)
        .args([&script("tcp_pytorch_server.py"), "127.0.0.1", backend])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let line = first_line(&mut child, Duration::from_secs(120));
    let _g = Guard(child);
    let port: u16 = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad port line {line:?}"));
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
    // The CLI talks to PyTorch's server too.
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_c10d-store"))
            .args([
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--timeout-ms",
                "20000",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(cli(&["get", "key"]), "6");
    assert_eq!(cli(&["add", "key", "1"]), "7\n");
    cli(&["set", "from_cli", "x"]);
    assert_eq!(s.get("from_cli").unwrap(), b"x");
    assert_eq!(cli(&["check", "from_cli"]), "true\n");
}

#[test]
fn our_client_drives_pytorch_libuv_server() {
    our_client_on_pytorch_server("libuv");
}

#[test]
fn our_client_drives_pytorch_legacy_server() {
    our_client_on_pytorch_server("legacy");
}

#[test]
fn gloo_ranks_rendezvous_on_our_cli_server() {
    let Some(py) = torch_python() else { return };
    let mut srv = Command::new(env!("CARGO_BIN_EXE_c10d-store"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--world-size",
            "2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut srv, Duration::from_secs(30));
    let _srv = Guard(srv);
    let port = line.trim().rsplit_once(':').unwrap().1.to_string();
    let ranks: Vec<Guard> = (0..2)
        .map(|r| {
            Guard(
                Command::new(&py)
                    .arg(script("tcp_gloo_rank.py"))
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .env("RANK", r.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                    .env("GLOO_SOCKET_IFNAME", "lo")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    for (r, g) in ranks.into_iter().enumerate() {
        let (ok, out, err) = finish(g, Duration::from_secs(240));
        assert!(
            ok && out.contains(&format!("rank {r} OK")),
            "rank {r} failed\nstdout:\n{out}\nstderr:\n{err}"
        );
    }
    // The job's keys are visible through our client.
    let c = TcpStore::new(
        "127.0.0.1",
        port.parse().unwrap(),
        TcpStoreOptions {
            timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(c.num_keys().unwrap() > 0);
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

/// PyTorch's server as a child process; returns it with its port.
fn pytorch_server(py: &str, backend: &str) -> (Guard, u16) {
    let mut child = Command::new(py)
        .args([&script("tcp_pytorch_server.py"), "127.0.0.1", backend])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = first_line(&mut child, Duration::from_secs(120));
    let port = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad port line {line:?}"));
    (Guard(child), port)
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
