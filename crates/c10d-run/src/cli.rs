//! The command line: torchrun's options (both spellings) plus c10drun's own, checked and turned
//! into a [`Config`].

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Command line of `c10drun`: torchrun's options, dashes or underscores, unambiguous
/// abbreviations, and each also from the environment variable `PET_<NAME>` (torchrun's).
#[derive(Parser, Debug)]
#[command(
    name = "c10drun",
    // torchrun (argparse) takes unambiguous abbreviations: `--nnode`, `--max-re`.
    infer_long_args = true,
    version,
    about = "Launch a distributed job (torchrun's command line, for c10d-rs and PyTorch programs)",
    after_help = "Examples:\n  c10drun --standalone --nproc_per_node=2 train.py --epochs 3\n  c10drun --nproc-per-node 4 --master-port 0 ./train\n  c10drun --nnodes 2 --node-rank 0 --master-addr host0 --master-port 29500 -m pkg.train"
)]
pub struct Args {
    /// Workers per node: a number, `cpu` (CPU cores), `gpu` (CUDA devices) or `auto`.
    #[arg(
        long = "nproc-per-node",
        alias = "nproc_per_node",
        default_value = "1",
        env = "PET_NPROC_PER_NODE"
    )]
    pub nproc_per_node: String,
    /// Number of nodes, `N` or `MIN:MAX` (MIN < MAX: elastic, with `--rdzv-backend c10d`).
    #[arg(long, default_value = "1", env = "PET_NNODES")]
    pub nnodes: String,
    /// Rank of this node, 0..nnodes (static rendezvous). Node 0 hosts the store.
    #[arg(long = "node-rank", alias = "node_rank", env = "PET_NODE_RANK")]
    pub node_rank: Option<usize>,
    /// Address of node 0, where the store runs (given to workers as MASTER_ADDR).
    #[arg(long = "master-addr", alias = "master_addr", env = "PET_MASTER_ADDR")]
    pub master_addr: Option<String>,
    /// Port of the store on node 0 (MASTER_PORT, default 29500); 0 picks a free port (node 0 only).
    #[arg(long = "master-port", alias = "master_port", env = "PET_MASTER_PORT")]
    pub master_port: Option<u16>,
    /// Job id shared by all nodes (TORCHELASTIC_RUN_ID).
    #[arg(
        long = "run-id",
        alias = "rdzv-id",
        alias = "rdzv_id",
        env = "PET_RDZV_ID"
    )]
    pub run_id: Option<String>,
    /// Rendezvous backend: `static` (default: --node-rank, node 0 hosts the store) or `c10d`
    /// (node ranks in order of arrival; the node owning --rdzv-endpoint hosts the store).
    #[arg(
        long = "rdzv-backend",
        alias = "rdzv_backend",
        env = "PET_RDZV_BACKEND"
    )]
    pub rdzv_backend: Option<String>,
    /// Store address `host[:port]` (c10d default port 29400; static default --master-addr:--master-port).
    #[arg(
        long = "rdzv-endpoint",
        alias = "rdzv_endpoint",
        env = "PET_RDZV_ENDPOINT"
    )]
    pub rdzv_endpoint: Option<String>,
    /// `key=value,...`: join_timeout / timeout (s, rendezvous), read_timeout (s, bound of every
    /// agent store operation, default 10), is_host (c10d); elastic (`--nnodes MIN:MAX`):
    /// last_call_timeout (s, default 30), close_timeout (s, default 30), keep_alive_interval
    /// (s, default 5), keep_alive_max_attempt (default 3); use_libuv, heartbeat_timeout,
    /// store_type, cas_backoff_max_seconds (accepted, no effect).
    #[arg(
        long = "rdzv-conf",
        alias = "rdzv_conf",
        default_value = "",
        env = "PET_RDZV_CONF"
    )]
    pub rdzv_conf: String,
    /// One node, store on 127.0.0.1 with a free port, fresh run id (c10d rendezvous).
    #[arg(
        long,
        env = "PET_STANDALONE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new(),
    )]
    pub standalone: bool,
    /// Restart the whole worker group this many times after a failure.
    #[arg(
        long = "max-restarts",
        alias = "max_restarts",
        default_value_t = 0,
        env = "PET_MAX_RESTARTS"
    )]
    pub max_restarts: u32,
    /// Seconds between the agent's checks of the store (at least 1 s is used); worker exits are
    /// noticed at once.
    #[arg(
        long = "monitor-interval",
        alias = "monitor_interval",
        default_value_t = 0.1,
        env = "PET_MONITOR_INTERVAL"
    )]
    pub monitor_interval: f64,
    /// torchrun's process start method (spawn, fork, forkserver): accepted, workers are always
    /// started as new processes.
    #[arg(
        long = "start-method",
        alias = "start_method",
        env = "PET_START_METHOD"
    )]
    pub start_method: Option<String>,
    /// Role of the workers (ROLE_NAME).
    #[arg(long, default_value = "default", env = "PET_ROLE")]
    pub role: String,
    /// Run `python3 -m PROGRAM ARGS...`.
    #[arg(
        short = 'm',
        long = "module",
        env = "PET_MODULE",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new(),
    )]
    pub module: bool,
    /// Run PROGRAM as given, even when it ends in `.py`.
    #[arg(
        long = "no-python",
        alias = "no_python",
        env = "PET_NO_PYTHON",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new(),
    )]
    pub no_python: bool,
    /// Run PROGRAM with `python3 PROGRAM` whatever its name.
    #[arg(
        long = "run-path",
        alias = "run_path",
        env = "PET_RUN_PATH",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new(),
    )]
    pub run_path: bool,
    /// Directory for the per-worker logs and error files (kept after the run).
    #[arg(long = "log-dir", alias = "log_dir", env = "PET_LOG_DIR")]
    pub log_dir: Option<PathBuf>,
    /// Send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local
    /// rank `0:1,1:2`.
    #[arg(
        short = 'r',
        long = "redirects",
        default_value = "0",
        env = "PET_REDIRECTS"
    )]
    pub redirects: String,
    /// Like --redirects, but also show the streams on the console.
    #[arg(short = 't', long = "tee", default_value = "0", env = "PET_TEE")]
    pub tee: String,
    /// Show only these local ranks' output on the console (`0,2`); log files get everything.
    #[arg(
        long = "local-ranks-filter",
        alias = "local_ranks_filter",
        default_value = "",
        env = "PET_LOCAL_RANKS_FILTER"
    )]
    pub local_ranks_filter: String,
    /// The job's secret file (owner-only): the store, the agents and the workers' stores and
    /// CPU groups authenticate with it (exported to the workers as `C10D_AUTH_SECRET_FILE`).
    #[arg(long = "auth-secret-file", alias = "auth_secret_file")]
    pub auth_secret_file: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when stopping workers.
    #[arg(long = "stop-timeout", default_value_t = 10.0)]
    pub stop_timeout: f64,
    /// Seconds the nodes wait for each other (start and exit barriers, store connection).
    #[arg(long = "rdzv-timeout", alias = "rdzv_timeout")]
    pub rdzv_timeout: Option<f64>,
    /// Do not prefix worker output lines with `[rank N]: `.
    #[arg(long = "no-prefix")]
    pub no_prefix: bool,
    /// The console line prefix instead of `[rank N]: `: `${role_name}`, `${rank}`,
    /// `${local_rank}` and `${hostname}` are substituted (torchrun's; also
    /// `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`).
    #[arg(
        long = "log-line-prefix-template",
        alias = "log_line_prefix_template",
        env = "PET_LOG_LINE_PREFIX_TEMPLATE"
    )]
    pub log_line_prefix_template: Option<String>,
    /// Also copy stdout lines containing any of these comma-separated strings (`,,` is a
    /// comma) to `filtered_stdout.log` in the attempt's log directory.
    #[arg(
        long = "duplicate-stdout-filters",
        alias = "duplicate_stdout_filters",
        default_value = "",
        env = "PET_DUPLICATE_STDOUT_FILTERS"
    )]
    pub duplicate_stdout_filters: String,
    /// As --duplicate-stdout-filters, for stderr (`filtered_stderr.log`).
    #[arg(
        long = "duplicate-stderr-filters",
        alias = "duplicate_stderr_filters",
        default_value = "",
        env = "PET_DUPLICATE_STDERR_FILTERS"
    )]
    pub duplicate_stderr_filters: String,
    /// Signals forwarded to the workers (comma-separated names; torchrun's default
    /// `SIGTERM,SIGINT,SIGHUP,SIGQUIT`; also `TORCHELASTIC_SIGNALS_TO_HANDLE`).
    #[arg(
        long = "signals-to-handle",
        alias = "signals_to_handle",
        env = "PET_SIGNALS_TO_HANDLE"
    )]
    pub signals_to_handle: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when stopping workers (torchrun's name for
    /// --stop-timeout; also `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`).
    #[arg(
        long = "shutdown-timeout",
        alias = "shutdown_timeout",
        env = "PET_SHUTDOWN_TIMEOUT"
    )]
    pub shutdown_timeout: Option<u64>,
    /// Every worker gets `LOCAL_RANK=0` and `CUDA_VISIBLE_DEVICES` set to its own GPU (the
    /// local rank's entry of this process's `CUDA_VISIBLE_DEVICES`, else the local rank).
    #[arg(
        long = "virtual-local-rank",
        alias = "virtual_local_rank",
        env = "PET_VIRTUAL_LOCAL_RANK",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::FalseyValueParser::new(),
    )]
    pub virtual_local_rank: bool,
    /// This node's address, shown in the elastic rendezvous' messages (torchrun also uses it
    /// to reach the node; c10drun's workers always meet through the agent's store).
    #[arg(long = "local-addr", alias = "local_addr", env = "PET_LOCAL_ADDR")]
    pub local_addr: Option<String>,
    /// torchrun's event log handler: only `null` (no event log) is available.
    #[arg(
        long = "event-log-handler",
        alias = "event_log_handler",
        env = "PET_EVENT_LOG_HANDLER"
    )]
    pub event_log_handler: Option<String>,
    /// The program to run in every worker, followed by its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]..."
    )]
    pub command: Vec<String>,
}

