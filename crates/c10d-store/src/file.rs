//! `FileStore`: a store kept in one file shared by every process (mirrors
//! `torch.distributed.FileStore`), byte-compatible with PyTorch's file format.
//!
//! # File format (store-protocol.md §5)
//!
//! A flat append-only log with no header: each record is `u32 LE keylen`, key bytes,
//! `u32 LE valuelen`, value bytes. User key `k` is written as `"/k"`; deleting `k` appends the
//! record `"-/k"` with an empty value; the internal counters `refcount/` and `cleanup/` carry no
//! prefix and hold ASCII decimal values. Reading replays the log in order (a key starting with
//! `-` erases the key without that `-`, otherwise the last write wins). Each handle caches the
//! replayed map and the byte offset read so far and only parses the new tail.
//!
//! Every operation opens the file anew and takes a BSD `flock(2)` on it — `LOCK_EX` for
//! writers, `LOCK_SH` for readers — exactly like PyTorch, so a PyTorch process and this one can
//! share the same file (`fcntl` record locks would not see PyTorch's locks on Linux).

use crate::hash::parse_i64;
use crate::store::{Store, DEFAULT_STORE_TIMEOUT};
use c10d_core::{DistError, Result};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Prefix of user keys inside the file.
const REGULAR_PREFIX: &str = "/";
/// Prefix of deletion records inside the file.
const DELETE_PREFIX: &str = "-";
/// Internal counter: live handles on the file.
const REFCOUNT_KEY: &str = "refcount/";
/// Internal counter: handles that were closed.
const CLEANUP_KEY: &str = "cleanup/";
/// Poll interval of `get`/`wait` and of the open retry (PyTorch's 10 ms).
const POLL: Duration = Duration::from_millis(10);

/// The replayed view of the file: live keys (as written in the file) and bytes consumed.
#[derive(Default)]
struct Cache {
    map: HashMap<Vec<u8>, Vec<u8>>,
    pos: u64,
}

/// How a file is opened for one operation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenMode {
    /// `O_RDONLY` (get, check, num_keys).
    Read,
    /// `O_RDWR | O_CREAT`, mode 0644 (set, add, compare_set).
    WriteCreate,
    /// `O_RDWR` without create (delete_key).
    Write,
}

/// True once a poll loop started at `start` has run past `timeout` (zero = never: PyTorch's
/// `kNoTimeout`).
fn expired(start: Instant, timeout: Duration) -> bool {
    !timeout.is_zero() && start.elapsed() > timeout
}

/// An open file holding a `flock(2)`; the lock is released (`LOCK_UN`) before the file closes.
struct LockedFile {
    file: File,
}

impl LockedFile {
    /// Opens `path`, retrying every 10 ms while `open` fails with `ENOENT` (the file or its
    /// directory may be created by another process), until `timeout` (zero = forever); then
    /// takes a shared or exclusive `flock`.
    fn open(path: &Path, mode: OpenMode, timeout: Duration) -> Result<LockedFile> {
        let start = Instant::now();
        let file = loop {
            let mut opts = OpenOptions::new();
            opts.read(true);
            match mode {
                OpenMode::Read => {}
                OpenMode::WriteCreate => {
                    opts.write(true).create(true).mode(0o644);
                }
                OpenMode::Write => {
                    opts.write(true);
                }
            }
            match opts.open(path) {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::NotFound && !expired(start, timeout) => {
                    std::thread::sleep(POLL);
                }
                Err(e) => return Err(io_err(path, "open", e)),
            }
        };
        let op = if mode == OpenMode::Read {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        flock(&file, op).map_err(|e| io_err(path, "flock", e))?;
        Ok(LockedFile { file })
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Appends one record (`u32 LE keylen`, key, `u32 LE valuelen`, value) in one write.
    fn append_record(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        let (kl, vl) = (record_len(key)?, record_len(value)?);
        let mut buf = Vec::with_capacity(8 + key.len() + value.len());
        buf.extend_from_slice(&kl.to_le_bytes());
        buf.extend_from_slice(key);
        buf.extend_from_slice(&vl.to_le_bytes());
        buf.extend_from_slice(value);
        self.file.seek(SeekFrom::End(0))?;
        self.file.write_all(&buf)
    }
}

impl Drop for LockedFile {
    fn drop(&mut self) {
        // Unlock errors are ignored: closing the descriptor releases the lock anyway.
        let _ = flock(&self.file, libc::LOCK_UN);
    }
}

/// `flock(2)` on the whole file, retried on `EINTR`.
fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: `file` owns an open descriptor for the duration of this call, and `flock`
        // only takes an integer descriptor and an operation code; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn record_len(b: &[u8]) -> io::Result<u32> {
    u32::try_from(b.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "FileStore record longer than 4 GiB",
        )
    })
}

