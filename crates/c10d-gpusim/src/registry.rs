//! Opaque handles: what the C API hands out for streams, events, pools, graphs and
//! communicators are small integers cast to pointers, looked up here, never dereferenced, so a
//! stale or foreign handle is an error (`CUDA_ERROR_INVALID_HANDLE`), not a crash.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A table of live objects of one kind.
pub struct Registry<T> {
    map: Mutex<HashMap<usize, Arc<T>>>,
    next: AtomicUsize,
    base: usize,
}

impl<T> Registry<T> {
    /// An empty table whose handles start at `base` (distinct per kind, never 0, 1 or 2).
    pub fn new(base: usize) -> Registry<T> {
        Registry {
            map: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(0),
            base,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<T>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `value`; returns its handle.
    pub fn insert(&self, value: Arc<T>) -> usize {
        let h = self.base + 16 * self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(h, value);
        h
    }

    /// The object behind `handle`.
    pub fn get(&self, handle: usize) -> Option<Arc<T>> {
        self.lock().get(&handle).cloned()
    }

    /// Removes `handle`; returns its object.
    pub fn remove(&self, handle: usize) -> Option<Arc<T>> {
        self.lock().remove(&handle)
    }

    /// Every live object.
    pub fn all(&self) -> Vec<Arc<T>> {
        self.lock().values().cloned().collect()
    }
}
