//! Where a mesh's ranks sit in its root's rank map: each mesh dimension is a list of
//! (size, stride) modes, outermost first (row-major), over positions of the root's flat rank map.
//!
//! This is the bookkeeping PyTorch keeps in `_MeshLayout` / `_FlatLayout` (CuTe layouts), in
//! the row-major reading `remap_to_tensor` gives them: position of index `k` of a dimension =
//! Σ digitᵢ(k)·strideᵢ, digits of `k` in the mixed radix of the sizes, the last mode fastest.
//!
//! - A root mesh of shape (s₀, …, sₙ₋₁) has one mode per dimension with row-major strides.
//! - Slicing picks dimensions; flattening concatenates their modes into one dimension;
//!   unflattening splits one dimension's modes.
//! - The groups of a dimension are the rank map read along it from every *block base*: the
//!   positions the dimension cannot reach from a smaller base, in ascending order (PyTorch's
//!   complement layout, enumerated as `remap_to_tensor` does).

use c10d_core::{DistError, Result};

/// One (size, stride) mode.
pub(crate) type Mode = (usize, usize);

/// One mesh dimension: its modes, outermost first, coalesced (no size-1 modes; neighbours
/// that form one contiguous run merged).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Axis {
    modes: Vec<Mode>,
}

impl Axis {
    /// An axis over `modes`, coalesced.
    pub(crate) fn new(modes: Vec<Mode>) -> Axis {
        Axis {
            modes: coalesce(modes),
        }
    }

    /// Number of positions along the axis.
    pub(crate) fn numel(&self) -> usize {
        self.modes.iter().map(|m| m.0).product()
    }

    /// The modes, outermost first.
    pub(crate) fn modes(&self) -> &[Mode] {
        &self.modes
    }

    /// Splits the axis into consecutive axes of `sizes` (product = [`Axis::numel`]), the inner
    /// sizes taking the inner modes (PyTorch's `composition` with a row-major layout).
    ///
    /// # Errors
    /// When a mode cannot be divided at a size boundary.
    pub(crate) fn split(&self, sizes: &[usize]) -> Result<Vec<Axis>> {
        let mut rest: Vec<Mode> = self.modes.clone();
        let mut out = Vec::with_capacity(sizes.len());
        for &n in sizes.iter().rev() {
            out.push(Axis::new(take_inner(&mut rest, n)?));
        }
        out.reverse();
        Ok(out)
    }
}

/// Removes the innermost `n` positions' worth of modes from `modes` and returns them.
fn take_inner(modes: &mut Vec<Mode>, mut n: usize) -> Result<Vec<Mode>> {
    let mut taken = Vec::new();
    while n > 1 {
        let Some((size, stride)) = modes.pop() else {
            return Err(cannot_split());
        };
        if size <= n && n.is_multiple_of(size) {
            taken.insert(0, (size, stride));
            n /= size;
        } else if size % n == 0 {
            taken.insert(0, (n, stride));
            modes.push((size / n, stride * n));
            n = 1;
        } else {
            return Err(cannot_split());
        }
    }
    Ok(taken)
}

fn cannot_split() -> DistError {
    DistError::invalid("the mesh dimension's layout cannot be split into the requested sizes")
}

/// Offsets of all indices of row-major `modes`.
fn offsets_of(modes: &[Mode]) -> Vec<usize> {
    let mut offs = vec![0usize];
    for &(size, stride) in modes {
        offs = offs
            .iter()
            .flat_map(|&o| (0..size).map(move |i| o + i * stride))
            .collect();
    }
    offs
}

/// Drops size-1 modes and merges `(a, b·d), (b, d)` into `(a·b, d)`.
fn coalesce(modes: Vec<Mode>) -> Vec<Mode> {
    let mut out: Vec<Mode> = Vec::with_capacity(modes.len());
    for (size, stride) in modes.into_iter().filter(|m| m.0 != 1) {
        match out.last_mut() {
            Some(last) if last.1 == size * stride => *last = (last.0 * size, stride),
            _ => out.push((size, stride)),
        }
    }
    out
}

/// A mesh's dimensions over its root's rank map.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Layout {
    axes: Vec<Axis>,
}

impl Layout {
    /// The row-major layout of `shape` (a root mesh).
    pub(crate) fn row_major(shape: &[usize]) -> Layout {
        let mut stride = 1;
        let mut axes: Vec<Axis> = shape
            .iter()
            .rev()
            .map(|&s| {
                let a = Axis::new(vec![(s, stride)]);
                stride *= s;
                a
            })
            .collect();
        axes.reverse();
        Layout { axes }
    }

    /// A layout of the given axes.
    pub(crate) fn from_axes(axes: Vec<Axis>) -> Layout {
        Layout { axes }
    }

    /// The axes, one per mesh dimension.
    pub(crate) fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// Number of dimensions.
    pub(crate) fn ndim(&self) -> usize {
        self.axes.len()
    }

    /// Size of each dimension.
    pub(crate) fn shape(&self) -> Vec<usize> {
        self.axes.iter().map(Axis::numel).collect()
    }

    /// Number of positions of the mesh.
    pub(crate) fn numel(&self) -> usize {
        self.shape().iter().product()
    }

    /// All dimensions as one axis (PyTorch's `collapse`).
    pub(crate) fn collapse(&self) -> Axis {
        Axis::new(self.axes.iter().flat_map(|a| a.modes.clone()).collect())
    }

