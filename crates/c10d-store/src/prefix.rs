//! `PrefixStore`: a namespace inside another store (mirrors `torch.distributed.PrefixStore`).

use crate::store::Store;
use c10d_core::{DistError, Result};
use std::sync::Arc;
use std::time::Duration;

/// Wraps a store and maps every key `k` to `"<prefix>/k"` (`PrefixStore(prefix, store)`).
///
/// - Every keyed op is forwarded with the joined key: set, get, add, compare_set, check, wait,
///   delete_key, append, multi_get, multi_set, queue_push/pop/len. Prefix stores nest:
///   `PrefixStore("b", PrefixStore("a", s))` writes `"a/b/k"` into `s`.
/// - `num_keys`, `timeout` and `set_timeout` pass through unchanged, so `num_keys` is the
///   *underlying* store's total (internal keys and other prefixes included), as in PyTorch.
/// - `has_extended_api` forwards. When the inner store lacks the extended API, `append` falls
///   back to a `compare_set` loop (PyTorch's `Store::append` fallback: atomic on every store);
///   `multi_get`/`multi_set` always forward, the inner store's own (default: one `get`/`set`
///   per key) doing the work.
/// - `list_keys` keeps only the inner keys that start with `"<prefix>/"` and strips that prefix.
/// - `clone_store` clones the inner store and wraps the clone with the same prefix.
pub struct PrefixStore {
    prefix: String,
    inner: Arc<dyn Store>,
}

impl std::fmt::Debug for PrefixStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl PrefixStore {
    /// A view of `inner` where every key gets `"<prefix>/"` in front
    /// (`torch.distributed.PrefixStore(prefix, store)`). PyTorch's `ValueError` for a `None`
    /// store cannot happen here: `inner` is always a store.
    pub fn new(prefix: &str, inner: Arc<dyn Store>) -> PrefixStore {
        PrefixStore {
            prefix: prefix.to_owned(),
            inner,
        }
    }

    /// The prefix (without the trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The store this one wraps (`PrefixStore.underlying_store`); may itself be a `PrefixStore`.
    pub fn underlying_store(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The innermost store that is not a `PrefixStore`, following nested prefix stores
    /// (`PrefixStore._underlying_non_prefix_store`).
    pub fn innermost_store(&self) -> Arc<dyn Store> {
        let mut cur = self.inner.clone();
        while let Some(next) = cur.wrapped_store() {
            cur = next;
        }
        cur
    }

    /// `"<prefix>/<key>"` (PyTorch's `joinKey`).
    pub fn join_key(&self, key: &str) -> String {
        let mut s = String::with_capacity(self.prefix.len() + 1 + key.len());
        s.push_str(&self.prefix);
        s.push('/');
        s.push_str(key);
        s
    }

    fn join_keys(&self, keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| self.join_key(k)).collect()
    }
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

impl Store for PrefixStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.join_key(key), value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.inner.get(&self.join_key(key))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.inner.add(&self.join_key(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.inner
            .compare_set(&self.join_key(key), expected, desired)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.inner.check(&as_strs(&self.join_keys(keys)))
    }

    fn wait(&self, keys: &[&str]) -> Result<()> {
        self.inner.wait(&as_strs(&self.join_keys(keys)))
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.inner
            .wait_timeout(&as_strs(&self.join_keys(keys)), timeout)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        self.inner.delete_key(&self.join_key(key))
    }

    fn num_keys(&self) -> Result<i64> {
        self.inner.num_keys()
    }

    fn has_extended_api(&self) -> bool {
        self.inner.has_extended_api()
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let key = self.join_key(key);
        if self.inner.has_extended_api() {
            return self.inner.append(&key, value);
        }
        // PyTorch's `Store::append` fallback: compare_set until no other writer interleaved.
        // Each round either succeeds or observes a newer value, so it ends once writers stop.
        let mut expected = value.to_vec();
        let mut current = self.inner.compare_set(&key, b"", &expected)?;
        while current != expected {
            expected = current.clone();
            expected.extend_from_slice(value);
            current = self.inner.compare_set(&key, &current, &expected)?;
        }
        Ok(())
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.inner.multi_get(&as_strs(&self.join_keys(keys)))
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        if keys.len() != values.len() {
            return Err(DistError::invalid(format!(
                "multi_set: {} keys but {} values; they must have the same length",
                keys.len(),
                values.len()
            )));
        }
        self.inner
            .multi_set(&as_strs(&self.join_keys(keys)), values)
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.queue_push(&self.join_key(key), value)
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        self.inner.queue_pop(&self.join_key(key), block)
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        self.inner.queue_len(&self.join_key(key))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        let head = self.join_key("");
        Ok(self
            .inner
            .list_keys()?
            .into_iter()
            .filter_map(|k| k.strip_prefix(&head).map(str::to_owned))
            .collect())
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&self, timeout: Duration) {
        self.inner.set_timeout(timeout);
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(PrefixStore::new(
            &self.prefix,
            self.inner.clone_store()?,
        )))
    }

