//! Locking the engine's shared mutexes: a poisoned lock (a panic while held, which fails the
//! group anyway) is taken as is. A leaf of the engine.

use std::sync::Mutex;

/// `m` locked, poisoned or not.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
