//! Judging a trial from what its ranks printed: which ranks an error blames, and whether each
//! survivor failed in time naming the culprit (or, for a slow rank, whether the job finished).

use super::inject::Injected;
use super::job::Rank;
use super::plan::{FaultKind, Plan};
use std::time::{Duration, Instant};

/// How `c10d-bench` reports a rank's failure.
const ERROR_LINE: &str = "error: ";

/// The ranks an error message names as the cause: lost connections, ranks that sent no data or
/// took no data, ranks that shut down. Global ranks in parentheses are ignored (a chaos job
/// only has the default group, where both are equal).
pub fn blamed(msg: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let clauses: [(&str, &[&str]); 6] = [
        ("reading ", &["'s buffer"]),
        ("connection to ", &[" lost"]),
        ("; rank(s) ", &[" did not answer"]),
        ("no data from rank(s) ", &[";", ")", " ("]),
        ("sends to rank(s) ", &[" did not"]),
        ("send to ", &[" did not"]),
    ];
    for (start, ends) in clauses {
        for (i, _) in msg.match_indices(start) {
            let rest = &msg[i + start.len()..];
            let end = ends
                .iter()
                .filter_map(|e| rest.find(e))
                .min()
                .unwrap_or(rest.len());
            numbers(&strip_global(&rest[..end]), &mut out);
        }
    }
    for (i, _) in msg.match_indices(" has shut down its process group") {
        let before = strip_global(&msg[..i]);
        if let Some(j) = before.rfind("rank ") {
            numbers(&before[j..], &mut out);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn strip_global(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(" (global rank ") {
        out.push_str(&rest[..i]);
        rest = rest[i..].split_once(')').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

fn numbers(s: &str, out: &mut Vec<usize>) {
    out.extend(
        s.split(|c: char| !c.is_ascii_digit())
            .filter_map(|t| t.parse::<usize>().ok()),
    );
}

/// What one survivor did.
pub struct Seen {
    /// From the fault to its error line.
    pub detect: Option<Duration>,
}

/// The judgement of a trial.
pub struct Verdict {
    /// Empty when the trial is ok; otherwise why not.
    pub problems: Vec<String>,
    pub seen: Vec<Seen>,
}

/// How soon survivors must report `kind`: at once for a dead peer or a closed connection,
/// within the op timeout for a silent one, plus 2 s during which survivors may still start ops
/// after the fault: a silent rank's peers run ahead until the kernel's socket buffers towards
/// it are full (a broadcast root of 64 B ops over TCP ran about 1.1 s ahead: reported at
/// 4.09 s with a 3 s timeout, the most in 300 trials of this layer).
pub fn bound(kind: FaultKind, timeout: Duration) -> Duration {
    match kind {
        FaultKind::Kill | FaultKind::CloseSocket => Duration::from_secs(1),
        _ => timeout + Duration::from_secs(2),
    }
}

/// Judges the ranks of `plan` after the fault `inj`, once they exited or the deadline passed.
pub fn judge(plan: &Plan, ranks: &[Rank], inj: &Injected, timeout: Duration) -> Verdict {
    let mut problems = Vec::new();
    let mut seen = Vec::new();
    for &r in &inj.survivors {
        let rank = &ranks[r];
        let err = rank.line_with(ERROR_LINE);
        if plan.kind == FaultKind::Slow {
            match (rank.exit, err) {
                (Some(Some(0)), None) => {}
                (exit, err) => problems.push(format!(
                    "rank {r} did not finish after being slowed (exit {exit:?}): {}",
                    err.map(|e| e.1).unwrap_or_default()
                )),
            }
            continue;
        }
        let Some((t, line)) = err else {
            problems.push(match rank.exit {
                None => format!("rank {r} hung (no error, still running)"),
                Some(e) => format!("rank {r} exited ({e:?}) without an error line"),
            });
            continue;
        };
        let detect = t.saturating_duration_since(inj.at);
        let b = blamed(&line);
        if !b.iter().any(|x| inj.culprits[r].contains(x)) {
            problems.push(format!(
                "rank {r}'s error does not name {:?}: {line}",
                inj.culprits[r]
            ));
        }
        if detect > bound(plan.kind, timeout) {
            problems.push(format!(
                "rank {r} took {} ms to report the fault",
                detect.as_millis()
            ));
        }
        if rank.exit.is_none() {
            problems.push(format!("rank {r} hung after its error"));
        }
        seen.push(Seen {
            detect: Some(detect),
        });
    }
    Verdict { problems, seen }
}

/// Problems from before the fault: a rank that already exited.
pub fn early_exits(ranks: &mut [Rank]) -> Vec<String> {
    let mut out = Vec::new();
    for (r, rank) in ranks.iter_mut().enumerate() {
        if rank.poll() {
            out.push(format!(
                "rank {r} exited ({:?}) before the fault: {}",
                rank.exit.flatten(),
                rank.output()
            ));
        }
    }
    out
}

/// When the trial must be over: long enough for any correct outcome.
pub fn deadline(plan: &Plan, at: Instant, timeout: Duration) -> Instant {
    match plan.kind {
        FaultKind::Slow => at + Duration::from_secs(120),
        _ => at + timeout + Duration::from_secs(10),
    }
}

#[cfg(test)]
mod tests {
    use super::blamed;

    #[test]
    fn blamed_ranks_of_each_message_kind() {
        let lost = "all_reduce (seq 9) on rank 2 failed: ProcessGroupGloo (group 0, rank 2): connection to rank 1, rank 3 (global rank 3) lost (rank 1: EOF; rank 3: reset); the peer process died";
        assert_eq!(blamed(lost), vec![1, 3]);
        let timeout = "ProcessGroupGloo (group 0): Timed out waiting 3000ms for ALLREDUCE (seq 4) on rank 0; no data from rank(s) 2, 3";
        assert_eq!(blamed(timeout), vec![2, 3]);
        let left = "ProcessGroupGloo (group 0, rank 1): rank 0 has shut down its process group";
        assert_eq!(blamed(left), vec![0]);
        let send =
            "Timed out waiting 3000ms for SEND (seq 1) on rank 1; send to rank 3 did not complete";
        assert_eq!(blamed(send), vec![3]);
        let cma = "ProcessGroupGloo (group 0, rank 1): reading rank 0's buffer (process_vm_readv) failed: No such process (os error 3); the peer process died";
        assert_eq!(blamed(cma), vec![0]);
        assert!(blamed("invalid argument on rank 2").is_empty());
    }
}