    /// The layout with `axis` replaced by `with`.
    pub(crate) fn splice(&self, axis: usize, with: Vec<Axis>) -> Layout {
        let mut axes = self.axes.clone();
        axes.splice(axis..=axis, with);
        Layout { axes }
    }

    /// Whether no two indices reach the same position (`check_orthogonal`).
    pub(crate) fn is_orthogonal(&self) -> bool {
        let mut m = self.collapse().modes;
        m.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
        m.windows(2).all(|w| w[0].1 % (w[1].1 * w[1].0) == 0)
    }

    /// Whether the collapsed strides never increase (`check_sorted`): dimensions in the order of
    /// the root's.
    pub(crate) fn is_sorted(&self) -> bool {
        self.collapse().modes.windows(2).all(|w| w[0].1 >= w[1].1)
    }

    /// Offsets of every mesh position from its block's base, row-major over the dimensions.
    pub(crate) fn offsets(&self) -> Vec<usize> {
        let modes: Vec<Mode> = self.axes.iter().flat_map(|a| a.modes.clone()).collect();
        offsets_of(&modes)
    }

    /// The blocks of the mesh in a rank map of `n` positions: for each block base (ascending),
    /// the ranks of the mesh there, row-major (`remap_to_tensor(rank_map)`, one row per block).
    ///
    /// # Errors
    /// When the layout does not tile `rank_map` (a position is outside it or reached twice).
    pub(crate) fn blocks(&self, rank_map: &[usize]) -> Result<Vec<Vec<usize>>> {
        let offs = self.offsets();
        let mut seen = vec![false; rank_map.len()];
        let mut rows = Vec::with_capacity(rank_map.len() / offs.len().max(1));
        for base in 0..rank_map.len() {
            if seen[base] {
                continue;
            }
            let mut row = Vec::with_capacity(offs.len());
            for &o in &offs {
                let p = base + o;
                if p >= rank_map.len() || std::mem::replace(&mut seen[p], true) {
                    return Err(DistError::invalid(format!(
                        "the mesh layout {self:?} does not tile a rank map of {} ranks",
                        rank_map.len()
                    )));
                }
                row.push(rank_map[p]);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// The groups of dimension `dim`: `blocks` of that dimension alone.
    ///
    /// # Errors
    /// As [`Layout::blocks`].
    pub(crate) fn groups_along(&self, dim: usize, rank_map: &[usize]) -> Result<Vec<Vec<usize>>> {
        Layout::from_axes(vec![self.axes[dim].clone()]).blocks(rank_map)
    }
}

/// Coordinates of flat row-major index `i` in `shape`.
pub(crate) fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (d, &s) in shape.iter().enumerate().rev() {
        c[d] = i % s;
        i /= s;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(shape: &[usize], dim: usize) -> Vec<Vec<usize>> {
        let n = shape.iter().product();
        let map: Vec<usize> = (0..n).collect();
        Layout::row_major(shape).groups_along(dim, &map).unwrap()
    }

    #[test]
    fn groups_follow_pytorch_remap_order() {
        // Expected rows printed by PyTorch 2.15's _MeshLayout.remap_to_tensor.
        assert_eq!(
            groups(&[2, 4], 0),
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        assert_eq!(groups(&[2, 4], 1), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        assert_eq!(
            groups(&[2, 2, 2], 1),
            vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]
        );
        assert_eq!(
            groups(&[3, 2, 2], 0),
            vec![vec![0, 4, 8], vec![1, 5, 9], vec![2, 6, 10], vec![3, 7, 11]]
        );
        assert_eq!(groups(&[2, 1, 4], 1).len(), 8);
    }

    #[test]
    fn flatten_slice_and_split() {
        let root = Layout::row_major(&[2, 2, 2]);
        let dp_cp = Layout::from_axes(vec![root.axes[0].clone(), root.axes[1].clone()]);
        assert!(dp_cp.is_sorted() && dp_cp.is_orthogonal());
        let flat = Layout::from_axes(vec![dp_cp.collapse()]);
        let map: Vec<usize> = (0..8).collect();
        assert_eq!(
            flat.blocks(&map).unwrap(),
            vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]
        );
        let back = flat.axes[0].split(&[2, 2]).unwrap();
        assert_eq!(back, vec![root.axes[0].clone(), root.axes[1].clone()]);
        let reversed = Layout::from_axes(vec![root.axes[1].clone(), root.axes[0].clone()]);
        assert!(!reversed.is_sorted());
        let overlap = Layout::from_axes(vec![root.axes[0].clone(), root.axes[0].clone()]);
        assert!(!overlap.is_orthogonal());
        // a single mode split in three
        let one = Axis::new(vec![(8, 1)]);
        let parts = one.split(&[2, 2, 2]).unwrap();
        assert_eq!(Layout::from_axes(parts), root);
        // (2:6, 3:1) cannot give an inner dimension of 2
        assert!(Axis::new(vec![(2, 6), (3, 1)]).split(&[3, 2]).is_err());
    }

    #[test]
    fn coalesce_and_unravel() {
        assert_eq!(Axis::new(vec![(2, 4), (4, 1)]).modes(), &[(8, 1)]);
        assert_eq!(
            Axis::new(vec![(1, 9), (2, 4), (2, 1)]).modes(),
            &[(2, 4), (2, 1)]
        );
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(Layout::row_major(&[2, 3]).offsets(), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn blocks_refuse_a_layout_that_does_not_tile() {
        let l = Layout::from_axes(vec![Axis::new(vec![(3, 1)])]);
        assert!(l.blocks(&[0, 1, 2, 3]).is_err());
    }
}
