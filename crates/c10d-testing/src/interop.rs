//! Helpers of the interop tests against real PyTorch (`C10D_TORCH_PYTHON`): its Python,
//! the scripts under c10d-store's `tests/py`, and child processes with deadlines. Used by the
//! interop tests of c10d-store, c10d-tools and c10d-world.
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The Python with PyTorch, or `None` (with a printed reason) when `C10D_TORCH_PYTHON` is unset.
pub fn torch_python() -> Option<String> {
    match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            None
        }
    }
}

/// A script of c10d-store's `tests/py`.
pub fn script(name: &str) -> String {
    format!(
        "{}/../c10d-store/tests/py/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Kills the child on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` up to `limit`; returns (success, stdout, stderr). Kills it on timeout.
pub fn finish(mut g: Guard, limit: Duration) -> (bool, String, String) {
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
pub fn first_line(child: &mut Child, limit: Duration) -> String {
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

/// PyTorch's own TCPStore server (`backend`: "libuv" or "legacy") on 127.0.0.1, port 0:
/// the process (killed on drop) and its port.
/// PyTorch's server as a child process; returns it with its port.
pub fn pytorch_server(py: &str, backend: &str) -> (Guard, u16) {
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
