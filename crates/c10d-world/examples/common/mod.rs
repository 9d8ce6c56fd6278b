//! What the examples that join a job from outside share: the environment they are given and
//! the default group they join through the job's TCPStore on 127.0.0.1.
#![allow(dead_code)] // each example uses part of it

use c10d_core::{DistError, Result};
use c10d_store::{Store, TcpStore, TcpStoreOptions};
use c10d_world::{InitOptions, World};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable `name` parsed, `None` when unset or unparsable.
pub fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The environment variable `name` as a number; an error naming it when missing.
pub fn need(name: &str) -> Result<usize> {
    var(name).ok_or_else(|| DistError::invalid(format!("{name} is not set")))
}

/// A world whose default group (`"gloo"`) is rank `rank` of `world_size`, joined through the
/// job's store at 127.0.0.1:`port` (a client, used as given), every step bounded by `timeout`.
pub fn join(rank: usize, world_size: usize, port: u16, timeout: Duration) -> Result<World> {
    let opts = TcpStoreOptions {
        timeout,
        ..Default::default()
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, opts)?);
    let w = World::new();
    w.init_process_group(InitOptions {
        backend: Some("gloo".into()),
        store: Some(store),
        rank: Some(rank),
        world_size: Some(world_size),
        timeout: Some(timeout),
        ..Default::default()
    })?;
    Ok(w)
}
