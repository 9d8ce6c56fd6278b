//! What every layer of the harness provides: its fault kinds, and one trial of a kind. The
//! run ([`super::chaos`]) draws a kind per trial from every layer available here (seeded),
//! tallies each kind's verdicts and detection times, and prints the summary.
//!
//! A layer is one place a job can fail: the ranks of a `c10d-bench` job (`ranks`), the
//! launcher, elastic membership, TLS and authentication, hostile objects, the simulated GPU.
//! Each trial checks what it leaves behind (processes, shared memory, temporary files,
//! sockets, namespaces, store keys) and reports it as a problem.

use super::rng::Rng;
use std::path::PathBuf;
use std::time::Duration;

/// What a trial gets from the run.
pub struct Ctx<'a> {
    /// The trial's index (for its marker, its log and temp-dir names).
    pub trial: usize,
    /// The run's seeded generator: draw everything random from it.
    pub rng: &'a mut Rng,
    /// The op timeout the run was given (`--timeout`).
    pub timeout: Duration,
    /// `target/chaos` (absolute): where a trial may keep logs and dumps.
    pub logs: PathBuf,
}

/// What one trial found.
#[derive(Debug, Default)]
pub struct TrialOut {
    /// One line saying what was drawn (job, victim, when).
    pub desc: String,
    /// Empty when the trial passed; else one line per problem (hang, wrong verdict, leak).
    pub problems: Vec<String>,
    /// Time from the fault to each survivor's error (or to the outcome the kind expects).
    pub detect: Vec<Duration>,
    /// Output of every process of the trial, kept when it failed.
    pub log: String,
}

/// One layer of faults.
pub trait Layer {
    /// The fault kinds this layer can inject here (names for the report, e.g. `"agent kill -9"`).
    fn kinds(&self) -> Vec<&'static str>;
    /// Runs one trial of `kind` (one of [`Layer::kinds`]).
    fn trial(&mut self, kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut;
}

/// Variants of one kind taken in turn, the first drawn: every `n` trials of the kind cover
/// all `n` variants (a GPU fault's four error-handling modes, a TLS fault's four actions).
#[derive(Debug, Default)]
pub struct Turns {
    first: Option<u64>,
    runs: u64,
}

impl Turns {
    /// The next variant of `n` (`0..n`).
    pub fn next(&mut self, n: u64, rng: &mut Rng) -> usize {
        let first = *self.first.get_or_insert_with(|| rng.range(0, n - 1));
        let v = (first + self.runs) % n;
        self.runs += 1;
        v as usize
    }
}
