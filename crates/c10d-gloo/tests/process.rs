//! Real rank processes over a TcpStore: a normal run, and a rank killed mid-all_reduce.

use c10d_store::{ServerOptions, TcpStoreServer};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const EXE: &str = env!("CARGO_BIN_EXE_c10d-gloo-worker");

struct Ranks(Vec<Child>);
impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(
    mode: &str,
    port: u16,
    n: usize,
    extra: &[&str],
) -> (Ranks, mpsc::Receiver<(usize, String)>) {
    let (tx, rx) = mpsc::channel();
    let mut kids = Vec::new();
    for r in 0..n {
        let mut c = Command::new(EXE)
            .arg(mode)
            .args([
                "--port",
                &port.to_string(),
                "--rank",
                &r.to_string(),
                "--size",
                &n.to_string(),
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rank process");
        let out = c.stdout.take().expect("stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, line));
            }
        });
        kids.push(c);
    }
    (Ranks(kids), rx)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[test]
fn ranks_as_processes_compute_correct_results() {
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        ..Default::default()
    })
    .unwrap();
    let (mut ranks, rx) = spawn(
        "bench",
        server.port(),
        3,
        &[
            "--min-bytes",
            "1024",
            "--max-bytes",
            "1048576",
            "--iters",
            "1",
            "--timeout-s",
            "60",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    for c in &mut ranks.0 {
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "rank exited with {st}");
                break;
            }
            assert!(Instant::now() < deadline, "rank processes hang");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The processes have exited; their reader threads may still be forwarding lines. Read
    // until every sender is gone (EOF on every pipe), bounded by the deadline.
    let mut lines: Vec<String> = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok((0, l)) => lines.push(l),
            Ok(_) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("rank output never closed"),
        }
    }
    let rows: Vec<&String> = lines
        .iter()
        .filter(|l| !l.starts_with('#') && l.contains("float"))
        .collect();
    assert_eq!(rows.len(), 6, "{lines:?}");
    for row in rows {
        assert!(row.trim_end().ends_with(" 0"), "wrong elements: {row}");
    }
}

#[test]
fn killed_rank_fails_every_survivor_within_a_second() {
    // Same-host Unix sockets (default) and plain TCP, 4 MiB (cross-memory attach / sockets);
    // and 4 KiB on one host, which goes through the group's shared memory.
    killed_rank_case("true", "4194304");
    killed_rank_case("false", "4194304");
    killed_rank_case("true", "4096");
}

fn killed_rank_case(unix: &str, bytes: &str) {
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        ..Default::default()
    })
    .unwrap();
    let n = 3;
    let victim = 1;
    let (mut ranks, rx) = spawn(
        "allreduce-loop",
        server.port(),
        n,
        &["--bytes", bytes, "--timeout-s", "60", "--unix", unix],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = 0;
    while ready < n {
        let (_, l) = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("ranks did not start");
        if l.starts_with("READY") {
            ready += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    ranks.0[victim].kill().unwrap();
    let killed_at = now_ms();
    ranks.0[victim].wait().unwrap();
    let mut errors = Vec::new();
    while errors.len() < n - 1 {
        let (r, l) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a survivor hangs after the kill");
        if let Some(rest) = l.strip_prefix("ERROR ") {
            let (ms, msg) = rest.split_once(' ').unwrap();
            errors.push((r, ms.parse::<u128>().unwrap(), msg.to_string()));
        }
    }
    for (r, ms, msg) in &errors {
        eprintln!(
            "[{unix}, {bytes} B] rank {r} failed {} ms after the kill: {msg}",
            ms.saturating_sub(killed_at)
        );
        assert_ne!(*r, victim);
        assert!(msg.contains(&format!("rank {victim}")), "rank {r}: {msg}");
        assert!(
            ms.saturating_sub(killed_at) < 1000,
            "rank {r} noticed after {} ms",
            ms - killed_at
        );
    }
    for (r, c) in ranks.0.iter_mut().enumerate() {
        if r != victim {
            let st = c.wait().unwrap();
            assert_eq!(st.code(), Some(3));
        }
    }
}

#[test]
fn interface_environment_variables_choose_the_listen_address() {
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        ..Default::default()
    })
    .unwrap();
    let run = |env: (&str, &str), port: u16| {
        let kids: Vec<Child> = (0..2)
            .map(|r| {
                Command::new(EXE)
                    .arg("bench")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--rank",
                        &r.to_string(),
                        "--size",
                        "2",
                    ])
                    .args([
                        "--min-bytes",
                        "1024",
                        "--max-bytes",
                        "1024",
                        "--iters",
                        "1",
                        "--unix",
                        "false",
                        "--timeout-s",
                        "20",
                    ])
                    .env_remove("C10D_SOCKET_IFNAME")
                    .env_remove("GLOO_SOCKET_IFNAME")
                    .env(env.0, env.1)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut ranks = Ranks(kids);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        for c in &mut ranks.0 {
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    let mut err = String::new();
                    if let Some(mut e) = c.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    out.push((st.success(), err));
                    break;
                }
                assert!(Instant::now() < deadline, "rank processes hang");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        out
    };
    let ok = run(("C10D_SOCKET_IFNAME", "lo"), server.port());
    assert!(ok.iter().all(|(s, _)| *s), "{ok:?}");
    let bad = run(("GLOO_SOCKET_IFNAME", "no-such-if0"), server.port());
    assert!(
        bad.iter()
            .all(|(s, e)| !*s && e.contains("GLOO_SOCKET_IFNAME=no-such-if0")),
        "{bad:?}"
    );
}
