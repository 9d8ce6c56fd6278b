//! `c10d-bench`: the `all_reduce_perf` of c10d-rs — one binary for every collective, printing
//! nccl-tests' table.
//!
//! ```text
//! c10d-bench <op> [--nproc N] [--backend gloo|nccl] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR]
//!            [-d DTYPE] [-o REDOP] [-n ITERS] [-w WARMUP] [-c 0|1]
//! op: all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | sendrecv
//! ```
//!
//! - With `--nproc N` it launches N local ranks itself: it hosts a `TcpStore` server on
//!   127.0.0.1 (free port) and re-executes itself N times with `RANK`, `WORLD_SIZE`,
//!   `MASTER_ADDR`, `MASTER_PORT` (and `TORCHELASTIC_USE_AGENT_STORE=True`) set. Without it, it
//!   is one rank of a job started by `c10drun` (or torchrun / any env:// launcher).
//! - Sizes accept suffixes `K`, `M`, `G` (powers of 1024). `size` is the byte count nccl-tests
//!   reports: the buffer of all_reduce/broadcast/reduce/sendrecv, the *output* of all_gather,
//!   the *input* of reduce_scatter and all_to_all.
//! - Warm-up until steady: after the `-w` warm-up iterations, blocks of iterations run (each
//!   long enough to take 2 ms, doubling from 8) for at least 100 ms and until the median time
//!   per iteration of two consecutive blocks agrees within 5 % on every rank (on a GPU, where
//!   ops only queue, a block's time up to its stream synchronize over its iterations), or
//!   `--warmup_max_ms` passed (then a `#` line under the row says so). Runs with `-n` below 20
//!   check results rather than time them and only run the `-w` iterations. The first
//!   hundreds of ops of a fresh job can be 50–150× slower than later ones (the scheduler had
//!   put two ranks on one core), and a fixed warm-up reported that as the first row's time.
//! - Timing, as nccl-tests: the warm-up, a barrier, then `-n` timed iterations
//!   (each a blocking collective); time = average per iteration on each rank, and the table shows
//!   the maximum over the ranks. `algbw = size / time`; `busbw = algbw × factor` with factor
//!   2(n−1)/n for all_reduce, (n−1)/n for all_gather, reduce_scatter and all_to_all, 1 for
//!   broadcast, reduce and sendrecv. Without `-n`, small sizes (≤ 64 KiB) run 200 iterations and
//!   sizes ≥ 16 MiB run 10, others 20, or more when the warm-up's median says that these take
//!   less than 100 ms (a row that lasts 0.4 ms moves with every interrupt).
//! - `#wrong` (with `-c 1`, the default) counts elements that differ from the expected result
//!   after one more run on fresh data, summed over all ranks; every element is checked. Inputs
//!   are small integers, exact in every dtype. The exit status is 1 when any element is wrong or
//!   any rank fails.
//!
//! Header and footer lines start with `#`; data rows hold numbers except the `type` and `redop`
//! columns (nccl-tests prints `none` as the redop of ops without a reduction).

