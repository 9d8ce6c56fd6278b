//! `c10drun`: the launcher of c10d-rs, doing `torchrun`'s job for any program (Rust or Python)
//! with torchrun's command line: replacing `torchrun` by `c10drun` just works.
//!
//! ```text
//! c10drun [--standalone] [--nproc-per-node N|cpu|gpu|auto] [--nnodes N] [--node-rank R]
//!         [--master-addr A] [--master-port P] [--rdzv-backend static|c10d] [--rdzv-endpoint H:P]
//!         [--rdzv-id ID] [--rdzv-conf K=V,...] [--max-restarts N] [-m | --no-python | --run-path]
//!         [--log-dir D] [-r SPEC] [-t SPEC] [--local-ranks-filter R,...] [--role NAME]
//!         PROGRAM [ARGS...]
//! ```
//!
//! What it does, mirroring `torchrun`:
//!
//! - **Program.** `PROGRAM` ending in `.py` runs as `python3 PROGRAM` (the `python3` on `PATH`),
//!   `-m` runs `python3 -m PROGRAM`, `--run-path` always prefixes `python3`, `--no-python` and any
//!   other name run the program as given.
//! - **Store.** One agent hosts a `TcpStore` server in this process: node 0 with the static
//!   rendezvous (`--master-addr`/`--master-port`, default port 29500; `0` = pick a free port,
//!   printed on stderr), the owner of `--rdzv-endpoint` with `c10d` (default port 29400; node
//!   ranks follow the order of arrival), 127.0.0.1 with a free port under `--standalone`. Workers
//!   use it instead of starting their own (`TORCHELASTIC_USE_AGENT_STORE=True`).
//! - **Environment.** Each worker gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//!   `GROUP_RANK` (= node rank), `GROUP_WORLD_SIZE`, `ROLE_RANK`, `ROLE_NAME` (`--role`),
//!   `ROLE_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_RUN_ID`,
//!   `TORCHELASTIC_RESTART_COUNT`, `TORCHELASTIC_MAX_RESTARTS`, `TORCHELASTIC_USE_AGENT_STORE=True`,
//!   `TORCHELASTIC_ERROR_FILE` (`<log dir>/<run id>_<n>/attempt_<k>/<local rank>/error.json`, the
//!   log dir being `--log-dir` or a temporary directory removed at exit); also
//!   `OMP_NUM_THREADS=1` (when unset and more than one worker, like torchrun) and
//!   `PYTHONUNBUFFERED=1` (when unset, so prefixed lines appear as they are printed).
//! - **Output.** Every line a worker writes to stdout/stderr is copied to the same stream of
//!   `c10drun`, prefixed with `[rank N]: ` (`--no-prefix` turns that off); `--redirects` sends
//!   streams to `stdout.log`/`stderr.log` next to the error file instead, `--tee` to both, and
//!   `--local-ranks-filter` limits what reaches the console.
//! - **Failures.** When a worker exits non-zero or is killed by a signal, the others are stopped
//!   (SIGTERM to each worker's process group, SIGKILL after `--stop-timeout` seconds) and, unless
//!   `--max-restarts` allows another attempt (the whole group restarts, on every node),
//!   `c10drun` exits with status 1 after printing a summary on stderr that names the failed rank,
//!   its `exit code C` or `signal NAME`, and its own error: the traceback torch's `@record` wrote
//!   to the error file, or else the last lines of its stderr (a Rust panic message).
//! - **Signals.** SIGINT, SIGTERM and SIGHUP sent to `c10drun` are forwarded to the workers; it
//!   then exits with 128 + the signal number. Workers get SIGKILL if `c10drun` itself dies.
//! - **Several nodes.** Run one `c10drun` per node with the same `--nnodes`, store address and
//!   run id. The agents meet in the store before each attempt and again after their workers
//!   finished (so the hosting node keeps serving the store until every node is done); a failure
//!   on one node is published in the store and stops (or restarts) the workers on the others.
//! - **An unreachable store.** Every store operation of an agent is bounded (`--rdzv-conf
//!   read_timeout=S`, default 10 s) and the agent checks the store every second while its
//!   workers run: when the store stops answering (its node died or the network is cut), the
//!   workers are stopped and c10drun exits with a summary naming the unreachable store.
//!
//! Differences from torchrun: `--nnodes MIN:MAX` needs MIN = MAX (no elastic membership
//! changes); `--rdzv-backend` etcd is not available; `--start-method` has no effect; torchrun's
//! `--logs-specs`, `--local-addr`, `--numa-binding`, `--signals-to-handle`, `--shutdown-timeout`,
//! `--virtual-local-rank`, `--log-line-prefix-template` and `--duplicate-std*-filters` are
//! refused with a message.

