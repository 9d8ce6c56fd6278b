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
//! - **Command line.** torchrun's options with dashes or underscores, unambiguous
//!   abbreviations (`--nnode`), and each option also from `PET_<NAME>` (`PET_NNODES`,
//!   `PET_STANDALONE=1`, …), as torchrun's argument parser reads them.
//! - **Program.** `PROGRAM` ending in `.py` runs as `python3 PROGRAM` (the `python3` on `PATH`),
//!   `-m` runs `python3 -m PROGRAM`, `--run-path` always prefixes `python3`, `--no-python` and any
//!   other name run the program as given.
//! - **Store.** One agent hosts a `TcpStore` server in this process: node 0 with the static
//!   rendezvous (`--master-addr`/`--master-port`, default port 29500; `0` = pick a free port,
//!   printed on stderr), the owner of `--rdzv-endpoint` with `c10d` (default port 29400; node
//!   ranks follow the order of arrival), 127.0.0.1 with a free port under `--standalone`. Workers
//!   use it instead of starting their own (`TORCHELASTIC_USE_AGENT_STORE=True`): the first
//!   attempt's workers that store, each restart's an empty one of their own, hosted by the same
//!   agent on a free port (`MASTER_PORT` changes), as torchrun's "new TCPStore for every retry"
//!   promises PyTorch's env:// (see `worker_store`).
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
//! - **Signals.** The signals of `--signals-to-handle` (torchrun's default SIGTERM, SIGINT,
//!   SIGHUP, SIGQUIT) sent to `c10drun` are forwarded to the workers and stop the job, as in
//!   torchrun; it then exits with 128 + the signal number. Workers get SIGKILL if `c10drun`
//!   itself dies.
//! - **Several nodes.** Run one `c10drun` per node with the same `--nnodes`, store address and
//!   run id. The agents meet in the store before each attempt and again after their workers
//!   finished (so the hosting node keeps serving the store until every node is done); a failure
//!   on one node is published in the store and stops (or restarts) the workers on the others.
//! - **Elastic node counts.** `--nnodes MIN:MAX` with `--rdzv-backend c10d`: the workers start
//!   once MIN nodes joined (after `last_call_timeout`, or at once with MAX); a node that joins
//!   later, or one whose launcher's keep-alive stops (`keep_alive_interval` ×
//!   `keep_alive_max_attempt`), makes every node stop its workers and meet in a new round, with
//!   the new `WORLD_SIZE`, `RANK`s and `GROUP_RANK`s, not counted against `--max-restarts`
//!   (see `elastic`).
//! - **An unreachable store.** Every store operation of an agent is bounded (`--rdzv-conf
//!   read_timeout=S`, default 10 s) and the agent checks the store every second while its
//!   workers run: when the store stops answering (its node died or the network is cut), the
//!   workers are stopped and c10drun exits with a summary naming the unreachable store.
//!
//! Differences from torchrun: the elastic rendezvous keeps its own state in the store (c10drun
//! and torchrun agents cannot share a job) and orders nodes by first arrival; `--rdzv-backend`
//! etcd is not available; `--start-method` has no effect; the default console prefix is
//! `[rank N]: ` (torchrun's `[<role><local rank>]:` with `--log-line-prefix-template
//! '[${role_name}${local_rank}]:'`); `--shutdown-timeout` defaults to `--stop-timeout`'s 10 s
//! (torchrun: 30 s); `--local-addr` only names the node in messages; `--event-log-handler`
//! takes only `null`; torchrun's `--logs-specs`, `--numa-binding` and `--print-completion` are
//! refused with a message.

#[path = "c10drun/agent.rs"]
mod agent;
#[path = "c10drun/attempt.rs"]
mod attempt;
#[path = "c10drun/cli.rs"]
mod cli;
#[path = "c10drun/elastic.rs"]
mod elastic;
#[path = "c10drun/elastic_job.rs"]
mod elastic_job;
#[path = "c10drun/output.rs"]
mod output;
#[path = "c10drun/report.rs"]
mod report;
#[path = "c10drun/summary.rs"]
mod summary;
#[path = "c10drun/worker_store.rs"]
mod worker_store;

