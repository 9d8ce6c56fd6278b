//! The exchanges a compiling framework runs on the compile-side groups (what
//! `torch/_dynamo` and AOTAutograd exchange, in plain words):
//!
//! - [`CompileGroups::compiler_collective`]: every rank contributes its [`FrameState`] (the
//!   sizes/int values it saw per input); every rank gets back the same merged state in which
//!   anything that differs on any rank is dynamic. Ranks then trace identical graphs and take
//!   identical recompile decisions, so SPMD jobs do not deadlock on mismatched collectives.
//! - [`CompileGroups::guard_collective`]: one bool per rank ("my guards hit"); if any rank
//!   missed, all ranks see a miss and recompile together.
//! - [`CompileGroups::compile_sync_digests`]: all-gathers the SHA-256 of a compiled artifact and
//!   reports the ranks whose artifact differs from rank 0's; [`CompileGroups::cache_hit_collective`]
//!   all-reduces MIN of a "local cache hit" so all ranks hit or all miss.
//!
//! With the relevant group switched off (or no initialized world) each exchange answers from the
//! local value alone, as a one-rank job would.
//!
//! Every exchange is a collective: all ranks must call it, in the same order.

use crate::frame_state::FrameState;
use crate::groups::CompileGroups;
use c10d_core::{DType, DistError, ReduceOp, Result, Tensor};
use c10d_world::GroupMember;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// A SHA-256 digest.
pub type Sha256Digest = [u8; 32];

/// The outcome of a guard collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardVerdict {
    /// True only if every rank's guards hit.
    pub all_hit: bool,
    /// Group ranks (= global ranks: the guard group spans all ranks) whose guards missed.
    pub missed: Vec<usize>,
}

/// The outcome of [`CompileGroups::compile_sync_digests`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestReport {
    /// Every rank's digest, in rank order.
    pub digests: Vec<Sha256Digest>,
}

/// Lower-case hex of a digest.
pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256::digest(bytes).into()
}

impl DigestReport {
    /// Ranks whose digest differs from rank 0's.
    pub fn differing_ranks(&self) -> Vec<usize> {
        match self.digests.first() {
            Some(d0) => (1..self.digests.len())
                .filter(|&r| &self.digests[r] != d0)
                .collect(),
            None => Vec::new(),
        }
    }

    /// True when every rank has rank 0's digest.
    pub fn all_equal(&self) -> bool {
        self.differing_ranks().is_empty()
    }

    /// `Ok(digest)` when all ranks agree.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "compile sync: compiled artifacts differ across ranks:
    /// ranks \[..\] differ from rank 0 (rank 0: `<hex>`, rank r: `<hex>`, ...)".
    pub fn ensure_identical(&self) -> Result<Sha256Digest> {
        let diff = self.differing_ranks();
        if diff.is_empty() {
            return self
                .digests
                .first()
                .copied()
                .ok_or_else(|| DistError::invalid("compile sync: no digests"));
        }
        let detail: Vec<String> = std::iter::once(0)
            .chain(diff.iter().copied())
            .map(|r| format!("rank {r}: {}", hex(&self.digests[r])))
            .collect();
        Err(DistError::invalid(format!(
            "compile sync: compiled artifacts differ across ranks: ranks {diff:?} differ from rank 0 ({})",
            detail.join(", ")
        )))
    }
}

