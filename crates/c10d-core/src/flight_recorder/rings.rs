//! Which ring each thread writes. Every thread that records into a recorder owns one ring of
//! that recorder, found through a thread-local: recording takes no lock and makes no atomic
//! read-modify-write, whatever other threads record at the same time.
//!
//! Rings are never freed, so that a [`super::Trace`] can refer to one without a reference
//! count; they are reused instead. When a thread ends, its rings go to their recorders' idle
//! lists, and the recorder's next new recording thread adopts one (entries kept, ids counting
//! on). The rings of a recorder that is gone go to a process-wide free list, from which a new
//! recorder's thread adopts one of the right capacity (its old entries forgotten). So a
//! process holds about one ring per thread that records at once and per recorder (a thread
//! gives up the ring of a recorder that is gone when it next looks up a ring, or ends).

use super::entry::current_thread;
use super::ring::Ring;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// The rings of one recorder.
#[derive(Debug)]
pub(crate) struct RingSet {
    /// Unique per recorder in the process (never 0).
    uid: u64,
    capacity: usize,
    /// Every ring of this recorder (dumps read them all).
    all: Mutex<Vec<&'static Ring>>,
    /// Rings whose owning thread ended, for the next thread that records.
    idle: Mutex<Vec<&'static Ring>>,
}

/// Rings of recorders that are gone.
static FREE: Mutex<Vec<&'static Ring>> = Mutex::new(Vec::new());
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A ring this thread owns.
struct Owned {
    set: Weak<RingSet>,
    uid: u64,
    ring: &'static Ring,
}

/// This thread's rings; when the thread ends they go back to their recorders (or to `FREE`).
struct Owner(RefCell<Vec<Owned>>);

impl Drop for Owner {
    fn drop(&mut self) {
        // A record from a later thread-local destructor must not reach a ring given back.
        let _ = LAST.try_with(|l| l.set((0, None)));
        for o in self.0.get_mut().drain(..) {
            give_back(o);
        }
    }
}

fn give_back(o: Owned) {
    match o.set.upgrade() {
        Some(set) => lock(&set.idle).push(o.ring),
        None => lock(&FREE).push(o.ring),
    }
}

thread_local! {
    /// The ring of the recorder this thread recorded into last: `(uid, ring)`.
    static LAST: Cell<(u64, Option<&'static Ring>)> = const { Cell::new((0, None)) };
    static OWNER: Owner = const { Owner(RefCell::new(Vec::new())) };
}

impl RingSet {
    pub fn new(capacity: usize) -> Arc<RingSet> {
        Arc::new(RingSet {
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            capacity,
            all: Mutex::default(),
            idle: Mutex::default(),
        })
    }

    /// This thread's ring of this recorder, adopted or made at the thread's first record;
    /// `None` while the thread's locals are being destroyed, or when no ring can be
    /// allocated.
    #[inline]
    pub fn mine(self: &Arc<Self>) -> Option<&'static Ring> {
        match LAST.try_with(Cell::get) {
            Ok((uid, Some(ring))) if uid == self.uid => Some(ring),
            _ => self.mine_slow(),
        }
    }

    fn mine_slow(self: &Arc<Self>) -> Option<&'static Ring> {
        let ring = OWNER.try_with(|owner| {
            let mut owned = owner.0.borrow_mut();
            // Rings of recorders that are gone are released here rather than at thread end.
            let (dead, live): (Vec<_>, Vec<_>) =
                owned.drain(..).partition(|o| o.set.strong_count() == 0);
            *owned = live;
            dead.into_iter().for_each(give_back);
            if let Some(o) = owned.iter().find(|o| o.uid == self.uid) {
                return Some(o.ring);
            }
            let ring = self.adopt()?;
            owned.push(Owned {
                set: Arc::downgrade(self),
                uid: self.uid,
                ring,
            });
            Some(ring)
        });
        let ring = ring.ok().flatten()?;
        let _ = LAST.try_with(|l| l.set((self.uid, Some(ring))));
        Some(ring)
    }

    /// A ring for the calling thread: an idle one of this recorder, a free one of the right
    /// capacity, or a new one.
    fn adopt(&self) -> Option<&'static Ring> {
        let thread = current_thread();
        if let Some(ring) = lock(&self.idle).pop() {
            ring.adopt(thread, false);
            return Some(ring);
        }
        let free = {
            let mut free = lock(&FREE);
            let i = free.iter().position(|r| r.capacity() == self.capacity);
            i.map(|i| free.swap_remove(i))
        };
        let ring = match free {
            Some(r) => r,
            None => Ring::leak(self.capacity)?,
        };
        ring.adopt(thread, true);
        lock(&self.all).push(ring);
        Some(ring)
    }

    /// Every ring of this recorder.
    pub fn rings(&self) -> Vec<&'static Ring> {
        lock(&self.all).clone()
    }
}

impl Drop for RingSet {
    fn drop(&mut self) {
        lock(&FREE).extend(
            self.idle
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..),
        );
    }
}