#[path = "c10drun/agent.rs"]
mod agent;
#[path = "c10drun/cli.rs"]
mod cli;
#[path = "c10drun/output.rs"]
mod output;
#[path = "c10drun/report.rs"]
mod report;

use agent::{AgentKeys, AgentStore, Remote, StoreFail};
use c10d_store::tcp::{ServerOptions, TcpStoreServer};
use c10d_store::Store;
use clap::Parser;
use cli::{Args, Config, HostMode};
use output::{pump, Sink};
use report::{describe_status, signal_name, worker_error_lines, Tail};
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The signal received by c10drun (0 = none), set by the handler.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `sigaction` with a zeroed struct, an empty mask and a handler that only performs
        // an atomic store (async-signal-safe). SA_RESTART keeps blocking reads in other threads
        // from failing with EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn say(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "c10drun: {msg}");
}

/// One local worker process.
struct Worker {
    rank: usize,
    local_rank: usize,
    pid: i32,
    status: Option<ExitStatus>,
    ended_at: Option<Instant>,
    /// The signals c10drun sent to it.
    sent: Vec<i32>,
    error_file: PathBuf,
    tail: Tail,
}

impl Worker {
    /// Ended by a signal that c10drun itself sent (a casualty, not a failure).
    fn stopped_by_us(&self) -> bool {
        matches!(self.status.and_then(|s| s.signal()), Some(sig) if self.sent.contains(&sig))
    }
    /// Ended unsuccessfully on its own.
    fn failed(&self) -> bool {
        matches!(self.status, Some(s) if !s.success()) && !self.stopped_by_us()
    }

    fn signal(&mut self, sig: i32) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: plain syscall. Each worker leads its own process group (pgid = pid) so the
        // signal also reaches the processes it started; the group exists until we reap the
        // leader, which happens only after `status` is set (checked above).
        unsafe {
            libc::kill(-self.pid, sig);
        }
        self.sent.push(sig);
    }
}

/// Why the launcher stopped the workers.
enum StopReason {
    /// A local worker failed (index into `workers`).
    LocalFailure(usize),
    /// Another node reported a failure (its message).
    RemoteFailure(String),
    /// c10drun received a signal.
    Signal(i32),
    /// The store stopped answering (why).
    StoreLost(String),
}

/// Where this node stands in the job.
struct Ctx<'a> {
    cfg: &'a Config,
    node_rank: usize,
    master_addr: String,
    port: u16,
    keys: AgentKeys,
}

/// Tells the other nodes' agents why this node is stopping (bounded; single-node runs have no
/// store client). Returns a note when the store could not be told.
fn publish_failure(
    store: &mut Option<AgentStore>,
    keys: &AgentKeys,
    attempt: u32,
    msg: &str,
) -> Option<String> {
    let s = store.as_mut()?;
    let (key, msg) = (keys.failed(attempt), msg.to_string());
    match s.bounded("publishing the failure", Duration::ZERO, move |st| {
        st.set(&key, msg.as_bytes())
    }) {
        Ok(()) => None,
        Err(e) => Some(agent::fail_text(&e)),
    }
}

fn main() {
    let args = Args::parse();
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(msg) => {
            say(&format!("error: {msg}"));
            std::process::exit(1);
        }
    };
    std::process::exit(match run(&cfg) {
        Ok(code) => code,
        Err(msg) => {
            say(&format!("error: {msg}"));
            1
        }
    });
}