/// torchrun options that c10drun does not implement (yet).
const UNSUPPORTED: &[&str] = &["logs-specs", "numa-binding", "print-completion"];

/// Rendezvous backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Static,
    C10d,
}

/// Whether this agent runs the store server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    Yes,
    No,
    /// c10d: host it if the endpoint is an address of this machine and its port is free.
    Try,
}

/// The elastic rendezvous' timing (`--rdzv-conf`, torchrun's keys and defaults).
#[derive(Debug, Clone, Copy)]
pub struct ElasticConf {
    /// After MIN nodes joined, how long a round waits for more before it closes.
    pub last_call: Duration,
    /// How long an agent whose job ended keeps the store up for the others to see it.
    pub close: Duration,
    /// How often each agent proves it is alive.
    pub keep_alive_interval: Duration,
    /// Missed keep-alives after which a node counts as lost.
    pub keep_alive_max_attempt: u32,
}

impl ElasticConf {
    /// How long a node's keep-alive may stay silent before it counts as lost.
    pub fn lost_after(&self) -> Duration {
        self.keep_alive_interval * self.keep_alive_max_attempt
    }
}

/// Where a worker stream goes besides the console.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamMode {
    /// Written to a log file.
    pub file: bool,
    /// Shown on the console.
    pub console: bool,
}

