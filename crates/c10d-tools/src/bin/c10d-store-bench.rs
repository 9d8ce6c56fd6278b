//! `c10d-store-bench`: our TCPStore server against PyTorch's, measured in one run.
//!
//! 1. Throughput: set+get pairs per second (a `get` is WAIT + GET, as in PyTorch) with 8 and 64
//!    concurrent clients, each its own connection. Load generators: our Rust client (one thread
//!    per client) and PyTorch's own Python client (one forked process per client).
//! 2. Rendezvous: N (default 4096) clients connect (VALIDATE + PING), `add` a counter, the one
//!    that brings it to N sets "go", every client waits on "go". Driven by a few threads that
//!    each own many connections (handshakes and WAITs pipelined per thread), not N OS threads.
//!
//! Both servers run as separate processes on 127.0.0.1 (ours: this binary re-executed with
//! `--serve-internal`; PyTorch's: `TCPStore(..., is_master=True)` in the torch python given by
//! `--python` or `C10D_TORCH_PYTHON`). RLIMIT_NOFILE is raised to the hard limit first.
//!
//! The last column is each server's CPU time (utime + stime from /proc) over a run divided by
//! the pairs served. Rendezvous runs are capped (`--rendezvous-cap-s`, default 60 s); a server
//! still unfinished then is shown as `>cap (joined/N)`.
//!
//! ```text
//! cargo run --release -p c10d-tools --bin c10d-store-bench -- [--python PY] [--seconds S]
//! ```

use c10d_store::tcp::protocol::{Request, VALIDATE_MAGIC};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use clap::Parser;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "c10d-store-bench",
    about = "TCPStore server throughput and rendezvous: ours vs PyTorch's"
)]
struct Args {
    /// Python with torch installed (default: env C10D_TORCH_PYTHON). Without it only our server is measured.
    #[arg(long)]
    python: Option<String>,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Client counts for the throughput runs.
    #[arg(long, value_delimiter = ',', default_values_t = vec![8usize, 64])]
    clients: Vec<usize>,
    /// Clients of the rendezvous run.
    #[arg(long, default_value_t = 4096)]
    rendezvous: usize,
    /// Threads driving the rendezvous clients.
    #[arg(long, default_value_t = 32)]
    rendezvous_threads: usize,
    /// Time cap of one rendezvous run, seconds (a server that has not finished by then is
    /// reported as "> cap" with the number of clients that got in).
    #[arg(long, default_value_t = 60.0)]
    rendezvous_cap_s: f64,
    /// Skip the Python-client throughput runs.
    #[arg(long)]
    no_python_clients: bool,
    /// Internal: run our server and print its port.
    #[arg(long, hide = true)]
    serve_internal: bool,
}

const PY_SERVER: &str = r#"
import sys
from datetime import timedelta
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
print(s.port, flush=True)
sys.stdin.read()
"#;

const PY_CLIENTS: &str = r#"
import multiprocessing as mp, sys, time
from datetime import timedelta
import torch.distributed as dist
port, n, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def work(i, bar, q):
    s = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=120))
    k = f"py{i}"
    bar.wait()
    end = time.time() + secs
    c = 0
    while time.time() < end:
        for _ in range(20):
            s.set(k, "x" * 32)
            s.get(k)
        c += 20
    q.put(c)
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    bar, q = ctx.Barrier(n + 1), ctx.Queue()
    ps = [ctx.Process(target=work, args=(i, bar, q)) for i in range(n)]
    for p in ps: p.start()
    bar.wait()
    t0 = time.time()
    tot = sum(q.get() for _ in ps)
    el = time.time() - t0
    for p in ps: p.join()
    print(tot / el, flush=True)
"#;

fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    r.rlim_cur
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_with_port(mut cmd: Command) -> Result<(Proc, u16), String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let out = child.stdout.take().expect("piped");
    let p = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = BufReader::new(out).read_line(&mut l);
        let _ = tx.send(l);
    });
    let l = rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| "server printed no port".to_string())?;
    let port = l
        .trim()
        .parse()
        .map_err(|_| format!("bad port line {l:?}"))?;
    Ok((p, port))
}