/// True when `host` names an address of this machine.
fn is_local(host: &str) -> bool {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .map(|mut addrs| addrs.any(|a| std::net::TcpListener::bind((a.ip(), 0)).is_ok()))
        .unwrap_or(false)
}

/// Where the worker logs and error files go: `--log-dir` (kept) or a temporary directory.
struct LogDir {
    job: PathBuf,
    temporary: bool,
}

impl LogDir {
    fn new(cfg: &Config) -> Result<LogDir, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let (base, temporary) = match &cfg.log_dir {
            Some(d) => (d.clone(), false),
            None => (std::env::temp_dir(), true),
        };
        let name = if temporary {
            format!("c10drun-{}-{}-{nanos:08x}", cfg.run_id, std::process::id())
        } else {
            format!("{}_{}_{nanos:08x}", cfg.run_id, std::process::id())
        };
        let job = base.join(name);
        std::fs::create_dir_all(&job)
            .map_err(|e| format!("cannot create the log directory {}: {e}", job.display()))?;
        Ok(LogDir { job, temporary })
    }
    fn worker(&self, attempt: u32, local_rank: usize) -> Result<PathBuf, String> {
        let d = self
            .job
            .join(format!("attempt_{attempt}"))
            .join(local_rank.to_string());
        std::fs::create_dir_all(&d)
            .map_err(|e| format!("cannot create the log directory {}: {e}", d.display()))?;
        Ok(d)
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.job);
        }
    }
}

fn run(cfg: &Config) -> Result<i32, String> {
    install_signal_handlers();

    // 1. The store: hosted by one agent, reached as a client from every agent.
    let host_it = match cfg.host_mode {
        HostMode::Yes => true,
        HostMode::No => false,
        HostMode::Try => is_local(&cfg.store_host),
    };
    let bind = || {
        TcpStoreServer::bind(ServerOptions {
            host: None,
            port: cfg.store_port,
            world_size: None,
            ..Default::default()
        })
    };
    let server = if host_it {
        match bind() {
            Ok(s) => Some(s),
            // c10d: another agent on this machine got the port first; use its store.
            Err(_) if cfg.host_mode == HostMode::Try => None,
            Err(e) => {
                return Err(format!(
                    "cannot host the store on port {}: {e}",
                    cfg.store_port
                ))
            }
        }
    } else {
        None
    };
    let port = server.as_ref().map(|s| s.port()).unwrap_or(cfg.store_port);
    if server.is_some() && (cfg.store_port == 0 || cfg.nnodes > 1) {
        say(&format!(
            "store listening on {}:{port} (run id {})",
            cfg.store_host, cfg.run_id
        ));
    }
    let logs = LogDir::new(cfg)?;
    let keys = AgentKeys::new(&cfg.run_id);
    let mut store: Option<AgentStore> = if cfg.nnodes > 1 {
        let host = if server.is_some() {
            "127.0.0.1"
        } else {
            cfg.store_host.as_str()
        };
        Some(AgentStore::connect(
            host,
            port,
            cfg.rdzv_timeout,
            cfg.store_deadline,
        )?)
    } else {
        None
    };
    let hosting = server.is_some();

    let mut node_rank = cfg.node_rank;
    let mut attempt: u32 = 0;
    loop {
        // 2. Rendezvous: every node's agent joined this attempt before any worker starts.
        if let Some(s) = store.as_mut() {
            let idx =
                agent::rendezvous(s, &keys, attempt, cfg.nnodes, &cfg.run_id, cfg.rdzv_timeout)?;
            if node_rank.is_none() {
                node_rank = Some(idx);
            }
        }
        let ctx = Ctx {
            cfg,
            node_rank: node_rank.unwrap_or(0),
            master_addr: cfg.store_host.clone(),
            port,
            keys: AgentKeys::new(&cfg.run_id),
        };
        let (stop, workers, elapsed) = run_attempt(&ctx, attempt, &mut store, &logs)?;
        let Some(reason) = stop else {
            if let Some(s) = store.as_mut() {
                // Exit barrier: the hosting node keeps the store up until every node is done.
                if let Err(msg) = exit_barrier(s, &keys, cfg.nnodes, cfg.rdzv_timeout) {
                    say(&format!("exit barrier: {msg}"));
                }
            }
            drop(server);
            return Ok(0);
        };
        let restart = matches!(
            reason,
            StopReason::LocalFailure(_) | StopReason::RemoteFailure(_)
        ) && attempt < cfg.max_restarts;
        if restart {
            print_summary(
                &ctx,
                &workers,
                &reason,
                elapsed,
                &format!(
                    "worker group failed (attempt {} of {}); restarting it",
                    attempt + 1,
                    cfg.max_restarts + 1
                ),
                &[],
            );
            attempt += 1;
            continue;
        }
        let mut notes = Vec::new();
        if let StopReason::StoreLost(_) = reason {
        } else if let Some(s) = store.as_mut() {
            if !hosting {
                let done = keys.done();
                if let Err(e) = s.bounded("the exit barrier", Duration::ZERO, move |st| {
                    st.add(&done, 1)
                }) {
                    notes.push(format!(
                        "{}; not waiting for the other nodes",
                        agent::fail_text(&e)
                    ));
                }
            }
        }
        if let Some(why) = store.as_ref().and_then(|s| s.lost.clone()) {
            if notes.is_empty() && !matches!(reason, StopReason::StoreLost(_)) {
                notes.push(why);
            }
        }
        print_summary(&ctx, &workers, &reason, elapsed, "job failed", &notes);
        if hosting {
            if let Some(s) = store.as_mut() {
                // Give the other agents a moment to read the failure before the store goes away.
                let grace = cfg.stop_timeout + Duration::from_secs(5);
                if let Err(msg) = exit_barrier(s, &keys, cfg.nnodes, grace) {
                    say(&format!("exit barrier: {msg}"));
                }
            }
        }
        drop(server);
        return Ok(match reason {
            StopReason::Signal(sig) => 128 + sig,
            _ => 1,
        });
    }
}

