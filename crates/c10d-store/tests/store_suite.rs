//! The common store suite of PyTorch's `test_store.py` (pytorch-behaviours.md §1 items 1–12, 17),
//! run against every store through one factory per store, so each gets the same checks.
//!
//! Run: `cargo test -p c10d-store --test store_suite`.

use c10d_core::{DistError, ErrorKind};
use c10d_store::{
    store_barrier, FileStore, HashStore, PrefixStore, Store, TcpStore, TcpStoreOptions,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which store a fixture holds; decides the expected per-store quirks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Hash,
    File,
    Tcp,
}

/// One store under test plus what PyTorch says it must report.
struct Fixture {
    store: Arc<dyn Store>,
    /// The base (non-prefix) store kind.
    kind: Kind,
    /// `Some(prefix)` when `store` is a `PrefixStore` over `inner`.
    prefix: Option<&'static str>,
    /// The store under the prefix (or `store` itself).
    inner: Arc<dyn Store>,
    /// Keys the store holds before the test writes anything (refcount/ or init/).
    internal_keys: i64,
    /// Keeps temporary directories / servers alive.
    _guard: Box<dyn std::any::Any>,
}

impl Fixture {
    /// The key as the base store's error messages spell it.
    fn wire_key(&self, key: &str) -> String {
        let k = match self.prefix {
            Some(p) => format!("{p}/{key}"),
            None => key.to_owned(),
        };
        if self.kind == Kind::Tcp {
            format!("/{k}")
        } else {
            k
        }
    }

    /// The text of a timed-out `wait(keys=[key], timeout)` on this store.
    fn wait_timeout_text(&self, key: &str, timeout: Duration) -> String {
        match self.kind {
            Kind::Hash | Kind::File => "Wait timeout".to_owned(),
            Kind::Tcp => format!(
                "wait timeout after {}ms, keys: {}",
                timeout.as_millis(),
                self.wire_key(key)
            ),
        }
    }

    /// The text of a timed-out `get(key)` with store timeout `timeout`.
    fn get_timeout_text(&self, key: &str, timeout: Duration) -> String {
        match self.kind {
            Kind::File => format!(
                "Timeout waiting for key: {} after {} ms",
                self.wire_key(key),
                timeout.as_millis()
            ),
            _ => self.wait_timeout_text(key, timeout),
        }
    }

    fn supports_queues(&self) -> bool {
        self.kind != Kind::File
    }
}

fn hash() -> Fixture {
    let s: Arc<dyn Store> = Arc::new(HashStore::new());
    Fixture {
        store: s.clone(),
        kind: Kind::Hash,
        prefix: None,
        inner: s,
        internal_keys: 0,
        _guard: Box::new(()),
    }
}

fn file() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let s: Arc<dyn Store> =
        Arc::new(FileStore::new(dir.path().join("store"), Some(1)).expect("FileStore"));
    Fixture {
        store: s.clone(),
        kind: Kind::File,
        prefix: None,
        inner: s,
        internal_keys: 1,
        _guard: Box::new(dir),
    }
}

/// A master TcpStore on 127.0.0.1, port 0, world size 1 (so it holds the `init/` key).
fn tcp() -> Fixture {
    let opts = TcpStoreOptions {
        world_size: Some(1),
        is_master: true,
        timeout: Duration::from_secs(60),
        ..TcpStoreOptions::default()
    };
    let s: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", 0, opts).expect("TcpStore"));
    Fixture {
        store: s.clone(),
        kind: Kind::Tcp,
        prefix: None,
        inner: s,
        internal_keys: 1,
        _guard: Box::new(()),
    }
}

fn prefix_tcp() -> Fixture {
    prefixed(tcp())
}

fn prefixed(f: Fixture) -> Fixture {
    let p: Arc<dyn Store> = Arc::new(PrefixStore::new("test_prefix", f.store.clone()));
    Fixture {
        store: p,
        prefix: Some("test_prefix"),
        inner: f.store.clone(),
        ..f
    }
}

fn prefix_hash() -> Fixture {
    prefixed(hash())
}

