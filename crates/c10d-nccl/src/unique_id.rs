//! How rank 0's `ncclUniqueId` (or, for large groups under PyTorch 2.15's nccl2, each root's)
//! reaches the other ranks through the store: under which key, and encoded how. The scheme
//! decides who else can be in the group: a PyTorch or vLLM process reads only its own scheme's
//! keys.
//!
//! | scheme | key (in the group's store) | value | then |
//! |---|---|---|---|
//! | [`UniqueIdExchange::C10dRs`] (default) | `nccl_unique_id_{n}` | the 128 bytes | |
//! | [`UniqueIdExchange::TorchLegacy`] | `{n}` | the 128 bytes | |
//! | [`UniqueIdExchange::TorchNccl2`] | `{group name}/nccl_storekey_{n}`; above `ranks_per_root` ranks `{group name}/nccl_storekey_{n}_{i}` for root `i` | the 128 bytes | `ncclCommInitRankScalable` with several roots |
//! | [`UniqueIdExchange::Vllm`] | `broadcast_from/0/{first + n}` | vLLM's pickle ([`crate::pickled_id`]) | a warm-up all_reduce |
//!
//! `n` counts the communicators the group made from a unique id, from 0 (split and shrink use
//! none). PyTorch's legacy `ProcessGroupNCCL` (`"nccl-legacy"`, and `"nccl"` before 2.15 or
//! with `TORCH_DIST_USE_NCCL2=0`) keys by its per-group `ncclCommCounter_`, under the group's
//! `<group name>/cuda/` prefix, which c10d-world's groups share. PyTorch 2.15's eager `"nccl"`
//! (`c10d::nccl2`) keys by its per-group `bootstrap_generation_` under one more prefix, the
//! group's name (`PrefixStore(name, store)` in its `NCCLBootstrap`); a group of more than
//! `TORCH_NCCL_RANKS_PER_ROOT` ranks (default 128) makes its communicator from
//! `ceil(size / ranks_per_root)` ids, id `i` made by the first rank of the `i`-th of as many
//! nearly equal blocks of ranks (the larger blocks first), each under its own key, and every rank
//! reads them all. (Earlier torchcomms bootstraps keyed `nccl_storekey_{n}` by a process-wide
//! counter; later torchcomms keys by the communicator's name alone, `nccl_storekey_{name}`.
//! Neither is offered: they are not what a PyTorch 2.15 peer writes.) vLLM's
//! `StatelessProcessGroup` has no prefix and keys `broadcast_obj` by a per-source counter:
//! `first` is how many objects rank 0 broadcast in that store before the id (0 for a fresh
//! `PyNcclCommunicator`), and every member then joins a one-element float32 all_reduce
//! (`PyNcclCommunicator`'s warm-up).

use crate::pickled_id;
use c10d_core::{DistError, Result};

/// The 128 bytes of an `ncclUniqueId`.
pub type IdBytes = [u8; pickled_id::ID_BYTES];

/// A unique-id exchange scheme (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UniqueIdExchange {
    /// c10d-rs's own: the bytes under `nccl_unique_id_{n}`.
    #[default]
    C10dRs,
    /// PyTorch's legacy `ProcessGroupNCCL`: the bytes under `{n}`.
    TorchLegacy,
    /// PyTorch 2.15's eager `"nccl"` (nccl2): the bytes under `{group name}/nccl_storekey_{n}`,
    /// one id per root above `ranks_per_root` ranks (see the module docs).
    TorchNccl2 {
        /// `TORCH_NCCL_RANKS_PER_ROOT` (PyTorch's default 128; at least 1).
        ranks_per_root: usize,
    },
    /// vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`: the pickled id under
    /// `broadcast_from/0/{first + n}`, then a warm-up all_reduce.
    Vllm {
        /// Objects rank 0 broadcast through the store before the id.
        first: u64,
    },
}