use c10d_core::half;
use c10d_core::{DType, DistError, ReduceOp, Result, Tensor, Work};
use c10d_run::die_with_parent;
use c10d_store::tcp::{ServerOptions, TcpStoreServer};
use c10d_world as dist;
use clap::{Parser, ValueEnum};
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[clap(rename_all = "snake_case")]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Sendrecv,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::Sendrecv => "sendrecv",
        }
    }
    /// nccl-tests' bus-bandwidth factor.
    fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce | Op::Sendrecv => 1.0,
        }
    }
    fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }
    /// Element count must be a multiple of the world size.
    fn needs_divisible(self) -> bool {
        matches!(self, Op::AllGather | Op::ReduceScatter | Op::AllToAll)
    }
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "c10d-bench",
    version,
    about = "nccl-tests style benchmark of the c10d-rs collectives"
)]
struct Args {
    /// The collective to time.
    #[arg(value_enum)]
    op: Op,
    /// Launch this many local ranks (otherwise run as one rank of an env:// job, e.g. under c10drun).
    #[arg(long)]
    nproc: Option<usize>,
    /// Backend: gloo (CPU) or nccl (CUDA; refused when this build has no NCCL).
    #[arg(long, default_value = "gloo")]
    backend: String,
    /// Smallest size in bytes (suffixes K, M, G).
    #[arg(short = 'b', long = "minbytes", default_value = "1K", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes (suffixes K, M, G).
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: usize,
    /// Element type: float, double, half, bfloat16, int8, uint8, int16, int32, int64, bool.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_dtype)]
    dtype: DType,
    /// Reduction: sum, prod, min, max, avg, band, bor, bxor.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_redop)]
    redop: ReduceOp,
    /// Timed iterations per size (default: 200 up to 64 KiB, 10 from 16 MiB, else 20).
    #[arg(short = 'n', long = "iters")]
    iters: Option<usize>,
    /// Warm-up iterations per size (before the warm-up until steady).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Longest warm-up until steady per size, in ms (0, or -n below 20: only the -w iterations).
    #[arg(long = "warmup_max_ms", default_value_t = 1000)]
    warmup_max_ms: u64,
    /// Check every element of the result (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    check: u8,
    /// Collective timeout in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix('B').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("invalid size '{s}' (use e.g. 1024, 1K, 16M, 1G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    let d = DType::parse(s).map_err(|e| e.to_string())?;
    if d.is_complex() {
        return Err(format!("dtype {s} is not supported by c10d-bench"));
    }
    Ok(d)
}

/// nccl-tests' spelling of a reduction ("sum", "prod", "min", "max", "avg", "band" ...).
fn redop_name(op: ReduceOp) -> String {
    match op {
        ReduceOp::Product => "prod".into(),
        other => other.name().to_ascii_lowercase(),
    }
}

fn parse_redop(s: &str) -> std::result::Result<ReduceOp, String> {
    let s = if s.eq_ignore_ascii_case("prod") {
        "product"
    } else {
        s
    };
    match ReduceOp::parse(s).map_err(|e| e.to_string())? {
        ReduceOp::PremulSum(_) => Err("premul_sum is not supported by c10d-bench".into()),
        op => Ok(op),
    }
}

fn main() {
    // `RUST_LOG=c10d_gloo=info` shows the engine's choices (shared memory, host map).
    let _ = env_logger::try_init();
    let args = Args::parse();
    let code = match args.nproc {
        Some(n) => launch(&args, n),
        None => match run_rank(&args) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!(
                    "c10d-bench: rank {}: error: {e}",
                    std::env::var("RANK").unwrap_or_else(|_| "?".into())
                );
                1
            }
        },
    };
    std::process::exit(code);
}

/// Argument checks shared by the launcher and the ranks (so a bad command fails once, clearly).
fn validate(args: &Args) -> std::result::Result<(), String> {
    check_backend(args)?;
    if args.factor < 2 {
        return Err("-f must be at least 2".into());
    }
    if args.min_bytes > args.max_bytes {
        return Err(format!(
            "-b ({}) must not exceed -e ({})",
            args.min_bytes, args.max_bytes
        ));
    }
    if args.op.reduces() {
        args.redop
            .check_dtype(args.dtype)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn check_backend(args: &Args) -> std::result::Result<(), String> {
    if !dist::is_backend_available(&args.backend) {
        let why = if args.backend.eq_ignore_ascii_case("nccl") {
            match c10d_nccl::check_available() {
                Err(e) => e.to_string(),
                Ok(_) => "NCCL is present but unusable".to_string(),
            }
        } else {
            "it is not a backend of this build".to_string()
        };
        return Err(format!(
            "backend '{}' is not available: {why}; use --backend gloo",
            args.backend
        ));
    }
    Ok(())
}

/// `--nproc N`: host the store and run N copies of this program as the ranks.
fn launch(args: &Args, n: usize) -> i32 {
    if n == 0 {
        eprintln!("c10d-bench: --nproc must be at least 1");
        return 1;
    }
    if let Err(e) = validate(args) {
        eprintln!("c10d-bench: {e}");
        return 1;
    }
    let server = match TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        world_size: Some(n),
        ..Default::default()
    }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("c10d-bench: cannot start the store: {e}");
            return 1;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("c10d-bench: cannot find my own executable: {e}");
            return 1;
        }
    };
    let Some(children) = spawn_ranks(&exe, n, server.port(), nccl_shares_gpus(args, n)) else {
        return 1;
    };
    let code = wait_ranks(children);
    drop(server);
    code
}