fn prefix_file() -> Fixture {
    prefixed(file())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Item 1 + 2: set/get/add sequence and the per-store num_keys totals.
fn set_get_add_num_keys(f: &Fixture) {
    let s = &f.store;
    s.add("key", 1).unwrap();
    s.add("key", 2).unwrap();
    assert_eq!(s.add("key", 3).unwrap(), 6);
    s.set("key0", b"value0").unwrap();
    s.add("key3", 1).unwrap();
    s.set("key1", b"value1").unwrap();
    s.add("key3", 2).unwrap();
    s.set("key2", b"value2").unwrap();
    for d in 3..=6 {
        s.add("key3", d).unwrap();
    }
    assert_eq!(s.get("key").unwrap(), b"6");
    assert_eq!(s.get("key3").unwrap(), b"21");
    assert_eq!(s.get("key0").unwrap(), b"value0");
    assert_eq!(s.get("key1").unwrap(), b"value1");
    assert_eq!(s.get("key2").unwrap(), b"value2");
    assert_eq!(s.add("key3", 0).unwrap(), 21, "add(k, 0) reads the value");
    assert_eq!(s.add("neg", -3).unwrap(), -3);
    assert_eq!(s.get("neg").unwrap(), b"-3", "ASCII decimal, no padding");
    assert!(s.delete_key("neg").unwrap());
    let want = match f.kind {
        Kind::Hash => 5,
        Kind::File | Kind::Tcp => 6,
    };
    assert_eq!(
        s.num_keys().unwrap(),
        want,
        "{:?} prefix={:?}",
        f.kind,
        f.prefix
    );
    assert_eq!(want, 5 + f.internal_keys);
}

/// Item 3: keys may start with "-" (FileStore's deletion marker must not clash).
fn dash_keys(f: &Fixture) {
    let s = &f.store;
    s.set("key", b"x").unwrap();
    let before = s.num_keys().unwrap();
    s.set("-key3", b"7").unwrap();
    assert_eq!(s.get("-key3").unwrap(), b"7");
    assert_eq!(s.num_keys().unwrap(), before + 1);
    assert!(s.delete_key("-key3").unwrap());
    assert_eq!(s.num_keys().unwrap(), before);
    assert_eq!(
        s.get("key").unwrap(),
        b"x",
        "deleting -key3 must not touch key"
    );
    assert!(!s.check(&["-key3"]).unwrap());
}

/// Item 4: check.
fn check(f: &Fixture) {
    let s = &f.store;
    s.add("key3", 1).unwrap();
    assert!(s.check(&["key3"]).unwrap());
    assert!(!s.check(&["Randomkey3"]).unwrap());
    assert!(!s.check(&["key3", "Randomkey3"]).unwrap());
    assert!(s.check(&[]).unwrap(), "zero keys are ready");
}

/// Item 5: compare_set decision table.
fn compare_set(f: &Fixture) {
    let s = &f.store;
    // missing, expected non-empty → returns expected, creates nothing
    assert_eq!(
        s.compare_set("cs_key0", b"wrong_old_value", b"new_value0")
            .unwrap(),
        b"wrong_old_value"
    );
    assert!(!s.check(&["cs_key0"]).unwrap());
    // present, expected != current → current, no change
    s.set("cs_key0", b"value0").unwrap();
    assert_eq!(
        s.compare_set("cs_key0", b"wrong_old_value", b"new_value0")
            .unwrap(),
        b"value0"
    );
    assert_eq!(s.get("cs_key0").unwrap(), b"value0");
    // present, equal → stores and returns desired
    assert_eq!(
        s.compare_set("cs_key0", b"value0", b"new_value0").unwrap(),
        b"new_value0"
    );
    assert_eq!(s.get("cs_key0").unwrap(), b"new_value0");
    // missing, expected "" → stores desired
    assert_eq!(
        s.compare_set("cs_key1", b"", b"new_value1").unwrap(),
        b"new_value1"
    );
    assert_eq!(s.get("cs_key1").unwrap(), b"new_value1");
}

/// Item 6: wait/get timeouts and their texts; wait on an existing key returns at once.
fn wait_timeouts(f: &Fixture) {
    let s = &f.store;
    let t = ms(250);
    let start = Instant::now();
    let e = s.wait_timeout(&["bad_key"], t).unwrap_err();
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::Store, "{e:?}");
    assert_eq!(e.to_string(), f.wait_timeout_text("bad_key", t));
    assert!(took >= t, "returned after {took:?} < {t:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");

    s.set("here", b"1").unwrap();
    let start = Instant::now();
    s.wait_timeout(&["here"], Duration::from_secs(30)).unwrap();
    s.wait(&["here"]).unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));

    let old = s.timeout();
    s.set_timeout(ms(100));
    assert_eq!(s.timeout(), ms(100));
    let start = Instant::now();
    let e = s.get("missing").unwrap_err();
    assert!(start.elapsed() >= ms(100));
    assert_eq!(e.kind(), ErrorKind::Store, "{e:?}");
    assert_eq!(e.to_string(), f.get_timeout_text("missing", ms(100)));
    // wait() without a timeout uses the store timeout
    let e = s.wait(&["missing"]).unwrap_err();
    assert_eq!(e.to_string(), f.wait_timeout_text("missing", ms(100)));
    // the store is still usable after timeouts
    assert_eq!(s.get("here").unwrap(), b"1");
    s.set_timeout(old);
}