/// The checked configuration of a run.
#[derive(Debug)]
pub struct Config {
    pub nproc: usize,
    /// The number of nodes (the maximum when elastic).
    pub nnodes: usize,
    /// The least number of nodes the job runs with (= `nnodes` unless elastic).
    pub min_nodes: usize,
    /// The elastic rendezvous settings (`--nnodes MIN:MAX` with MIN < MAX).
    pub elastic: Option<ElasticConf>,
    /// Static: the given node rank; c10d: assigned at the rendezvous.
    pub node_rank: Option<usize>,
    pub store_host: String,
    pub store_port: u16,
    pub host_mode: HostMode,
    pub run_id: String,
    pub stop_timeout: Duration,
    pub rdzv_timeout: Duration,
    /// Bound of every agent store operation (rdzv-conf read_timeout).
    pub store_deadline: Duration,
    pub max_restarts: u32,
    pub monitor_interval: Duration,
    pub role: String,
    /// What each worker executes.
    pub argv: Vec<String>,
    /// The command as the user gave it (for messages).
    pub display: String,
    pub log_dir: Option<PathBuf>,
    /// Per local rank: (stdout, stderr).
    pub streams: Vec<(StreamMode, StreamMode)>,
    pub no_prefix: bool,
    /// `--log-line-prefix-template` (or its environment variable).
    pub prefix_template: Option<String>,
    /// `--duplicate-std{out,err}-filters`: substrings (empty: no copy).
    pub duplicate_filters: [Vec<String>; 2],
    /// The signals forwarded to the workers.
    pub signals: Vec<i32>,
    pub virtual_local_rank: bool,
    pub local_addr: Option<String>,
}

