//! # c10d-run
//!
//! The `c10drun` launcher (`torch.distributed.run` / torchrun's counterpart): it starts the
//! workers of a job on each node with the environment torchrun gives them (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_*` …), hosts or joins
//! the rendezvous store (a PyTorch-compatible TCPStore from `c10d-store`), restarts failed
//! attempts and reports how each worker ended. Install it with `cargo install c10d-run`; see
//! `c10drun --help`.
//!
//! The library half holds what other process launchers of the workspace share.

pub mod die_with_parent;

pub use die_with_parent::die_with_parent;
