//! Collective algorithms, one small module each, written against [`crate::engine::Comm`].
//!
//! Every algorithm is deterministic in (op, sizes, group size, options), so all ranks run the
//! same message pattern; each posts its receives from a given peer in the order that peer
//! sends. Reductions combine contributions in a fixed order (rank order, or ring order for the
//! ring), so every rank ends with bit-identical results.

pub(crate) mod allreduce;
pub(crate) mod barrier;
pub(crate) mod broadcast;
pub(crate) mod cma;
pub(crate) mod dispatch;
pub(crate) mod doubling;
pub(crate) mod exchange;
pub(crate) mod hierarchical;
pub(crate) mod reduce;
pub(crate) mod select;
pub(crate) mod shm;
pub(crate) mod step;

/// Byte range of part `i` of `count` elements of `es` bytes split into `parts` nearly equal parts.
pub(crate) fn part(count: usize, parts: usize, i: usize, es: usize) -> std::ops::Range<usize> {
    (i * count / parts) * es..((i + 1) * count / parts) * es
}
