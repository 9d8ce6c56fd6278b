//! One copy of PyTorch's argument checks, the same text from every backend.
//!
//! - [`Checks`] holds one check per op of the [`Backend`](crate::Backend) trait (what
//!   `ProcessGroupGloo` checks before it runs an op, with its texts), for a backend named by its
//!   class (`"ProcessGroupGloo"`, `"ProcessGroupNCCL"`). Every backend calls it first, then adds
//!   only what its own hardware cannot do (gloo: CPU tensors; NCCL: CUDA tensors, one tensor per
//!   list).
//! - [`At`] is one op of one backend and the checks the ops are made of; its errors read
//!   `"{backend}::{op}: {text}"` (`"ProcessGroupGloo::reduce: invalid root rank: 4"`).
//!
//! Every error is [`DistError::InvalidArgument`] (Python's `RuntimeError`/`ValueError` as
//! PyTorch raises it).

mod all_to_all;
mod ops;

pub use ops::Checks;

use crate::error::{DistError, Result};
use crate::reduce::ReduceOp;
use crate::tensor::Tensor;
use crate::DType;

/// Where a check runs: the backend's class name and the op, for the message prefix.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    /// `"ProcessGroupGloo"`, `"ProcessGroupNCCL"`.
    pub backend: &'a str,
    /// The op as PyTorch names it (`"reduce"`, `"_allgather_base"`, `"alltoall_base"` …).
    pub op: &'a str,
}

impl At<'_> {
    /// `"{backend}::{op}: {msg}"` as [`DistError::InvalidArgument`].
    pub fn invalid(&self, msg: impl std::fmt::Display) -> DistError {
        DistError::invalid(format!("{}::{}: {msg}", self.backend, self.op))
    }

    /// Fails with `msg()` unless `ok` holds.
    fn ensure(&self, ok: bool, msg: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(self.invalid(msg()))
        }
    }

    /// "invalid root rank: {root}" unless `root < size`.
    ///
    /// # Errors
    /// As described.
    pub fn root(&self, root: usize, size: usize) -> Result<()> {
        self.ensure(root < size, || format!("invalid root rank: {root}"))
    }

    /// "invalid root tensor: {index}" unless `index < len` (the root's index into its list).
    ///
    /// # Errors
    /// As described.
    pub fn root_tensor(&self, index: usize, len: usize) -> Result<()> {
        self.ensure(index < len, || format!("invalid root tensor: {index}"))
    }

    /// "requires non-empty tensor list" (`what` "") or "requires non-empty input tensor list"
    /// (`what` "input") unless `tensors` has one or more.
    ///
    /// # Errors
    /// As described.
    pub fn non_empty(&self, tensors: &[Tensor], what: &str) -> Result<()> {
        self.ensure(!tensors.is_empty(), || {
            format!("requires non-empty {}tensor list", spaced(what))
        })
    }

    /// "requires a single-element tensor list" unless exactly one tensor.
    ///
    /// # Errors
    /// As described.
    pub fn single(&self, tensors: &[Tensor]) -> Result<()> {
        self.single_of(tensors.len(), "")
    }

    /// "requires a single-element {what} tensor list" (`what` "input"/"output"; "" for none)
    /// unless `len` is 1.
    ///
    /// # Errors
    /// As described.
    pub fn single_of(&self, len: usize, what: &str) -> Result<()> {
        self.ensure(len == 1, || {
            format!("requires a single-element {}tensor list", spaced(what))
        })
    }

    /// The root's list of gather (`kind` "output") or scatter (`kind` "input"): exactly one
    /// list of `n` tensors ("Incorrect output list size 3. Output list size should be 4.").
    ///
    /// # Errors
    /// As described; "requires a single-element {kind} list" for none or several lists.
    pub fn root_list(&self, lists: &[Vec<Tensor>], n: usize, kind: &str) -> Result<()> {
        self.ensure(lists.len() == 1, || {
            format!("requires a single-element {kind} list")
        })?;
        let cap = format!("{}{}", kind[..1].to_ascii_uppercase(), &kind[1..]);
        self.ensure(lists[0].len() == n, || {
            format!(
                "Incorrect {kind} list size {}. {cap} list size should be {n}.",
                lists[0].len()
            )
        })
    }

    /// Input/output pairs of a `*_coalesced` op: non-empty lists of one length.
    ///
    /// # Errors
    /// "requires non-empty input/output tensor lists of the same length".
    pub fn pairs(&self, outputs: &[Tensor], inputs: &[Tensor]) -> Result<()> {
        self.ensure(!inputs.is_empty() && outputs.len() == inputs.len(), || {
            "requires non-empty input/output tensor lists of the same length".into()
        })
    }

    /// Every tensor has `proto`'s dtype ("invalid tensor type") and element count ("invalid
    /// tensor size").
    ///
    /// # Errors
    /// As described, with the expected and actual values.
    pub fn same<'t>(&self, ts: impl IntoIterator<Item = &'t Tensor>, proto: &Tensor) -> Result<()> {
        for t in ts {
            self.dtype(t.dtype(), proto.dtype())?;
            self.ensure(t.numel() == proto.numel(), || {
                format!(
                    "invalid tensor size (expected {} elements, got {})",
                    proto.numel(),
                    t.numel()
                )
            })?;
        }
        Ok(())
    }

    /// "invalid tensor type (expected {want}, got {got})" unless they agree.
    ///
    /// # Errors
    /// As described.
    pub fn dtype(&self, got: DType, want: DType) -> Result<()> {
        self.ensure(got == want, || {
            format!("invalid tensor type (expected {want}, got {got})")
        })
    }

    /// `op` is defined on `dtype` ([`ReduceOp::check_dtype`]'s texts, with this prefix).
    ///
    /// # Errors
    /// As described.
    pub fn reduce_op(&self, op: ReduceOp, dtype: DType) -> Result<()> {
        op.check_dtype(dtype)
            .map_err(|e| e.with_prefix(&format!("{}::{}: ", self.backend, self.op)))
    }

    /// A send's destination (`what` "destination") or a receive's source ("source") is a rank
    /// of the group, and another rank than this one unless `to_self` is allowed.
    ///
    /// # Errors
    /// "invalid destination rank {p} (rank {r} of a group of {n})".
    pub fn peer(&self, peer: usize, (rank, size): (usize, usize), to_self: bool) -> Result<()> {
        let what = if self.op == "send" {
            "destination"
        } else {
            "source"
        };
        self.ensure(peer < size && (to_self || peer != rank), || {
            format!("invalid {what} rank {peer} (rank {rank} of a group of {size})")
        })
    }

    /// Every tensor is in host memory.
    ///
    /// # Errors
    /// "unsupported device type (expected cpu, got cuda:0)".
    pub fn cpu<'t>(&self, ts: impl IntoIterator<Item = &'t Tensor>) -> Result<()> {
        match ts.into_iter().find(|t| !t.is_cpu()) {
            Some(t) => Err(self.invalid(format!(
                "unsupported device type (expected cpu, got {})",
                t.device()
            ))),
            None => Ok(()),
        }
    }
}

