//! # c10d-testing
//!
//! Test support of the workspace, not published (`publish = false`): the tests (and benches)
//! of the crates use it as a dev-dependency, instead of including each other's files.
//!
//! - [`StoreBackend`] (`store_backend`): a CPU backend whose collectives go through the store;
//!   [`fake_device`]: a fake accelerator device type; [`world`]: ranks as threads (each its own
//!   `World`) and ranks as processes for the world-level tests. These need the `world` feature
//!   (on by default), which brings c10d-core, c10d-store and c10d-world.
//! - [`interop`]: PyTorch's Python, c10d-store's interop scripts and child processes with
//!   deadlines (interop tests); [`wire`]: raw TcpStore wire bytes; [`netns`]: two "hosts" or a
//!   LAN of network namespaces on this machine; [`procfs`]: a process's sockets and memory as
//!   `/proc` gives them. These need nothing but std, so c10d-store's own
//!   tests use them with `default-features = false`.

#[cfg(feature = "world")]
pub mod fake_device;
pub mod interop;
pub mod netns;
pub mod procfs;
#[cfg(feature = "world")]
mod store_backend;
pub mod wire;
#[cfg(feature = "world")]
pub mod world;

#[cfg(feature = "world")]
pub use store_backend::*;
