//! Setting the segment up when a group connects: rank 0 creates it under a random name and
//! publishes the name in the group's store, every rank maps it and votes, the name is unlinked
//! once the votes are in (see the module docs).

use super::segment::*;
use super::ShmState;
use c10d_core::Result;
use c10d_store::Store;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Store keys of the set-up (under the group's store).
pub(crate) const KEY_NAME: &str = "c10d_shm/name";
pub(crate) const KEY_VOTE: &str = "c10d_shm/vote/";
/// The collective set-up through the group's store (see the module docs): `On` when every rank
/// of a group of 2 ..= [`MAX_RANKS`] mapped the segment, `Off` otherwise. `eligible`: this rank
/// agrees (option on, every peer on this host).
///
/// # Errors
/// A store failure or timeout (a peer did not get this far); the name is unlinked anyway.
pub(crate) fn setup(
    store: &dyn Store,
    rank: usize,
    n: usize,
    eligible: bool,
    timeout: Duration,
) -> Result<ShmState> {
    if !(2..=MAX_RANKS).contains(&n) {
        return Ok(ShmState::Off);
    }
    let (mine, created) = if rank == 0 {
        create(n, eligible)
    } else {
        (None, None)
    };
    let _unlink = created.map(Unlink);
    let mine = match rank {
        0 => {
            let name = _unlink
                .as_ref()
                .map_or(Vec::new(), |u| u.0.as_bytes().to_vec());
            store.set(KEY_NAME, &name)?;
            mine
        }
        _ => {
            store.wait_timeout(&[KEY_NAME], timeout)?;
            let name = store.get(KEY_NAME)?;
            open(&name, n, eligible)
        }
    };
    store.set(&format!("{KEY_VOTE}{rank}"), &[mine.is_some() as u8])?;
    let keys: Vec<String> = (0..n).map(|p| format!("{KEY_VOTE}{p}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait_timeout(&refs, timeout)?;
    let all = store.multi_get(&refs)?;
    match mine {
        Some(seg) if all.iter().all(|v| v.as_slice() == [1]) => {
            seg.line(rank)
                .pid
                .store(std::process::id() as i32, Ordering::Release);
            Ok(ShmState::On(seg))
        }
        _ => Ok(ShmState::Off),
    }
}

/// Unlinks a segment name when dropped (after the votes, or on a failed set-up).
pub(crate) struct Unlink(CString);

impl Drop for Unlink {
    fn drop(&mut self) {
        unlink(&self.0);
    }
}

/// Rank 0's segment and its name.
pub(crate) fn create(n: usize, eligible: bool) -> (Option<Segment>, Option<CString>) {
    if !eligible {
        return (None, None);
    }
    let name = CString::new(format!(
        "/c10d-shm-{}-{:016x}",
        std::process::id(),
        rand_u64()
    ))
    .expect("no NUL");
    match Segment::map(&name, n, true) {
        Ok(s) => (Some(s), Some(name)),
        Err(e) => {
            log::info!("c10d-gloo: no shared memory for the group ({e}); using sockets");
            (None, None)
        }
    }
}

/// A peer's mapping of the segment rank 0 named (`None`: no name, not eligible, or it fails).
pub(crate) fn open(name: &[u8], n: usize, eligible: bool) -> Option<Segment> {
    if name.is_empty() || !eligible {
        return None;
    }
    let c = CString::new(name).ok()?;
    Segment::map(&c, n, false)
        .map_err(|e| {
            log::info!("c10d-gloo: cannot map the group's shared memory ({e}); using sockets")
        })
        .ok()
}
