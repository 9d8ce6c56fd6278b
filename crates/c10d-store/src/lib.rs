//! # c10d-store
//!
//! Rendezvous stores of c10d-rs, mirroring `torch.distributed`'s: the [`Store`] trait and its
//! implementations ([`HashStore`], `PrefixStore`, `FileStore`, `TcpStore` server and client) that
//! share PyTorch's wire protocol and file format, plus the init-method URLs.

pub mod hash;
pub mod store;
// -- module list: each line is owned by the module's author; add yours below. --
pub mod file;
pub mod prefix;
pub mod rendezvous;
pub mod tcp;

pub use hash::HashStore;
pub use store::{store_barrier, Store, DEFAULT_STORE_TIMEOUT};
// -- re-exports: add yours below. --
pub use file::FileStore;
pub use prefix::PrefixStore;
pub use rendezvous::{rendezvous, rendezvous_with_env, Rendezvous, DEFAULT_RENDEZVOUS_TIMEOUT};
pub use tcp::{ServerOptions, TcpStore, TcpStoreOptions, TcpStoreServer};