/// A `DistStoreError` naming the file and the step, carrying `e` (its kind for a program).
fn io_err(path: &Path, what: &str, e: io::Error) -> DistError {
    DistError::store(format!("FileStore {}: {what} failed: {e}", path.display())).with_io_source(e)
}

/// A store backed by one file that several processes (Rust or PyTorch) open by path
/// (`torch.distributed.FileStore(file_name, world_size=-1)`).
///
/// - Keys are stored as `"/" + key`; `num_keys` counts *every* live key in the file, including
///   the internal `refcount/` counter (and `cleanup/` once some handle was closed), so five user
///   keys give 6, as in PyTorch.
/// - `get` polls the file every 10 ms; on timeout it fails with [`DistError::Store`]
///   `"Timeout waiting for key: {key} after {ms} ms"`. `wait` polls `check` every 10 ms and fails
///   with `"Wait timeout"`. A zero timeout waits forever (PyTorch's `kNoTimeout`).
/// - `delete_key` always returns `true`, even for a missing key (PyTorch quirk).
/// - No native extended API (`has_extended_api` is false): `append` is an atomic
///   read-modify-write under the exclusive lock (PyTorch reaches the same file contents through
///   its `compare_set` fallback), `multi_get`/`multi_set` loop over `get`/`set`. No queues.
/// - `list_keys` returns user keys only (PyTorch 2.15 returns every key with its first byte
///   stripped, internal counters included; that quirk is not reproduced).
/// - Dropping a handle appends `cleanup/ += 1` and `refcount/ -= 1`; when the refcount reaches 0
///   and at least `world_size` handles were closed, the file is removed. `world_size = None`
///   (PyTorch's -1) never removes it.
pub struct FileStore {
    path: PathBuf,
    world_size: Option<usize>,
    cache: Mutex<Cache>,
    timeout: Mutex<Duration>,
    /// Set once `refcount/` was incremented; only registered handles clean up on drop.
    registered: bool,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl FileStore {
    /// Opens (creating it if needed) the store file at `path` and registers this handle in its
    /// `refcount/` counter (`FileStore(path, world_size)`; `None` = PyTorch's -1: the file is
    /// never removed). The default timeout is 300 s.
    ///
    /// # Errors
    /// [`DistError::Store`] when the file cannot be opened, locked, read or written (e.g. the
    /// directory does not appear within the timeout), or holds a corrupt record.
    pub fn new(path: impl AsRef<Path>, world_size: Option<usize>) -> Result<FileStore> {
        Self::with_timeout(path, world_size, DEFAULT_STORE_TIMEOUT)
    }

    /// As [`FileStore::new`] with a store timeout other than 300 s (zero = wait forever).
    ///
    /// # Errors
    /// As [`FileStore::new`].
    pub fn with_timeout(
        path: impl AsRef<Path>,
        world_size: Option<usize>,
        timeout: Duration,
    ) -> Result<FileStore> {
        let mut store = FileStore {
            path: path.as_ref().to_path_buf(),
            world_size,
            cache: Mutex::new(Cache::default()),
            timeout: Mutex::new(timeout),
            registered: false,
        };
        store.add_raw(REFCOUNT_KEY.as_bytes(), 1)?;
        store.registered = true;
        Ok(store)
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The world size given at construction (`None` = never remove the file).
    pub fn world_size(&self) -> Option<usize> {
        self.world_size
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open(&self, mode: OpenMode) -> Result<LockedFile> {
        LockedFile::open(&self.path, mode, self.timeout())
    }

    /// Replays the records between the cached offset and the end of the file into the cache.
    /// A file shorter than the cached offset was replaced (removed and re-created): replay it
    /// from the start.
    fn refresh(&self, file: &mut LockedFile, cache: &mut Cache) -> Result<()> {
        let size = file.size().map_err(|e| io_err(&self.path, "stat", e))?;
        if size < cache.pos {
            *cache = Cache::default();
        }
        if size == cache.pos {
            return Ok(());
        }
        let mut buf = Vec::new();
        file.file
            .seek(SeekFrom::Start(cache.pos))
            .and_then(|_| (&file.file).take(size - cache.pos).read_to_end(&mut buf))
            .map_err(|e| io_err(&self.path, "read", e))?;
        let mut at = 0usize;
        while at < buf.len() {
            let corrupt = || {
                DistError::store(format!(
                    "FileStore {}: truncated or corrupt record at byte offset {}",
                    self.path.display(),
                    cache.pos + at as u64
                ))
            };
            let (key, next) = read_field(&buf, at).ok_or_else(corrupt)?;
            let (value, next) = read_field(&buf, next).ok_or_else(corrupt)?;
            if let Some(erased) = key.strip_prefix(DELETE_PREFIX.as_bytes()) {
                cache.map.remove(erased);
            } else if let Some(v) = cache.map.get_mut(key) {
                // Rewrites (counters above all) reuse the entry: no key copy.
                v.clear();
                v.extend_from_slice(value);
            } else {
                cache.map.insert(key.to_vec(), value.to_vec());
            }
            at = next;
        }
        cache.pos = size;
        Ok(())
    }

    /// PyTorch's `addHelper`: exclusive lock, replay, add `delta` to the decimal value
    /// (missing/empty = 0), append the new value.
    fn add_raw(&self, key: &[u8], delta: i64) -> Result<i64> {
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::WriteCreate)?;
        self.refresh(&mut file, &mut cache)?;
        let cur = match cache.map.get(key) {
            Some(v) if !v.is_empty() => parse_i64(v)?,
            _ => 0,
        };
        let new = cur.wrapping_add(delta);
        file.append_record(key, new.to_string().as_bytes())
            .map_err(|e| io_err(&self.path, "write", e))?;
        Ok(new)
    }

    /// True iff every (file) key is live, after replaying under a shared lock.
    fn check_raw(&self, keys: &[Vec<u8>]) -> Result<bool> {
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::Read)?;
        self.refresh(&mut file, &mut cache)?;
        Ok(keys.iter().all(|k| cache.map.contains_key(k)))
    }
}

/// Reads one `u32 LE len` + bytes field at `at`; `None` when it runs past the end.
fn read_field(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let len_bytes: [u8; 4] = buf.get(at..at.checked_add(4)?)?.try_into().ok()?;
    let start = at + 4;
    let end = start.checked_add(u32::from_le_bytes(len_bytes) as usize)?;
    Some((buf.get(start..end)?, end))
}

fn regular_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(REGULAR_PREFIX.len() + key.len());
    k.extend_from_slice(REGULAR_PREFIX.as_bytes());
    k.extend_from_slice(key.as_bytes());
    k
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let _cache = self.cache();
        let mut file = self.open(OpenMode::WriteCreate)?;
        file.append_record(&regular_key(key), value)
            .map_err(|e| io_err(&self.path, "write", e))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let rk = regular_key(key);
        let timeout = self.timeout();
        let start = Instant::now();
        loop {
            if expired(start, timeout) {
                return Err(DistError::store(format!(
                    "Timeout waiting for key: {key} after {} ms",
                    timeout.as_millis()
                )));
            }
            {
                let mut cache = self.cache();
                let mut file = self.open(OpenMode::Read)?;
                // Replays only a grown (or replaced) file; unchanged, it costs one fstat.
                self.refresh(&mut file, &mut cache)?;
                if let Some(v) = cache.map.get(&rk) {
                    return Ok(v.clone());
                }
            }
            // Lock, file and cache are released while sleeping so other threads of this
            // process can write the key meanwhile.
            std::thread::sleep(POLL);
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.add_raw(&regular_key(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let rk = regular_key(key);
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::WriteCreate)?;
        self.refresh(&mut file, &mut cache)?;
        match cache.map.get(&rk) {
            // Missing with empty `expected`, or equal: store `desired` below.
            None if expected.is_empty() => {}
            Some(cur) if cur == expected => {}
            // Missing with non-empty `expected`: echo `expected`, store nothing (PyTorch quirk).
            None => return Ok(expected.to_vec()),
            Some(cur) => return Ok(cur.clone()),
        }
        file.append_record(&rk, desired)
            .map_err(|e| io_err(&self.path, "write", e))?;
        Ok(desired.to_vec())
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| regular_key(k)).collect();
        self.check_raw(&keys)
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let keys: Vec<Vec<u8>> = keys.iter().map(|k| regular_key(k)).collect();
        let start = Instant::now();
        while !self.check_raw(&keys)? {
            if expired(start, timeout) {
                return Err(DistError::store("Wait timeout"));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        let mut dk = DELETE_PREFIX.as_bytes().to_vec();
        dk.extend_from_slice(&regular_key(key));
        let _cache = self.cache();
        let mut file = self.open(OpenMode::Write)?;
        file.append_record(&dk, b"")
            .map_err(|e| io_err(&self.path, "write", e))?;
        Ok(true)
    }

    fn num_keys(&self) -> Result<i64> {
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::Read)?;
        self.refresh(&mut file, &mut cache)?;
        Ok(cache.map.len() as i64)
    }

    /// Atomic append under the exclusive lock; writes the concatenated value as one record
    /// (the same bytes PyTorch's `compare_set`-based fallback leaves in the file).
    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        let rk = regular_key(key);
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::WriteCreate)?;
        self.refresh(&mut file, &mut cache)?;
        let mut new = cache.map.get(&rk).cloned().unwrap_or_default();
        new.extend_from_slice(value);
        file.append_record(&rk, &new)
            .map_err(|e| io_err(&self.path, "write", e))
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        let _ = (key, value);
        Err(DistError::unsupported("queue support is not implemented."))
    }

    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        let _ = (key, block);
        Err(DistError::unsupported("queue support is not implemented."))
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        let _ = key;
        Err(DistError::unsupported("queue support is not implemented."))
    }

    fn list_keys(&self) -> Result<Vec<String>> {
        let mut cache = self.cache();
        let mut file = self.open(OpenMode::Read)?;
        self.refresh(&mut file, &mut cache)?;
        Ok(cache
            .map
            .keys()
            .filter_map(|k| k.strip_prefix(REGULAR_PREFIX.as_bytes()))
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect())
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }

    /// A new handle on the same file, like PyTorch's `FileStore.clone()`: it registers itself
    /// in `refcount/` (and counts in `cleanup/` when dropped). Keeps this handle's timeout.
    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(FileStore::with_timeout(
            &self.path,
            self.world_size,
            self.timeout(),
        )?))
    }
}