/// One attempt: starts the local workers and supervises them until all ended. Returns why they
/// were stopped (`None`: all succeeded), the workers, and the seconds they ran.
fn run_attempt(
    ctx: &Ctx,
    attempt: u32,
    store: &mut Option<AgentStore>,
    logs: &LogDir,
) -> Result<(Option<StopReason>, Vec<Worker>, f64), String> {
    let cfg = ctx.cfg;
    let world_size = cfg.nnodes * cfg.nproc;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut workers: Vec<Worker> = Vec::new();
    let (exit_tx, exit_rx) = mpsc::channel::<(usize, std::io::Result<ExitStatus>)>();
    let mut pumps = 0usize;
    let started_at = Instant::now();
    for local_rank in 0..cfg.nproc {
        let rank = ctx.node_rank * cfg.nproc + local_rank;
        let dir = logs.worker(attempt, local_rank)?;
        let error_file = dir.join("error.json");
        let mut cmd = Command::new(&cfg.argv[0]);
        cmd.args(&cfg.argv[1..])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_WORLD_SIZE", cfg.nproc.to_string())
            .env("GROUP_RANK", ctx.node_rank.to_string())
            .env("GROUP_WORLD_SIZE", cfg.nnodes.to_string())
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_NAME", &cfg.role)
            .env("ROLE_WORLD_SIZE", world_size.to_string())
            .env("MASTER_ADDR", &ctx.master_addr)
            .env("MASTER_PORT", ctx.port.to_string())
            .env("TORCHELASTIC_RUN_ID", &cfg.run_id)
            .env("TORCHELASTIC_RESTART_COUNT", attempt.to_string())
            .env("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts.to_string())
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("TORCHELASTIC_ERROR_FILE", &error_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if std::env::var_os("OMP_NUM_THREADS").is_none() && cfg.nproc > 1 {
            cmd.env("OMP_NUM_THREADS", "1");
        }
        if std::env::var_os("PYTHONUNBUFFERED").is_none() {
            cmd.env("PYTHONUNBUFFERED", "1");
        }
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe `prctl` syscall: the worker gets SIGKILL when the launcher thread
        // that forked it (our main thread, alive until we exit) dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                say(&format!("cannot start rank {rank} ({}): {e}", cfg.argv[0]));
                for w in workers.iter_mut() {
                    w.signal(libc::SIGKILL);
                }
                for _ in 0..workers.len() {
                    let _ = exit_rx.recv_timeout(Duration::from_secs(10));
                }
                publish_failure(
                    store,
                    &ctx.keys,
                    attempt,
                    &format!("rank {rank} on node {} could not start: {e}", ctx.node_rank),
                );
                return Err(format!(
                    "worker group of node {} not started",
                    ctx.node_rank
                ));
            }
        };
        let prefix = if cfg.no_prefix {
            None
        } else {
            Some(format!("[rank {rank}]: "))
        };
        let tail = Tail::default();
        let (out_mode, err_mode) = cfg.streams[local_rank];
        let open = |name: &str, on: bool| -> Result<Option<std::fs::File>, String> {
            if !on {
                return Ok(None);
            }
            let p = dir.join(name);
            std::fs::File::create(&p)
                .map(Some)
                .map_err(|e| format!("cannot create {}: {e}", p.display()))
        };
        let sinks = [
            Sink {
                prefix: prefix.clone(),
                to_stderr: false,
                console: out_mode.console,
                file: open("stdout.log", out_mode.file)?,
                tail: None,
            },
            Sink {
                prefix,
                to_stderr: true,
                console: err_mode.console,
                file: open("stderr.log", err_mode.file)?,
                tail: Some(tail.clone()),
            },
        ];
        let streams = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for (stream, sink) in streams.into_iter().zip(sinks) {
            if let Some(s) = stream {
                let tx = done_tx.clone();
                std::thread::spawn(move || {
                    pump(s, sink);
                    let _ = tx.send(());
                });
                pumps += 1;
            }
        }
        let pid = child.id() as i32;
        // A waiter thread per worker reaps it the moment it ends, so exit order (and so the root
        // cause) is observed exactly, not at the next poll.
        let tx = exit_tx.clone();
        let index = workers.len();
        std::thread::spawn(move || {
            let st = child.wait();
            let _ = tx.send((index, st));
        });
        workers.push(Worker {
            rank,
            local_rank,
            pid,
            status: None,
            ended_at: None,
            sent: Vec::new(),
            error_file,
            tail,
        });
    }
    drop(done_tx);

    // A watcher for failures published by other nodes, and for the store going silent.
    let (remote_tx, remote_rx) = mpsc::channel::<Remote>();
    let watcher_stop = Arc::new(AtomicBool::new(false));
    if let Some(s) = store.as_ref() {
        // Its own connection: a client handle serves one request at a time, and this one blocks.
        match s.clone_conn() {
            Ok(conn) => agent::watch(
                conn,
                ctx.keys.failed(attempt),
                s.addr.clone(),
                cfg.monitor_interval.max(Duration::from_secs(1)),
                s.deadline,
                watcher_stop.clone(),
                remote_tx,
            ),
            Err(e) => {
                let _ = remote_tx.send(Remote::Lost(format!(
                    "the store at {} is unreachable ({e})",
                    s.addr
                )));
            }
        }
    }

    // 3. Supervise.
    let grace = cfg.stop_timeout;
    let mut stop: Option<(StopReason, Instant)> = None;
    let mut killed = false;
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            say(&format!(
                "received {}, forwarding it to the workers",
                signal_name(sig)
            ));
            for w in workers.iter_mut() {
                w.signal(sig);
            }
            if stop.is_none() {
                publish_failure(
                    store,
                    &ctx.keys,
                    attempt,
                    &format!(
                        "c10drun on node {} received {}",
                        ctx.node_rank,
                        signal_name(sig)
                    ),
                );
                stop = Some((StopReason::Signal(sig), Instant::now()));
            }
        }
        if stop.is_none() {
            match remote_rx.try_recv() {
                Ok(Remote::Failure(msg)) => {
                    say(&format!(
                        "another node failed ({msg}); stopping the workers of node {}",
                        ctx.node_rank
                    ));
                    for w in workers.iter_mut() {
                        w.signal(libc::SIGTERM);
                    }
                    stop = Some((StopReason::RemoteFailure(msg), Instant::now()));
                }
                Ok(Remote::Lost(msg)) => {
                    say(&format!(
                        "{msg}; stopping the workers of node {}",
                        ctx.node_rank
                    ));
                    if let Some(s) = store.as_mut() {
                        s.lost = Some(msg.clone());
                    }
                    for w in workers.iter_mut() {
                        w.signal(libc::SIGTERM);
                    }
                    stop = Some((StopReason::StoreLost(msg), Instant::now()));
                }
                Err(_) => {}
            }
        }
        // Wait (briefly) for the next worker to end, then take every exit already reported.
        let mut exits = Vec::new();
        match exit_rx.recv_timeout(Duration::from_millis(20)) {
            Ok(e) => {
                exits.push(e);
                exits.extend(exit_rx.try_iter());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err("lost track of the workers".into())
            }
        }
        for (i, st) in exits {
            let st = st.map_err(|e| format!("waiting for rank {}: {e}", workers[i].rank))?;
            workers[i].status = Some(st);
            workers[i].ended_at = Some(Instant::now());
            if !st.success() && stop.is_none() {
                let w = &workers[i];
                say(&format!(
                    "rank {} (local_rank {}, pid {}) failed with {}; stopping the other workers",
                    w.rank,
                    w.local_rank,
                    w.pid,
                    describe_status(&st)
                ));
                let msg = format!(
                    "rank {} on node {}: {}",
                    w.rank,
                    ctx.node_rank,
                    describe_status(&st)
                );
                publish_failure(store, &ctx.keys, attempt, &msg);
                for w in workers.iter_mut() {
                    w.signal(libc::SIGTERM);
                }
                stop = Some((StopReason::LocalFailure(i), Instant::now()));
            }
        }
        if workers.iter().all(|w| w.status.is_some()) {
            break;
        }
        if let Some((_, since)) = &stop {
            if !killed && since.elapsed() >= grace {
                let left: Vec<String> = workers
                    .iter()
                    .filter(|w| w.status.is_none())
                    .map(|w| w.rank.to_string())
                    .collect();
                say(&format!(
                    "ranks [{}] still running {:.1} s after SIGTERM; sending SIGKILL",
                    left.join(", "),
                    grace.as_secs_f64()
                ));
                for w in workers.iter_mut() {
                    w.signal(libc::SIGKILL);
                }
                killed = true;
            }
        }
    }
    watcher_stop.store(true, Ordering::SeqCst);

    // Let the output pumps drain (a grandchild holding a pipe open must not keep us here).
    let drain_deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    let elapsed = started_at.elapsed().as_secs_f64();
    Ok((stop.map(|(r, _)| r), workers, elapsed))
}