/// Whether `--backend nccl --nproc n` puts several ranks on one GPU.
fn nccl_shares_gpus(args: &Args, n: usize) -> bool {
    bench_device(args).is_some() && n > c10d_nccl::cuda_device_count().max(1)
}

/// Starts the `n` ranks (this program with the same arguments but `--nproc`, torchrun's
/// environment, SIGKILL when the launcher dies); `None` (the started ones killed) when one
/// cannot start. With `share_gpu`, each rank poses as its own host for NCCL.
fn spawn_ranks(
    exe: &std::path::Path,
    n: usize,
    port: u16,
    share_gpu: bool,
) -> Option<Vec<std::process::Child>> {
    // Same arguments without --nproc.
    let mut child_args = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--nproc" {
            it.next();
        } else if !a.starts_with("--nproc=") {
            child_args.push(a);
        }
    }
    let mut children = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(exe);
        cmd.args(&child_args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TORCHELASTIC_USE_AGENT_STORE", "True");
        if share_gpu {
            // More ranks than GPUs: NCCL refuses two ranks on one GPU of one host, so each
            // rank poses as its own host and NCCL joins them through its socket transport.
            cmd.env("NCCL_HOSTID", format!("c10d-bench-rank-{rank}"))
                .env("NCCL_SOCKET_IFNAME", "lo")
                // The socket transport, as the suite says: not an InfiniBand loopback.
                .env("NCCL_NET", "Socket")
                .env("NCCL_IB_DISABLE", "1");
        }
        die_with_parent(&mut cmd);
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("c10d-bench: cannot start rank {rank}: {e}");
                for c in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return None;
            }
        }
    }
    Some(children)
}

/// Waits for all ranks; when one fails, stops the others (they would wait for it forever).
/// Returns the exit status: 0 when every rank succeeded.
fn wait_ranks(mut children: Vec<std::process::Child>) -> i32 {
    let n = children.len();
    let mut code = 0;
    let mut left = n;
    let mut done = vec![false; n];
    while left > 0 {
        for (rank, c) in children.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(st)) => {
                    done[rank] = true;
                    left -= 1;
                    if !st.success() && code == 0 {
                        eprintln!(
                            "c10d-bench: rank {rank} failed ({st}); stopping the other ranks"
                        );
                        code = 1;
                    }
                }
                Ok(None) if code != 0 => {
                    let _ = c.kill();
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("c10d-bench: waiting for rank {rank}: {e}");
                    let _ = c.kill();
                    code = 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    code
}

/// Element access through f64 for every supported dtype.
trait Num: c10d_core::Element {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}
macro_rules! num_prim {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn from_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
        }
    )*};
}
num_prim!(f32, f64, i8, u8, i16, i32, i64);
impl Num for bool {
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
}
impl Num for half::f16 {
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}
impl Num for half::bf16 {
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
}

/// Calls `$body` with `T` bound to the Rust type of `$dtype`.
macro_rules! with_type {
    ($dtype:expr, $f:ident ( $($a:expr),* )) => {
        match $dtype {
            DType::F32 => $f::<f32>($($a),*),
            DType::F64 => $f::<f64>($($a),*),
            DType::F16 => $f::<half::f16>($($a),*),
            DType::BF16 => $f::<half::bf16>($($a),*),
            DType::I8 => $f::<i8>($($a),*),
            DType::U8 => $f::<u8>($($a),*),
            DType::I16 => $f::<i16>($($a),*),
            DType::I32 => $f::<i32>($($a),*),
            DType::I64 => $f::<i64>($($a),*),
            DType::Bool => $f::<bool>($($a),*),
            other => Err(DistError::invalid(format!("dtype {other} is not supported by c10d-bench"))),
        }
    };
}