use agent::{AgentKeys, AgentStore, StoreFail};
use attempt::run_attempt;
use c10d_store::tcp::{ServerOptions, TcpStoreServer};
use c10d_store::Store;
use clap::Parser;
use cli::{Args, Config, HostMode};
use elastic::Elastic;
use elastic_job::run_elastic;
use report::Tail;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};
use summary::print_summary;

/// The signal received by c10drun (0 = none), set by the handler.
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Handlers for the signals c10drun forwards to its workers (`--signals-to-handle`).
fn install_signal_handlers(signals: &[i32]) {
    for &sig in signals {
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
    /// Elastic: a node joined or was lost (why).
    Membership(String),
}

/// Where this node stands in the job.
struct Ctx<'a> {
    cfg: &'a Config,
    /// The attempt (elastic: the round) the workers run in.
    attempt: u32,
    /// Nodes in this attempt.
    nnodes: usize,
    /// Restarts after failures so far (`TORCHELASTIC_RESTART_COUNT`).
    restarts: u32,
    /// Elastic: what the watcher of the round watches.
    watch: Option<elastic::RoundWatch>,
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
    if let Some(path) = &args.auth_secret_file {
        // Checked here (readable, owner-only, long enough); then every store server and client
        // of this process and of its workers finds it in the environment.
        if let Err(e) = c10d_store::AuthSecret::from_file(path) {
            say(&format!("error: --auth-secret-file: {e}"));
            std::process::exit(1);
        }
        // Before any thread starts: nothing reads the environment concurrently.
        std::env::set_var(c10d_store::auth::SECRET_FILE_ENV, path);
    }
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

/// This machine's (short) host name, as Python's `socket.gethostname()`.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
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
    /// The directory of `attempt` (made).
    fn attempt(&self, attempt: u32) -> Result<PathBuf, String> {
        let d = self.job.join(format!("attempt_{attempt}"));
        std::fs::create_dir_all(&d)
            .map_err(|e| format!("cannot create the log directory {}: {e}", d.display()))?;
        Ok(d)
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
    install_signal_handlers(&cfg.signals);

    // 1. The store: hosted by one agent, reached as a client from every agent.
    let server = host_store(cfg)?;
    let port = server.as_ref().map(|s| s.port()).unwrap_or(cfg.store_port);
    if server.is_some() && (cfg.store_port == 0 || cfg.nnodes > 1) {
        say(&format!(
            "store listening on {}:{port} (run id {})",
            cfg.store_host, cfg.run_id
        ));
    }
    let logs = LogDir::new(cfg)?;
    let keys = AgentKeys::new(&cfg.run_id);
    let hosting = server.is_some();
    let mut store = connect_store(cfg, hosting, port)?;
    if let (Some(conf), Some(s)) = (cfg.elastic, store.as_mut()) {
        let el = Elastic::start(
            s,
            &keys,
            conf,
            (cfg.min_nodes, cfg.nnodes),
            cfg.rdzv_timeout,
            cfg.local_addr.as_deref(),
        )?;
        return run_elastic(cfg, &el, server, port, store, &logs);
    }

    let mut node_rank = cfg.node_rank;
    let mut attempt: u32 = 0;
    loop {
        // 2. A restart's workers get an empty store of their own (see `worker_store`).
        let fresh = worker_store::prepare(attempt, hosting, store.as_mut(), &keys)?;
        // 3. Rendezvous: every node's agent joined this attempt before any worker starts.
        if let Some(s) = store.as_mut() {
            let idx =
                agent::rendezvous(s, &keys, attempt, cfg.nnodes, &cfg.run_id, cfg.rdzv_timeout)?;
            if node_rank.is_none() {
                node_rank = Some(idx);
            }
        }
        let ctx = Ctx {
            cfg,
            attempt,
            nnodes: cfg.nnodes,
            restarts: attempt,
            watch: None,
            node_rank: node_rank.unwrap_or(0),
            master_addr: cfg.store_host.clone(),
            port: worker_store::port(attempt, fresh.as_ref(), port, &mut store, &keys)?,
            keys: AgentKeys::new(&cfg.run_id),
        };
        // 4. Start and supervise the workers.
        let (stop, workers, elapsed) = run_attempt(&ctx, attempt, &mut store, &logs)?;
        let Some(reason) = stop else {
            if let Some(s) = store.as_mut() {
                // Exit barrier: the hosting node keeps the store up until every node is done.
                if let Err(msg) = exit_barrier(s, &keys, attempt, cfg.nnodes, cfg.rdzv_timeout) {
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
        let code = finish_failed(&ctx, &mut store, hosting, &reason, &workers, elapsed);
        drop(server);
        return Ok(code);
    }
}

/// Hosts the store server when this agent is the one to (`None` otherwise, or when another agent
/// on this machine got the port first under `c10d`).
fn host_store(cfg: &Config) -> Result<Option<TcpStoreServer>, String> {
    let host_it = match cfg.host_mode {
        HostMode::Yes => true,
        HostMode::No => false,
        HostMode::Try => is_local(&cfg.store_host),
    };
    if !host_it && cfg.store_port == 0 {
        return Err(format!(
            "port 0 (pick a free port) needs the node that hosts the store, and {} is not an address of this machine",
            cfg.store_host
        ));
    }
    if !host_it {
        return Ok(None);
    }
    let bound = TcpStoreServer::bind(ServerOptions {
        host: None,
        port: cfg.store_port,
        world_size: None,
        ..Default::default()
    });
    match bound {
        Ok(s) => Ok(Some(s)),
        // c10d: another agent on this machine got the port first; use its store.
        Err(_) if cfg.host_mode == HostMode::Try => Ok(None),
        Err(e) => Err(format!(
            "cannot host the store on port {}: {e}",
            cfg.store_port
        )),
    }
}

/// The agent's store client (several nodes only): the local server when hosting, else the
/// store address.
fn connect_store(cfg: &Config, hosting: bool, port: u16) -> Result<Option<AgentStore>, String> {
    if cfg.nnodes <= 1 {
        return Ok(None);
    }
    let host = if hosting {
        "127.0.0.1"
    } else {
        cfg.store_host.as_str()
    };
    Ok(Some(AgentStore::connect(
        host,
        port,
        cfg.rdzv_timeout,
        cfg.store_deadline,
    )?))
}

/// The job failed for good: tells the other nodes this one is done, prints the summary, keeps a
/// hosted store up a moment for the other agents, and returns c10drun's exit status (128 +
/// signal after a signal, else 1).
fn finish_failed(
    ctx: &Ctx,
    store: &mut Option<AgentStore>,
    hosting: bool,
    reason: &StopReason,
    workers: &[Worker],
    elapsed: f64,
) -> i32 {
    let cfg = ctx.cfg;
    let mut notes = Vec::new();
    if let StopReason::StoreLost(_) = reason {
    } else if let Some(s) = store.as_mut() {
        if !hosting {
            let done = ctx.keys.done(ctx.attempt);
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
    print_summary(ctx, workers, reason, elapsed, "job failed", &notes);
    if hosting {
        if let Some(s) = store.as_mut() {
            // Give the other agents a moment to read the failure before the store goes away.
            let grace = cfg.stop_timeout + Duration::from_secs(5);
            if let Err(msg) = exit_barrier(s, &ctx.keys, ctx.attempt, ctx.nnodes, grace) {
                say(&format!("exit barrier: {msg}"));
            }
        }
    }
    match reason {
        StopReason::Signal(sig) => 128 + sig,
        _ => 1,
    }
}

/// Marks this node done and waits (bounded by `timeout`, each store operation by the store
/// deadline) until all nodes are; the last one marks the run finished.
fn exit_barrier(
    s: &mut AgentStore,
    keys: &AgentKeys,
    attempt: u32,
    nnodes: usize,
    timeout: Duration,
) -> Result<(), String> {
    let done = keys.done(attempt);
    let n = s
        .bounded("the exit barrier", Duration::ZERO, move |st| {
            st.add(&done, 1)
        })
        .map_err(|e| agent::fail_text(&e))?;
    let finished = keys.finished(attempt);
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
