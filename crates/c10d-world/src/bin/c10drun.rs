//! `c10drun`: the launcher of c10d-rs, doing `torchrun`'s job for any program (Rust or Python).
//!
//! ```text
//! c10drun [--nproc-per-node N] [--nnodes N] [--node-rank R] [--master-addr A] [--master-port P]
//!         [--run-id ID] PROGRAM [ARGS...]
//! ```
//!
//! What it does, mirroring `torchrun` with a static rendezvous:
//!
//! - **Store.** Node 0 hosts a `TcpStore` server in this process on `--master-port` (`0` = pick a
//!   free port; the chosen one is printed on stderr) and tells the workers to use it instead of
//!   starting their own (`TORCHELASTIC_USE_AGENT_STORE=True`, as torchrun's agent store).
//! - **Environment.** Each worker gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//!   `GROUP_RANK` (= node rank), `GROUP_WORLD_SIZE`, `ROLE_RANK`, `ROLE_NAME`, `ROLE_WORLD_SIZE`,
//!   `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT=0`,
//!   `TORCHELASTIC_MAX_RESTARTS=0`, `TORCHELASTIC_USE_AGENT_STORE=True`; also
//!   `OMP_NUM_THREADS=1` (when unset and more than one worker, like torchrun) and
//!   `PYTHONUNBUFFERED=1` (when unset, so prefixed lines appear as they are printed).
//! - **Output.** Every line a worker writes to stdout/stderr is copied to the same stream of
//!   `c10drun`, prefixed with `[rank N]: ` (`--no-prefix` turns that off).
//! - **Failures.** When a worker exits non-zero or is killed by a signal, the others are stopped
//!   (SIGTERM to each worker's process group, SIGKILL after `--stop-timeout` seconds) and
//!   `c10drun` exits with status 1 after printing a summary on stderr that names the failed rank
//!   and its `exit code C` or `signal NAME` (the first failure is the root cause).
//! - **Signals.** SIGINT, SIGTERM and SIGHUP sent to `c10drun` are forwarded to the workers; it
//!   then exits with 128 + the signal number. Workers get SIGKILL if `c10drun` itself dies.
//! - **Several nodes.** Run one `c10drun` per node with the same `--nnodes`, `--master-addr`,
//!   `--master-port` and `--run-id`. The agents meet in the store before starting workers and
//!   again after their workers finished (so node 0 keeps serving the store until every node is
//!   done); a failure on one node is published in the store and stops the workers on the others.
//!
//! Differences from torchrun: no elastic membership changes and no restarts (`--max-restarts 0`).

use c10d_store::tcp::{ServerOptions, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_store::Store;
use clap::Parser;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Command line of `c10drun` (torchrun's spellings with underscores are accepted as aliases).
#[derive(Parser, Debug)]
#[command(
    name = "c10drun",
    version,
    about = "Launch a distributed job (torchrun for c10d-rs and PyTorch programs)",
    after_help = "Example: c10drun --nproc-per-node 4 ./train --epochs 3\n         c10drun --nproc-per-node 2 python train.py"
)]
struct Args {
    /// Workers per node: a number, or `cpu`/`auto` for the number of CPU cores.
    #[arg(long = "nproc-per-node", alias = "nproc_per_node", default_value = "1", value_parser = parse_nproc)]
    nproc_per_node: usize,
    /// Number of nodes (one c10drun per node).
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// Rank of this node, 0..nnodes. Node 0 hosts the store.
    #[arg(long = "node-rank", alias = "node_rank", default_value_t = 0)]
    node_rank: usize,
    /// Address of node 0, where the store runs (given to workers as MASTER_ADDR).
    #[arg(
        long = "master-addr",
        alias = "master_addr",
        default_value = "127.0.0.1"
    )]
    master_addr: String,
    /// Port of the store on node 0 (MASTER_PORT); 0 picks a free port (node 0 only).
    #[arg(long = "master-port", alias = "master_port", default_value_t = 29500)]
    master_port: u16,
    /// Job id shared by all nodes (TORCHELASTIC_RUN_ID).
    #[arg(
        long = "run-id",
        alias = "rdzv-id",
        alias = "rdzv_id",
        default_value = "none"
    )]
    run_id: String,
    /// Seconds between SIGTERM and SIGKILL when stopping workers.
    #[arg(long = "stop-timeout", default_value_t = 10.0)]
    stop_timeout: f64,
    /// Seconds the nodes wait for each other (start and exit barriers, store connection).
    #[arg(long = "rdzv-timeout", alias = "rdzv_timeout", default_value_t = 900.0)]
    rdzv_timeout: f64,
    /// Do not prefix worker output lines with `[rank N]: `.
    #[arg(long = "no-prefix")]
    no_prefix: bool,
    /// The program to run in every worker, followed by its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    command: Vec<String>,
}