/// The input of rank `r` at element `i`: a small integer, exact in every dtype.
fn value(redop: ReduceOp, dtype: DType, r: usize, i: usize) -> f64 {
    if dtype == DType::Bool {
        return ((r + i) % 2) as f64;
    }
    match redop {
        // Products stay small: 1 or 2.
        ReduceOp::Product => (1 + (r + i) % 2) as f64,
        _ => (1 + (r * 7 + i) % 5) as f64,
    }
}

/// The reduction of `vals` as the backend computes it (in f64, then rounded to the dtype).
fn reduce_expected(
    redop: ReduceOp,
    dtype: DType,
    vals: impl Iterator<Item = f64> + Clone,
    n: usize,
) -> f64 {
    match redop {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Avg => {
            let s: f64 = vals.sum();
            if dtype.is_integral(true) {
                (s / n as f64).trunc()
            } else {
                s / n as f64
            }
        }
        ReduceOp::Product => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Band => vals.map(|v| v as i64).fold(-1i64, |a, b| a & b) as f64,
        ReduceOp::Bor => vals.map(|v| v as i64).fold(0i64, |a, b| a | b) as f64,
        ReduceOp::Bxor => vals.map(|v| v as i64).fold(0i64, |a, b| a ^ b) as f64,
        ReduceOp::PremulSum(f) => vals.map(|v| v * f).sum(),
    }
}

fn fill_typed<T: Num>(t: &Tensor, f: &dyn Fn(usize) -> f64) -> Result<()> {
    t.write(|s: &mut [T]| {
        for (i, x) in s.iter_mut().enumerate() {
            *x = T::from_f64(f(i));
        }
    })
}

fn count_wrong_typed<T: Num>(t: &Tensor, expected: &dyn Fn(usize) -> f64, tol: f64) -> Result<u64> {
    t.read(|s: &[T]| {
        s.iter()
            .enumerate()
            .filter(|(i, x)| {
                let want = T::from_f64(expected(*i)).to_f64();
                let got = x.to_f64();
                // NaN counts as wrong.
                !matches!(
                    (got - want).abs().partial_cmp(&(tol * want.abs().max(1.0))),
                    Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
                )
            })
            .count() as u64
    })
}

fn read_first<T: Num>(t: &Tensor) -> Result<f64> {
    t.read(|s: &[T]| s[0].to_f64())
}

/// Fills `t` (a CUDA tensor through a host copy) with `f(i)`.
fn fill(t: &Tensor, f: &dyn Fn(usize) -> f64) -> Result<()> {
    if !t.is_cpu() {
        let host = Tensor::zeros(t.dtype(), t.shape());
        with_type!(t.dtype(), fill_typed(&host, f))?;
        return t.copy_from(&host);
    }
    with_type!(t.dtype(), fill_typed(t, f))
}

fn count_wrong(t: &Tensor, expected: &dyn Fn(usize) -> f64) -> Result<u64> {
    let tol = match t.dtype() {
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    };
    let t = t.to_cpu()?;
    with_type!(t.dtype(), count_wrong_typed(&t, expected, tol))
}

/// Buffers of one size, with the operation and its checker.
struct Case {
    op: Op,
    redop: ReduceOp,
    dtype: DType,
    rank: usize,
    n: usize,
    /// Element count reported (see module docs).
    count: usize,
    input: Tensor,
    output: Tensor,
}

/// The buffers' device: `cuda:<LOCAL_RANK % GPUs>` for `--backend nccl`, else the CPU.
fn bench_device(args: &Args) -> Option<c10d_core::Device> {
    if !args.backend.eq_ignore_ascii_case("nccl") {
        return None;
    }
    let local: usize = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let gpus = c10d_nccl::cuda_device_count().max(1);
    Some(c10d_core::Device::Cuda((local % gpus) as u32))
}

