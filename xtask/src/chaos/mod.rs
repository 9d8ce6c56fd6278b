//! `cargo xtask chaos --trials N|each [--seed S] [--timeout SECS] [--kinds A,B]`: the
//! fault-injection harness (`each`: one trial of every kind; `cargo xtask test` runs that).
//!
//! Faults are injected at every layer a job can fail in; each layer is a module with its own
//! kinds and verdicts (see [`layer::Layer`]): `ranks` (a rank of a running `c10d-bench` job
//! killed, stopped, slowed, a connection closed, a link cut), `launcher` (a `c10drun` agent of
//! a 2-node job killed or stopped, the store's host killed), `elastic` (nodes joining and
//! leaving an elastic training job that checkpoints every step), `tls` (faults during the
//! store's TLS handshake and the job secret's challenge), `objects` (hostile pickles through
//! the object collectives) and `gpu` (c10d-nccl on the simulated CUDA and NCCL: a hang, an
//! async error, a dead rank, an abort, an init that never ends, in every
//! `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode). Every trial draws its kind
//! (seeded, `--seed`): each run of as many trials as there are kinds is a random order of all
//! kinds, so `N` trials draw every kind at least `N / kinds` times. `--kinds` keeps the kinds
//! whose names contain one of the given texts. Every trial checks what it leaves behind
//! (processes, temporary files, shared memory, sockets, namespaces). The summary prints, per
//! kind, its trials, passes and the time from the fault to the last survivor's error; the
//! last line reads `chaos: K of N trials ok (kind ×n, …)`, and the exit status is 1 when
//! K < N. A layer that cannot run here (no root for namespaces, say) is skipped, said so at
//! the start.

mod elastic;
mod gpu;
mod hosts;
mod inject;
mod job;
mod launcher;
mod layer;
mod leaks;
mod objects;
mod plan;
mod ranks;
mod report;
mod rng;
mod tls;
mod verdict;

/// Every op `c10d-bench` runs (its names).
pub use plan::OPS as BENCH_OPS;

use layer::{Ctx, Layer};
use std::path::PathBuf;
use std::time::Duration;

/// Options of a run.
struct Opts {
    /// `None`: one trial of each kind (`--trials each`).
    trials: Option<usize>,
    seed: u64,
    timeout: Duration,
    /// Texts a kind's name must contain one of (empty: every kind).
    kinds: Vec<String>,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        trials: Some(20),
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        timeout: Duration::from_secs(3),
        kinds: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let each = it.clone().next().is_some_and(|v| v == "each");
        let mut val = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a number"))
        };
        match a.as_str() {
            "--trials" if each => {
                o.trials = None;
                it.next();
            }
            "--trials" => o.trials = Some(val("--trials")? as usize),
            "--seed" => o.seed = val("--seed")?,
            "--timeout" => o.timeout = Duration::from_secs(val("--timeout")?.max(1)),
            "--kinds" => {
                let v = it.next().ok_or("--kinds needs a comma-separated list")?;
                o.kinds = v.split(',').map(str::to_string).collect();
            }
            other => {
                return Err(format!(
                    "chaos: unknown argument {other}; usage: cargo xtask chaos --trials N|each [--seed S] [--timeout SECS] [--kinds A,B]"
                ))
            }
        }
    }
    Ok(o)
}

/// Runs the harness ([`run`]).
///
/// # Errors
/// A failed trial, or [`run`]'s errors.
pub fn chaos(
    args: &[String],
    bench: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<(), String> {
    let failed = run(args, bench)?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("chaos: trials of {} failed", failed.join(", ")))
    }
}