/// `"input "` for `"input"`, `""` for `""`.
fn spaced(what: &str) -> String {
    if what.is_empty() {
        String::new()
    } else {
        format!("{what} ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: At = At {
        backend: "ProcessGroupNCCL",
        op: "gather",
    };

    #[test]
    fn texts() {
        assert_eq!(
            AT.root(4, 4).unwrap_err().message(),
            "ProcessGroupNCCL::gather: invalid root rank: 4"
        );
        let l = vec![vec![Tensor::zeros(DType::F32, &[2]); 3]];
        assert_eq!(
            AT.root_list(&l, 4, "output").unwrap_err().message(),
            "ProcessGroupNCCL::gather: Incorrect output list size 3. Output list size should be 4."
        );
        assert!(AT.root_list(&l, 3, "output").is_ok());
        let a = Tensor::zeros(DType::F32, &[2]);
        let b = Tensor::zeros(DType::F64, &[2]);
        assert!(AT
            .same([&b], &a)
            .unwrap_err()
            .message()
            .contains("invalid tensor type"));
        let c = Tensor::zeros(DType::F32, &[3]);
        assert!(AT
            .same([&c], &a)
            .unwrap_err()
            .message()
            .contains("invalid tensor size"));
        assert!(AT.pairs(&[], &[]).is_err());
        assert_eq!(
            AT.non_empty(&[], "input").unwrap_err().message(),
            "ProcessGroupNCCL::gather: requires non-empty input tensor list"
        );
        assert_eq!(
            AT.single_of(2, "").unwrap_err().message(),
            "ProcessGroupNCCL::gather: requires a single-element tensor list"
        );
    }

    #[test]
    fn peers() {
        let send = At {
            backend: "B",
            op: "send",
        };
        assert!(send.peer(1, (0, 2), false).is_ok());
        assert!(send.peer(0, (0, 2), true).is_ok());
        assert_eq!(
            send.peer(0, (0, 2), false).unwrap_err().message(),
            "B::send: invalid destination rank 0 (rank 0 of a group of 2)"
        );
        assert!(send.peer(2, (0, 2), true).is_err());
    }
}