/// A zero tensor on the bench device.
fn zeros(args: &Args, len: usize) -> Result<Tensor> {
    match bench_device(args) {
        Some(d) => c10d_nccl::memory::zeros(args.dtype, &[len], d),
        None => Ok(Tensor::zeros(args.dtype, &[len])),
    }
}

/// Waits for the device work queued on the caller's stream (nothing to do on the CPU).
fn sync_device(args: &Args) -> Result<()> {
    match bench_device(args) {
        Some(d) => c10d_nccl::stream::current_stream(d)?
            .synchronize()
            .map_err(|e| DistError::backend(format!("cuStreamSynchronize: {e:?}"))),
        None => Ok(()),
    }
}

impl Case {
    fn new(args: &Args, rank: usize, n: usize, bytes: usize) -> Result<Case> {
        let es = args.dtype.size();
        let mut count = (bytes / es).max(1);
        if args.op.needs_divisible() {
            count = (count / n).max(1) * n;
        }
        let (in_len, out_len) = match args.op {
            Op::AllReduce | Op::Broadcast | Op::Reduce => (count, 0),
            Op::AllGather => (count / n, count),
            Op::ReduceScatter => (count, count / n),
            Op::AllToAll | Op::Sendrecv => (count, count),
        };
        Ok(Case {
            op: args.op,
            redop: args.redop,
            dtype: args.dtype,
            rank,
            n,
            count,
            input: zeros(args, in_len)?,
            output: zeros(args, out_len)?,
        })
    }

    fn run(&self) -> Result<()> {
        let (r, n) = (self.rank, self.n);
        match self.op {
            Op::AllReduce => dist::all_reduce(&self.input).op(self.redop).run(),
            Op::AllGather => dist::all_gather_into_tensor(&self.output, &self.input).run(),
            Op::ReduceScatter => {
                let rs = dist::reduce_scatter_tensor(&self.output, &self.input);
                rs.op(self.redop).run()
            }
            Op::Broadcast => dist::broadcast(&self.input, 0).run(),
            Op::Reduce => dist::reduce(&self.input, 0).op(self.redop).run(),
            Op::AllToAll => dist::all_to_all_single(&self.output, &self.input).run(),
            Op::Sendrecv => {
                if n == 1 {
                    return self.output.copy_from(&self.input);
                }
                let to = (r + 1) % n;
                let from = (r + n - 1) % n;
                if !self.input.is_cpu() {
                    // NCCL: the pair as one group, as batch_isend_irecv runs it.
                    let ops = [
                        dist::P2POp::isend(self.input.clone(), to),
                        dist::P2POp::irecv(self.output.clone(), from),
                    ];
                    return dist::batch_isend_irecv(&ops)?
                        .iter()
                        .try_for_each(Work::wait);
                }
                let s = dist::isend(&self.input, to).start()?;
                let rv = dist::irecv(&self.output).src(from).start()?;
                rv.wait()?;
                s.wait()
            }
        }
    }

    /// Fresh inputs for the check run.
    fn prepare(&self) -> Result<()> {
        let (r, redop, dtype) = (self.rank, self.redop, self.dtype);
        match self.op {
            Op::AllGather => {
                let c = self.input.numel();
                fill(&self.input, &|i| value(redop, dtype, r, r * c + i))
            }
            Op::Broadcast if r != 0 => fill(&self.input, &|i| value(redop, dtype, r + 3, i)),
            _ => fill(&self.input, &|i| value(redop, dtype, r, i)),
        }?;
        if self.output.numel() > 0 {
            fill(&self.output, &|_| 0.0)?;
        }
        Ok(())
    }

    /// Changes one element of this rank's checked result (see `C10D_BENCH_CORRUPT_RANK`).
    fn corrupt(&self) -> Result<()> {
        let t = match self.op {
            Op::AllReduce | Op::Broadcast | Op::Reduce => &self.input,
            _ => &self.output,
        };
        let last = t.numel() - 1;
        let cell = t.flat_slice(last, 1)?;
        let old = with_type!(t.dtype(), read_first(&cell))?;
        fill(&cell, &|_| if old == 0.0 { 1.0 } else { 0.0 })
    }