fn parse_nproc(s: &str) -> Result<usize, String> {
    match s {
        "cpu" | "auto" | "gpu" => Ok(std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)),
        _ => match s.parse::<usize>() {
            Ok(0) => Err("must be at least 1".into()),
            Ok(n) => Ok(n),
            Err(_) => Err(format!("expected a number, `cpu` or `auto`, got '{s}'")),
        },
    }
}

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

/// Name of a signal number ("SIGKILL"), or "signal N" style fallback.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

fn describe_status(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {}", signal_name(s)),
        _ => "unknown status".into(),
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

/// Copies a worker's stream to ours line by line with an optional prefix. Returns when the
/// stream closes.
fn pump(src: impl Read, prefix: Option<String>, to_stderr: bool) {
    let mut r = BufReader::with_capacity(64 * 1024, src);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                let mut buf = Vec::with_capacity(line.len() + 16);
                if let Some(p) = &prefix {
                    buf.extend_from_slice(p.as_bytes());
                }
                buf.extend_from_slice(&line);
                // Write errors (closed stdout) are ignored: the workers must keep running.
                if to_stderr {
                    let _ = std::io::stderr().lock().write_all(&buf);
                } else {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(&buf);
                    let _ = o.flush();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Why the launcher is stopping the workers.
enum StopReason {
    /// A local worker failed (index into `workers`).
    LocalFailure(usize),
    /// Another node reported a failure (its message).
    RemoteFailure(String),
    /// c10drun received a signal.
    Signal(i32),
}

/// Keys in the store used by the agents (never clash with PyTorch's keys).
struct AgentKeys {
    joined: String,
    started: String,
    failed: String,
    done: String,
    finished: String,
}

impl AgentKeys {
    fn new(run_id: &str) -> Self {
        let p = format!("c10drun/{run_id}");
        AgentKeys {
            joined: format!("{p}/joined"),
            started: format!("{p}/started"),
            failed: format!("{p}/failed"),
            done: format!("{p}/done"),
            finished: format!("{p}/finished"),
        }
    }
}

/// Tells the other nodes' agents (best effort; single-node runs have no store client) why this
/// node is stopping.
fn publish_failure(store: Option<&TcpStore>, keys: &AgentKeys, msg: &str) {
    if let Some(s) = store {
        let _ = s.set(&keys.failed, msg.as_bytes());
    }
}

fn main() {
    let args = Args::parse();
    std::process::exit(match run(args) {
        Ok(code) => code,
        Err(msg) => {
            say(&format!("error: {msg}"));
            1
        }
    });
}

fn run(args: Args) -> Result<i32, String> {
    if args.nnodes == 0 {
        return Err("--nnodes must be at least 1".into());
    }
    if args.node_rank >= args.nnodes {
        return Err(format!(
            "--node-rank {} is out of range for --nnodes {}",
            args.node_rank, args.nnodes
        ));
    }
    if args.master_port == 0 && args.node_rank != 0 {
        return Err("--master-port 0 (pick a free port) only works on node 0; give the other nodes the port node 0 printed".into());
    }
    if !(args.stop_timeout >= 0.0 && args.rdzv_timeout > 0.0) {
        return Err("--stop-timeout and --rdzv-timeout must be positive".into());
    }
    install_signal_handlers();
    let rdzv_timeout = Duration::from_secs_f64(args.rdzv_timeout);

    // 1. The store: hosted on node 0, reached as a client from every agent.
    let server = if args.node_rank == 0 {
        let srv = TcpStoreServer::bind(ServerOptions {
            host: None,
            port: args.master_port,
            world_size: None,
            ..Default::default()
        })
        .map_err(|e| format!("cannot host the store on port {}: {e}", args.master_port))?;
        Some(srv)
    } else {
        None
    };
    let port = server
        .as_ref()
        .map(|s| s.port())
        .unwrap_or(args.master_port);
    if args.master_port == 0 || args.nnodes > 1 {
        say(&format!(
            "store listening on {}:{port} (run id {})",
            args.master_addr, args.run_id
        ));
    }
    let keys = AgentKeys::new(&args.run_id);
    let store: Option<Arc<TcpStore>> = if args.nnodes > 1 {
        let host = if args.node_rank == 0 {
            "127.0.0.1".to_string()
        } else {
            args.master_addr.clone()
        };
        let s = TcpStore::new(
            &host,
            port,
            TcpStoreOptions {
                world_size: None,
                is_master: false,
                timeout: rdzv_timeout,
                wait_for_workers: false,
                ..Default::default()
            },
        )
        .map_err(|e| format!("cannot reach the store of node 0 at {host}:{port}: {e}"))?;
        let s = Arc::new(s);
        // Start barrier: all agents joined before any worker starts.
        let n = s.add(&keys.joined, 1).map_err(|e| format!("store: {e}"))?;
        if n as usize > args.nnodes {
            return Err(format!(
                "run id '{}' already has {} agents but --nnodes is {}; use a fresh --run-id",
                args.run_id,
                n - 1,
                args.nnodes
            ));
        }
        if n as usize == args.nnodes {
            s.set(&keys.started, b"1")
                .map_err(|e| format!("store: {e}"))?;
        }
        s.wait_timeout(&[keys.started.as_str()], rdzv_timeout)
            .map_err(|e| {
                format!(
                    "timed out waiting for {} nodes to join (--rdzv-timeout {} s): {e}",
                    args.nnodes, args.rdzv_timeout
                )
            })?;
        Some(s)
    } else {
        None
    };

    // 2. Start the workers.
    let world_size = args.nnodes * args.nproc_per_node;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut workers: Vec<Worker> = Vec::new();
    let (exit_tx, exit_rx) = mpsc::channel::<(usize, std::io::Result<ExitStatus>)>();
    let mut pumps = 0usize;
    let started_at = Instant::now();
    for local_rank in 0..args.nproc_per_node {
        let rank = args.node_rank * args.nproc_per_node + local_rank;
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local_rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_WORLD_SIZE", args.nproc_per_node.to_string())
            .env("GROUP_RANK", args.node_rank.to_string())
            .env("GROUP_WORLD_SIZE", args.nnodes.to_string())
            .env("ROLE_RANK", rank.to_string())
            .env("ROLE_NAME", "default")
            .env("ROLE_WORLD_SIZE", world_size.to_string())
            .env("MASTER_ADDR", &args.master_addr)
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_RUN_ID", &args.run_id)
            .env("TORCHELASTIC_RESTART_COUNT", "0")
            .env("TORCHELASTIC_MAX_RESTARTS", "0")
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if std::env::var_os("OMP_NUM_THREADS").is_none() && args.nproc_per_node > 1 {
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
                say(&format!(
                    "cannot start rank {rank} ({}): {e}",
                    args.command[0]
                ));
                for w in workers.iter_mut() {
                    w.signal(libc::SIGKILL);
                }
                for _ in 0..workers.len() {
                    let _ = exit_rx.recv_timeout(Duration::from_secs(10));
                }
                publish_failure(
                    store.as_deref(),
                    &keys,
                    &format!(
                        "rank {rank} on node {} could not start: {e}",
                        args.node_rank
                    ),
                );
                return Ok(1);
            }
        };
        let prefix = if args.no_prefix {
            None
        } else {
            Some(format!("[rank {rank}]: "))
        };
        for (stream, to_stderr) in [
            (
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn Read + Send>),
                false,
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn Read + Send>),
                true,
            ),
        ] {
            if let Some(s) = stream {
                let tx = done_tx.clone();
                let p = prefix.clone();
                std::thread::spawn(move || {
                    pump(s, p, to_stderr);
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
        });
    }
    drop(done_tx);

    // A watcher for failures published by other nodes.
    let (remote_tx, remote_rx) = mpsc::channel::<String>();
    if let Some(s) = &store {
        // Its own connection: a client handle serves one request at a time, and this one blocks.
        let s = s
            .clone_store()
            .map_err(|e| format!("cannot open a second store connection: {e}"))?;
        let key = keys.failed.clone();
        std::thread::spawn(move || loop {
            match s.wait_timeout(&[key.as_str()], Duration::from_secs(3600)) {
                Ok(()) => {
                    let msg = s
                        .get(&key)
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_else(|e| e.to_string());
                    let _ = remote_tx.send(msg);
                    return;
                }
                Err(e) if e.is_store_error() => continue,
                Err(_) => return, // store gone: the local workers decide the outcome.
            }
        });
    }

    // 3. Supervise.
    let grace = Duration::from_secs_f64(args.stop_timeout);
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
                    store.as_deref(),
                    &keys,
                    &format!(
                        "c10drun on node {} received {}",
                        args.node_rank,
                        signal_name(sig)
                    ),
                );
                stop = Some((StopReason::Signal(sig), Instant::now()));
            }
        }
        if stop.is_none() {
            if let Ok(msg) = remote_rx.try_recv() {
                say(&format!(
                    "another node failed ({msg}); stopping the workers of node {}",
                    args.node_rank
                ));
                for w in workers.iter_mut() {
                    w.signal(libc::SIGTERM);
                }
                stop = Some((StopReason::RemoteFailure(msg), Instant::now()));
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
                publish_failure(
                    store.as_deref(),
                    &keys,
                    &format!(
                        "rank {} on node {}: {}",
                        w.rank,
                        args.node_rank,
                        describe_status(&st)
                    ),
                );
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

    // Let the output pumps drain (a grandchild holding a pipe open must not keep us here).
    let drain_deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }

    let elapsed = started_at.elapsed().as_secs_f64();
    let code = match stop {
        None => {
            if let Some(s) = &store {
                // Exit barrier: node 0 keeps the store up until every node's workers are done.
                exit_barrier(s, &keys, args.nnodes, rdzv_timeout);
            }
            0
        }
        Some((reason, _)) => {
            print_summary(&args, &workers, &reason, elapsed);
            if let Some(s) = &store {
                if args.node_rank == 0 {
                    // Give the other agents a moment to read the failure before the store goes away.
                    exit_barrier(
                        s,
                        &keys,
                        args.nnodes,
                        Duration::from_secs_f64(grace.as_secs_f64() + 5.0),
                    );
                } else {
                    let _ = s.add(&keys.done, 1);
                }
            }
            match reason {
                StopReason::Signal(sig) => 128 + sig,
                _ => 1,
            }
        }
    };
    drop(server);
    Ok(code)
}

