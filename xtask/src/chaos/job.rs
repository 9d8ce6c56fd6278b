//! One multi-process job: `c10d-bench` ranks started directly with env:// variables (rank 0
//! hosts the store), each in its host namespace when the trial uses two, with every output
//! line kept with the instant it was read.

use super::hosts;
use super::plan::{FaultKind, Plan};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Output lines of one rank, with the instant each was read.
pub type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

/// One rank process.
pub struct Rank {
    pub child: Child,
    pub pid: i32,
    pub lines: Lines,
    /// Exit status once reaped: `Some(code)`, `None` when killed by a signal.
    pub exit: Option<Option<i32>>,
    pub exited_at: Option<Instant>,
    /// The signal that ended it, once reaped (SIGKILL when [`kill_all`] ended it).
    pub signal: Option<i32>,
    /// The threads reading its stdout and stderr (joined once it exited, so that its last
    /// lines are in `lines` before anyone judges them).
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// The environment marker every rank of trial `t` carries (found again by the leak check).
pub fn marker(trial: usize) -> String {
    format!("{}-{trial}", std::process::id())
}

/// Iterations of the job: endless for fatal faults, enough to outlast the fault otherwise.
fn iters(plan: &Plan) -> usize {
    match plan.kind {
        // About a second or more: ~50 µs per op plus ~0.5 ns per byte (debug build).
        FaultKind::Slow => (1_000_000_000 / (50_000 + plan.size / 2)).max(100),
        _ => 1 << 30,
    }
}

/// Where and how the ranks of one trial run.
pub struct Setup<'a> {
    /// The `c10d-bench` binary.
    pub bench: &'a Path,
    /// The two host namespaces, when the harness has them.
    pub ns: Option<&'a [String; 2]>,
    /// Rank 0's store port.
    pub port: u16,
    /// The op timeout, seconds.
    pub timeout_s: u64,
    /// The ranks' private `TMPDIR`.
    pub tmp: &'a Path,
    /// Where their flight-recorder dumps go (`TORCH_FR_DUMP_TEMP_FILE`).
    pub fr_prefix: &'a Path,
    /// The trial's number.
    pub trial: usize,
}

/// Starts every rank of `plan`'s job.
///
/// # Errors
/// A rank that cannot be started (the others are killed).
pub fn start(plan: &Plan, s: &Setup) -> Result<Vec<Rank>, String> {
    let (bench, ns, port, timeout_s, tmp, fr_prefix, trial) = (
        s.bench,
        s.ns,
        s.port,
        s.timeout_s,
        s.tmp,
        s.fr_prefix,
        s.trial,
    );
    let master = match plan.split {
        Some(_) => hosts::addr(0),
        None => "127.0.0.1".into(),
    };
    let mut ranks: Vec<Rank> = Vec::new();
    for r in 0..plan.world {
        let mut cmd = match (plan.host_of(r), ns) {
            (Some(h), Some(ns)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns[h]]).arg(bench);
                c
            }
            _ => Command::new(bench),
        };
        let size = plan.size.to_string();
        let n = iters(plan).to_string();
        let t = timeout_s.to_string();
        // No warm-up until steady: the trials' timing bounds count the ops they run.
        cmd.args([plan.op, "-b", &size, "-e", &size, "-n", &n, "-w", "1"])
            .args(["--warmup_max_ms", "0", "--timeout", &t])
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", plan.world.to_string())
            .env("LOCAL_WORLD_SIZE", plan.world.to_string())
            .env("MASTER_ADDR", &master)
            .env("MASTER_PORT", port.to_string())
            .env("C10D_GLOO_TCP_ONLY", if plan.tcp_only { "1" } else { "0" })
            .env("C10D_CHAOS_TRIAL", marker(trial))
            .env("TMPDIR", tmp)
            .env("TORCH_FR_DUMP_TEMP_FILE", fr_prefix)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match spawn(&mut cmd) {
            Ok(rank) => ranks.push(rank),
            Err(e) => {
                kill_all(&mut ranks);
                return Err(format!("cannot start rank {r}: {e}"));
            }
        }
    }
    Ok(ranks)
}

/// Starts `cmd` with its stdout and stderr read into the rank's lines (stdin closed).
///
/// # Errors
/// The spawn's.
pub fn spawn(cmd: &mut Command) -> std::io::Result<Rank> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let lines: Lines = Arc::default();
    let readers = vec![
        read_lines(child.stdout.take().expect("piped"), lines.clone()),
        read_lines(child.stderr.take().expect("piped"), lines.clone()),
    ];
    let pid = child.id() as i32;
    Ok(Rank {
        child,
        pid,
        lines,
        exit: None,
        exited_at: None,
        signal: None,
        readers,
    })
}

fn read_lines(src: impl Read + Send + 'static, lines: Lines) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut buf = Vec::new();
        while let Ok(n) = r.read_until(b'\n', &mut buf) {
            if n == 0 {
                return;
            }
            let s = String::from_utf8_lossy(&buf).trim_end().to_string();
            lines.lock().expect("lines").push((Instant::now(), s));
            buf.clear();
        }
    })
}

impl Rank {
    /// The first line containing `needle`, with its instant.
    pub fn line_with(&self, needle: &str) -> Option<(Instant, String)> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .find(|(_, l)| l.contains(needle))
            .cloned()
    }

    /// Reaps the rank if it has exited; true once it has.
    pub fn poll(&mut self) -> bool {
        if self.exit.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exit = Some(st.code());
                self.signal = std::os::unix::process::ExitStatusExt::signal(&st);
                self.exited_at = Some(Instant::now());
                self.join_readers();
            }
        }
        self.exit.is_some()
    }

    /// Waits until everything the exited rank wrote is in `lines` (its pipes are at EOF).
    fn join_readers(&mut self) {
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }

    /// Sends `sig` unless the rank was reaped already.
    pub fn signal(&self, sig: i32) {
        if self.exit.is_none() {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(self.pid, sig) };
        }
    }

    /// Everything the rank printed.
    pub fn output(&self) -> String {
        let l = self.lines.lock().expect("lines");
        l.iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Waits until `ranks` (by index) have all exited or `deadline` passes; true if they exited.
pub fn wait(ranks: &mut [Rank], which: &[usize], deadline: Instant) -> bool {
    loop {
        let mut all = true;
        for &i in which {
            all &= ranks[i].poll();
        }
        if all {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGKILLs and reaps every rank still running (stopped ones included).
pub fn kill_all(ranks: &mut [Rank]) {
    for r in ranks.iter_mut() {
        if !r.poll() {
            r.signal(libc::SIGKILL);
            let _ = r.child.wait();
            r.exit = Some(None);
            r.signal = Some(libc::SIGKILL);
            r.join_readers();
        }
    }
}
