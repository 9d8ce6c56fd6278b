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

use crate::agent::{self, AgentKeys, AgentStore};
use crate::attempt::{run_attempt, Ctx, StopReason};
use crate::cli::{Args, Config, HostMode};
use crate::elastic::Elastic;
use crate::elastic_job::run_elastic;
use crate::finish::{exit_barrier, finish_failed};
use crate::host::is_local;
use crate::log_dir::LogDir;
use crate::output::say;
use crate::signals::install_signal_handlers;
use crate::summary::print_summary;
use crate::worker_store;
use c10d_store::tcp::{ServerOptions, TcpStoreServer};

/// Runs `c10drun` with the parsed command line `args` and returns its exit status: 0 when every
/// worker succeeded, 1 after a failure or a command-line error (the message is on stderr), 128 +
/// the signal number after a handled signal.
///
/// Call it before the process starts any thread: with `--auth-secret-file` it sets
/// the environment variable the store clients and servers read.
pub fn launch(args: Args) -> i32 {
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
    match run(&cfg) {
        Ok(code) => code,
        Err(msg) => {
            say(&format!("error: {msg}"));
            1
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
