//! The `tls` layer: faults during a store connection's TLS handshake and the job secret's
//! challenge. A `c10d-store serve` process (TLS files or a secret file from the environment,
//! made once per run with `c10d-store new-tls` / `new-secret`) and a `c10d-store set` client
//! talk through a proxy thread of this harness, which forwards every chunk read on either side
//! and, before forwarding chunk N (drawn among the first messages of the handshake: the
//! fault lands inside it), kills the server (`kill -9`), stops it (`SIGSTOP`), cuts the
//! connection (both sockets shut) or stalls it (holds both open, forwarding nothing). From
//! then on the proxy refuses new connections, so a client that retries meets a dead store.
//!
//! Verdict: the client fails within its store timeout + [`MARGIN`] of the fault, its error
//! naming the store's address as it was given (the proxy's `(127.0.0.1, port)`); where the
//! server survives (cut, stalled), a fresh client connecting to it directly is served within
//! [`SERVED`] while the broken connection is still held; nothing is left behind.

use super::job::{self, Rank};
use super::layer::{Ctx, Layer, TrialOut, Turns};
use super::leaks;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// "handshake": TLS only; "auth challenge": the job secret only (plain TCP, so that the
/// proxy's chunks are the challenge's messages).
/// The layer's kinds: a fault in the TLS handshake, or in the job secret's challenge; each
/// takes its four actions (the store killed or stopped, the connection cut or stalled) in
/// turn, as [`VARIANTS`] names them.
const KINDS: [&str; 2] = ["tls: handshake fault", "tls: auth challenge fault"];

/// Every (kind, action) pair, as the trial reads it.
const VARIANTS: [&str; 8] = [
    "tls: handshake, store killed",
    "tls: handshake, store stopped",
    "tls: handshake, conn cut",
    "tls: handshake, conn stalled",
    "tls: auth challenge, store killed",
    "tls: auth challenge, store stopped",
    "tls: auth challenge, conn cut",
    "tls: auth challenge, conn stalled",
];

/// Beyond the client's store timeout: a debug `c10d-store` process starting, loading its TLS
/// files and exiting on a loaded 2-core machine (about 0.1–0.5 s each), plus the harness's
/// polling; 3 s is several times what was seen.
const MARGIN: Duration = Duration::from_secs(3);
/// A fresh client beside a broken handshake: connect, handshake and one SET, debug build.
const SERVED: Duration = Duration::from_secs(10);
/// The server's start (debug build, TLS files): it prints where it listens.
const START: Duration = Duration::from_secs(30);

/// What the proxy does at the fault.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Action {
    Kill,
    Stop,
    Cut,
    Stall,
}

/// The layer: the `c10d-store` binary and the job's TLS and secret files, once made.
pub struct Tls {
    bin: Option<PathBuf>,
    dir: PathBuf,
    /// Actions taken in turn, per kind.
    actions: [Turns; 2],
}

impl Tls {
    pub fn new() -> Tls {
        Tls {
            bin: None,
            dir: std::env::temp_dir().join(format!("c10d-chaos-tls-{}", std::process::id())),
            actions: Default::default(),
        }
    }