    /// Wrong elements on this rank after a run on [`Case::prepare`]d inputs.
    fn wrong(&self) -> Result<u64> {
        let (r, n, redop, dtype) = (self.rank, self.n, self.redop, self.dtype);
        let red = |i: usize| {
            reduce_expected(
                redop,
                dtype,
                (0..n).map(move |k| value(redop, dtype, k, i)),
                n,
            )
        };
        match self.op {
            Op::AllReduce => count_wrong(&self.input, &red),
            Op::Reduce if r == 0 => count_wrong(&self.input, &red),
            Op::Reduce => Ok(0),
            Op::Broadcast => count_wrong(&self.input, &|i| value(redop, dtype, 0, i)),
            Op::AllGather => {
                let c = self.input.numel();
                count_wrong(&self.output, &|i| value(redop, dtype, i / c, i))
            }
            Op::ReduceScatter => {
                let c = self.output.numel();
                count_wrong(&self.output, &|j| red(r * c + j))
            }
            Op::AllToAll => {
                let c = self.count / n;
                // Chunk k of my output is chunk r of rank k's input.
                count_wrong(&self.output, &|i| value(redop, dtype, i / c, r * c + i % c))
            }
            Op::Sendrecv => {
                let from = (r + n - 1) % n;
                count_wrong(&self.output, &|i| value(redop, dtype, from, i))
            }
        }
    }
}

fn run_rank(args: &Args) -> Result<bool> {
    validate(args).map_err(DistError::invalid)?;
    if std::env::var_os("RANK").is_none() || std::env::var_os("WORLD_SIZE").is_none() {
        return Err(DistError::invalid("RANK/WORLD_SIZE not set: run under c10drun (or another env:// launcher), or pass --nproc N"));
    }
    // Test hook: this rank corrupts one element of its result before the check, to prove that
    // the check sees it.
    let corrupt_rank: Option<usize> = std::env::var("C10D_BENCH_CORRUPT_RANK")
        .ok()
        .and_then(|v| v.parse().ok());
    let timeout = Duration::from_secs(args.timeout);
    let nccl = args.backend.eq_ignore_ascii_case("nccl");
    dist::init_process_group(dist::InitOptions {
        // NCCL: CUDA buffers; the timing and check reductions use CPU tensors through gloo.
        backend: Some(if nccl {
            "cpu:gloo,cuda:nccl".into()
        } else {
            args.backend.clone()
        }),
        device_id: bench_device(args),
        timeout: Some(timeout),
        ..Default::default()
    })?;
    if let Some(d) = bench_device(args) {
        // Ops are queued on a stream of our own, as nccl-tests does: declared, so each op is
        // ordered after it (not after the whole device; see c10d_nccl::stream).
        let s = c10d_nccl::device::context(d)?
            .new_stream()
            .map_err(|e| DistError::backend(format!("cuStreamCreate: {e:?}")))?;
        c10d_nccl::stream::set_current_stream(d, Some(s))?;
    }
    let rank = dist::get_rank(None)? as usize;
    let n = dist::get_world_size(None)? as usize;
    let lead = rank == 0;
    let redop_col = if args.op.reduces() {
        redop_name(args.redop)
    } else {
        "none".into()
    };
    if lead {
        print_header(args, n, &redop_col);
    }
    let mut total_wrong = 0u64;
    let mut busbw_sum = 0f64;
    let mut rows = 0usize;
    let mut bytes = args.min_bytes.max(1);
    loop {
        let case = Case::new(args, rank, n, bytes)?;
        let size = case.count * args.dtype.size();
        let (secs, steady) = time_case(args, &case, size)?;
        let wrong = if args.check == 1 {
            check_case(args, &case, corrupt_rank == Some(rank))?
        } else {
            0
        };
        total_wrong += wrong;
        let algbw = size as f64 / secs / 1e9;
        let busbw = algbw * args.op.bus_factor(n);
        busbw_sum += busbw;
        rows += 1;
        if lead {
            let wrong_col = (args.check == 1).then_some(wrong);
            print_row(args, &case, size, &redop_col, secs, n, wrong_col);
            if !steady {
                println!(
                    "#   ({size} bytes: timings not steady after {} ms of warm-up)",
                    args.warmup_max_ms
                );
            }
        }
        match bytes.checked_mul(args.factor) {
            Some(b) if b <= args.max_bytes => bytes = b,
            _ => break,
        }
    }
    if lead {
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.3}",
            busbw_sum / rows.max(1) as f64
        );
    }
    dist::destroy_process_group(None)?;
    Ok(total_wrong == 0)
}

