//! How rank 0's `ncclUniqueId` reaches the other ranks through the store: under which key, and
//! encoded how. The scheme decides who else can be in the group: a PyTorch or vLLM process
//! reads only its own scheme's keys.
//!
//! | scheme | key (in the group's store) | value | then |
//! |---|---|---|---|
//! | [`UniqueIdExchange::C10dRs`] (default) | `nccl_unique_id_{n}` | the 128 bytes | |
//! | [`UniqueIdExchange::TorchLegacy`] | `{n}` | the 128 bytes | |
//! | [`UniqueIdExchange::Vllm`] | `broadcast_from/0/{first + n}` | vLLM's pickle ([`crate::pickled_id`]) | a warm-up all_reduce |
//!
//! `n` counts the communicators the group made from a unique id, from 0 (split and shrink use
//! none). PyTorch's legacy `ProcessGroupNCCL` (`"nccl-legacy"`, and `"nccl"` before 2.15 or
//! with `TORCH_DIST_USE_NCCL2=0`) keys by its per-group `ncclCommCounter_`, under the group's
//! `<group name>/cuda/` prefix, which c10d-world's groups share. vLLM's `StatelessProcessGroup`
//! has no prefix and keys `broadcast_obj` by a per-source counter: `first` is how many objects
//! rank 0 broadcast in that store before the id (0 for a fresh `PyNcclCommunicator`), and every
//! member then joins a one-element float32 all_reduce (`PyNcclCommunicator`'s warm-up).
//! PyTorch 2.15's default `"nccl"` (nccl2) keys by `nccl_storekey_{n}`; its counter rule was
//! not verified against the 2.15 wheel, so no preset is offered for it yet.

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
    /// vLLM's `StatelessProcessGroup` + `PyNcclCommunicator`: the pickled id under
    /// `broadcast_from/0/{first + n}`, then a warm-up all_reduce.
    Vllm {
        /// Objects rank 0 broadcast through the store before the id.
        first: u64,
    },
}

impl UniqueIdExchange {
    /// The store key of the group's `n`-th unique id.
    pub fn key(&self, n: u64) -> String {
        match self {
            UniqueIdExchange::C10dRs => format!("nccl_unique_id_{n}"),
            UniqueIdExchange::TorchLegacy => n.to_string(),
            UniqueIdExchange::Vllm { first } => {
                format!("broadcast_from/0/{}", first.saturating_add(n))
            }
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
        let c = UniqueIdExchange::C10dRs;
        assert_eq!(
            (c.key(0), c.key(3)),
            ("nccl_unique_id_0".into(), "nccl_unique_id_3".into())
        );
        let t = UniqueIdExchange::TorchLegacy;
        assert_eq!((t.key(0), t.key(1)), ("0".into(), "1".into()));
        let v = UniqueIdExchange::Vllm { first: 2 };
        assert_eq!(v.key(0), "broadcast_from/0/2");
        for s in [c, t, v] {
            assert_eq!(s.decode("k", &s.encode(&id)).unwrap(), id, "{s:?}");
        }
        assert_eq!(t.encode(&id), id.to_vec());
        assert!(!c.warm_up() && !t.warm_up() && v.warm_up());
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
}
