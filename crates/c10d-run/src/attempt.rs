//! One attempt of the worker group: start the local workers (environment, output pumps, a reaper
//! thread each), watch the store for other nodes' failures, and supervise until every worker
//! ended (forwarding signals, stopping the group on the first failure, SIGKILL after the grace
//! period).

use crate::agent::{self, publish_failure, AgentKeys, AgentStore, Remote};
use crate::cli::Config;
use crate::die_with_parent;
use crate::elastic;
use crate::host::hostname;
use crate::log_dir::LogDir;
use crate::output::{pump, say, Duplicate, Sink};
use crate::report::{describe_status, signal_name, Tail};
use crate::signals::PENDING_SIGNAL;
use crate::worker::Worker;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why the launcher stopped the workers.
pub(crate) enum StopReason {
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
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a Config,
    /// The attempt (elastic: the round) the workers run in.
    pub(crate) attempt: u32,
    /// Nodes in this attempt.
    pub(crate) nnodes: usize,
    /// Restarts after failures so far (`TORCHELASTIC_RESTART_COUNT`).
    pub(crate) restarts: u32,
    /// Elastic: what the watcher of the round watches.
    pub(crate) watch: Option<elastic::RoundWatch>,
    pub(crate) node_rank: usize,
    pub(crate) master_addr: String,
    pub(crate) port: u16,
    pub(crate) keys: AgentKeys,
}

/// A worker's end as its reaper thread reports it: (index into the workers, wait's result).
type Exit = (usize, std::io::Result<ExitStatus>);

/// What an attempt ends with: why the workers were stopped (`None`: all succeeded), the workers,
/// and the seconds they ran.
pub(super) type Outcome = (Option<StopReason>, Vec<Worker>, f64);

/// One attempt: starts the local workers and supervises them until all ended.
pub(super) fn run_attempt(
    ctx: &Ctx,
    attempt: u32,
    store: &mut Option<AgentStore>,
    logs: &LogDir,
) -> Result<Outcome, String> {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (exit_tx, exit_rx) = mpsc::channel::<Exit>();
    let mut workers: Vec<Worker> = Vec::new();
    let mut pumps = 0usize;
    let duplicates = open_duplicates(ctx.cfg, &logs.attempt(attempt)?)?;
    let started_at = Instant::now();
    for local_rank in 0..ctx.cfg.nproc {
        let rank = ctx.node_rank * ctx.cfg.nproc + local_rank;
        let dir = logs.worker(attempt, local_rank)?;
        let error_file = dir.join("error.json");
        let mut child = match worker_command(ctx, rank, local_rank, &error_file).spawn() {
            Ok(c) => c,
            Err(e) => {
                return Err(abort_start(
                    ctx,
                    attempt,
                    store,
                    &mut workers,
                    &exit_rx,
                    rank,
                    &e,
                ))
            }
        };
        let tail = Tail::default();
        let out = Output {
            rank,
            local_rank,
            dir: &dir,
            tail: &tail,
            duplicates: &duplicates,
        };
        pumps += attach_output(ctx, out, &mut child, &done_tx)?;
        let worker = Worker {
            rank,
            local_rank,
            pid: child.id() as i32,
            status: None,
            ended_at: None,
            sent: Vec::new(),
            error_file,
            tail,
        };
        reap_in_background(child, workers.len(), &exit_tx);
        workers.push(worker);
    }
    drop(done_tx);
    let (remote_rx, watcher_stop) = start_watcher(ctx, attempt, store);
    let mut sup = Supervisor {
        ctx,
        attempt,
        store,
        workers,
        stop: None,
        killed: false,
    };
    sup.supervise(&exit_rx, &remote_rx)?;
    watcher_stop.store(true, Ordering::SeqCst);
    drain_pumps(&done_rx, pumps);
    let elapsed = started_at.elapsed().as_secs_f64();
    Ok((sup.stop.map(|(r, _)| r), sup.workers, elapsed))
}