    /// Builds `c10d-store` and makes the files, the first time.
    fn setup(&mut self) -> Result<PathBuf, String> {
        if let Some(b) = &self.bin {
            return Ok(b.clone());
        }
        let st = crate::cargo()
            .args(["build", "-q", "-p", "c10d-tools", "--bin", "c10d-store"])
            .status()
            .map_err(|e| format!("cargo: {e}"))?;
        if !st.success() {
            return Err("cannot build c10d-store".into());
        }
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let bin = std::fs::canonicalize(format!("{target}/debug/c10d-store"))
            .map_err(|e| format!("c10d-store not built: {e}"))?;
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        for args in [
            vec!["new-tls".into(), self.dir.join("tls")],
            vec!["new-secret".into(), self.dir.join("secret")],
        ] {
            let out = Command::new(&bin)
                .args(&args)
                .output()
                .map_err(|e| format!("c10d-store: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "c10d-store {:?}: {}",
                    args,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        self.bin = Some(bin.clone());
        Ok(bin)
    }

    /// The environment that turns on TLS (or the secret) for a server or client.
    fn env(&self, cmd: &mut Command, tls: bool) {
        let t = self.dir.join("tls");
        if tls {
            cmd.env("C10D_TLS_CA_FILE", t.join("ca.pem"))
                .env("C10D_TLS_CERT_FILE", t.join("cert.pem"))
                .env("C10D_TLS_KEY_FILE", t.join("key.pem"))
                .env_remove("C10D_AUTH_SECRET_FILE");
        } else {
            cmd.env("C10D_AUTH_SECRET_FILE", self.dir.join("secret"))
                .env_remove("C10D_TLS_CA_FILE")
                .env_remove("C10D_TLS_CERT_FILE")
                .env_remove("C10D_TLS_KEY_FILE");
        }
        cmd.env_remove("C10D_TLS_SERVER_NAME")
            .env_remove("RUST_LOG");
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Layer for Tls {
    fn kinds(&self) -> Vec<&'static str> {
        KINDS.to_vec()
    }

    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let k = usize::from(kind != KINDS[0]);
        let kind = VARIANTS[4 * k + self.actions[k].next(4, ctx.rng)];
        let tls = kind.contains("handshake");
        let action = if kind.contains("killed") {
            Action::Kill
        } else if kind.contains("stopped") {
            Action::Stop
        } else if kind.contains("cut") {
            Action::Cut
        } else {
            Action::Stall
        };
        // Chunks of the handshake seen by the proxy, both ways: TLS 1.3 with client
        // certificates has three flights (client hello, 234 bytes; server hello to finished,
        // 736; client certificate to finished, 556), the challenge three messages (the
        // server's challenge, 41 bytes; the client's answer and nonce, 64; the server's
        // answer, 32), then VALIDATE and the request follow. A flight may arrive in several
        // chunks, never fewer, so chunk 0..=2 lands inside the handshake.
        let at = ctx.rng.range(0, 2) as usize;
        let mut out = TrialOut {
            desc: format!(
                "{} store: {action:?} before handshake chunk {at}",
                if tls { "TLS" } else { "secret" }
            ),
            ..TrialOut::default()
        };
        let bin = match self.setup() {
            Ok(b) => b,
            Err(e) => {
                out.problems.push(e);
                return out;
            }
        };
        let tmp =
            std::env::temp_dir().join(format!("c10d-chaos-{}-{}", std::process::id(), ctx.trial));
        let _ = std::fs::create_dir_all(&tmp);
        let shm_before = leaks::shm();
        let marker = job::marker(ctx.trial);
        let mut procs: Vec<Rank> = Vec::new();
        run(self, &bin, tls, action, at, ctx, &tmp, &mut procs, &mut out);
        job::kill_all(&mut procs);
        for (i, p) in procs.iter().enumerate() {
            let who = ["server", "client", "fresh client"].get(i).unwrap_or(&"?");
            out.log += &format!("=== {who} (exit {:?})\n{}\n", p.exit, p.output());
        }
        let pids: Vec<i32> = procs.iter().map(|r| r.pid).collect();
        for l in leaks::check(&marker, &pids, &tmp, &shm_before) {
            out.problems.push(format!("leak: {l}"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        out
    }
}

/// One trial: server, proxy, client, fault, verdict. `procs`: server, client, fresh client.
#[allow(clippy::too_many_arguments)]
fn run(
    layer: &Tls,
    bin: &Path,
    tls: bool,
    action: Action,
    at: usize,
    ctx: &mut Ctx<'_>,
    tmp: &Path,
    procs: &mut Vec<Rank>,
    out: &mut TrialOut,
) {
    let command = |args: &[&str]| {
        let mut c = Command::new(bin);
        c.args(args)
            .env("C10D_CHAOS_TRIAL", job::marker(ctx.trial))
            .env("TMPDIR", tmp);
        layer.env(&mut c, tls);
        c
    };
    match job::spawn(&mut command(&[
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ])) {
        Ok(s) => procs.push(s),
        Err(e) => return out.problems.push(format!("cannot start the server: {e}")),
    }
    let deadline = Instant::now() + START;
    let server_port = loop {
        if let Some((_, l)) = procs[0].line_with("c10d-store listening on") {
            match l
                .rsplit(':')
                .next()
                .and_then(|p| p.trim().parse::<u16>().ok())
            {
                Some(p) => break p,
                None => return out.problems.push(format!("server said {l}")),
            }
        }
        if Instant::now() > deadline || procs[0].poll() {
            return out.problems.push("the server did not start".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let proxy = match Proxy::start(server_port, procs[0].pid, action, at) {
        Ok(p) => p,
        Err(e) => return out.problems.push(format!("proxy: {e}")),
    };
    let timeout_ms = ctx.timeout.as_millis().to_string();
    let addr = format!("127.0.0.1:{}", proxy.port);
    match job::spawn(&mut command(&[
        "--addr",
        &addr,
        "--timeout-ms",
        &timeout_ms,
        "set",
        "k",
        "v",
    ])) {
        Ok(c) => procs.push(c),
        Err(e) => return out.problems.push(format!("cannot start the client: {e}")),
    }
    // The client exits by its timeout + margin after the fault; the fault comes within its
    // start and connect (START covers a loaded machine).
    let end = Instant::now() + START + ctx.timeout + MARGIN;
    loop {
        if procs[1].poll() {
            break;
        }
        if let Some(f) = proxy.fault_at() {
            if Instant::now() > f + ctx.timeout + MARGIN {
                break;
            }
        }
        if Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // While the broken connection is still held (the proxy keeps a stalled one open), the
    // surviving server serves others.
    let fresh_ok = (proxy.fault_at().is_some() && matches!(action, Action::Cut | Action::Stall))
        .then(|| fresh_client(&command, server_port, procs));
    let fault = proxy.fault_at();
    let proxy_port = proxy.port;
    proxy.stop();
    let Some(f) = fault else {
        out.problems.push(format!(
            "fault not injected: the exchange had fewer than {} chunks",
            at + 1
        ));
        return;
    };
    let client = &procs[1];
    match client.exited_at {
        None => out.problems.push(format!(
            "hang: the client still ran {} ms after the fault (store timeout {} ms + {} ms)",
            (ctx.timeout + MARGIN).as_millis(),
            ctx.timeout.as_millis(),
            MARGIN.as_millis()
        )),
        Some(t) => {
            out.detect.push(t.saturating_duration_since(f));
            if client.exit == Some(Some(0)) {
                out.problems
                    .push("the client succeeded through a broken handshake".into());
            }
            let named = format!("(127.0.0.1, {proxy_port})");
            let text = client.output();
            if matches!(action, Action::Stop | Action::Stall) && text.contains("certificate") {
                out.problems.push(format!(
                    "the client blames certificates for a silent store: {}",
                    text.lines().last().unwrap_or("")
                ));
            }
            if !text.contains(&named) && !text.contains(&addr) {
                out.problems.push(format!(
                    "the client's error does not name the store {named}: {}",
                    text.lines().last().unwrap_or("")
                ));
            }
        }
    }
    if let Some(Err(e)) = fresh_ok {
        out.problems.push(e);
    }
}

/// A fresh client straight to the server: served within [`SERVED`].
fn fresh_client(
    command: &dyn Fn(&[&str]) -> Command,
    port: u16,
    procs: &mut Vec<Rank>,
) -> Result<(), String> {
    let addr = format!("127.0.0.1:{port}");
    let ms = SERVED.as_millis().to_string();
    let c = job::spawn(&mut command(&[
        "--addr",
        &addr,
        "--timeout-ms",
        &ms,
        "set",
        "k2",
        "v",
    ]))
    .map_err(|e| format!("cannot start a fresh client: {e}"))?;
    procs.push(c);
    let i = procs.len() - 1;
    let t0 = Instant::now();
    if !job::wait(procs, &[i], t0 + SERVED + MARGIN) {
        return Err("a fresh client was not served beside the broken handshake".into());
    }
    match procs[i].exit {
        Some(Some(0)) => Ok(()),
        e => Err(format!(
            "a fresh client failed beside the broken handshake ({e:?}): {}",
            procs[i].output()
        )),
    }
}

/// A TCP proxy in front of the server for one connection, faulting before chunk `at`.
struct Proxy {
    port: u16,
    fault: Arc<Mutex<Option<Instant>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(server: u16, server_pid: i32, action: Action, at: usize) -> std::io::Result<Proxy> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        let port = l.local_addr()?.port();
        let fault = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let (f, d) = (fault.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            let chunks = Arc::new(AtomicUsize::new(0));
            let mut pumps = Vec::new();
            let mut held = Vec::new();
            let mut listener = Some(l);
            while !d.load(Ordering::SeqCst) {
                if f.lock().expect("fault").is_some() {
                    // After the fault: no new connections (a retry meets a closed port).
                    listener = None;
                }
                if let Some(l) = &listener {
                    if let Ok((c, _)) = l.accept() {
                        let Ok(s) = TcpStream::connect(("127.0.0.1", server)) else {
                            continue;
                        };
                        let _ = c.set_nonblocking(false);
                        for (from, to) in [(&c, &s), (&s, &c)] {
                            let (from, to) = (from.try_clone(), to.try_clone());
                            if let (Ok(from), Ok(to)) = (from, to) {
                                let p = Pump {
                                    chunks: chunks.clone(),
                                    fault: f.clone(),
                                    done: d.clone(),
                                    at,
                                    action,
                                    server_pid,
                                };
                                pumps.push(std::thread::spawn(move || p.run(from, to)));
                            }
                        }
                        held.push((c, s));
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            for (c, s) in &held {
                let _ = c.shutdown(Shutdown::Both);
                let _ = s.shutdown(Shutdown::Both);
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Ok(Proxy {
            port,
            fault,
            done,
            thread: Some(thread),
        })
    }

    fn fault_at(&self) -> Option<Instant> {
        *self.fault.lock().expect("fault")
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One direction of the proxied connection.
struct Pump {
    chunks: Arc<AtomicUsize>,
    fault: Arc<Mutex<Option<Instant>>>,
    done: Arc<AtomicBool>,
    at: usize,
    action: Action,
    server_pid: i32,
}

impl Pump {
    fn run(self, mut from: TcpStream, mut to: TcpStream) {
        let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
        let mut buf = vec![0u8; 64 << 10];
        let mut stalled = false;
        while !self.done.load(Ordering::SeqCst) {
            if stalled {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let n = match from.read(&mut buf) {
                Ok(0) => {
                    let _ = to.shutdown(Shutdown::Write);
                    return;
                }
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    stalled = self.stalled();
                    continue;
                }
                Err(_) => {
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            };
            if self.stalled() {
                stalled = true;
                continue;
            }
            let i = self.chunks.fetch_add(1, Ordering::SeqCst);
            if i == self.at {
                *self.fault.lock().expect("fault") = Some(Instant::now());
                match self.action {
                    Action::Kill => {
                        // SAFETY: kill(2) on the trial's own server process.
                        unsafe { libc::kill(self.server_pid, libc::SIGKILL) };
                    }
                    Action::Stop => {
                        // SAFETY: as above; it is killed (stopped or not) when the trial ends.
                        unsafe { libc::kill(self.server_pid, libc::SIGSTOP) };
                    }
                    Action::Cut => {
                        let _ = from.shutdown(Shutdown::Both);
                        let _ = to.shutdown(Shutdown::Both);
                        return;
                    }
                    Action::Stall => {
                        stalled = true;
                        continue;
                    }
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
        }
    }

    /// The connection is stalled (the fault, a stall, happened on either side).
    fn stalled(&self) -> bool {
        self.action == Action::Stall && self.fault.lock().expect("fault").is_some()
    }
}
