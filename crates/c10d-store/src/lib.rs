//! # c10d-store
//!
//! Rendezvous stores of c10d-rs, mirroring `torch.distributed`'s: the [`Store`] trait and its
//! implementations ([`HashStore`], `PrefixStore`, `FileStore`, `TcpStore` server and client) that
//! share PyTorch's wire protocol and file format, plus the init-method URLs.
//!
//! Where things live: [`store`] the trait and `store_barrier`; [`hash`], [`prefix`], [`file`](mod@file)
//! one store each; [`tcp`] the `TCPStore` (`protocol` the wire format and request decoder,
//! `server` the event-loop server with one handler per request, `client` the blocking client);
//! [`rendezvous`](mod@rendezvous) the init-method URLs (`env://`, `tcp://`, `file://`) → (store, rank, world
//! size); `src/bin/` the `c10d-store` CLI and `c10d-store-bench`. A group's store in c10d-world is
//! a chain of [`PrefixStore`]s over the rendezvous store (`"default_pg"`, `"<group name>/"`,
//! `"<device>/"`), as in PyTorch.
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `cert-gen` | off | `tls::create_job_files`: a fresh CA and one certificate it signed, written as a job's three TLS files (what `c10d-store new-tls DIR` writes). Pulls in `rcgen`. |
//!
//! A library user that brings its own certificates (see [`tls`]) needs no feature: the default
//! build has no certificate generator. The `c10d-store` CLI (c10d-tools) turns `cert-gen` on.

pub mod auth;
pub mod hash;
pub mod store;
// -- module list: each line is owned by the module's author; add yours below. --
pub mod file;
pub mod prefix;
pub mod rendezvous;
pub mod tcp;
pub mod tls;

pub use auth::AuthSecret;
pub use hash::HashStore;
pub use store::{store_barrier, Store, DEFAULT_STORE_TIMEOUT};
// -- re-exports: add yours below. --
/// The error type every store operation returns (c10d-core's), re-exported so that a store user
/// needs no other crate.
pub use c10d_core::{DistError, ErrorKind, Result};
pub use file::FileStore;
pub use prefix::PrefixStore;
pub use rendezvous::{rendezvous, rendezvous_with_env, Rendezvous, DEFAULT_RENDEZVOUS_TIMEOUT};
pub use tcp::{ServerOptions, TcpStore, TcpStoreOptions, TcpStoreServer};
pub use tls::TlsConfig;
