//! The cross-rank argument check of mesh creation (a departure from PyTorch, whose ranks hang
//! when they pass different meshes): through the default store, every rank compares its
//! arguments with rank 0's, rank 0 collects the verdicts and publishes the first mismatch, and
//! every rank fails with that one error naming the rank and the argument.
//!
//! Keys, under the default store: `device_mesh/<n>/args/<rank>`, `device_mesh/<n>/verdict/<rank>`
//! (both deleted by rank 0 once read), `device_mesh/<n>/result` and `device_mesh/<n>/done` (a
//! count of readers; the last reader deletes both), where `<n>` counts the meshes this world
//! has checked. Each wait is bounded by the store's timeout.

use super::options::{py_tuple, MeshArray, MeshOptions};
use crate::World;
use c10d_core::{DistError, Result};
use c10d_store::Store;
use std::time::Duration;

/// The arguments of one mesh creation, as named (argument, value) pairs.
pub(crate) struct MeshArgs(Vec<(&'static str, String)>);

impl MeshArgs {
    pub(crate) fn new(device_type: &str, mesh: &MeshArray, opts: &MeshOptions) -> MeshArgs {
        let names = opts
            .mesh_dim_names
            .as_deref()
            .map_or("None".into(), py_tuple);
        let overrides: Vec<String> = opts
            .backend_override
            .iter()
            .map(|(k, v)| format!("{k}:{:?}", v.backend))
            .collect();
        MeshArgs(vec![
            ("device_type", device_type.to_string()),
            ("mesh_shape", format!("{:?}", mesh.shape())),
            ("mesh", mesh.to_string()),
            ("mesh_dim_names", names),
            ("backend_override", format!("{overrides:?}")),
            ("preserve_rank_order", opts.preserve_rank_order.to_string()),
        ])
    }

    fn encode(&self) -> Vec<u8> {
        let lines: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.join("\n").into_bytes()
    }

    /// The first argument where `self` (this rank's) differs from `theirs` (rank 0's encoding):
    /// (name, mine, theirs).
    fn first_difference(&self, theirs: &[u8]) -> Option<(String, String, String)> {
        let theirs = String::from_utf8_lossy(theirs);
        let theirs: Vec<(&str, &str)> = theirs.lines().filter_map(|l| l.split_once('=')).collect();
        self.0.iter().find_map(|(k, mine)| {
            let other = theirs.iter().find(|(tk, _)| tk == k).map_or("", |t| t.1);
            (other != mine).then(|| (k.to_string(), mine.clone(), other.to_string()))
        })
    }
}

/// Fails on every rank when some rank's `args` differ from rank 0's.
///
/// # Errors
/// "{what}: rank {r} passed {arg}={value} but rank 0 passed {arg}={value}; every rank must pass
/// the same arguments"; a store error or timeout naming the key waited for.
pub(crate) fn check_same_arguments(world: &World, what: &str, args: &MeshArgs) -> Result<()> {
    let store = world.default_store()?;
    let (rank, size) = (world.rank()?, world.world_size()?);
    let n = world.next_mesh_check();
    let key = |kind: &str, r: usize| format!("device_mesh/{n}/{kind}/{r}");
    let timeout = store.timeout();
    store.set(&key("args", rank), &args.encode())?;
    let zero = wait_get(store.as_ref(), &key("args", 0), timeout, what)?;
    let verdict = match args.first_difference(&zero) {
        None => String::new(),
        Some((arg, mine, theirs)) => format!(
            "{what}: rank {rank} passed {arg}={mine} but rank 0 passed {arg}={theirs}; every rank must pass the same arguments"
        ),
    };
    store.set(&key("verdict", rank), verdict.as_bytes())?;
    let result_key = format!("device_mesh/{n}/result");
    if rank == 0 {
        let result = collect_verdicts(store.as_ref(), size, &key, timeout, what)?;
        store.set(&result_key, result.as_bytes())?;
    }
    let result = wait_get(store.as_ref(), &result_key, timeout, what)?;
    let done_key = format!("device_mesh/{n}/done");
    if store.add(&done_key, 1)? == size as i64 {
        store.delete_key(&result_key)?;
        store.delete_key(&done_key)?;
    }
    match String::from_utf8_lossy(&result).as_ref() {
        "ok" => Ok(()),
        msg => Err(DistError::invalid(msg)),
    }
}

/// Rank 0: every rank's verdict, the first non-empty one (or "ok"); deletes the per-rank keys.
fn collect_verdicts(
    store: &dyn Store,
    size: usize,
    key: &dyn Fn(&str, usize) -> String,
    timeout: Duration,
    what: &str,
) -> Result<String> {
    let keys: Vec<String> = (0..size).map(|r| key("verdict", r)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait_timeout(&refs, timeout).map_err(|e| {
        let missing: Vec<usize> = (0..size)
            .filter(|&r| !store.check(&[refs[r]]).unwrap_or(true))
            .collect();
        e.with_prefix(&format!(
            "{what}: rank 0 waited {timeout:?} for the argument check of ranks {missing:?}: "
        ))
    })?;
    let verdicts = store.multi_get(&refs)?;
    for r in 0..size {
        store.delete_key(&key("args", r))?;
        store.delete_key(&key("verdict", r))?;
    }
    let first = verdicts.into_iter().find(|v| !v.is_empty());
    Ok(first.map_or("ok".into(), |v| String::from_utf8_lossy(&v).into_owned()))
}

/// Waits up to `timeout` for `key` and reads it.
fn wait_get(store: &dyn Store, key: &str, timeout: Duration, what: &str) -> Result<Vec<u8>> {
    store.wait_timeout(&[key], timeout).map_err(|e| {
        e.with_prefix(&format!(
            "{what}: waited {timeout:?} for key '{key}' of the cross-rank argument check: "
        ))
    })?;
    store.get(key)
}
