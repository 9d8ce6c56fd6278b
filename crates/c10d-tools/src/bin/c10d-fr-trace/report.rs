//! The findings in plain words.

use crate::analyze::{done, failed, Finding, GroupReport, Op};
use c10d_world::flight_recorder::DumpEntry;

/// "rank 2" / "ranks 0, 1".
pub fn ranks(rs: &[usize]) -> String {
    let list: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    match rs.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// `[256]`, `2×[4, 2]` or `[[4, 2], [3]]`, then the dtypes.
fn tensors(sizes: &[Vec<i64>], dtypes: &[String]) -> String {
    let shape = |s: &Vec<i64>| {
        let v: Vec<String> = s.iter().map(|d| d.to_string()).collect();
        format!("[{}]", v.join(", "))
    };
    let shapes = match sizes {
        [] => return "no tensors".into(),
        [one] => shape(one),
        [first, rest @ ..] if rest.iter().all(|s| s == first) => {
            format!("{}×{}", sizes.len(), shape(first))
        }
        _ => format!(
            "[{}]",
            sizes.iter().map(shape).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut d = dtypes.to_vec();
    d.dedup();
    format!("{shapes} {}", d.join("/"))
}

/// `all_reduce [256] Float`, `all_gather [4] Float → 2×[4] Float`, `send to rank 1 ([3] Long)`.
pub fn what(op: &Op, group_ranks: &[usize]) -> String {
    let e = &op.entry;
    let ins = tensors(&e.input_sizes, &e.input_dtypes);
    let outs = tensors(&e.output_sizes, &e.output_dtypes);
    let data = if ins == outs {
        ins
    } else {
        format!("{ins} → {outs}")
    };
    if e.is_p2p {
        return format!(
            "{} ({data}, p2p #{})",
            p2p_peer(e, group_ranks),
            e.p2p_seq_id
        );
    }
    format!("collective #{} {} {data}", e.collective_seq_id, e.op_name())
}

/// `send to rank 1` / `recv from rank 0` / `recv from any rank`, in global ranks.
fn p2p_peer(e: &DumpEntry, group_ranks: &[usize]) -> String {
    let meta = e.profiling_name.rsplit(':').next().unwrap_or("");
    let meta = meta.split(' ').nth(1).unwrap_or("");
    let global = |s: &str| match s.parse::<usize>() {
        Ok(g) => format!("rank {}", group_ranks.get(g).copied().unwrap_or(g)),
        Err(_) => "any rank".to_string(),
    };
    if let Some((_, dst)) = meta.split_once("->") {
        format!("send to {}", global(dst))
    } else if let Some((_, src)) = meta.split_once("<-") {
        format!("recv from {}", global(src))
    } else {
        e.op_name().to_string()
    }
}

/// `completed`, `failed`, `started`, `scheduled`: the state without details.
fn short_state(e: &DumpEntry) -> &str {
    if done(e) {
        "completed"
    } else if failed(e) {
        "failed"
    } else {
        &e.state
    }
}

/// `completed`, `started, not completed`, `failed: <error>` ...
pub fn state(e: &DumpEntry) -> String {
    if done(e) {
        return "completed".into();
    }
    if failed(e) {
        return match &e.error {
            Some(err) => format!("failed: {err}"),
            None => format!("{}, then retired without completing (timed out)", e.state),
        };
    }
    match e.state.as_str() {
        "started" => format!("started, not completed (timeout {} ms)", e.timeout_ms),
        _ => "scheduled, not started".into(),
    }
}

fn more(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => " (and 1 later op)".into(),
        _ => format!(" (and {n} later ops)"),
    }
}

/// One finding as a sentence.
pub fn sentence(f: &Finding, g: &GroupReport) -> String {
    let w = |o: &Op| what(o, &g.ranks);
    match f {
        Finding::NoDump(rs) => format!("no dump from {} (analysis uses the others)", ranks(rs)),
        Finding::NeverEntered {
            seq,
            entered,
            missing,
        } => {
            let miss: Vec<usize> = missing.iter().map(|m| m.0).collect();
            let last: Vec<String> = missing
                .iter()
                .map(|(r, o)| match o {
                    Some(o) => format!("rank {r}: {} ({})", w(o), state(&o.entry)),
                    None => format!("rank {r}: none recorded"),
                })
                .collect();
            let ent: Vec<usize> = entered.iter().map(|o| o.rank).collect();
            let head = match entered.first() {
                Some(o) => w(o),
                None => format!("collective #{seq}"),
            };
            let states: Vec<String> = entered
                .iter()
                .map(|o| format!("rank {} {}", o.rank, short_state(&o.entry)))
                .collect();
            format!(
                "{} never entered {head}, which {} entered ({}); last collective entered by {}",
                ranks(&miss),
                ranks(&ent),
                states.join("; "),
                last.join("; ")
            )
        }
        Finding::Mismatch { seq, variants } => {
            let v: Vec<String> = variants
                .iter()
                .map(|(o, rs)| format!("{} ran {}", ranks(rs), w(o)))
                .collect();
            format!("collective #{seq} differs between ranks: {}", v.join("; "))
        }
        Finding::Behind {
            behind,
            ahead,
            ahead_at,
        } => {
            let b: Vec<usize> = behind.iter().map(|x| x.0).collect();
            let at = match behind[0].1 {
                Some(s) => format!("last completed collective is #{s}"),
                None => "completed no recorded collective".into(),
            };
            format!(
                "{} {} behind: {at}, while {} completed up to #{ahead_at}",
                ranks(&b),
                if b.len() == 1 { "is" } else { "are" },
                ranks(ahead)
            )
        }
        Finding::Failed { op, more: n } => {
            format!(
                "rank {}: {} {}{}",
                op.rank,
                w(op),
                state(&op.entry),
                more(*n)
            )
        }
        Finding::Pending { op, more: n } => {
            format!(
                "rank {}: {} is pending: {}{}",
                op.rank,
                w(op),
                state(&op.entry),
                more(*n)
            )
        }
    }
}

/// The whole group: a heading, then one line per finding (or that all is well).
pub fn render(g: &GroupReport) -> String {
    let mut out = format!(
        "group {} ({}), {}: dumps from {}",
        g.name,
        g.desc,
        ranks(&g.ranks),
        ranks(&g.dumped)
    );
    match g.window {
        Some((lo, hi)) => out += &format!("; collectives #{lo}..#{hi}\n"),
        None => out += "; no collectives recorded\n",
    }
    if g.findings.is_empty() {
        out += "  ok: every rank completed the same collectives with the same ops and sizes\n";
    }
    for f in &g.findings {
        out += &format!("  - {}\n", sentence(f, g));
    }
    out
}