/// Waits until all agents reported done (bounded by `timeout`), then marks the run finished.
fn exit_barrier(s: &TcpStore, keys: &AgentKeys, nnodes: usize, timeout: Duration) {
    match s.add(&keys.done, 1) {
        Ok(n) if n as usize >= nnodes => {
            let _ = s.set(&keys.finished, b"1");
        }
        Ok(_) => {
            if let Err(e) = s.wait_timeout(&[keys.finished.as_str()], timeout) {
                if e.is_store_error() {
                    say(&format!(
                        "exit barrier: not every node finished within {:.0} s",
                        timeout.as_secs_f64()
                    ));
                }
            }
        }
        Err(_) => {}
    }
}

fn print_summary(args: &Args, workers: &[Worker], reason: &StopReason, elapsed: f64) {
    let mut lines = Vec::new();
    lines.push("=".repeat(72));
    lines.push(format!(
        "job failed: {} (run id {}, node {}, {:.2} s)",
        args.command.join(" "),
        args.run_id,
        args.node_rank,
        elapsed
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
        }
        (StopReason::RemoteFailure(msg), _) => {
            lines.push(format!("root cause: another node failed: {msg}"))
        }
        (StopReason::Signal(sig), _) => lines.push(format!(
            "root cause: c10drun received {}",
            signal_name(*sig)
        )),
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
    lines.push("=".repeat(72));
    let mut e = std::io::stderr().lock();
    for l in lines {
        let _ = writeln!(e, "c10drun: {l}");
    }
}
