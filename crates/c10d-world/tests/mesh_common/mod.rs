//! The grid the DeviceMesh tests check against, computed without the crate's layout code: a
//! rank's coordinates in a row-major grid, and the ranks of its group along a dimension.
#![allow(dead_code)]

/// Coordinates of `rank` in a row-major grid of `shape`.
pub fn coord(mut rank: usize, shape: &[usize]) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = rank % shape[d];
        rank /= shape[d];
    }
    c
}

/// The ranks that share every coordinate of `rank` except along `dim` (the group along `dim`).
pub fn line(rank: usize, shape: &[usize], dim: usize) -> Vec<usize> {
    let me = coord(rank, shape);
    (0..shape.iter().product())
        .filter(|&r| {
            let c = coord(r, shape);
            (0..shape.len()).all(|d| d == dim || c[d] == me[d])
        })
        .collect()
}
