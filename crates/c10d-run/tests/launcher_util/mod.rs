//! Helpers shared by the launcher tests (all in c10d-run's `tests/`, also those running the
//! examples and tools of other crates under `c10drun`): run `c10drun` (or another binary) with
//! a deadline and capture its output while it runs; find the workspace's binaries and examples
//! (built with cargo when missing).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `target/<profile>` of this test binary.
pub fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The binary `name` of the workspace package `package`, built with cargo when `cargo test`
/// did not build it already (`cargo test --workspace` builds every package's binaries).
pub fn workspace_bin(package: &str, name: &str) -> String {
    built(package, "--bin", name, profile_dir().join(name))
}

/// The example `name` of the workspace package `package` (`target/<profile>/examples`), built
/// with cargo when missing.
pub fn workspace_example(package: &str, name: &str) -> String {
    built(
        package,
        "--example",
        name,
        profile_dir().join("examples").join(name),
    )
}

/// `path`, after `cargo build -p package kind name` when it does not exist.
fn built(package: &str, kind: &str, name: &str, path: std::path::PathBuf) -> String {
    if !path.exists() {
        let profile = profile_dir();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", package, kind, name, "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml"))
            .env("CARGO_TARGET_DIR", profile.parent().unwrap());
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("cannot run cargo");
        assert!(
            st.success(),
            "cargo build -p {package} {kind} {name} failed"
        );
    }
    path.to_string_lossy().into_owned()
}

/// Path of the `c10drun` binary under test.
pub fn c10drun() -> String {
    match option_env!("CARGO_BIN_EXE_c10drun") {
        Some(p) => p.to_string(),
        None => workspace_bin("c10d-run", "c10drun"),
    }
}

/// Finished process: exit code (None when killed by a signal) and its output.
pub struct Output {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The first stdout line containing `needle`.
    pub fn stdout_line_with(&self, needle: &str) -> Option<String> {
        self.stdout
            .lines()
            .find(|l| l.contains(needle))
            .map(str::to_string)
    }
    /// c10drun's own stderr lines (not the workers').
    pub fn summary(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("c10drun: "))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "\n--- exit code {:?}\n--- stdout:\n{}\n--- stderr:\n{}\n---",
            self.code, self.stdout, self.stderr
        )
    }
}

/// A running process whose output is collected by background threads.
pub struct Job {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    lines: Receiver<(bool, String)>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn collect(
    src: impl Read + Send + 'static,
    buf: Arc<Mutex<String>>,
    is_err: bool,
    tx: std::sync::mpsc::Sender<(bool, String)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&line).into_owned();
                    buf.lock().unwrap().push_str(&s);
                    let _ = tx.send((is_err, s));
                }
            }
        }
    })
}

/// Starts `program args` with piped output.
pub fn spawn(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Job {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let (tx, rx) = channel();
    let stdout = Arc::new(Mutex::new(String::new()));
    let stderr = Arc::new(Mutex::new(String::new()));
    let r1 = collect(
        child.stdout.take().unwrap(),
        stdout.clone(),
        false,
        tx.clone(),
    );
    let r2 = collect(child.stderr.take().unwrap(), stderr.clone(), true, tx);
    Job {
        child,
        stdout,
        stderr,
        lines: rx,
        readers: vec![r1, r2],
    }
}

/// Starts `c10drun args`.
pub fn spawn_c10drun(args: &[&str]) -> Job {
    spawn(&c10drun(), args, &[])
}

/// Runs `c10drun args` to completion (killed and failed after `limit`).
pub fn run_c10drun(args: &[&str], limit: Duration) -> Output {
    spawn_c10drun(args).finish(limit)
}

impl Job {
    fn wait_line(&mut self, want_err: bool, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            // Look in everything received so far (lines may arrive in any order).
            let buf = if want_err { &self.stderr } else { &self.stdout };
            if let Some(l) = buf.lock().unwrap().lines().find(|l| l.contains(needle)) {
                return l.trim_end().to_string();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if self
                .lines
                .recv_timeout(left.min(Duration::from_millis(100)))
                .is_err()
                && left.is_zero()
            {
                let _ = self.child.kill();
                panic!(
                    "no line containing {needle:?} within {limit:?}\nstdout: {}\nstderr: {}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
        }
    }
    /// Waits for a stdout line containing `needle` and returns it.
    pub fn wait_for_stdout(&mut self, needle: &str, limit: Duration) -> String {
        self.wait_line(false, needle, limit)
    }
    /// Waits until `n` stdout lines contain `needle`.
    pub fn wait_for_stdout_count(&mut self, needle: &str, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.stdout.lock().unwrap().matches(needle).count() < n {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "fewer than {n} lines containing {needle:?} within {limit:?}\nstdout: {}\nstderr: {}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            let _ = self.lines.recv_timeout(Duration::from_millis(100));
        }
    }
    /// Waits for a stderr line containing `needle` and returns it.
    pub fn wait_for_stderr(&mut self, needle: &str, limit: Duration) -> String {
        self.wait_line(true, needle, limit)
    }
    /// Waits (up to `limit`) for the launcher's "store listening on <host>:<port>" line and
    /// returns the port.
    pub fn wait_for_store_port(&mut self, host: &str, limit: Duration) -> String {
        let prefix = format!("store listening on {host}:");
        let line = self.wait_for_stderr(&prefix, limit);
        line.split(prefix.as_str())
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .expect("port in the store line")
            .to_string()
    }
    /// Sends a signal to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child's pid (not yet reaped).
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
    /// Waits for exit; kills the process and panics after `limit`.
    pub fn finish(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                // SIGTERM first so c10drun can stop its workers; then SIGKILL.
                self.signal(libc::SIGTERM);
                std::thread::sleep(Duration::from_secs(3));
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "process did not finish within {limit:?}\nstdout: {}\nstderr: {}",
                    self.stdout.lock().unwrap(),
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let stdout = self.stdout.lock().unwrap().clone();
        let stderr = self.stderr.lock().unwrap().clone();
        Output {
            code: status.code(),
            stdout,
            stderr,
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A test that panicked must not leave a launcher (and so its workers) behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