/// set+get pairs per second with `n` Rust clients.
fn rust_throughput(port: u16, n: usize, secs: f64) -> f64 {
    let stores: Vec<TcpStore> = (0..n)
        .map(|_| {
            TcpStore::new(
                "127.0.0.1",
                port,
                TcpStoreOptions {
                    timeout: Duration::from_secs(120),
                    ..Default::default()
                },
            )
            .expect("connect")
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let bar = Arc::new(Barrier::new(n + 1));
    let hs: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let (stop, total, bar) = (stop.clone(), total.clone(), bar.clone());
            std::thread::spawn(move || {
                let key = format!("rs{i}");
                let val = [b'x'; 32];
                bar.wait();
                let mut c = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    s.set(&key, &val).expect("set");
                    let v = s.get(&key).expect("get");
                    debug_assert_eq!(v.len(), 32);
                    c += 1;
                }
                total.fetch_add(c, Ordering::Relaxed);
            })
        })
        .collect();
    bar.wait();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().expect("client thread");
    }
    total.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

fn python_throughput(py: &str, port: u16, n: usize, secs: f64) -> Result<f64, String> {
    let out = Command::new(py)
        .args([
            "-c",
            PY_CLIENTS,
            &port.to_string(),
            &n.to_string(),
            &secs.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("python clients: {e}"))?;
    if !out.status.success() {
        return Err(format!("python clients failed: {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("python clients output: {e}"))
}

/// Outcome of a rendezvous run.
struct Rdv {
    secs: f64,
    /// Clients that connected and added before the cap.
    joined: usize,
    /// False when the time cap stopped it before every client joined.
    complete: bool,
}

/// The rendezvous: returns seconds from the first connect until every client saw "go".
fn rendezvous(port: u16, n: usize, threads: usize, cap: Duration) -> Result<Rdv, String> {
    let key = format!("/rdv{}", std::process::id());
    let joined = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deadline_hit = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let go = format!("{key}/go");
    let threads = threads.clamp(1, n);
    let bar = Arc::new(Barrier::new(threads + 1));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (key, go, bar, joined, hit) = (
                key.clone(),
                go.clone(),
                bar.clone(),
                joined.clone(),
                deadline_hit.clone(),
            );
            let mine = n / threads + usize::from(t < n % threads);
            let c = RdvClients {
                port,
                n,
                mine,
                key,
                go,
                start,
                cap,
                verbose: t == 0 && std::env::var_os("C10D_BENCH_VERBOSE").is_some(),
                joined,
                hit,
            };
            std::thread::spawn(move || -> std::io::Result<()> {
                bar.wait();
                c.run()
            })
        })
        .collect();
    bar.wait();
    let t0 = Instant::now();
    for h in hs {
        h.join()
            .map_err(|_| "rendezvous thread panicked".to_string())?
            .map_err(|e| format!("rendezvous client: {e}"))?;
    }
    let joined = joined.load(Ordering::Relaxed);
    Ok(Rdv {
        secs: t0.elapsed().as_secs_f64(),
        joined,
        complete: !deadline_hit.load(Ordering::Relaxed) && joined == n,
    })
}

/// One rendezvous thread's share of the clients.
struct RdvClients {
    port: u16,
    /// All clients of the rendezvous.
    n: usize,
    /// This thread's clients.
    mine: usize,
    key: String,
    go: String,
    start: Instant,
    cap: Duration,
    verbose: bool,
    joined: Arc<std::sync::atomic::AtomicUsize>,
    hit: Arc<AtomicBool>,
}

impl RdvClients {
    /// Connects this thread's clients one after the other, then waits for "go" on each.
    fn run(self) -> std::io::Result<()> {
        let RdvClients {
            port,
            n,
            mine,
            key,
            go,
            start,
            cap,
            verbose,
            joined,
            hit,
        } = self;
        let t0 = Instant::now();
        let mut hello = Request::Validate(VALIDATE_MAGIC).encode();
        Request::Ping(std::process::id()).encode_into(&mut hello);
        let add = Request::Add(key.clone().into_bytes(), 1).encode();
        let wait = Request::Wait(vec![go.clone().into_bytes()]).encode();
        let mut socks = Vec::with_capacity(mine);
        // Each client in turn: connect, handshake, add (what TCPStore's constructor and
        // `add` do), then park a WAIT on "go"; the last arrival sets "go".
        for _ in 0..mine {
            if start.elapsed() > cap || hit.load(Ordering::Relaxed) {
                hit.store(true, Ordering::Relaxed);
                return Ok(());
            }
            let mut s = TcpStream::connect(("127.0.0.1", port))?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(Duration::from_secs(300)))?;
            s.write_all(&hello)?;
            let mut b = [0u8; 4];
            s.read_exact(&mut b)?;
            s.write_all(&add)?;
            let mut b = [0u8; 8];
            s.read_exact(&mut b)?;
            if i64::from_le_bytes(b) == n as i64 {
                s.write_all(&Request::Set(go.clone().into_bytes(), b"1".to_vec()).encode())?;
            }
            s.write_all(&wait)?;
            joined.fetch_add(1, Ordering::Relaxed);
            socks.push(s);
        }
        if verbose {
            eprintln!(
                "  thread 0: {mine} clients connected, added and waiting after {:?}",
                t0.elapsed()
            );
        }
        while !hit.load(Ordering::Relaxed) && joined.load(Ordering::Relaxed) < n {
            std::thread::sleep(Duration::from_millis(1));
        }
        if hit.load(Ordering::Relaxed) {
            return Ok(());
        }
        for s in &mut socks {
            let mut b = [0u8; 1];
            s.read_exact(&mut b)?;
            if b[0] != 0 {
                return Err(std::io::Error::other("bad STOP_WAITING"));
            }
        }
        Ok(())
    }
}

/// CPU time (user + system) consumed so far by process `pid`.
fn proc_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state(0) ... utime(11) stime(12).
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(Duration::from_secs_f64(ticks as f64 / hz))
}