fn usage(msg: impl Into<String>) -> String {
    msg.into()
}

/// Number of CUDA devices on this machine (`/dev/nvidiaN`, else `nvidia-smi -L`).
fn gpu_count() -> usize {
    let n = std::fs::read_dir("/dev")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.strip_prefix("nvidia").is_some_and(|rest| {
                        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())
                    })
                })
                .count()
        })
        .unwrap_or(0);
    if n > 0 {
        return n;
    }
    std::process::Command::new("nvidia-smi")
        .arg("-L")
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.starts_with("GPU "))
                .count()
        })
        .unwrap_or(0)
}

/// Number of CPUs this process may use.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// `--nproc-per-node` as torchrun reads it.
pub fn parse_nproc(s: &str) -> Result<usize, String> {
    match s {
        "cpu" => Ok(cpu_count()),
        "gpu" => match gpu_count() {
            0 => Err("--nproc-per-node gpu: no CUDA device found (no /dev/nvidiaN, no GPU listed by nvidia-smi)".into()),
            n => Ok(n),
        },
        "auto" => Ok(match gpu_count() {
            0 => cpu_count(),
            n => n,
        }),
        _ => match s.parse::<usize>() {
            Ok(0) => Err("--nproc-per-node must be at least 1".into()),
            Ok(n) => Ok(n),
            Err(_) => Err(format!(
                "--nproc-per-node: expected a number, `cpu`, `gpu` or `auto`, got '{s}'"
            )),
        },
    }
}

/// `--nnodes N` or `MIN:MAX`: (MIN, MAX).
fn parse_nnodes(s: &str) -> Result<(usize, usize), String> {
    let num = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("--nnodes: expected N or MIN:MAX, got '{s}'"))
    };
    let (lo, hi) = match s.split_once(':') {
        None => (num(s)?, num(s)?),
        Some((a, b)) => (num(a)?, num(b)?),
    };
    if lo > hi {
        return Err(format!("--nnodes {s}: MIN is larger than MAX"));
    }
    if lo == 0 {
        return Err("--nnodes must be at least 1".into());
    }
    Ok((lo, hi))
}

/// The grace period between SIGTERM and SIGKILL: `--shutdown-timeout`, else
/// `TORCH_ELASTIC_SHUTDOWN_TIMEOUT`, else `--stop-timeout`.
fn stop_timeout(a: &Args) -> Result<Duration, String> {
    let env = std::env::var("TORCH_ELASTIC_SHUTDOWN_TIMEOUT").ok();
    match (a.shutdown_timeout, env) {
        (Some(s), _) => Ok(Duration::from_secs(s)),
        (None, Some(v)) => v.trim().parse().map(Duration::from_secs).map_err(|_| {
            format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT={v}: expected a whole number of seconds")
        }),
        (None, None) => Ok(Duration::from_secs_f64(a.stop_timeout.max(0.0))),
    }
}

/// torchrun's `comma_separated_list`: `,` separates, `,,` is a literal comma, empty parts
/// are dropped.
fn comma_separated(s: &str) -> Vec<String> {
    s.replace(",,", "\u{0}")
        .split(',')
        .map(|p| p.replace('\u{0}', ","))
        .filter(|p| !p.is_empty())
        .collect()
}

/// `--signals-to-handle`: signal names (`SIGTERM` or `TERM`) to numbers.
fn parse_signals(spec: &str) -> Result<Vec<i32>, String> {
    let known: [(&str, i32); 8] = [
        ("SIGTERM", libc::SIGTERM),
        ("SIGINT", libc::SIGINT),
        ("SIGHUP", libc::SIGHUP),
        ("SIGQUIT", libc::SIGQUIT),
        ("SIGUSR1", libc::SIGUSR1),
        ("SIGUSR2", libc::SIGUSR2),
        ("SIGCONT", libc::SIGCONT),
        ("SIGALRM", libc::SIGALRM),
    ];
    spec.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let name = if n.starts_with("SIG") { n.to_string() } else { format!("SIG{n}") };
            known
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    format!(
                        "--signals-to-handle: unknown signal '{n}' (known: SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT, SIGALRM)"
                    )
                })
        })
        .collect()
}

