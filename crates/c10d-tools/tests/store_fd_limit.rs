//! The TcpStore server at its file-descriptor limit: `c10d-store serve` runs in a child process
//! whose RLIMIT_NOFILE is lowered, is filled with connections, and must turn the excess away at
//! once (its clients retry) and serve a retrying client as soon as descriptors free up.

use c10d_store::{Store, TcpStore, TcpStoreOptions};
use c10d_testing::wire as wire_common;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use wire_common::HELLO;

/// The child's descriptor limit: a few for stdio, epoll, waker, listener and reserve; the
/// rest for connections.
const NOFILE: libc::rlim_t = 32;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve_with_nofile(limit: libc::rlim_t) -> (Server, u16) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_c10d-store"));
    cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let srv = Server(child);
    let port = line
        .trim()
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("bad line {line:?}"));
    (srv, port)
}

/// Connects and pings: `Ok(stream)` when served, `Err(elapsed)` when the server closed it.
fn try_served(port: u16) -> Result<TcpStream, Duration> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(&HELLO);
    let mut b = [0u8; 4];
    match s.read_exact(&mut b) {
        Ok(()) => {
            assert_eq!(b, [1, 0, 0, 0]);
            Ok(s)
        }
        Err(e) => {
            let waited = t0.elapsed();
            assert!(
                waited < Duration::from_secs(10),
                "a connection over the limit waited {waited:?} ({e}) instead of being closed"
            );
            Err(waited)
        }
    }
}

#[test]
fn excess_connections_are_closed_at_once_and_clients_served_when_descriptors_free_up() {
    let (_srv, port) = serve_with_nofile(NOFILE);

    // Fill the server: connections are served until its descriptors run out.
    let mut held = Vec::new();
    let refused = loop {
        match try_served(port) {
            Ok(s) => held.push(s),
            Err(waited) => break waited,
        }
        assert!(
            held.len() < NOFILE as usize,
            "the descriptor limit was not applied"
        );
    };
    assert!(held.len() >= 8, "only {} connections served", held.len());
    // Still full: every new connection is closed at once, never left queued.
    for _ in 0..3 {
        assert!(
            try_served(port).is_err(),
            "a connection over the limit was served"
        );
    }
    let _ = refused;

    // A client that keeps retrying (PyTorch's connect loop) while the server is full...
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                timeout: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .and_then(|s| {
            s.set("k", b"v")?;
            s.get("k")
        });
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "served while the server was full");
    // ...is served soon after some descriptors free up, without any other client connecting.
    let freed = Instant::now();
    held.truncate(held.len() - 4);
    let got = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("the retrying client was not served after descriptors freed up");
    assert_eq!(got.unwrap(), b"v");
    h.join().unwrap();
    assert!(freed.elapsed() < Duration::from_secs(15));

    // The freed descriptors serve plain new connections too, up to the limit again.
    let mut more = 0;
    while try_served(port).map(|s| held.push(s)).is_ok() {
        more += 1;
        assert!(
            more <= 8,
            "served more connections than descriptors were freed"
        );
    }
    assert!(
        more >= 2,
        "only {more} new connections served after freeing 4"
    );
}

#[test]
fn a_queued_connection_is_not_left_waiting() {
    let (_srv, port) = serve_with_nofile(NOFILE);
    let mut held = Vec::new();
    while let Ok(s) = try_served(port) {
        held.push(s);
        assert!(held.len() < NOFILE as usize);
    }
    // Connections queued while the server is full: each one is closed at once (so that its
    // client retries) rather than left in the backlog until someone else connects.
    let queued: Vec<TcpStream> = (0..5)
        .map(|_| {
            let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        })
        .collect();
    for mut s in queued {
        let t0 = Instant::now();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("queued connection not closed: {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    drop(held);
    // With descriptors free again a new connection is served.
    let t0 = Instant::now();
    loop {
        if try_served(port).is_ok() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not served after the connections closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