/// Runs `f` (returning pairs/s over `secs`) and also returns the server's CPU µs per pair.
fn with_cpu(pid: u32, secs: f64, f: impl FnOnce() -> Option<f64>) -> RateCpu {
    let c0 = proc_cpu(pid);
    let rate = f();
    let c1 = proc_cpu(pid);
    let per = match (rate, c0, c1) {
        (Some(r), Some(a), Some(b)) if r > 0.0 => Some((b - a).as_secs_f64() * 1e6 / (r * secs)),
        _ => None,
    };
    (rate, per)
}

/// (pairs/s, server CPU µs per pair) of one measurement.
type RateCpu = (Option<f64>, Option<f64>);

fn fmt_rate(x: Option<f64>) -> String {
    x.map_or("n/a".into(), |v| format!("{v:.0}"))
}

fn main() {
    let args = Args::parse();
    if args.serve_internal {
        serve_internal();
        return;
    }
    let nofile = raise_nofile();
    let py = args.python.clone().or_else(|| {
        std::env::var("C10D_TORCH_PYTHON")
            .ok()
            .filter(|s| !s.is_empty())
    });
    let exe = std::env::current_exe().expect("current exe");
    let mut ours_cmd = Command::new(exe);
    ours_cmd.arg("--serve-internal");
    let (ours, our_port) = spawn_with_port(ours_cmd).expect("start our server");
    let theirs = py.as_ref().map(|py| {
        let mut c = Command::new(py);
        c.args(["-c", PY_SERVER]);
        spawn_with_port(c).expect("start PyTorch's server")
    });
    let their_port = theirs.as_ref().map(|(_, p)| *p);
    eprintln!(
        "servers: ours on 127.0.0.1:{our_port}, PyTorch's on {}; RLIMIT_NOFILE={nofile}; {} s per throughput point",
        their_port.map_or("(none: no --python / C10D_TORCH_PYTHON)".into(), |p| format!("127.0.0.1:{p}")),
        args.seconds
    );
    let ours = Server {
        port: our_port,
        pid: ours.0.id(),
    };
    let theirs = theirs.as_ref().map(|(p, port)| Server {
        port: *port,
        pid: p.0.id(),
    });
    let rows = throughput_rows(&args, py.as_deref(), &ours, theirs.as_ref());
    eprintln!(
        "rendezvous: {} clients over {} threads ...",
        args.rendezvous, args.rendezvous_threads
    );
    let cap = Duration::from_secs_f64(args.rendezvous_cap_s);
    let o = rendezvous(our_port, args.rendezvous, args.rendezvous_threads, cap)
        .map_err(|e| eprintln!("ours: {e}"))
        .ok();
    let t = their_port.and_then(|p| {
        rendezvous(p, args.rendezvous, args.rendezvous_threads, cap)
            .map_err(|e| eprintln!("PyTorch's: {e}"))
            .ok()
    });
    print_throughput(rows);
    print_rendezvous(&args, &o, &t);
}

