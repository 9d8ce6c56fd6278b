//! The summary of a chaos run: per fault kind, trials ok and the distribution of detection
//! times (min / median / p90 / max over every survivor of every trial of that kind).

use super::layer::TrialOut;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Results gathered over the run.
#[derive(Default)]
pub struct Tally {
    /// kind -> (trials, ok trials, detection times of every survivor).
    kinds: BTreeMap<&'static str, (usize, usize, Vec<Duration>)>,
}

impl Tally {
    /// Records one trial.
    pub fn add(&mut self, kind: &'static str, ok: bool, detect: impl Iterator<Item = Duration>) {
        let e = self.kinds.entry(kind).or_default();
        e.0 += 1;
        e.1 += usize::from(ok);
        e.2.extend(detect);
    }

    /// Prints the table.
    pub fn print(&self, timeout: Duration) {
        println!();
        println!(
            "chaos: detection time (fault -> survivor's error), ms; op timeout {} ms",
            timeout.as_millis()
        );
        println!(
            "  {:<34} {:>7} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8}",
            "fault", "trials", "ok", "samples", "min", "median", "p90", "max"
        );
        for (kind, (n, ok, d)) in &self.kinds {
            let mut ms: Vec<f64> = d.iter().map(|x| x.as_secs_f64() * 1e3).collect();
            ms.sort_by(f64::total_cmp);
            let q = |p: f64| -> String {
                if ms.is_empty() {
                    return "-".into();
                }
                let i = ((ms.len() - 1) as f64 * p).round() as usize;
                format!("{:.1}", ms[i])
            };
            println!(
                "  {:<34} {:>7} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8}",
                kind,
                n,
                ok,
                ms.len(),
                q(0.0),
                q(0.5),
                q(0.9),
                q(1.0)
            );
        }
    }
}

impl Tally {
    /// The kinds of which a trial failed.
    pub fn failed(&self) -> Vec<&'static str> {
        self.kinds
            .iter()
            .filter(|(_, (n, ok, _))| ok < n)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Trials that passed, over every kind.
    pub fn passed(&self) -> usize {
        self.kinds.values().map(|(_, ok, _)| ok).sum()
    }

    /// `kind ×n, …`: how often each kind was drawn.
    pub fn counts(&self) -> String {
        let v: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, (n, _, _))| format!("{k} ×{n}"))
            .collect();
        v.join(", ")
    }
}

/// Prints trial `t`'s line (its kind and what was drawn); a failed trial's problems too, its log kept under `logs`.
pub fn trial_line(t: usize, kind: &str, out: &TrialOut, logs: &Path) {
    let good = out.problems.is_empty();
    let worst = out
        .detect
        .iter()
        .max()
        .map(|d| format!("{} ms", d.as_millis()));
    println!(
        "trial {t:>3} {}  [{kind}] {}; detected in {}",
        if good { "ok  " } else { "FAIL" },
        out.desc,
        worst.unwrap_or_else(|| "-".into())
    );
    if good {
        return;
    }
    let log = logs.join(format!("trial-{t}.log"));
    let _ = std::fs::write(&log, &out.log);
    for p in &out.problems {
        println!("    {}", p.lines().next().unwrap_or(""));
    }
    println!("    (output of every process: {})", log.display());
}