/// Item 7: delete_key and num_keys bookkeeping.
fn delete_and_num_keys(f: &Fixture) {
    let s = &f.store;
    let base = f.internal_keys;
    assert_eq!(s.num_keys().unwrap(), base);
    for _ in 0..3 {
        s.add("key", 1).unwrap();
    }
    s.set("key0", b"value0").unwrap();
    s.add("key3", 1).unwrap();
    s.set("key1", b"value1").unwrap();
    assert_eq!(s.num_keys().unwrap(), base + 4);
    assert!(s.delete_key("key").unwrap());
    assert_eq!(s.num_keys().unwrap(), base + 3);
    s.set_timeout(ms(300));
    assert!(s.get("key").is_err(), "deleted key must not be readable");
    assert!(s.delete_key("key0").unwrap());
    assert!(s.delete_key("key3").unwrap());
    assert_eq!(s.num_keys().unwrap(), base + 1);
    s.set("key4", b"value2").unwrap();
    assert_eq!(s.num_keys().unwrap(), base + 2);
    assert_eq!(s.get("key1").unwrap(), b"value1");
    assert_eq!(s.get("key4").unwrap(), b"value2");
    // PyTorch quirk: FileStore reports true for a missing key.
    assert_eq!(s.delete_key("never_set").unwrap(), f.kind == Kind::File);
    if let Ok(mut keys) = s.list_keys() {
        keys.sort();
        assert_eq!(
            keys,
            vec!["key1".to_owned(), "key4".to_owned()],
            "list_keys omits internal keys"
        );
    }
}