impl Drop for FileStore {
    /// PyTorch's destructor: if the file still exists, `cleanup/ += 1`, `refcount/ -= 1`; the
    /// last handle removes the file once at least `world_size` handles were closed. Errors are
    /// logged, never raised.
    fn drop(&mut self) {
        if !self.registered || !self.path.exists() {
            return;
        }
        let res = self
            .add_raw(CLEANUP_KEY.as_bytes(), 1)
            .and_then(|n| Ok((n, self.add_raw(REFCOUNT_KEY.as_bytes(), -1)?)));
        match res {
            Ok((finished, refs)) => {
                let enough = self
                    .world_size
                    .is_some_and(|w| finished >= 0 && finished as u64 >= w as u64);
                if refs == 0 && enough {
                    if let Err(e) = std::fs::remove_file(&self.path) {
                        log::debug!("FileStore {}: remove failed: {e}", self.path.display());
                    }
                }
            }
            Err(e) => log::warn!(
                "FileStore {}: cleanup on close failed: {e}",
                self.path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// store-protocol.md §8 FileStore vector (observed on PyTorch 2.15).
    #[test]
    fn file_bytes_match_pytorch_vector() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("store");
        let s = FileStore::new(&p, Some(2)).unwrap();
        s.set("a", b"b").unwrap();
        assert_eq!(s.add("c", 5).unwrap(), 5);
        assert_eq!(s.compare_set("cs", b"", b"v").unwrap(), b"v");
        assert!(s.delete_key("a").unwrap());
        let want = "09000000726566636f756e742f0100000031\
                    020000002f610100000062\
                    020000002f630100000035\
                    030000002f63730100000076\
                    030000002d2f6100000000";
        assert_eq!(hex(&std::fs::read(&p).unwrap()), want);
        assert_eq!(s.num_keys().unwrap(), 3);
        drop(s);
        // One of two handles closed: cleanup/=1, refcount/=0, file stays.
        let tail = "08000000636c65616e75702f0100000031";
        let bytes = std::fs::read(&p).unwrap();
        assert!(hex(&bytes).contains(tail), "{}", hex(&bytes));
        assert!(hex(&bytes).ends_with("09000000726566636f756e742f0100000030"));
    }

    #[test]
    fn cleanup_removes_file_after_world_size_closes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("store");
        let a = FileStore::new(&p, Some(2)).unwrap();
        let b = FileStore::new(&p, Some(2)).unwrap();
        drop(a);
        assert!(p.exists());
        drop(b);
        assert!(!p.exists());
        let c = FileStore::new(&p, None).unwrap();
        drop(c);
        assert!(p.exists(), "world_size None never removes the file");
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("store");
        std::fs::write(&p, [0xff, 0xff, 0xff, 0x7f, b'x']).unwrap();
        let e = FileStore::new(&p, None).unwrap_err();
        assert!(
            e.to_string().contains("corrupt record at byte offset 0"),
            "{e}"
        );
    }
}
