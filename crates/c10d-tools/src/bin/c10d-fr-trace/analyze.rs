//! What the dumps of all ranks say about each group: who never entered which collective, who
//! ran something else, who is behind, what failed or is still pending.

use crate::load::RankDump;
use c10d_world::flight_recorder::DumpEntry;
use std::collections::{BTreeMap, BTreeSet};

/// A collective or send/recv as a rank recorded it.
#[derive(Clone)]
pub struct Op {
    pub rank: usize,
    pub entry: DumpEntry,
}

/// What the analysis found in one group.
pub enum Finding {
    /// Members whose dump is missing.
    NoDump(Vec<usize>),
    /// The first collective some ranks entered and others did not.
    NeverEntered {
        seq: u64,
        entered: Vec<Op>,
        /// The ranks that did not, with the last collective they entered.
        missing: Vec<(usize, Option<Op>)>,
    },
    /// The first collective the ranks ran differently: each variant with its ranks.
    Mismatch {
        seq: u64,
        variants: Vec<(Op, Vec<usize>)>,
    },
    /// Ranks whose last completed collective is lower than the others'.
    Behind {
        behind: Vec<(usize, Option<u64>)>,
        ahead: Vec<usize>,
        ahead_at: u64,
    },
    /// A rank's first failed op (`more` failed after it).
    Failed { op: Op, more: usize },
    /// A rank's first op that neither completed nor failed (`more` after it).
    Pending { op: Op, more: usize },
}

/// One group across all dumps.
pub struct GroupReport {
    pub name: String,
    pub desc: String,
    pub ranks: Vec<usize>,
    pub dumped: Vec<usize>,
    /// First and last collective sequence id seen on every dumped rank (`None`: none).
    pub window: Option<(u64, u64)>,
    pub findings: Vec<Finding>,
}

/// Completed: state "completed", or retired without error while never seen starting (PyTorch's
/// gloo retires ops at completion without recording start or completion).
pub fn done(e: &DumpEntry) -> bool {
    e.state == "completed" || (e.retired && e.error.is_none() && e.state == "scheduled")
}

/// Failed: it ended (retired) without completing; a timed-out op in PyTorch's dumps, an op
/// with its `error` in ours.
pub fn failed(e: &DumpEntry) -> bool {
    e.error.is_some() || (e.retired && !done(e))
}

/// Op name, input sizes, output sizes, input dtypes, output dtypes.
type Signature = (
    String,
    Vec<Vec<i64>>,
    Vec<Vec<i64>>,
    Vec<String>,
    Vec<String>,
);

/// What must agree across ranks for collective #k (uneven and rooted ops compare less).
fn signature(e: &DumpEntry) -> Signature {
    let op = e.op_name().to_string();
    let (is, os) = (e.input_sizes.clone(), e.output_sizes.clone());
    let (id, od) = (e.input_dtypes.clone(), e.output_dtypes.clone());
    match op.as_str() {
        "gather" => (op, is, vec![], id, vec![]),
        "scatter" => (op, vec![], os, vec![], od),
        // "all_to_all" and PyTorch's "all_to_all_single"
        o if o.starts_with("all_to_all") => (op, vec![], vec![], id, od),
        _ => (op, is, os, id, od),
    }
}

/// The groups a dump speaks of: (name, desc, global ranks) from its `pg_config`, plus groups
/// its entries name but its `pg_config` lacks (PyTorch's gloo can leave them out), whose ranks
/// are then taken to be the ranks whose dumps mention them (`unlisted`).
fn groups_of(
    d: &RankDump,
    unlisted: &BTreeMap<String, BTreeSet<usize>>,
) -> Vec<(String, String, Vec<usize>)> {
    let mut out: Vec<(String, String, Vec<usize>)> = d
        .dump
        .pg_config
        .iter()
        .filter(|(name, _)| {
            !name.is_empty() || d.dump.entries.iter().any(|e| e.process_group.0.is_empty())
        })
        .map(|(name, c)| {
            (
                name.clone(),
                c.desc.clone(),
                c.rank_list().unwrap_or_default(),
            )
        })
        .collect();
    for e in &d.dump.entries {
        let name = &e.process_group.0;
        if !out.iter().any(|g| &g.0 == name) {
            let ranks = unlisted
                .get(name)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            out.push((name.clone(), e.process_group.1.clone(), ranks));
        }
    }
    out
}

/// Every group named in the dumps, keyed by (name, ranks) as PyTorch's analyzer keys them.
pub fn analyze(dumps: &[RankDump]) -> Vec<GroupReport> {
    let mut unlisted: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for d in dumps {
        for e in &d.dump.entries {
            if !d.dump.pg_config.contains_key(&e.process_group.0) {
                unlisted
                    .entry(e.process_group.0.clone())
                    .or_default()
                    .insert(d.rank);
            }
        }
    }
    type Key = (Option<u64>, String, Vec<usize>);
    let mut groups: BTreeMap<Key, (String, BTreeMap<usize, Vec<Op>>)> = BTreeMap::new();
    for d in dumps {
        for (name, desc, ranks) in groups_of(d, &unlisted) {
            let slot = groups
                .entry((name.parse().ok(), name.clone(), ranks))
                .or_insert_with(|| (desc, BTreeMap::new()));
            let ops: Vec<Op> = d
                .dump
                .entries
                .iter()
                .filter(|e| e.process_group.0 == name)
                .map(|e| Op {
                    rank: d.rank,
                    entry: e.clone(),
                })
                .collect();
            slot.1.insert(d.rank, ops);
        }
    }
    groups
        .into_iter()
        .map(|((_, name, ranks), (desc, per_rank))| group_report(name, desc, ranks, per_rank))
        .collect()
}