/// `--redirects` / `--tee`: one value 0-3 for all local ranks, or `LOCAL_RANK:VALUE,...`.
fn parse_std_spec(name: &str, s: &str, nproc: usize) -> Result<Vec<u8>, String> {
    let val = |v: &str| {
        match v.trim().parse::<u8>() {
        Ok(x) if x <= 3 => Ok(x),
        _ => Err(format!(
            "--{name}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or LOCAL_RANK:VALUE,..., got '{s}'"
        )),
    }
    };
    if !s.contains(':') {
        return Ok(vec![val(s)?; nproc]);
    }
    let mut out = vec![0u8; nproc];
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (r, v) = part
            .split_once(':')
            .ok_or_else(|| format!("--{name}: bad entry '{part}' in '{s}'"))?;
        let r: usize = r
            .trim()
            .parse()
            .map_err(|_| format!("--{name}: bad local rank '{r}' in '{s}'"))?;
        if r < nproc {
            out[r] = val(v)?;
        }
    }
    Ok(out)
}

/// `--rdzv-conf key=value,...`.
fn parse_conf(s: &str) -> Result<Vec<(String, String)>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| format!("--rdzv-conf: expected key=value, got '{p}'"))
        })
        .collect()
}

fn secs(key: &str, v: &str) -> Result<Duration, String> {
    match v.parse::<f64>() {
        Ok(x) if x > 0.0 && x.is_finite() => Ok(Duration::from_secs_f64(x)),
        _ => Err(format!(
            "--rdzv-conf {key}={v}: expected a positive number of seconds"
        )),
    }
}

/// `host[:port]`, IPv6 as `[addr]:port`.
fn parse_endpoint(s: &str, default_port: u16) -> Result<(String, u16), String> {
    let bad = || format!("--rdzv-endpoint: expected host[:port], got '{s}'");
    if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest.split_once(']').ok_or_else(bad)?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad())?,
            None if tail.is_empty() => default_port,
            None => return Err(bad()),
        };
        return Ok((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Ok((h.to_string(), p.parse().map_err(|_| bad())?)),
        _ if s.is_empty() => Err(bad()),
        _ => Ok((s.to_string(), default_port)),
    }
}

