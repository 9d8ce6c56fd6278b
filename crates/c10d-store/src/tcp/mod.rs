//! PyTorch-compatible `TCPStore`: wire protocol, `mio` server and blocking client.
//!
//! - [`protocol`]: command numbers, encoders and the incremental request [`protocol::Decoder`]
//!   (byte-exact with PyTorch 2.x, see `shared/docs/store-protocol.md`).
//! - [`TcpStoreServer`]: one event-loop thread, libuv-backend semantics.
//! - [`TcpStore`]: the client (`torch.distributed.TCPStore`), optionally owning the server.

pub mod client;
pub mod protocol;
pub mod server;

pub use client::{TcpStore, TcpStoreOptions};
pub use server::{ServerOptions, TcpStoreServer};
