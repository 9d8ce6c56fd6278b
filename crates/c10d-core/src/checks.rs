//! Argument checks every backend shares, with PyTorch's texts, prefixed by the backend's op name
//! (`"ProcessGroupGloo::reduce: "`, `"ProcessGroupNCCL::scatter: "`). Each returns
//! [`DistError::InvalidArgument`] (Python's `ValueError`/`RuntimeError` as PyTorch raises it).

use crate::error::{DistError, Result};
use crate::tensor::Tensor;

/// Where a check runs: the backend's class name and the op, for the message prefix.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    /// `"ProcessGroupGloo"`, `"ProcessGroupNCCL"`.
    pub backend: &'a str,
    /// The op (`"reduce"`, `"scatter"` …).
    pub op: &'a str,
}

impl At<'_> {
    /// `"{backend}::{op}: {msg}"` as [`DistError::InvalidArgument`].
    pub fn invalid(&self, msg: impl std::fmt::Display) -> DistError {
        DistError::invalid(format!("{}::{}: {msg}", self.backend, self.op))
    }

    /// "invalid root rank: {root}" unless `root < size`.
    ///
    /// # Errors
    /// As described.
    pub fn root(&self, root: usize, size: usize) -> Result<()> {
        if root >= size {
            return Err(self.invalid(format!("invalid root rank: {root}")));
        }
        Ok(())
    }

    /// "requires a single-element tensor list" unless exactly one tensor.
    ///
    /// # Errors
    /// As described.
    pub fn single(&self, tensors: &[Tensor]) -> Result<()> {
        if tensors.len() != 1 {
            return Err(self.invalid("requires a single-element tensor list"));
        }
        Ok(())
    }

    /// The root's list of gather (`kind` "output") or scatter (`kind` "input"): exactly one
    /// list of `n` tensors ("Incorrect output list size 3. Output list size should be 4.").
    ///
    /// # Errors
    /// As described.
    pub fn root_list(&self, lists: &[Vec<Tensor>], n: usize, kind: &str) -> Result<()> {
        if lists.len() != 1 {
            return Err(self.invalid(format!("requires a single-element {kind} list")));
        }
        if lists[0].len() != n {
            let cap = format!("{}{}", kind[..1].to_ascii_uppercase(), &kind[1..]);
            return Err(self.invalid(format!(
                "Incorrect {kind} list size {}. {cap} list size should be {n}.",
                lists[0].len()
            )));
        }
        Ok(())
    }

    /// Input/output pairs of a `*_coalesced` op: non-empty lists of one length.
    ///
    /// # Errors
    /// "requires non-empty input/output tensor lists of the same length".
    pub fn pairs(&self, outputs: &[Tensor], inputs: &[Tensor]) -> Result<()> {
        if inputs.is_empty() || outputs.len() != inputs.len() {
            return Err(
                self.invalid("requires non-empty input/output tensor lists of the same length")
            );
        }
        Ok(())
    }

    /// Every tensor has `proto`'s dtype ("invalid tensor type") and element count ("invalid
    /// tensor size").
    ///
    /// # Errors
    /// As described, with the expected and actual values.
    pub fn same(&self, ts: &[&Tensor], proto: &Tensor) -> Result<()> {
        for t in ts {
            if t.dtype() != proto.dtype() {
                return Err(self.invalid(format!(
                    "invalid tensor type (expected {}, got {})",
                    proto.dtype(),
                    t.dtype()
                )));
            }
            if t.numel() != proto.numel() {
                return Err(self.invalid(format!(
                    "invalid tensor size (expected {} elements, got {})",
                    proto.numel(),
                    t.numel()
                )));
            }
        }
        Ok(())
    }

    /// `all_to_all_single` split sizes of `t` (`what`: "input" or "output"): empty (equal
    /// split, first dimension divisible by the group size) or one entry per rank summing to the
    /// first dimension. Returns the element counts per rank.
    ///
    /// # Errors
    /// PyTorch's texts (`checkSplitSizes`), each followed by the values in parentheses: "Tensor's
    /// dim 0 does not divide equally across group size", "Number of tensor splits not equal to
    /// group size", "Split sizes doesn't match total dim 0 size".
    pub fn split_counts(
        &self,
        t: &Tensor,
        splits: &[usize],
        size: usize,
        what: &str,
    ) -> Result<Vec<usize>> {
        let dim0 = t.shape().first().copied().unwrap_or(1);
        let row = t.numel().checked_div(dim0).unwrap_or(0);
        if splits.is_empty() {
            if !dim0.is_multiple_of(size) {
                return Err(self.invalid(format!(
                    "Tensor's dim 0 does not divide equally across group size ({what} dim 0 is {dim0}, group size {size})"
                )));
            }
            return Ok(vec![dim0 / size * row; size]);
        }
        if splits.len() != size {
            return Err(self.invalid(format!(
                "Number of tensor splits not equal to group size ({what} has {} split sizes, group size {size})",
                splits.len()
            )));
        }
        let sum = splits.iter().try_fold(0usize, |a, x| a.checked_add(*x));
        if sum != Some(dim0) {
            return Err(self.invalid(format!(
                "Split sizes doesn't match total dim 0 size ({what} split sizes {splits:?}, dim 0 is {dim0})"
            )));
        }
        Ok(splits.iter().map(|s| s * row).collect())
    }

    /// Every check of `all_to_all_single` on rank `rank` of `size`: one dtype for input and
    /// output, the split sizes of each ([`At::split_counts`]), and what this rank sends itself
    /// equal to what it expects from itself. Returns the (output, input) element counts per rank.
    ///
    /// # Errors
    /// "input and output tensors must have the same dtype (input: .., output: ..)"; the
    /// split-size texts; "rank {r} sends itself {n} elements but expects {m} from itself (input
    /// and output split sizes disagree at index {r})".
    pub fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        (rank, size): (usize, usize),
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        if output.dtype() != input.dtype() {
            return Err(self.invalid(format!(
                "input and output tensors must have the same dtype (input: {}, output: {})",
                input.dtype(),
                output.dtype()
            )));
        }
        let outs = self.split_counts(output, output_split_sizes, size, "output")?;
        let ins = self.split_counts(input, input_split_sizes, size, "input")?;
        if outs[rank] != ins[rank] {
            return Err(self.invalid(format!(
                "rank {rank} sends itself {} elements but expects {} from itself (input and output split sizes disagree at index {rank})",
                ins[rank], outs[rank]
            )));
        }
        Ok((outs, ins))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

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
            .same(&[&b], &a)
            .unwrap_err()
            .message()
            .contains("invalid tensor type"));
        let c = Tensor::zeros(DType::F32, &[3]);
        assert!(AT
            .same(&[&c], &a)
            .unwrap_err()
            .message()
            .contains("invalid tensor size"));
        assert!(AT.pairs(&[], &[]).is_err());
    }

    #[test]
    fn split_counts() {
        let t = Tensor::zeros(DType::F32, &[6, 2]);
        assert_eq!(AT.split_counts(&t, &[], 3, "input").unwrap(), vec![4, 4, 4]);
        assert_eq!(
            AT.split_counts(&t, &[1, 2, 3], 3, "input").unwrap(),
            vec![2, 4, 6]
        );
        assert!(AT.split_counts(&t, &[1, 2], 3, "input").is_err());
        assert!(AT.split_counts(&t, &[], 4, "input").is_err());
    }
}
