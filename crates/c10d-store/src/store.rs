//! The `Store` trait (mirrors `c10d::Store` / `torch.distributed.Store`).

use c10d_core::{DistError, Result};
use std::sync::Arc;
use std::time::Duration;

/// `Store::kDefaultTimeout`: 300 seconds.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(300);

/// A key-value store used for rendezvous, shared by all ranks of a job.
///
/// Keys are strings (PyTorch's are arbitrary bytes, but Python always passes UTF-8); values are
/// bytes. Every blocking call is bounded by [`Store::timeout`] (default 300 s) unless it takes
/// its own timeout. Semantics of each op are PyTorch's (see `shared/docs/store-protocol.md` §3).
///
/// Timeout meaning of `Duration::ZERO` follows PyTorch per store: `HashStore` and `FileStore`
/// treat it as "wait forever", `TcpStore` as "do not wait".
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, waking waiters on `key` (`store.set`).
    ///
    /// # Errors
    /// Network/IO failures.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Waits for `key` (up to the store timeout) and returns its value (`store.get`).
    ///
    /// # Errors
    /// [`DistError::Store`] on timeout (text per store, e.g. "wait timeout after 300000ms, keys: /k"),
    /// network/IO failures.
    fn get(&self, key: &str) -> Result<Vec<u8>>;

    /// Adds `delta` to the decimal integer stored at `key` (missing = 0) and returns the new value
    /// (`store.add`).
    ///
    /// # Errors
    /// [`DistError::Store`] when the current value is not a decimal integer; network/IO failures.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Atomic compare-and-set with PyTorch's decision table (`store.compare_set`): missing key and
    /// empty `expected` → stores `desired`; missing key and non-empty `expected` → returns
    /// `expected`, stores nothing; equal → stores and returns `desired`; else returns the current value.
    ///
    /// # Errors
    /// Network/IO failures.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;

    /// True iff every key exists (`store.check`). Zero keys → true.
    ///
    /// # Errors
    /// Network/IO failures.
    fn check(&self, keys: &[&str]) -> Result<bool>;

    /// Waits until every key exists, up to the store timeout (`store.wait(keys)`).
    ///
    /// # Errors
    /// As [`Store::wait_timeout`].
    fn wait(&self, keys: &[&str]) -> Result<()> {
        self.wait_timeout(keys, self.timeout())
    }

    /// Waits until every key exists, up to `timeout` (`store.wait(keys, timeout)`).
    ///
    /// # Errors
    /// [`DistError::Store`] on timeout; network/IO failures.
    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()>;

    /// Deletes `key`; true if it existed (`store.delete_key`; FileStore always returns true, as PyTorch).
    ///
    /// # Errors
    /// Network/IO failures.
    fn delete_key(&self, key: &str) -> Result<bool>;

    /// Number of keys, including a store's internal keys (`store.num_keys`).
    ///
    /// # Errors
    /// Network/IO failures.
    fn num_keys(&self) -> Result<i64>;

    /// True when append/multi_get/multi_set are native (`store.has_extended_api()`).
    fn has_extended_api(&self) -> bool {
        false
    }

    /// Appends `value` to `key` (creates it when missing) (`store.append`).
    ///
    /// # Errors
    /// [`DistError::Unsupported`] "Not implemented." when the store has no extended API.
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let _ = (key, value);
        Err(DistError::unsupported("Not implemented."))
    }

    /// Gets every key after waiting for all of them (`store.multi_get`).
    ///
    /// # Errors
    /// As [`Store::get`].
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Sets `keys[i]` to `values[i]` (`store.multi_set`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the lengths differ; as [`Store::set`].
    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set_len(keys, values)?;
        keys.iter()
            .zip(values)
            .try_for_each(|(k, v)| self.set(k, v))
    }

    /// Pushes onto the queue `key` (`store.queue_push`).
    ///
    /// # Errors
    /// [`DistError::Unsupported`] on stores without queues.
    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let _ = (key, value);
        Err(DistError::unsupported(
            "queues not implemented on this store",
        ))
    }

    /// Pops the front of queue `key`; with `block` waits up to the timeout for an item
    /// (`store.queue_pop`).
    ///
    /// # Errors
    /// [`DistError::QueueEmpty`] "queue is empty" (non-blocking, empty); [`DistError::Store`] on timeout;
    /// [`DistError::Unsupported`] on stores without queues.
    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        let _ = (key, block);
        Err(DistError::unsupported(
            "queues not implemented on this store",
        ))
    }

    /// Length of queue `key` (`store.queue_len`).
    ///
    /// # Errors
    /// [`DistError::Unsupported`] on stores without queues.
    fn queue_len(&self, key: &str) -> Result<i64> {
        let _ = key;
        Err(DistError::unsupported(
            "queues not implemented on this store",
        ))
    }

    /// User keys (`store.list_keys`), internal keys omitted.
    ///
    /// # Errors
    /// [`DistError::Unsupported`] on stores that cannot list.
    fn list_keys(&self) -> Result<Vec<String>> {
        Err(DistError::unsupported(
            "list_keys not implemented on this store",
        ))
    }

    /// The default timeout of blocking calls.
    fn timeout(&self) -> Duration;

    /// Changes the default timeout (`store.set_timeout`).
    fn set_timeout(&self, timeout: Duration);

    /// For a store that wraps another one (`PrefixStore`): the wrapped store; `None` for every
    /// base store. Lets [`crate::PrefixStore::innermost_store`] walk nested prefix stores.
    fn wrapped_store(&self) -> Option<Arc<dyn Store>> {
        None
    }

    /// A new handle to the same data (`store.clone()`); for TcpStore a new connection.
    ///
    /// # Errors
    /// Network failures while connecting.
    fn clone_store(&self) -> Result<Arc<dyn Store>>;

    /// Store barrier (`store.barrier(key, world_size, timeout)`): returns once `world_size`
    /// callers reached `key`. Default: the add-then-wait scheme of [`store_barrier`]; TcpStore
    /// overrides it with the native BARRIER command.
    ///
    /// # Errors
    /// [`DistError::Store`] "barrier timeout after {ms}ms, key: {key}" when not all arrive in time.
    fn barrier(&self, key: &str, world_size: usize, timeout: Duration) -> Result<()> {
        store_barrier(self, key, world_size, timeout)
    }
}

/// The argument check of every `multi_set`: as many values as keys.
pub(crate) fn check_multi_set_len(keys: &[&str], values: &[&[u8]]) -> Result<()> {
    if keys.len() != values.len() {
        return Err(DistError::invalid(
            "multi_set: keys and values must have the same length",
        ));
    }
    Ok(())
}

/// Store-based barrier (`store.barrier(key, world_size, timeout)` semantics on every store):
/// each caller adds 1 to `key` and waits until `world_size` callers arrived. The counter is never
/// reset, so a key can be used once per world.
///
/// # Errors
/// [`DistError::Store`] "barrier timeout after {ms}ms, key: {key}" when not all arrive in time.
pub fn store_barrier<S: Store + ?Sized>(
    store: &S,
    key: &str,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let n = store.add(key, 1)?;
    let done_key = format!("{key}/done");
    if n as usize >= world_size {
        return store.set(&done_key, b"1");
    }
    store
        .wait_timeout(&[done_key.as_str()], timeout)
        .map_err(|e| {
            if e.is_store_error() {
                DistError::store(format!(
                    "barrier timeout after {}ms, key: {key}",
                    timeout.as_millis()
                ))
            } else {
                e
            }
        })
}