/// Runs the harness; returns the kinds of which a trial failed (empty: every trial ok).
///
/// # Errors
/// Bad arguments, a binary that could not be built, no kind left by `--kinds`, or
/// namespaces left behind.
pub fn run(
    args: &[String],
    bench: impl FnOnce() -> Result<PathBuf, String>,
) -> Result<Vec<&'static str>, String> {
    let o = parse(args)?;
    let bench = bench()?;
    let ranks = ranks::Ranks::new(bench.clone());
    let namespaces = ranks.namespaces();
    let mut layers: Vec<Box<dyn Layer>> = vec![Box::new(ranks)];
    let wanted = |kinds: &[&str]| {
        o.kinds.is_empty()
            || kinds
                .iter()
                .any(|k| o.kinds.iter().any(|f| k.contains(f.as_str())))
    };
    // The other layers build their programs only when one of their kinds is wanted.
    add(&mut layers, "launcher", wanted(&launcher::KINDS), || {
        launcher::Launcher::new(
            bench.clone(),
            built(&["-p", "c10d-run", "--bin", "c10drun"], "c10drun"),
        )
    });
    add(&mut layers, "elastic", wanted(&elastic::KINDS), || {
        elastic::Elastic::new(
            built(&["-p", "c10d-run", "--bin", "c10drun"], "c10drun"),
            built(
                &["-p", "c10d-ddp", "--example", "ddp_elastic"],
                "examples/ddp_elastic",
            ),
        )
    });
    add(&mut layers, "gpu", wanted(&gpu::KIND_NAMES), gpu::Gpu::new);
    layers.push(Box::new(objects::Objects::new()));
    layers.push(Box::new(tls::Tls::new()));
    let kinds = kinds_of(&layers, &o.kinds);
    if kinds.is_empty() {
        return Err(format!("chaos: no fault kind matches {:?}", o.kinds));
    }
    let trials = o.trials.unwrap_or(kinds.len());
    println!(
        "chaos: {} trials, seed {}, op timeout {} s, {} kinds",
        trials,
        o.seed,
        o.timeout.as_secs(),
        kinds.len()
    );
    // Logs of an earlier run would be mistaken for this one's.
    let _ = std::fs::remove_dir_all("target/chaos");
    let _ = std::fs::create_dir_all("target/chaos");
    let logs = std::fs::canonicalize("target/chaos").map_err(|e| format!("target/chaos: {e}"))?;
    let mut rng = rng::Rng::new(o.seed);
    let mut tally = report::Tally::default();
    let mut order = Vec::new();
    for t in 0..trials {
        if order.is_empty() {
            order = shuffled(&kinds, &mut rng);
        }
        let (l, kind) = order.pop().expect("refilled above");
        let mut ctx = Ctx {
            trial: t,
            rng: &mut rng,
            timeout: o.timeout,
            logs: logs.clone(),
        };
        let out = layers[l].trial(kind, &mut ctx);
        report::trial_line(t, kind, &out, &logs);
        tally.add(kind, out.problems.is_empty(), out.detect.into_iter());
    }
    drop(layers);
    tally.print(o.timeout);
    let left: Vec<String> = hosts::list()
        .into_iter()
        .filter(|n| namespaces.contains(n))
        .collect();
    println!(
        "chaos: {} of {trials} trials ok ({})",
        tally.passed(),
        tally.counts()
    );
    if !left.is_empty() {
        return Err(format!(
            "chaos: namespaces left behind: {}",
            left.join(", ")
        ));
    }
    Ok(tally.failed())
}

/// Adds the layer `make` builds when `wanted`, or says why it is skipped.
fn add<L: Layer + 'static>(
    layers: &mut Vec<Box<dyn Layer>>,
    name: &str,
    wanted: bool,
    make: impl FnOnce() -> Result<L, String>,
) {
    if !wanted {
        return;
    }
    match make() {
        Ok(l) => layers.push(Box::new(l)),
        Err(why) => println!("chaos: {name} layer skipped: {why}"),
    }
}

/// Builds `cargo build ARGS` and returns `target/debug/<path>`.
fn built(args: &[&str], path: &str) -> Result<PathBuf, String> {
    crate::run(crate::cargo().arg("build").args(args))?;
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::fs::canonicalize(format!("{target}/debug/{path}"))
        .map_err(|e| format!("{path} not built: {e}"))
}

/// (layer index, kind) of every kind of every layer that `filter` keeps.
fn kinds_of(layers: &[Box<dyn Layer>], filter: &[String]) -> Vec<(usize, &'static str)> {
    let keep = |k: &str| filter.is_empty() || filter.iter().any(|f| k.contains(f.as_str()));
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.kinds().into_iter().map(move |k| (i, k)))
        .filter(|(_, k)| keep(k))
        .collect()
}

/// `kinds` in a random order (Fisher–Yates).
fn shuffled<T: Copy>(kinds: &[T], rng: &mut rng::Rng) -> Vec<T> {
    let mut v = kinds.to_vec();
    for i in (1..v.len()).rev() {
        v.swap(i, rng.range(0, i as u64) as usize);
    }
    v
}