/// The table's header (nccl-tests' layout), printed by rank 0.
fn print_header(args: &Args, n: usize, redop_col: &str) {
    println!(
        "# c10d-bench {}: nranks {n}, backend {}, dtype {}, redop {}, warmup {}, iters {}, check {}",
        args.op.name(),
        args.backend,
        args.dtype.short_name(),
        redop_col,
        args.warmup,
        args.iters.map(|i| i.to_string()).unwrap_or_else(|| "auto".into()),
        args.check
    );
    if steady_warm_up(args) {
        println!(
            "# warm-up: {} iterations, then blocks for at least {} ms and until two consecutive blocks' median times agree within {:.0}% on every rank (at most {} ms per size)",
            args.warmup,
            WARMUP_MIN_SECS * 1e3,
            STEADY * 100.0,
            args.warmup_max_ms
        );
    }
    println!(
        "# time: mean per iteration, max over ranks; algbw = size/time; busbw = algbw x {:.4}",
        args.op.bus_factor(n)
    );
    println!("#");
    println!(
        "# {:>10} {:>12} {:>8} {:>6} {:>11} {:>11} {:>11} {:>8}",
        "size", "count", "type", "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"
    );
}

/// One row of the table: size, count, dtype, redop, time, bandwidths and wrong elements
/// ("N/A" unchecked).
fn print_row(
    args: &Args,
    case: &Case,
    size: usize,
    redop_col: &str,
    secs: f64,
    n: usize,
    wrong: Option<u64>,
) {
    let algbw = size as f64 / secs / 1e9;
    let busbw = algbw * args.op.bus_factor(n);
    let wrong_col = wrong.map_or_else(|| "N/A".to_string(), |w| w.to_string());
    println!(
        "  {:>10} {:>12} {:>8} {:>6} {:>11.2} {:>11.3} {:>11.3} {:>8}",
        size,
        case.count,
        args.dtype.short_name(),
        redop_col,
        secs * 1e6,
        algbw,
        busbw,
        wrong_col
    );
}

/// Seconds per iteration of `case` (`size` bytes) after the warm-up, the maximum over ranks,
/// and whether the warm-up reached steady timings.
fn time_case(args: &Args, case: &Case, size: usize) -> Result<(f64, bool)> {
    case.prepare()?;
    for _ in 0..args.warmup {
        case.run()?;
    }
    let (steady, median) = warm_up(args, case)?;
    let fixed = if size <= 64 << 10 {
        200
    } else if size >= 16 << 20 {
        10
    } else {
        20
    };
    let by_time = median.map_or(0.0, |m| (ROW_SECS / m.max(1e-9)).min(1e6)) as usize;
    let iters = args.iters.unwrap_or(fixed.max(by_time)).max(1);
    dist::barrier().run()?;
    sync_device(args)?;
    let t0 = Instant::now();
    for _ in 0..iters {
        case.run()?;
    }
    // Device ops only queue on the caller's stream (as nccl-tests launches them): wait for all.
    sync_device(args)?;
    let mine = t0.elapsed().as_secs_f64() / iters as f64;
    let t = Tensor::from_vec(vec![mine]);
    dist::all_reduce(&t).op(ReduceOp::Max).run()?;
    Ok((t.to_vec::<f64>()?[0], steady))
}