fn group_report(
    name: String,
    desc: String,
    ranks: Vec<usize>,
    per_rank: BTreeMap<usize, Vec<Op>>,
) -> GroupReport {
    let dumped: Vec<usize> = per_rank.keys().copied().collect();
    let mut findings = Vec::new();
    let no_dump: Vec<usize> = ranks
        .iter()
        .copied()
        .filter(|r| !per_rank.contains_key(r))
        .collect();
    if !no_dump.is_empty() {
        findings.push(Finding::NoDump(no_dump));
    }
    let colls: BTreeMap<usize, BTreeMap<u64, Op>> = per_rank
        .iter()
        .map(|(r, ops)| {
            let mut m = BTreeMap::new();
            for o in ops.iter().filter(|o| !o.entry.is_p2p) {
                m.entry(o.entry.collective_seq_id)
                    .or_insert_with(|| o.clone());
            }
            (*r, m)
        })
        .collect();
    let window = window(&colls);
    if let Some((lo, hi)) = window {
        findings.extend(first_divergence(&colls, lo, hi));
    }
    findings.extend(behind(&colls));
    for ops in per_rank.values() {
        findings.extend(first_of(ops, failed, |op, more| Finding::Failed {
            op,
            more,
        }));
        let pending = |e: &DumpEntry| !done(e) && !failed(e);
        findings.extend(first_of(ops, pending, |op, more| Finding::Pending {
            op,
            more,
        }));
    }
    GroupReport {
        name,
        desc,
        ranks,
        dumped,
        window,
        findings,
    }
}

/// From the latest first collective of any rank (older ones fell out of some ring) to the
/// last collective of any rank.
fn window(colls: &BTreeMap<usize, BTreeMap<u64, Op>>) -> Option<(u64, u64)> {
    let lo = colls.values().filter_map(|m| m.keys().next()).max()?;
    let hi = colls.values().filter_map(|m| m.keys().next_back()).max()?;
    Some((*lo, (*hi).max(*lo)))
}

/// The first collective some rank never entered, and the first one ranks ran differently.
fn first_divergence(colls: &BTreeMap<usize, BTreeMap<u64, Op>>, lo: u64, hi: u64) -> Vec<Finding> {
    let (mut missing_found, mut mismatch_found) = (None, None);
    for seq in lo..=hi {
        let entered: Vec<Op> = colls
            .values()
            .filter_map(|m| m.get(&seq).cloned())
            .collect();
        if missing_found.is_none() && entered.len() < colls.len() {
            let missing = colls
                .iter()
                .filter(|(_, m)| !m.contains_key(&seq))
                .map(|(r, m)| (*r, m.range(..seq).next_back().map(|(_, o)| o.clone())))
                .collect();
            missing_found = Some(Finding::NeverEntered {
                seq,
                entered: entered.clone(),
                missing,
            });
        }
        if mismatch_found.is_none() {
            let mut variants: Vec<(Op, Vec<usize>)> = Vec::new();
            for o in &entered {
                match variants
                    .iter_mut()
                    .find(|v| signature(&v.0.entry) == signature(&o.entry))
                {
                    Some(v) => v.1.push(o.rank),
                    None => variants.push((o.clone(), vec![o.rank])),
                }
            }
            if variants.len() > 1 {
                variants.sort_by_key(|v| std::cmp::Reverse(v.1.len()));
                mismatch_found = Some(Finding::Mismatch { seq, variants });
            }
        }
        if missing_found.is_some() && mismatch_found.is_some() {
            break;
        }
    }
    missing_found.into_iter().chain(mismatch_found).collect()
}

/// Ranks whose last completed collective is the lowest, when the ranks differ.
fn behind(colls: &BTreeMap<usize, BTreeMap<u64, Op>>) -> Option<Finding> {
    let last: Vec<(usize, Option<u64>)> = colls
        .iter()
        .map(|(r, m)| {
            (
                *r,
                m.values()
                    .rev()
                    .find(|o| done(&o.entry))
                    .map(|o| o.entry.collective_seq_id),
            )
        })
        .collect();
    let min = last.iter().map(|x| x.1).min()?;
    let max = last.iter().map(|x| x.1).max()?;
    if min == max {
        return None;
    }
    Some(Finding::Behind {
        behind: last.iter().filter(|x| x.1 == min).copied().collect(),
        ahead: last.iter().filter(|x| x.1 == max).map(|x| x.0).collect(),
        ahead_at: max.unwrap_or(0),
    })
}

/// The first op of `ops` matching `pred`, with the count of later ones.
fn first_of(
    ops: &[Op],
    pred: impl Fn(&DumpEntry) -> bool,
    make: impl Fn(Op, usize) -> Finding,
) -> Option<Finding> {
    let mut it = ops.iter().filter(|o| pred(&o.entry));
    let first = it.next()?.clone();
    Some(make(first, it.count()))
}
