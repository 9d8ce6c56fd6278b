//! `HashStore`: an in-process store (mirrors `torch.distributed.HashStore`).

use crate::store::{check_multi_set_len, Store, DEFAULT_STORE_TIMEOUT};
use crate::tcp::protocol::parse_stoll;
use c10d_core::{DistError, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Data {
    map: HashMap<String, Vec<u8>>,
    queues: HashMap<String, VecDeque<Vec<u8>>>,
}

struct Shared {
    data: Mutex<Data>,
    cv: Condvar,
}

/// In-process store shared by threads: `clone_store` handles see the same data. No internal
/// keys (`num_keys` counts user keys only). Blocking calls wait on a condition variable;
/// a zero timeout waits forever (PyTorch's HashStore rule). Timeouts raise
/// [`DistError::Store`] "Wait timeout".
pub struct HashStore {
    shared: Arc<Shared>,
    timeout: Mutex<Duration>,
}

impl Default for HashStore {
    fn default() -> Self {
        Self::new()
    }
}

impl HashStore {
    /// An empty store with the default 300 s timeout.
    pub fn new() -> Self {
        HashStore {
            shared: Arc::new(Shared {
                data: Mutex::new(Data::default()),
                cv: Condvar::new(),
            }),
            timeout: Mutex::new(DEFAULT_STORE_TIMEOUT),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Data> {
        self.shared.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ready(data)` holds or the timeout passes (zero = forever).
    fn wait_until<'a>(
        &'a self,
        timeout: Duration,
        mut ready: impl FnMut(&Data) -> bool,
    ) -> Result<MutexGuard<'a, Data>> {
        // Zero, or a timeout past the end of time (Duration::MAX), waits forever.
        let deadline = (!timeout.is_zero())
            .then(|| Instant::now().checked_add(timeout))
            .flatten();
        let mut g = self.lock();
        while !ready(&g) {
            match deadline {
                None => g = self.shared.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(DistError::store("Wait timeout"));
                    }
                    g = self
                        .shared
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        Ok(g)
    }

    fn present(d: &Data, k: &str) -> bool {
        d.map.contains_key(k) || d.queues.get(k).is_some_and(|q| !q.is_empty())
    }
}

impl Store for HashStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock().map.insert(key.to_owned(), value.to_vec());
        self.shared.cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let g = self.wait_until(self.timeout(), |d| d.map.contains_key(key))?;
        Ok(g.map[key].clone())
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut g = self.lock();
        let cur = match g.map.get(key) {
            None => 0,
            Some(v) => parse_i64(v)?,
        };
        let new = cur.wrapping_add(delta);
        g.map.insert(key.to_owned(), new.to_string().into_bytes());
        drop(g);
        self.shared.cv.notify_all();
        Ok(new)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let mut g = self.lock();
        let out = match g.map.get(key) {
            None if expected.is_empty() => {
                g.map.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(cur) if cur == expected => {
                g.map.insert(key.to_owned(), desired.to_vec());
                desired.to_vec()
            }
            Some(cur) => cur.clone(),
        };
        drop(g);
        self.shared.cv.notify_all();
        Ok(out)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let g = self.lock();
        Ok(keys.iter().all(|k| Self::present(&g, k)))
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.wait_until(timeout, |d| keys.iter().all(|k| Self::present(d, k)))
            .map(drop)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(self.lock().map.remove(key).is_some())
    }

    fn num_keys(&self) -> Result<i64> {
        Ok(self.lock().map.len() as i64)
    }

    fn has_extended_api(&self) -> bool {
        true
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock()
            .map
            .entry(key.to_owned())
            .or_default()
            .extend_from_slice(value);
        self.shared.cv.notify_all();
        Ok(())
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let g = self.wait_until(self.timeout(), |d| {
            keys.iter().all(|k| d.map.contains_key(*k))
        })?;
        Ok(keys.iter().map(|k| g.map[*k].clone()).collect())
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set_len(keys, values)?;
        let mut g = self.lock();
        for (k, v) in keys.iter().zip(values) {
            g.map.insert((*k).to_owned(), v.to_vec());
        }
        drop(g);
        self.shared.cv.notify_all();
        Ok(())
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        self.lock()
            .queues
            .entry(key.to_owned())
            .or_default()
            .push_back(value.to_vec());
        self.shared.cv.notify_all();
        Ok(())
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        let mut g = if block {
            self.wait_until(self.timeout(), |d| {
                d.queues.get(key).is_some_and(|q| !q.is_empty())
            })
            .map_err(|_| DistError::store(format!("queue_pop timeout waiting for key: {key}")))?
        } else {
            self.lock()
        };
        g.queues
            .get_mut(key)
            .and_then(VecDeque::pop_front)
            .ok_or_else(|| DistError::queue_empty("queue is empty"))
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        Ok(self.lock().queues.get(key).map_or(0, |q| q.len() as i64))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        Ok(self.lock().map.keys().cloned().collect())
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }

    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(HashStore {
            shared: self.shared.clone(),
            timeout: Mutex::new(self.timeout()),
        }))
    }
}

/// Parses a stored counter like C's `stoll` ([`parse_stoll`]), as HashStore/FileStore `add`
/// needs it: a value without a leading decimal integer is a [`DistError::Store`].
pub(crate) fn parse_i64(v: &[u8]) -> Result<i64> {
    parse_stoll(v).ok_or_else(|| {
        DistError::store(format!(
            "add: value {:?} is not an integer",
            String::from_utf8_lossy(v)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_ops_and_wait_timeout() {
        let s = HashStore::new();
        assert_eq!(s.add("k", 3).unwrap(), 3);
        assert_eq!(s.add("k", -5).unwrap(), -2);
        assert_eq!(s.get("k").unwrap(), b"-2");
        let e = s
            .wait_timeout(&["nope"], Duration::from_millis(20))
            .unwrap_err();
        assert_eq!(e.to_string(), "Wait timeout");
        assert!(e.is_store_error());
        let c = s.clone_store().unwrap();
        let t = std::thread::spawn(move || c.get("late").unwrap());
        std::thread::sleep(Duration::from_millis(20));
        s.set("late", b"x").unwrap();
        assert_eq!(t.join().unwrap(), b"x");
        assert!(matches!(
            s.queue_pop("q", false),
            Err(DistError::QueueEmpty(_))
        ));
        assert_eq!(parse_i64(b"  +12abc").unwrap(), 12);
        s.set_timeout(Duration::MAX);
        assert_eq!(s.get("k").unwrap(), b"-2");
    }
}
