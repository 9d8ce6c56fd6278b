//! The split sizes of `all_to_all_single` (PyTorch's `checkSplitSizes`).

use super::At;
use crate::error::Result;
use crate::tensor::Tensor;

impl At<'_> {
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
            self.ensure(dim0.is_multiple_of(size), || format!(
                "Tensor's dim 0 does not divide equally across group size ({what} dim 0 is {dim0}, group size {size})"
            ))?;
            return Ok(vec![dim0 / size * row; size]);
        }
        self.ensure(splits.len() == size, || format!(
            "Number of tensor splits not equal to group size ({what} has {} split sizes, group size {size})",
            splits.len()
        ))?;
        let sum = splits.iter().try_fold(0usize, |a, x| a.checked_add(*x));
        self.ensure(sum == Some(dim0), || format!(
            "Split sizes doesn't match total dim 0 size ({what} split sizes {splits:?}, dim 0 is {dim0})"
        ))?;
        Ok(splits.iter().map(|s| s * row).collect())
    }

    /// What rank `rank` sends itself (`to_self` elements) equals what it expects from itself
    /// (`from_self`); `why` names the disagreeing arguments.
    ///
    /// # Errors
    /// "rank {r} sends itself {n} elements but expects {m} from itself ({why})".
    pub fn self_exchange(
        &self,
        rank: usize,
        to_self: usize,
        from_self: usize,
        why: &str,
    ) -> Result<()> {
        self.ensure(to_self == from_self, || {
            format!("rank {rank} sends itself {to_self} elements but expects {from_self} from itself ({why})")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    const AT: At = At {
        backend: "ProcessGroupNCCL",
        op: "alltoall_base",
    };

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
        assert!(AT
            .split_counts(&t, &[usize::MAX, 7, 0], 3, "input")
            .is_err());
    }
}