/// Marks this node done and waits (bounded by `timeout`, each store operation by the store
/// deadline) until all nodes are; the last one marks the run finished.
fn exit_barrier(
    s: &mut AgentStore,
    keys: &AgentKeys,
    nnodes: usize,
    timeout: Duration,
) -> Result<(), String> {
    let done = keys.done();
    let n = s
        .bounded("the exit barrier", Duration::ZERO, move |st| {
            st.add(&done, 1)
        })
        .map_err(|e| agent::fail_text(&e))?;
    let finished = keys.finished();
    if n as usize >= nnodes {
        return s
            .bounded("the exit barrier", Duration::ZERO, move |st| {
                st.set(&finished, b"1")
            })
            .map_err(|e| agent::fail_text(&e));
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "not every node finished within {:.0} s",
                timeout.as_secs_f64()
            ));
        }
        let slice = left.min(Duration::from_secs(1));
        let f = finished.clone();
        match s.bounded("the exit barrier", slice, move |st| {
            st.wait_timeout(&[f.as_str()], slice)
        }) {
            Ok(()) => return Ok(()),
            Err(StoreFail::Op(_)) => continue,
            Err(e) => return Err(agent::fail_text(&e)),
        }
    }
}

fn print_summary(
    ctx: &Ctx,
    workers: &[Worker],
    reason: &StopReason,
    elapsed: f64,
    heading: &str,
    notes: &[String],
) {
    let mut lines = Vec::new();
    lines.push("=".repeat(72));
    lines.push(format!(
        "{heading}: {} (run id {}, node {}, {:.2} s)",
        ctx.cfg.display, ctx.cfg.run_id, ctx.node_rank, elapsed
    ));
    let fmt_worker = |w: &Worker| {
        let st = w
            .status
            .as_ref()
            .map(describe_status)
            .unwrap_or_else(|| "still running".into());
        format!(
            "rank {} (local_rank {}, pid {}): {}",
            w.rank, w.local_rank, w.pid, st
        )
    };
    // Root cause: when a rank dies, its peers fail a moment later with "connection lost" errors,
    // and their exit may even be observed first. Among the failures seen within ROOT_WINDOW of
    // the first one, a death by a signal (crash, OOM kill, kill -9) is the cause rather than an
    // error exit; otherwise the earliest failure is.
    const ROOT_WINDOW: Duration = Duration::from_millis(1000);
    let root = match reason {
        StopReason::LocalFailure(first) => {
            let t0 = workers[*first].ended_at.unwrap_or_else(Instant::now);
            workers
                .iter()
                .enumerate()
                .filter(|(_, w)| w.failed() && w.ended_at.is_some_and(|t| t <= t0 + ROOT_WINDOW))
                .min_by_key(|(_, w)| (w.status.and_then(|s| s.signal()).is_none(), w.ended_at))
                .map(|(i, _)| i)
                .or(Some(*first))
        }
        _ => None,
    };
    match (reason, root) {
        (StopReason::LocalFailure(_), Some(i)) => {
            lines.push("root cause (first observed failure):".into());
            lines.push(format!("  {}", fmt_worker(&workers[i])));
            lines.extend(worker_error_lines(&workers[i].error_file, &workers[i].tail));
        }
        (StopReason::RemoteFailure(msg), _) => {
            lines.push(format!("root cause: another node failed: {msg}"))
        }
        (StopReason::Signal(sig), _) => lines.push(format!(
            "root cause: c10drun received {}",
            signal_name(*sig)
        )),
        (StopReason::StoreLost(msg), _) => lines.push(format!("root cause: {msg}")),
        _ => {}
    }
    let mut others = Vec::new();
    let mut stopped = Vec::new();
    let mut ok = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        if Some(i) == root || w.status.is_none() {
            continue;
        }
        if w.status.is_some_and(|s| s.success()) {
            ok.push(w.rank.to_string());
        } else if w.stopped_by_us() {
            stopped.push(format!("  {} (stopped by c10drun)", fmt_worker(w)));
        } else {
            others.push(format!("  {}", fmt_worker(w)));
            others.extend(worker_error_lines(&w.error_file, &w.tail));
        }
    }
    if !others.is_empty() {
        lines.push("other failures:".into());
        lines.extend(others);
    }
    if !stopped.is_empty() {
        lines.push("stopped:".into());
        lines.extend(stopped);
    }
    if !ok.is_empty() {
        lines.push(format!("finished successfully: ranks [{}]", ok.join(", ")));
    }
    for n in notes {
        lines.push(format!("store: {n}"));
    }
    lines.push("=".repeat(72));
    let mut e = std::io::stderr().lock();
    for l in lines {
        let _ = writeln!(e, "c10drun: {l}");
    }
}