/// Relative difference of two consecutive blocks' medians under which timings count as steady.
const STEADY: f64 = 0.05;
/// Shortest block of the warm-up until steady, in seconds.
const BLOCK_SECS: f64 = 0.002;
/// Shortest timed loop without `-n`, in seconds (from the warm-up's median).
const ROW_SECS: f64 = 0.1;
/// Shortest warm-up until steady, in seconds: a fresh job's ranks may share a core until the
/// scheduler moves one (tens of ms), a state steady enough to pass the test of the medians.
const WARMUP_MIN_SECS: f64 = 0.1;
/// Fewest `-n` iterations that get a warm-up until steady (fewer: a check, not a timing).
const TIMED_ITERS: usize = 20;

/// Whether sizes warm up until steady (see the module docs).
fn steady_warm_up(args: &Args) -> bool {
    args.warmup_max_ms > 0 && args.iters.is_none_or(|n| n >= TIMED_ITERS)
}

/// Runs blocks of `case` for at least [`WARMUP_MIN_SECS`] and until two consecutive blocks'
/// median times per iteration agree within [`STEADY`] on every rank (true) or `--warmup_max_ms` passed (false); with the last block's
/// median in seconds, the maximum over ranks (`None` without a warm-up until steady). Every rank
/// takes the same decisions: they come from values all-reduced (max) over the ranks after each
/// block.
fn warm_up(args: &Args, case: &Case) -> Result<(bool, Option<f64>)> {
    if !steady_warm_up(args) {
        return Ok((true, None));
    }
    let limit = args.warmup_max_ms as f64 / 1e3;
    let start = Instant::now();
    let (mut block, mut last) = (8usize, None::<f64>);
    let on_device = bench_device(args).is_some();
    loop {
        let mut times = Vec::with_capacity(block);
        let t0 = Instant::now();
        for _ in 0..block {
            let t = Instant::now();
            case.run()?;
            times.push(t.elapsed().as_secs_f64());
        }
        sync_device(args)?;
        let secs = t0.elapsed().as_secs_f64();
        let median = per_iteration(on_device, &mut times, secs);
        let change = last.map_or(f64::INFINITY, |l: f64| (median - l).abs() / l.max(1e-12));
        let elapsed = start.elapsed().as_secs_f64();
        let t = Tensor::from_vec(vec![change, secs, elapsed, median]);
        dist::all_reduce(&t).op(ReduceOp::Max).run()?;
        let [change, secs, elapsed, max_median] = t.to_vec::<f64>()?[..] else {
            return Err(DistError::backend("warm-up: 4 values expected"));
        };
        let steady = change <= STEADY && elapsed >= WARMUP_MIN_SECS;
        if steady || elapsed >= limit {
            return Ok((steady, Some(max_median)));
        }
        last = Some(median);
        if secs < BLOCK_SECS {
            block = (block * 2).min(1 << 20);
        }
    }
}

/// A warm-up block's time per iteration, in seconds: the median of `times` on the host; on a
/// device (`on_device`), where an op only queues (its host time says nothing of how long it runs), the
/// block's time up to the stream synchronize (`block_secs`) over its iterations. A host time
/// there let the timed loop queue thousands of ops whose last ones then waited past the
/// watchdog's timeout behind the others.
fn per_iteration(on_device: bool, times: &mut [f64], block_secs: f64) -> f64 {
    if on_device {
        return block_secs / times.len().max(1) as f64;
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// One checked run of `case` (this rank corrupting its result first when `corrupt`): the
/// number of wrong elements summed over ranks.
fn check_case(args: &Args, case: &Case, corrupt: bool) -> Result<u64> {
    case.prepare()?;
    dist::barrier().run()?;
    case.run()?;
    sync_device(args)?;
    if corrupt {
        case.corrupt()?;
    }
    let w = Tensor::from_vec(vec![case.wrong()? as i64]);
    dist::all_reduce(&w).run()?;
    Ok(w.to_vec::<i64>()?[0] as u64)
}