/// "ranks [0, 2] ..., ranks [1] ..." grouping of rank → value.
fn describe_groups<K: Ord + std::fmt::Debug>(by_rank: impl Iterator<Item = (usize, K)>) -> String {
    let mut groups: BTreeMap<K, Vec<usize>> = BTreeMap::new();
    for (r, k) in by_rank {
        groups.entry(k).or_default().push(r);
    }
    groups
        .into_iter()
        .map(|(k, ranks)| format!("ranks {ranks:?}: {k:?}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl CompileGroups<'_> {
    /// The compiler collective: all-gathers every rank's `local` state on the compile group and
    /// returns the merge of all of them (identical on every rank). Without a compile group the
    /// result is `local` itself.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming the ranks that disagree: "compiler collective: ranks
    /// disagree on the frame being compiled: ranks \[0, 2\]: \"f\"; ranks \[1\]: \"g\"", or "compiler
    /// collective: ranks disagree on the inputs of frame \"f\": ranks [..]: [..]; ..."; group
    /// creation and communication errors.
    pub fn compiler_collective(&self, local: &FrameState) -> Result<FrameState> {
        let Some(pg) = self.get_compile_pg()? else {
            return Ok(local.clone());
        };
        let states: Vec<FrameState> = self
            .world()
            .all_gather_object(local)
            .group(&GroupMember::from(pg))
            .run()?;
        if states.iter().any(|s| s.frame != states[0].frame) {
            return Err(DistError::invalid(format!(
                "compiler collective: ranks disagree on the frame being compiled: {}",
                describe_groups(states.iter().map(|s| s.frame.clone()).enumerate())
            )));
        }
        let names = |s: &FrameState| s.inputs.keys().cloned().collect::<Vec<_>>();
        if states.iter().any(|s| names(s) != names(&states[0])) {
            return Err(DistError::invalid(format!(
                "compiler collective: ranks disagree on the inputs of frame {:?}: {}",
                states[0].frame,
                describe_groups(states.iter().map(names).enumerate())
            )));
        }
        let mut merged = states[0].clone();
        for s in &states[1..] {
            merged.merge_from(s);
        }
        Ok(merged)
    }

    /// The guard collective: all-gathers one bool per rank on the guard group; `all_hit` only if
    /// every rank hit. Without a guard group the verdict is the local one.
    ///
    /// # Errors
    /// Group creation and communication errors.
    pub fn guard_collective(&self, hit: bool) -> Result<GuardVerdict> {
        let Some(pg) = self.get_guard_pg()? else {
            let me = self.world().rank().unwrap_or(0);
            return Ok(GuardVerdict {
                all_hit: hit,
                missed: if hit { Vec::new() } else { vec![me] },
            });
        };
        let n = pg.size();
        let inp = Tensor::from_vec(vec![hit as u8]);
        let out = Tensor::zeros(DType::U8, &[n]);
        self.world()
            .all_gather_into_tensor(&out, &inp)
            .group(&GroupMember::from(pg))
            .run()?;
        let hits = out.to_vec::<u8>()?;
        let missed: Vec<usize> = (0..n).filter(|&r| hits[r] == 0).collect();
        Ok(GuardVerdict {
            all_hit: missed.is_empty(),
            missed,
        })
    }

    /// All-gathers the SHA-256 of `artifact` on the compile-sync group (gloo). Without that
    /// group, the report holds the local digest only.
    ///
    /// # Errors
    /// Group creation and communication errors.
    pub fn compile_sync_digests(&self, artifact: &[u8]) -> Result<DigestReport> {
        let local = sha256(artifact);
        let Some(pg) = self.get_compile_sync_pg()? else {
            return Ok(DigestReport {
                digests: vec![local],
            });
        };
        let n = pg.size();
        let inp = Tensor::from_vec(local.to_vec());
        let out = Tensor::zeros(DType::U8, &[n * 32]);
        self.world()
            .all_gather_into_tensor(&out, &inp)
            .group(&GroupMember::from(pg))
            .run()?;
        let all = out.to_vec::<u8>()?;
        Ok(DigestReport {
            digests: all
                .chunks_exact(32)
                .map(|c| c.try_into().expect("32-byte chunks"))
                .collect(),
        })
    }

    /// All-reduces MIN of `local_hit` on the compile-sync group: true only if every rank hit its
    /// cache (AOTAutograd's cache agreement). Without that group, `local_hit`.
    ///
    /// # Errors
    /// Group creation and communication errors.
    pub fn cache_hit_collective(&self, local_hit: bool) -> Result<bool> {
        let Some(pg) = self.get_compile_sync_pg()? else {
            return Ok(local_hit);
        };
        let t = Tensor::from_vec(vec![local_hit as i64]);
        self.world()
            .all_reduce(&t)
            .op(ReduceOp::Min)
            .group(&GroupMember::from(pg))
            .run()?;
        Ok(t.to_vec::<i64>()?[0] == 1)
    }

    /// All-gathers an object (pickled, see c10d-world's object collectives) on the compile-sync
    /// group: the building block for agreeing on anything else (autotuning choices, ...).
    /// Without that group, `vec![obj]`.
    ///
    /// # Errors
    /// Group creation, serialisation and communication errors.
    pub fn compile_sync_all_gather_object<T: Serialize + DeserializeOwned + Clone>(
        &self,
        obj: &T,
    ) -> Result<Vec<T>> {
        let Some(pg) = self.get_compile_sync_pg()? else {
            return Ok(vec![obj.clone()]);
        };
        self.world()
            .all_gather_object(obj)
            .group(&GroupMember::from(pg))
            .run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_report_names_differing_ranks() {
        let a = sha256(b"graph a");
        let b = sha256(b"graph b");
        let r = DigestReport {
            digests: vec![a, a, b, b],
        };
        assert_eq!(r.differing_ranks(), vec![2, 3]);
        let e = r.ensure_identical().unwrap_err().to_string();
        assert!(e.contains("ranks [2, 3] differ from rank 0"), "{e}");
        assert!(e.contains(&format!("rank 2: {}", hex(&b))), "{e}");
        let ok = DigestReport {
            digests: vec![a, a],
        };
        assert_eq!(ok.ensure_identical().unwrap(), a);
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