impl UniqueIdExchange {
    /// [`UniqueIdExchange::TorchNccl2`] with `TORCH_NCCL_RANKS_PER_ROOT` from the environment
    /// (PyTorch's default 128 when unset).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for a value that is not a positive integer (PyTorch:
    /// "TORCH_NCCL_RANKS_PER_ROOT must be greater than zero").
    pub fn torch_nccl2() -> Result<UniqueIdExchange> {
        let ranks_per_root = match std::env::var("TORCH_NCCL_RANKS_PER_ROOT") {
            Err(_) => 128,
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(DistError::invalid(format!(
                        "TORCH_NCCL_RANKS_PER_ROOT must be greater than zero, got {v:?}"
                    )))
                }
            },
        };
        Ok(UniqueIdExchange::TorchNccl2 { ranks_per_root })
    }

    /// How many ids make a communicator of `size` ranks (1 but for nccl2 above its
    /// ranks per root).
    pub fn roots(&self, size: usize) -> usize {
        match self {
            UniqueIdExchange::TorchNccl2 { ranks_per_root } if size > *ranks_per_root => {
                size.div_ceil((*ranks_per_root).max(1))
            }
            _ => 1,
        }
    }

    /// The store keys of the group's `n`-th communicator, one per root (group `group_name`
    /// of `size` ranks).
    pub fn keys(&self, n: u64, group_name: &str, size: usize) -> Vec<String> {
        match self {
            UniqueIdExchange::C10dRs => vec![format!("nccl_unique_id_{n}")],
            UniqueIdExchange::TorchLegacy => vec![n.to_string()],
            UniqueIdExchange::TorchNccl2 { .. } => match self.roots(size) {
                1 => vec![format!("{group_name}/nccl_storekey_{n}")],
                k => (0..k)
                    .map(|i| format!("{group_name}/nccl_storekey_{n}_{i}"))
                    .collect(),
            },
            UniqueIdExchange::Vllm { first } => {
                vec![format!("broadcast_from/0/{}", first.saturating_add(n))]
            }
        }
    }

    /// Which of the keys `rank` (of `size`) makes and publishes the id for, if any: rank 0
    /// for one root; with several, the first rank of each of `roots` nearly equal blocks, the
    /// `size % roots` larger blocks first (PyTorch nccl2's `getRootIndex`).
    pub fn root_index(&self, rank: usize, size: usize) -> Option<usize> {
        let roots = self.roots(size);
        let (base, larger) = (size / roots, size % roots);
        let big_end = larger * (base + 1);
        if rank < big_end {
            rank.is_multiple_of(base + 1).then_some(rank / (base + 1))
        } else {
            (rank - big_end)
                .is_multiple_of(base)
                .then_some((rank - big_end) / base + larger)
        }
    }

    /// The value rank 0 stores.
    pub fn encode(&self, id: &IdBytes) -> Vec<u8> {
        match self {
            UniqueIdExchange::Vllm { .. } => pickled_id::encode(id),
            _ => id.to_vec(),
        }
    }

    /// The id in a value read under `key`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for a value of the wrong length, or a pickle that is not
    /// vLLM's id (it is parsed, never loaded), naming the key.
    pub fn decode(&self, key: &str, value: &[u8]) -> Result<IdBytes> {
        let id = match self {
            UniqueIdExchange::Vllm { .. } => pickled_id::decode(value),
            _ => value.try_into().map_err(|_| {
                DistError::invalid(format!(
                    "{} bytes, expected {}",
                    value.len(),
                    pickled_id::ID_BYTES
                ))
            }),
        };
        id.map_err(|e| {
            DistError::invalid(format!(
                "ProcessGroupNCCL: the unique id under store key {key:?} ({self:?}): {}",
                e.message()
            ))
        })
    }

    /// Whether every member joins a warm-up all_reduce of one float32 zero after the
    /// communicator is made (vLLM's `PyNcclCommunicator` does, and waits for it).
    pub fn warm_up(&self) -> bool {
        matches!(self, UniqueIdExchange::Vllm { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_of_each_scheme() {
        let id: IdBytes = std::array::from_fn(|i| i as u8);
        let key = |s: UniqueIdExchange, n| s.keys(n, "g", 8).remove(0);
        let c = UniqueIdExchange::C10dRs;
        assert_eq!(
            (key(c, 0), key(c, 3)),
            ("nccl_unique_id_0".into(), "nccl_unique_id_3".into())
        );
        let t = UniqueIdExchange::TorchLegacy;
        assert_eq!((key(t, 0), key(t, 1)), ("0".into(), "1".into()));
        let v = UniqueIdExchange::Vllm { first: 2 };
        assert_eq!(key(v, 0), "broadcast_from/0/2");
        let n2 = UniqueIdExchange::TorchNccl2 {
            ranks_per_root: 128,
        };
        assert_eq!(key(n2, 1), "g/nccl_storekey_1");
        for s in [c, t, v, n2] {
            assert_eq!(s.keys(0, "g", 8).len(), 1);
            assert_eq!(s.root_index(0, 8), Some(0));
            assert_eq!(s.root_index(5, 8), None);
            assert_eq!(s.decode("k", &s.encode(&id)).unwrap(), id, "{s:?}");
        }
        assert_eq!(t.encode(&id), id.to_vec());
        assert!(!c.warm_up() && !t.warm_up() && !n2.warm_up() && v.warm_up());
        let e = t.decode("0", &[1, 2, 3]).unwrap_err();
        assert!(
            e.message().contains("\"0\"") && e.message().contains("3 bytes, expected 128"),
            "{e}"
        );
        // Raw bytes where vLLM's pickle is expected: refused, never loaded.
        let e = v.decode("broadcast_from/0/2", &id).unwrap_err();
        assert!(
            e.message().contains("pickles are parsed, never loaded"),
            "{e}"
        );
    }

    /// nccl2 above its ranks per root: one key per root, and exactly one root rank per key,
    /// the first of each block (larger blocks first), as PyTorch's `getRootIndex` picks them.
    #[test]
    fn nccl2_multi_root_keys_and_roots() {
        let s = UniqueIdExchange::TorchNccl2 {
            ranks_per_root: 128,
        };
        assert_eq!(s.roots(128), 1);
        assert_eq!(
            s.keys(2, "0", 300),
            [
                "0/nccl_storekey_2_0",
                "0/nccl_storekey_2_1",
                "0/nccl_storekey_2_2"
            ]
        );
        for (size, want) in [
            (300, vec![0, 100, 200]),
            (257, vec![0, 86, 172]),
            (129, vec![0, 65]),
            (1024, (0..8).map(|i| i * 128).collect()),
        ] {
            let roots: Vec<usize> = (0..size)
                .filter_map(|r| s.root_index(r, size).map(|i| (i, r)))
                .map(|(i, r)| {
                    assert_eq!(want[i], r, "size {size}: root {i}");
                    r
                })
                .collect();
            assert_eq!(roots, want, "size {size}");
        }
        let small = UniqueIdExchange::TorchNccl2 { ranks_per_root: 2 };
        assert_eq!(small.roots(5), 3);
        let r: Vec<Option<usize>> = (0..5).map(|k| small.root_index(k, 5)).collect();
        assert_eq!(r, [Some(0), None, Some(1), None, Some(2)]);
    }
}