/// The worker's command: torchrun's environment, piped output, its own process group, and
/// SIGKILL when the launcher dies.
fn worker_command(ctx: &Ctx, rank: usize, local_rank: usize, error_file: &Path) -> Command {
    let cfg = ctx.cfg;
    let world_size = ctx.nnodes * cfg.nproc;
    let mut cmd = Command::new(&cfg.argv[0]);
    cmd.args(&cfg.argv[1..])
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("LOCAL_WORLD_SIZE", cfg.nproc.to_string())
        .env("GROUP_RANK", ctx.node_rank.to_string())
        .env("GROUP_WORLD_SIZE", ctx.nnodes.to_string())
        .env("ROLE_RANK", rank.to_string())
        .env("ROLE_NAME", &cfg.role)
        .env("ROLE_WORLD_SIZE", world_size.to_string())
        .env("MASTER_ADDR", &ctx.master_addr)
        .env("MASTER_PORT", ctx.port.to_string())
        .env("TORCHELASTIC_RUN_ID", &cfg.run_id)
        .env("TORCHELASTIC_RESTART_COUNT", ctx.restarts.to_string())
        .env("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts.to_string())
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .env("TORCHELASTIC_ERROR_FILE", error_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if cfg.virtual_local_rank {
        // torchrun: LOCAL_RANK 0 and only this worker's GPU visible.
        let gpu = std::env::var("CUDA_VISIBLE_DEVICES")
            .ok()
            .and_then(|v| v.split(',').nth(local_rank).map(|g| g.trim().to_string()))
            .unwrap_or_else(|| local_rank.to_string());
        cmd.env("LOCAL_RANK", "0").env("CUDA_VISIBLE_DEVICES", gpu);
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() && cfg.nproc > 1 {
        cmd.env("OMP_NUM_THREADS", "1");
    }
    if std::env::var_os("PYTHONUNBUFFERED").is_none() {
        cmd.env("PYTHONUNBUFFERED", "1");
    }
    die_with_parent(&mut cmd);
    cmd
}

/// A worker could not start: kills the ones already started, tells the other nodes, and
/// returns the error.
fn abort_start(
    ctx: &Ctx,
    attempt: u32,
    store: &mut Option<AgentStore>,
    workers: &mut [Worker],
    exit_rx: &mpsc::Receiver<Exit>,
    rank: usize,
    e: &std::io::Error,
) -> String {
    say(&format!(
        "cannot start rank {rank} ({}): {e}",
        ctx.cfg.argv[0]
    ));
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
    format!("worker group of node {} not started", ctx.node_rank)
}

/// The attempt's `filtered_stdout.log` / `filtered_stderr.log` when filters were given.
fn open_duplicates(cfg: &Config, dir: &Path) -> Result<[Option<Duplicate>; 2], String> {
    let open = |filters: &Vec<String>, name: &str| -> Result<Option<Duplicate>, String> {
        if filters.is_empty() {
            return Ok(None);
        }
        let p = dir.join(name);
        let f =
            std::fs::File::create(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        Ok(Some(Duplicate {
            file: Arc::new(std::sync::Mutex::new(f)),
            filters: Arc::new(filters.clone()),
        }))
    };
    let [o, e] = &cfg.duplicate_filters;
    Ok([
        open(o, "filtered_stdout.log")?,
        open(e, "filtered_stderr.log")?,
    ])
}

/// One worker's output: who it is and where its streams go besides the console.
struct Output<'a> {
    rank: usize,
    local_rank: usize,
    dir: &'a Path,
    tail: &'a Tail,
    duplicates: &'a [Option<Duplicate>; 2],
}

/// The console prefix of a worker's lines: `[rank N]: `, or `--log-line-prefix-template` with
/// torchrun's macros substituted; none under `--no-prefix`.
fn line_prefix(ctx: &Ctx, rank: usize, local_rank: usize) -> Option<String> {
    let cfg = ctx.cfg;
    if cfg.no_prefix {
        return None;
    }
    let Some(t) = &cfg.prefix_template else {
        return Some(format!("[rank {rank}]: "));
    };
    let host = hostname().unwrap_or_default();
    let mut p = t.clone();
    for (k, v) in [
        ("role_name", cfg.role.clone()),
        ("local_rank", local_rank.to_string()),
        ("rank", rank.to_string()),
        ("hostname", host),
    ] {
        p = p
            .replace(&format!("${{{k}}}"), &v)
            .replace(&format!("${k}"), &v);
    }
    Some(p)
}

/// Copies the worker's stdout and stderr to their sinks (console with its prefix, log files,
/// the filtered copies, the stderr tail for the summary), a thread each; returns the number of
/// pumps.
fn attach_output(
    ctx: &Ctx,
    o: Output,
    child: &mut Child,
    done_tx: &mpsc::Sender<()>,
) -> Result<usize, String> {
    let cfg = ctx.cfg;
    let (local_rank, dir, tail) = (o.local_rank, o.dir, o.tail);
    let prefix = line_prefix(ctx, o.rank, local_rank);
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
            duplicate: o.duplicates[0].clone(),
        },
        Sink {
            prefix,
            to_stderr: true,
            console: err_mode.console,
            file: open("stderr.log", err_mode.file)?,
            tail: Some(tail.clone()),
            duplicate: o.duplicates[1].clone(),
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
    let mut pumps = 0;
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
    Ok(pumps)
}

/// A waiter thread per worker reaps it the moment it ends, so exit order (and so the root
/// cause) is observed exactly, not at the next poll.
fn reap_in_background(mut child: Child, index: usize, exit_tx: &mpsc::Sender<Exit>) {
    let tx = exit_tx.clone();
    std::thread::spawn(move || {
        let st = child.wait();
        let _ = tx.send((index, st));
    });
}

/// A watcher for failures published by other nodes, and for the store going silent; the flag
/// stops it.
fn start_watcher(
    ctx: &Ctx,
    attempt: u32,
    store: &Option<AgentStore>,
) -> (mpsc::Receiver<Remote>, Arc<AtomicBool>) {
    let (remote_tx, remote_rx) = mpsc::channel::<Remote>();
    let watcher_stop = Arc::new(AtomicBool::new(false));
    if let (Some(s), Some(w)) = (store.as_ref(), ctx.watch.as_ref()) {
        match s.clone_conn() {
            Ok(conn) => elastic::watch_round(conn, w.clone(), watcher_stop.clone(), remote_tx),
            Err(e) => {
                let _ = remote_tx.send(Remote::Lost(format!(
                    "the store at {} is unreachable ({e})",
                    s.addr
                )));
            }
        }
    } else if let Some(s) = store.as_ref() {
        // Its own connection: a client handle serves one request at a time, and this one blocks.
        match s.clone_conn() {
            Ok(conn) => agent::watch(
                conn,
                ctx.keys.failed(attempt),
                s.addr.clone(),
                ctx.cfg.monitor_interval.max(Duration::from_secs(1)),
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
    (remote_rx, watcher_stop)
}

/// Lets the output pumps drain (a grandchild holding a pipe open must not keep us here).
fn drain_pumps(done_rx: &mpsc::Receiver<()>, pumps: usize) {
    let drain_deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..pumps {
        let left = drain_deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
}

/// The supervision of one attempt's running workers.
struct Supervisor<'a, 'c> {
    ctx: &'a Ctx<'c>,
    attempt: u32,
    store: &'a mut Option<AgentStore>,
    workers: Vec<Worker>,
    /// Why and since when the workers are being stopped.
    stop: Option<(StopReason, Instant)>,
    /// SIGKILL was sent.
    killed: bool,
}

impl Supervisor<'_, '_> {
    /// Runs until every worker ended.
    fn supervise(
        &mut self,
        exit_rx: &mpsc::Receiver<Exit>,
        remote_rx: &mpsc::Receiver<Remote>,
    ) -> Result<(), String> {
        loop {
            self.forward_signal();
            if self.stop.is_none() {
                self.check_remote(remote_rx);
            }
            self.take_exits(exit_rx)?;
            if self.workers.iter().all(|w| w.status.is_some()) {
                return Ok(());
            }
            self.escalate();
        }
    }

    fn signal_all(&mut self, sig: i32) {
        for w in self.workers.iter_mut() {
            w.signal(sig);
        }
    }

    /// A signal c10drun received goes to every worker (and, the first time, stops the job).
    fn forward_signal(&mut self) {
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig == 0 {
            return;
        }
        say(&format!(
            "received {}, forwarding it to the workers",
            signal_name(sig)
        ));
        self.signal_all(sig);
        if self.stop.is_none() {
            publish_failure(
                self.store,
                &self.ctx.keys,
                self.attempt,
                &format!(
                    "c10drun on node {} received {}",
                    self.ctx.node_rank,
                    signal_name(sig)
                ),
            );
            self.stop = Some((StopReason::Signal(sig), Instant::now()));
        }
    }

    /// Another node's failure, or the store going silent, stops the workers.
    fn check_remote(&mut self, remote_rx: &mpsc::Receiver<Remote>) {
        let node = self.ctx.node_rank;
        let reason = match remote_rx.try_recv() {
            Ok(Remote::Failure(msg)) => {
                say(&format!(
                    "another node failed ({msg}); stopping the workers of node {node}"
                ));
                StopReason::RemoteFailure(msg)
            }
            Ok(Remote::Membership(msg)) => {
                say(&format!(
                    "the membership changed ({msg}); stopping the workers of node {node} to re-rendezvous"
                ));
                StopReason::Membership(msg)
            }
            Ok(Remote::Lost(msg)) => {
                say(&format!("{msg}; stopping the workers of node {node}"));
                if let Some(s) = self.store.as_mut() {
                    s.lost = Some(msg.clone());
                }
                StopReason::StoreLost(msg)
            }
            Err(_) => return,
        };
        self.signal_all(libc::SIGTERM);
        self.stop = Some((reason, Instant::now()));
    }

    /// Waits (briefly) for the next worker to end, then takes every exit already reported; the
    /// first failure stops the others.
    fn take_exits(&mut self, exit_rx: &mpsc::Receiver<Exit>) -> Result<(), String> {
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
            let st = st.map_err(|e| format!("waiting for rank {}: {e}", self.workers[i].rank))?;
            self.workers[i].status = Some(st);
            self.workers[i].ended_at = Some(Instant::now());
            if !st.success() && self.stop.is_none() {
                self.on_failure(i, &st);
            }
        }
        Ok(())
    }

    /// Worker `i` failed first: say so, tell the other nodes, stop the rest.
    fn on_failure(&mut self, i: usize, st: &ExitStatus) {
        let w = &self.workers[i];
        say(&format!(
            "rank {} (local_rank {}, pid {}) failed with {}; stopping the other workers",
            w.rank,
            w.local_rank,
            w.pid,
            describe_status(st)
        ));
        let msg = format!(
            "rank {} on node {}: {}",
            w.rank,
            self.ctx.node_rank,
            describe_status(st)
        );
        publish_failure(self.store, &self.ctx.keys, self.attempt, &msg);
        self.signal_all(libc::SIGTERM);
        self.stop = Some((StopReason::LocalFailure(i), Instant::now()));
    }

    /// SIGKILL to the workers still running `--stop-timeout` after they were told to stop.
    fn escalate(&mut self) {
        let grace = self.ctx.cfg.stop_timeout;
        let Some((_, since)) = &self.stop else {
            return;
        };
        if self.killed || since.elapsed() < grace {
            return;
        }
        let left: Vec<String> = self
            .workers
            .iter()
            .filter(|w| w.status.is_none())
            .map(|w| w.rank.to_string())
            .collect();
        say(&format!(
            "ranks [{}] still running {:.1} s after SIGTERM; sending SIGKILL",
            left.join(", "),
            grace.as_secs_f64()
        ));
        self.signal_all(libc::SIGKILL);
        self.killed = true;
    }
}