/// A fresh random-looking run id (uuid4-shaped), as torchrun's --standalone makes.
fn fresh_run_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut x = (t as u64) ^ ((std::process::id() as u64) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let (a, b) = (next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

impl Config {
    /// Checks the command line and works out the configuration.
    pub fn from_args(a: Args) -> Result<Config, String> {
        check_command(&a)?;
        let nproc = parse_nproc(&a.nproc_per_node)?;
        let (min_nodes, nnodes) = parse_nnodes(&a.nnodes)?;
        let conf = RdzvConf::parse(&a)?;
        let backend = rdzv_backend(&a)?;
        if min_nodes < nnodes && (a.standalone || backend != Backend::C10d) {
            return Err(format!(
                "--nnodes {}: elastic node counts need --rdzv-backend c10d and --rdzv-endpoint",
                a.nnodes
            ));
        }
        let elastic = (min_nodes < nnodes).then_some(conf.elastic);
        let place = if a.standalone {
            standalone_place(nnodes)?
        } else {
            let run_id = a.run_id.clone().unwrap_or_else(|| "none".into());
            match backend {
                Backend::Static => static_place(&a, nnodes, run_id)?,
                Backend::C10d => c10d_place(&a, nnodes, conf.is_host, run_id)?,
            }
        };
        let argv = worker_argv(&a);
        let streams = stream_modes(&a, nproc)?;
        let signals = parse_signals(
            &a.signals_to_handle
                .clone()
                .or_else(|| std::env::var("TORCHELASTIC_SIGNALS_TO_HANDLE").ok())
                .unwrap_or_else(|| "SIGTERM,SIGINT,SIGHUP,SIGQUIT".into()),
        )?;
        let stop_timeout = stop_timeout(&a)?;
        Ok(Config {
            nproc,
            nnodes: place.nnodes,
            min_nodes: if elastic.is_some() {
                min_nodes
            } else {
                place.nnodes
            },
            elastic,
            node_rank: place.node_rank,
            store_host: place.store_host,
            store_port: place.store_port,
            host_mode: place.host_mode,
            run_id: place.run_id,
            stop_timeout,
            rdzv_timeout: conf.rdzv_timeout,
            store_deadline: conf.store_deadline,
            max_restarts: a.max_restarts,
            monitor_interval: Duration::from_secs_f64(a.monitor_interval),
            role: a.role,
            argv,
            display: a.command.join(" "),
            log_dir: a.log_dir,
            streams,
            no_prefix: a.no_prefix,
            prefix_template: a
                .log_line_prefix_template
                .clone()
                .or_else(|| std::env::var("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").ok())
                .filter(|t| !t.is_empty()),
            duplicate_filters: [
                comma_separated(&a.duplicate_stdout_filters),
                comma_separated(&a.duplicate_stderr_filters),
            ],
            signals,
            virtual_local_rank: a.virtual_local_rank,
            local_addr: a.local_addr.clone(),
        })
    }
}

/// The program slot must not hold an option clap did not know; `-m` excludes `--no-python`;
/// `--start-method` must be one of torchrun's.
fn check_command(a: &Args) -> Result<(), String> {
    // An option clap did not know lands in the program slot: never run it as the program.
    let first = &a.command[0];
    if first.starts_with('-') && first.len() > 1 {
        let name = first.trim_start_matches('-');
        let name = name.split('=').next().unwrap_or(name).replace('_', "-");
        if UNSUPPORTED.contains(&name.as_str()) {
            return Err(usage(format!(
                "torchrun's option --{name} is not supported by c10drun yet"
            )));
        }
        return Err(usage(format!(
            "unknown option '{first}' (see c10drun --help); the program to run comes after the options"
        )));
    }
    if a.module && a.no_python {
        return Err(usage(
            "--module and --no-python cannot be used together (-m runs the program as a Python module)",
        ));
    }
    if let Some(h) = &a.event_log_handler {
        if h != "null" {
            return Err(usage(format!(
                "--event-log-handler {h}: c10drun has no event log; only 'null' is available"
            )));
        }
    }
    if let Some(m) = &a.start_method {
        if !matches!(m.as_str(), "spawn" | "fork" | "forkserver") {
            return Err(usage(format!(
                "--start-method: expected spawn, fork or forkserver, got '{m}'"
            )));
        }
    }
    Ok(())
}

/// The rendezvous settings from `--rdzv-conf` and the timeouts given as flags.
struct RdzvConf {
    rdzv_timeout: Duration,
    store_deadline: Duration,
    is_host: Option<bool>,
    elastic: ElasticConf,
}

impl RdzvConf {
    /// Parses `--rdzv-conf` (torchrun's keys; those without effect here are accepted) and checks
    /// `--rdzv-timeout`, `--stop-timeout` and `--monitor-interval`.
    fn parse(a: &Args) -> Result<RdzvConf, String> {
        let conf = parse_conf(&a.rdzv_conf)?;
        let mut rdzv_timeout = a.rdzv_timeout.map(Duration::from_secs_f64);
        let mut store_deadline = Duration::from_secs(10);
        let mut is_host: Option<bool> = None;
        let mut elastic = ElasticConf {
            last_call: Duration::from_secs(30),
            close: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_max_attempt: 3,
        };
        for (k, v) in &conf {
            match k.as_str() {
                "join_timeout" | "timeout" => rdzv_timeout = Some(secs(k, v)?),
                "read_timeout" => store_deadline = secs(k, v)?,
                "is_host" => {
                    is_host = Some(match v.to_ascii_lowercase().as_str() {
                        "1" | "true" | "yes" | "y" | "on" => true,
                        "0" | "false" | "no" | "n" | "off" => false,
                        _ => return Err(format!("--rdzv-conf is_host={v}: expected true or false")),
                    })
                }
                "last_call_timeout" => elastic.last_call = secs(k, v)?,
                "close_timeout" => elastic.close = secs(k, v)?,
                "keep_alive_interval" => elastic.keep_alive_interval = secs(k, v)?,
                "keep_alive_max_attempt" => {
                    elastic.keep_alive_max_attempt = match v.parse::<u32>() {
                        Ok(n) if n > 0 => n,
                        _ => return Err(format!("--rdzv-conf {k}={v}: expected a positive count")),
                    }
                }
                // torchrun's keys that mean nothing here (c10drun's store is its own TCPStore;
                // its operations are bounded by read_timeout).
                "use_libuv" | "rank" | "heartbeat_timeout" | "store_type"
                | "cas_backoff_max_seconds" => {}
                _ => {
                    return Err(format!(
                        "--rdzv-conf: unknown key '{k}' (known: join_timeout, timeout, read_timeout, is_host, last_call_timeout, close_timeout, keep_alive_interval, keep_alive_max_attempt; accepted without effect: use_libuv, rank, heartbeat_timeout, store_type, cas_backoff_max_seconds)"
                    ))
                }
            }
        }
        let rdzv_timeout = rdzv_timeout.unwrap_or(Duration::from_secs(900));
        if !(a.stop_timeout >= 0.0 && a.stop_timeout.is_finite()) {
            return Err("--stop-timeout must be a non-negative number of seconds".into());
        }
        if rdzv_timeout.is_zero() {
            return Err("--rdzv-timeout must be positive".into());
        }
        if !(a.monitor_interval > 0.0 && a.monitor_interval.is_finite()) {
            return Err("--monitor-interval must be positive".into());
        }
        Ok(RdzvConf {
            rdzv_timeout,
            store_deadline,
            is_host,
            elastic,
        })
    }
}

/// `--rdzv-backend` (c10d under `--standalone`, static by default).
fn rdzv_backend(a: &Args) -> Result<Backend, String> {
    let backend_name = if a.standalone {
        "c10d".to_string()
    } else {
        a.rdzv_backend.clone().unwrap_or_else(|| "static".into())
    };
    match backend_name.as_str() {
        "static" => Ok(Backend::Static),
        "c10d" => Ok(Backend::C10d),
        other => Err(format!(
            "--rdzv-backend {other} is not supported by c10drun (supported: c10d, static)"
        )),
    }
}

/// Where the store is, who hosts it, and this node's rank (when known before the rendezvous).
struct StorePlace {
    nnodes: usize,
    store_host: String,
    store_port: u16,
    node_rank: Option<usize>,
    host_mode: HostMode,
    run_id: String,
}

/// `--standalone`: one node hosting a store on 127.0.0.1 with a free port and a fresh run id.
fn standalone_place(nnodes: usize) -> Result<StorePlace, String> {
    if nnodes != 1 {
        return Err(format!(
            "--standalone runs one node, but --nnodes is {nnodes}"
        ));
    }
    Ok(StorePlace {
        nnodes: 1,
        store_host: "127.0.0.1".to_string(),
        store_port: 0,
        node_rank: Some(0),
        host_mode: HostMode::Yes,
        run_id: fresh_run_id(),
    })
}

/// The static rendezvous: the store at `--master-addr`/`--master-port` (or `--rdzv-endpoint`),
/// hosted by node 0.
fn static_place(a: &Args, nnodes: usize, run_id: String) -> Result<StorePlace, String> {
    let (h, p) = match &a.rdzv_endpoint {
        Some(ep) if !ep.is_empty() => parse_endpoint(ep, a.master_port.unwrap_or(29500))?,
        _ => (
            a.master_addr.clone().unwrap_or_else(|| "127.0.0.1".into()),
            a.master_port.unwrap_or(29500),
        ),
    };
    let r = a.node_rank.unwrap_or(0);
    if r >= nnodes {
        return Err(format!(
            "--node-rank {r} is out of range for --nnodes {nnodes}"
        ));
    }
    if p == 0 && r != 0 {
        return Err("--master-port 0 (pick a free port) only works on node 0; give the other nodes the port node 0 printed".into());
    }
    Ok(StorePlace {
        nnodes,
        store_host: h,
        store_port: p,
        node_rank: Some(r),
        host_mode: if r == 0 { HostMode::Yes } else { HostMode::No },
        run_id,
    })
}

/// The c10d rendezvous: the store at `--rdzv-endpoint`, hosted by the agent owning it (or as
/// `is_host` says); node ranks follow the order of arrival. Port 0 (a free port, printed) is
/// for the agent that hosts the store: the others need the port it printed.
fn c10d_place(
    a: &Args,
    nnodes: usize,
    is_host: Option<bool>,
    run_id: String,
) -> Result<StorePlace, String> {
    let ep = a.rdzv_endpoint.clone().filter(|e| !e.is_empty()).ok_or(
        "--rdzv-backend c10d needs --rdzv-endpoint host[:port] (or use --standalone for one node)",
    )?;
    let (h, p) = parse_endpoint(&ep, 29400)?;
    // The c10d rendezvous numbers nodes in order of arrival (--node-rank is ignored, as
    // torchrun does).
    let node_rank = if nnodes == 1 { Some(0) } else { None };
    let host_mode = match (is_host, nnodes) {
        (Some(true), _) | (None, 1) => HostMode::Yes,
        (Some(false), _) => HostMode::No,
        (None, _) => HostMode::Try,
    };
    if p == 0 && host_mode == HostMode::No {
        return Err("--rdzv-endpoint with port 0 (pick a free port) only works on the node that hosts the store (is_host); give the other nodes the port it printed".into());
    }
    Ok(StorePlace {
        nnodes,
        store_host: h,
        store_port: p,
        node_rank,
        host_mode,
        run_id,
    })
}

/// What each worker runs: torchrun's rules, with the python3 found on PATH.
fn worker_argv(a: &Args) -> Vec<String> {
    let cmd = a.command.clone();
    if a.module {
        let mut v = vec!["python3".to_string(), "-m".to_string()];
        v.extend(cmd.iter().cloned());
        v
    } else if a.run_path || (!a.no_python && cmd[0].ends_with(".py")) {
        let mut v = vec!["python3".to_string()];
        v.extend(cmd.iter().cloned());
        v
    } else {
        cmd
    }
}

/// Per local rank, where its stdout and stderr go (`--redirects`, `--tee`,
/// `--local-ranks-filter`).
fn stream_modes(a: &Args, nproc: usize) -> Result<Vec<(StreamMode, StreamMode)>, String> {
    let redirects = parse_std_spec("redirects", &a.redirects, nproc)?;
    let tee = parse_std_spec("tee", &a.tee, nproc)?;
    let filter = parse_ranks_filter(&a.local_ranks_filter)?;
    Ok((0..nproc)
        .map(|lr| {
            let shown = filter.as_ref().is_none_or(|f| f.contains(&lr));
            let mode = |bit: u8| {
                let red = redirects[lr] & bit != 0;
                let tee = tee[lr] & bit != 0;
                StreamMode {
                    file: red || tee,
                    console: shown && (tee || !red),
                }
            };
            (mode(1), mode(2))
        })
        .collect())
}

/// `--local-ranks-filter 0,1` (`None`: show every rank).
fn parse_ranks_filter(spec: &str) -> Result<Option<Vec<usize>>, String> {
    if spec.trim().is_empty() {
        return Ok(None);
    }
    let ranks = spec
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.trim().parse::<usize>().map_err(|_| {
                format!("--local-ranks-filter: expected local ranks like 0,1, got '{spec}'")
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(ranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(parse_endpoint("h:12", 1).unwrap(), ("h".into(), 12));
        assert_eq!(parse_endpoint("h", 29400).unwrap(), ("h".into(), 29400));
        assert_eq!(parse_endpoint("[::1]:5", 1).unwrap(), ("::1".into(), 5));
        assert!(parse_endpoint("h:x", 1).is_err());
    }

    #[test]
    fn std_specs() {
        assert_eq!(parse_std_spec("r", "3", 2).unwrap(), vec![3, 3]);
        assert_eq!(parse_std_spec("r", "0:1,1:2", 3).unwrap(), vec![1, 2, 0]);
        assert!(parse_std_spec("r", "4", 1).is_err());
    }

    #[test]
    fn torchrun_lists_and_signals() {
        assert_eq!(comma_separated("a,b,,c,"), ["a", "b,c"]);
        assert!(comma_separated("").is_empty());
        assert_eq!(
            parse_signals("SIGTERM,USR1").unwrap(),
            [libc::SIGTERM, libc::SIGUSR1]
        );
        assert!(parse_signals("SIGFOO")
            .unwrap_err()
            .contains("unknown signal"));
    }

    #[test]
    fn nnodes() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("2:2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:3").unwrap(), (1, 3));
        assert!(parse_nnodes("3:1").unwrap_err().contains("larger"));
        assert!(parse_nnodes("0:2").is_err());
    }
}