/// `--serve-internal`: our server on 127.0.0.1, its port on stdout, until stdin closes.
fn serve_internal() {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .expect("bind");
    println!("{}", srv.port());
    let _ = std::io::stdout().flush();
    let mut sink = String::new();
    let _ = std::io::stdin().read_to_string(&mut sink);
}

/// A server under test: its port and process id (for its CPU time).
struct Server {
    port: u16,
    pid: u32,
}

/// One throughput row: its name, then (pairs/s, CPU) for ours and for PyTorch's.
type Row = (String, RateCpu, RateCpu);

/// The set+get throughput rows: Rust clients, then Python clients when a python is given.
fn throughput_rows(
    args: &Args,
    py: Option<&str>,
    ours: &Server,
    theirs: Option<&Server>,
) -> Vec<Row> {
    let secs = args.seconds;
    let mut rows: Vec<Row> = Vec::new();
    for &n in &args.clients {
        eprintln!("rust clients: {n} ...");
        let o = with_cpu(ours.pid, secs, || Some(rust_throughput(ours.port, n, secs)));
        let t = match theirs {
            Some(s) => with_cpu(s.pid, secs, || Some(rust_throughput(s.port, n, secs))),
            None => (None, None),
        };
        rows.push((format!("set+get pairs/s, {n} Rust clients"), o, t));
    }
    let Some(py) = py.filter(|_| !args.no_python_clients) else {
        return rows;
    };
    let py_rate = |port: u16, n: usize| {
        python_throughput(py, port, n, secs)
            .map_err(|e| eprintln!("{e}"))
            .ok()
    };
    for &n in &args.clients {
        eprintln!("python clients: {n} ...");
        let o = with_cpu(ours.pid, secs, || py_rate(ours.port, n));
        let t = match theirs {
            Some(s) => with_cpu(s.pid, secs, || py_rate(s.port, n)),
            None => (None, None),
        };
        rows.push((format!("set+get pairs/s, {n} Python clients"), o, t));
    }
    rows
}

/// The throughput table (with its header).
fn print_throughput(rows: Vec<Row>) {
    println!(
        "{:<42} {:>14} {:>14} {:>20}   {:>22}",
        "benchmark", "ours", "PyTorch", "ratio ours/PyTorch", "server CPU us/pair o|P"
    );
    let us = |x: Option<f64>| x.map_or("n/a".into(), |v| format!("{v:.1}"));
    for (name, (o, ocpu), (t, tcpu)) in rows {
        let ratio = match (o, t) {
            (Some(o), Some(t)) if t > 0.0 => format!("{:.2}x", o / t),
            _ => "n/a".into(),
        };
        println!(
            "{name:<42} {:>14} {:>14} {ratio:>20}   {:>22}",
            fmt_rate(o),
            fmt_rate(t),
            format!("{} | {}", us(ocpu), us(tcpu))
        );
    }
}

/// The rendezvous row: seconds for ours and PyTorch's (">" when the cap stopped it).
fn print_rendezvous(args: &Args, o: &Option<Rdv>, t: &Option<Rdv>) {
    let show = |r: &Option<Rdv>| match r {
        None => "failed".to_string(),
        Some(r) if r.complete => format!("{:.3}", r.secs),
        Some(r) => format!(">{:.0} ({}/{})", r.secs, r.joined, args.rendezvous),
    };
    let ratio = match (o, t) {
        (Some(o), Some(t)) if o.complete && t.secs > 0.0 => {
            format!(
                "{}{:.4}x",
                if t.complete { "" } else { "<" },
                o.secs / t.secs
            )
        }
        _ => "n/a".into(),
    };
    println!(
        "{:<42} {:>14} {:>14} {ratio:>20}",
        format!(
            "rendezvous of {} clients, seconds (lower=better)",
            args.rendezvous
        ),
        show(o),
        show(t)
    );
}