/// Item 8: append / multi_set / multi_get (native or through the fallbacks).
fn append_and_multi(f: &Fixture) {
    let s = &f.store;
    assert_eq!(
        s.has_extended_api(),
        f.kind != Kind::File,
        "has_extended_api"
    );
    s.set("foo", b"po").unwrap();
    s.append("foo", b"tato").unwrap();
    assert_eq!(s.get("foo").unwrap(), b"potato");
    s.append("new", b"x").unwrap();
    assert_eq!(s.get("new").unwrap(), b"x", "append creates a missing key");
    s.multi_set(&["foo", "bar"], &[b"po", b"tato"]).unwrap();
    assert_eq!(s.get("foo").unwrap(), b"po");
    assert_eq!(s.get("bar").unwrap(), b"tato");
    assert_eq!(
        s.multi_get(&["bar", "foo"]).unwrap(),
        vec![b"tato".to_vec(), b"po".to_vec()]
    );
    assert_eq!(s.multi_get(&[]).unwrap(), Vec::<Vec<u8>>::new());
    let e = s.multi_set(&["a", "b"], &[b"1"]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

/// Item 9: the prefix store writes `"<prefix>/K"` into the inner store for every op.
fn prefix_mapping(f: &Fixture) {
    let Some(p) = f.prefix else { return };
    let (s, inner) = (&f.store, &f.inner);
    let k = |key: &str| format!("{p}/{key}");
    s.set("a", b"1").unwrap();
    assert_eq!(inner.get(&k("a")).unwrap(), b"1");
    s.add("n", 4).unwrap();
    assert_eq!(inner.get(&k("n")).unwrap(), b"4");
    s.compare_set("c", b"", b"v").unwrap();
    assert_eq!(inner.get(&k("c")).unwrap(), b"v");
    s.append("a", b"2").unwrap();
    assert_eq!(inner.get(&k("a")).unwrap(), b"12");
    s.multi_set(&["m1", "m2"], &[b"x", b"y"]).unwrap();
    assert_eq!(
        inner.multi_get(&[&k("m1"), &k("m2")]).unwrap(),
        vec![b"x".to_vec(), b"y".to_vec()]
    );
    inner.set(&k("from_inner"), b"z").unwrap();
    assert_eq!(s.get("from_inner").unwrap(), b"z");
    assert!(s.check(&["from_inner"]).unwrap());
    s.wait_timeout(&["from_inner"], Duration::from_secs(30))
        .unwrap();
    assert!(
        !inner.check(&["a"]).unwrap(),
        "unprefixed key must not exist"
    );
    assert!(s.delete_key("a").unwrap());
    assert!(!inner.check(&[&k("a")]).unwrap());
    assert_eq!(
        s.num_keys().unwrap(),
        inner.num_keys().unwrap(),
        "num_keys passes through"
    );
    s.set_timeout(ms(1234));
    assert_eq!(inner.timeout(), ms(1234), "set_timeout passes through");
    assert_eq!(s.has_extended_api(), inner.has_extended_api());
    if f.supports_queues() {
        s.queue_push("q", b"1").unwrap();
        assert_eq!(inner.queue_len(&k("q")).unwrap(), 1);
        assert_eq!(inner.queue_pop(&k("q"), false).unwrap(), b"1");
    }
    // nested prefixes
    let nested = PrefixStore::new("inner2", f.store.clone());
    nested.set("deep", b"d").unwrap();
    assert_eq!(inner.get(&format!("{p}/inner2/deep")).unwrap(), b"d");
    assert!(Arc::ptr_eq(&nested.innermost_store(), &f.inner));
}

/// Item 10: clone() returns a handle to the same data.
fn clone_handle(f: &Fixture) {
    let c = f.store.clone_store().unwrap();
    f.store.set("k", b"v").unwrap();
    assert_eq!(c.get("k").unwrap(), b"v");
    c.set("k2", b"v2").unwrap();
    assert_eq!(f.store.get("k2").unwrap(), b"v2");
    assert_eq!(c.add("n", 2).unwrap(), 2);
    assert_eq!(f.store.add("n", 3).unwrap(), 5);
}

/// Item 11: queues where supported; FileStore refuses them.
fn queues(f: &Fixture) {
    let s = &f.store;
    if !f.supports_queues() {
        let e = s.queue_push("q", b"1").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert_eq!(e.to_string(), "queue support is not implemented.");
        return;
    }
    assert!(!s.check(&["foo"]).unwrap());
    assert_eq!(s.queue_len("foo").unwrap(), 0);
    s.queue_push("foo", b"1").unwrap();
    s.queue_push("foo", b"2").unwrap();
    assert!(s.check(&["foo"]).unwrap(), "a non-empty queue is ready");
    assert_eq!(s.queue_len("foo").unwrap(), 2);
    s.wait_timeout(&["foo"], Duration::from_secs(30)).unwrap();
    assert_eq!(s.queue_pop("foo", true).unwrap(), b"1");
    assert_eq!(s.queue_pop("foo", true).unwrap(), b"2");
    assert!(!s.check(&["foo"]).unwrap());
    assert_eq!(s.queue_len("foo").unwrap(), 0);
    let e = s.queue_pop("foo", false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueEmpty, "{e:?}");
    assert_eq!(e.to_string(), "queue is empty");
    assert!(e.is_store_error(), "QueueEmptyError is a DistStoreError");
    let old = s.timeout();
    s.set_timeout(ms(10));
    let e = s.queue_pop("foo", true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store, "{e:?}");
    assert!(e.to_string().to_lowercase().contains("timeout"), "{e}");
    s.set_timeout(old);

    // cloned handles in two threads exchange messages both ways
    let other = s.clone_store().unwrap();
    let t = std::thread::spawn(move || -> Result<(), DistError> {
        for i in 0..10 {
            let v = other.queue_pop("ping", true)?;
            other.queue_push(
                "pong",
                format!("{}!", String::from_utf8_lossy(&v)).as_bytes(),
            )?;
            assert_eq!(v, format!("m{i}").into_bytes());
        }
        Ok(())
    });
    for i in 0..10 {
        s.queue_push("ping", format!("m{i}").as_bytes()).unwrap();
        assert_eq!(
            s.queue_pop("pong", true).unwrap(),
            format!("m{i}!").into_bytes()
        );
    }
    t.join().unwrap().unwrap();
}

/// Item 12: store barrier, through the free `store_barrier` and the `Store::barrier` method
/// (native BARRIER command on TcpStore).
fn barrier(f: &Fixture) {
    let s = &f.store;
    for native in [false, true] {
        let run = move |st: &dyn Store, key: &str, n: usize, t: Duration| {
            if native {
                st.barrier(key, n, t)
            } else {
                store_barrier(st, key, n, t)
            }
        };
        let tag = if native { "m" } else { "f" };
        let start = Instant::now();
        run(s.as_ref(), &format!("b1{tag}"), 1, Duration::from_secs(30)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(10));
        let start = Instant::now();
        let key = format!("b2{tag}");
        let e = run(s.as_ref(), &key, 2, ms(100)).unwrap_err();
        assert!(start.elapsed() >= ms(100));
        assert_eq!(e.kind(), ErrorKind::Store);
        assert_eq!(
            e.to_string(),
            format!("barrier timeout after 100ms, key: {key}")
        );
        // the handle stays usable after a timed-out barrier
        s.set("after_barrier", b"ok").unwrap();
        assert_eq!(s.get("after_barrier").unwrap(), b"ok");
        // 4 workers, each on its own handle, all pass
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let c = s.clone_store().unwrap();
                std::thread::spawn(move || {
                    run(c.as_ref(), &format!("b4{tag}"), 4, Duration::from_secs(60))
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
    }
}

/// Item 17: one thread waits on key1 while another sets it (same handle and a clone).
/// A TcpStore handle serialises its requests (one connection, like PyTorch's per-object lock),
/// so there the waiter uses its own handle, as PyTorch's test does.
fn multithreaded_wait(f: &Fixture) {
    let variants: &[bool] = if f.kind == Kind::Tcp {
        &[true]
    } else {
        &[false, true]
    };
    for &use_clone in variants {
        let key = format!("key1_{use_clone}");
        let waiter = if use_clone {
            f.store.clone_store().unwrap()
        } else {
            f.store.clone()
        };
        let k2 = key.clone();
        let t = std::thread::spawn(move || {
            waiter.wait_timeout(&[k2.as_str()], Duration::from_secs(60))?;
            waiter.get(&k2)
        });
        std::thread::sleep(ms(50));
        f.store.set(&key, b"value1").unwrap();
        assert_eq!(t.join().unwrap().unwrap(), b"value1");
    }
}

macro_rules! store_suite {
    ($($name:ident => $factory:expr;)*) => {$(
        mod $name {
            use super::*;
            #[test] fn set_get_add_num_keys() { super::set_get_add_num_keys(&$factory()) }
            #[test] fn dash_keys() { super::dash_keys(&$factory()) }
            #[test] fn check() { super::check(&$factory()) }
            #[test] fn compare_set() { super::compare_set(&$factory()) }
            #[test] fn wait_timeouts() { super::wait_timeouts(&$factory()) }
            #[test] fn delete_and_num_keys() { super::delete_and_num_keys(&$factory()) }
            #[test] fn append_and_multi() { super::append_and_multi(&$factory()) }
            #[test] fn prefix_mapping() { super::prefix_mapping(&$factory()) }
            #[test] fn clone_handle() { super::clone_handle(&$factory()) }
            #[test] fn queues() { super::queues(&$factory()) }
            #[test] fn barrier() { super::barrier(&$factory()) }
            #[test] fn multithreaded_wait() { super::multithreaded_wait(&$factory()) }
        }
    )*};
}

store_suite! {
    hash_store => hash;
    file_store => file;
    prefix_hash_store => prefix_hash;
    prefix_file_store => prefix_file;
    tcp_store => tcp;
    prefix_tcp_store => prefix_tcp;
}

/// FileStore specifics: two handles (as two processes would) share keys through one file,
/// a zero timeout waits forever, and get blocks until another handle writes.
#[test]
fn file_store_two_handles_and_zero_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shared");
    let a = FileStore::new(&p, Some(2)).unwrap();
    let b = FileStore::new(&p, Some(2)).unwrap();
    b.set_timeout(Duration::ZERO);
    let t = std::thread::spawn(move || {
        let v = b.get("late").unwrap();
        (b, v)
    });
    std::thread::sleep(ms(100));
    a.set("late", b"yes").unwrap();
    let (b, v) = t.join().unwrap();
    assert_eq!(v, b"yes");
    assert_eq!(a.num_keys().unwrap(), 2, "refcount/ + late");
    drop(a);
    drop(b);
    assert!(!p.exists(), "world_size 2: removed after both closed");
}

/// FileStore: the open retries while the directory does not exist yet, up to the timeout.
#[test]
fn file_store_open_waits_for_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("later");
    let p = sub.join("store");
    let start = Instant::now();
    let e = FileStore::with_timeout(&p, None, ms(100)).unwrap_err();
    assert!(start.elapsed() >= ms(100));
    assert!(e.to_string().contains("open failed"), "{e}");
    let sub2 = sub.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(ms(100));
        std::fs::create_dir(&sub2).unwrap();
    });
    let s = FileStore::with_timeout(&p, None, Duration::from_secs(30)).unwrap();
    t.join().unwrap();
    s.set("k", b"v").unwrap();
    assert_eq!(s.get("k").unwrap(), b"v");
}