    fn wrapped_store(&self) -> Option<Arc<dyn Store>> {
        Some(self.inner.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::HashStore;

    /// A store without the extended API, to exercise the fallbacks.
    struct Bare(HashStore);

    impl Store for Bare {
        fn set(&self, k: &str, v: &[u8]) -> Result<()> {
            self.0.set(k, v)
        }
        fn get(&self, k: &str) -> Result<Vec<u8>> {
            self.0.get(k)
        }
        fn add(&self, k: &str, d: i64) -> Result<i64> {
            self.0.add(k, d)
        }
        fn compare_set(&self, k: &str, e: &[u8], d: &[u8]) -> Result<Vec<u8>> {
            self.0.compare_set(k, e, d)
        }
        fn check(&self, k: &[&str]) -> Result<bool> {
            self.0.check(k)
        }
        fn wait_timeout(&self, k: &[&str], t: Duration) -> Result<()> {
            self.0.wait_timeout(k, t)
        }
        fn delete_key(&self, k: &str) -> Result<bool> {
            self.0.delete_key(k)
        }
        fn num_keys(&self) -> Result<i64> {
            self.0.num_keys()
        }
        fn timeout(&self) -> Duration {
            self.0.timeout()
        }
        fn set_timeout(&self, t: Duration) {
            self.0.set_timeout(t)
        }
        fn clone_store(&self) -> Result<Arc<dyn Store>> {
            Err(DistError::unsupported("Not implemented."))
        }
    }

    #[test]
    fn fallbacks_without_extended_api() {
        let bare = Arc::new(Bare(HashStore::new()));
        assert_eq!(
            bare.append("x", b"y").unwrap_err().to_string(),
            "Not implemented."
        );
        let p = PrefixStore::new("p", bare.clone());
        assert!(!p.has_extended_api());
        p.append("foo", b"po").unwrap();
        p.append("foo", b"tato").unwrap();
        assert_eq!(bare.get("p/foo").unwrap(), b"potato");
        p.multi_set(&["a", "b"], &[b"1", b"22"]).unwrap();
        assert_eq!(
            p.multi_get(&["b", "a"]).unwrap(),
            vec![b"22".to_vec(), b"1".to_vec()]
        );
        assert_eq!(bare.get("p/a").unwrap(), b"1");
        assert!(p
            .multi_set(&["a"], &[])
            .unwrap_err()
            .to_string()
            .contains("1 keys but 0 values"));
    }

    #[test]
    fn nesting_and_accessors() {
        let h: Arc<dyn Store> = Arc::new(HashStore::new());
        let a: Arc<dyn Store> = Arc::new(PrefixStore::new("a", h.clone()));
        let b = PrefixStore::new("b", a.clone());
        b.set("k", b"v").unwrap();
        assert_eq!(h.get("a/b/k").unwrap(), b"v");
        assert!(Arc::ptr_eq(b.underlying_store(), &a));
        assert!(Arc::ptr_eq(&b.innermost_store(), &h));
        h.set("other", b"1").unwrap();
        h.set("a/bk", b"1").unwrap();
        assert_eq!(b.list_keys().unwrap(), vec!["k".to_owned()]);
        let mut ka = PrefixStore::new("a", h.clone()).list_keys().unwrap();
        ka.sort();
        assert_eq!(ka, vec!["b/k".to_owned(), "bk".to_owned()]);
        assert_eq!(b.num_keys().unwrap(), 3);
    }
}
