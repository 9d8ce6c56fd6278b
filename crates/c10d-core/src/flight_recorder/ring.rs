//! A thread's ring of its last `capacity` entries: entry `id` (counted per ring) lives in
//! slot `id % capacity` until entry `id + capacity` overwrites it. Only the owning thread
//! writes entries ([`Ring::push`]); starts and ends come from any thread; dumps read it
//! whole from any thread (see `slot`).

use super::entry::{Entry, Head};
use super::shapes::Packing;
use super::slot::{lap_tag, Slot};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug)]
pub(crate) struct Ring {
    slots: Box<[Slot]>,
    /// The next entry's id (stored by the owner after the entry is whole).
    next: AtomicU64,
    /// The next entry's lap (wrapping) << 32 | slot index (`next` = lap × capacity + index),
    /// kept by the owner so that recording divides nothing (a 64-bit division costs more than the
    /// rest of a slot's write).
    cursor: AtomicU64,
    /// Entries below this id are forgotten ([`Ring::forget`]).
    floor: AtomicU64,
    /// `next` when the current recorder adopted the ring: entries counted before belong to
    /// a recorder that is gone.
    base: AtomicU64,
    /// The thread registry index of the owner (see `entry::current_thread`).
    thread: AtomicU32,
    /// What does not fit a slot: long shape lists and errors, by entry id (rare; a lock).
    aside: Mutex<Aside>,
}

#[derive(Debug, Default)]
struct Aside {
    shapes: BTreeMap<u64, Vec<u64>>,
    errors: BTreeMap<u64, String>,
}

impl Aside {
    /// Drops what belongs to entries the ring no longer holds (below `oldest`).
    fn prune(&mut self, oldest: u64) {
        self.shapes = self.shapes.split_off(&oldest);
        self.errors = self.errors.split_off(&oldest);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ring {
    /// A ring of `capacity` (> 0) slots, never freed (traces refer to it without a count; see
    /// `rings` for how rings are reused), or `None` when the memory cannot be had (an absurd
    /// `TORCH_FR_BUFFER_SIZE`: the thread then records nothing).
    pub fn leak(capacity: usize) -> Option<&'static Ring> {
        let ring = Ring {
            slots: zeroed_slots(capacity)?,
            next: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            base: AtomicU64::new(0),
            thread: AtomicU32::new(u32::MAX),
            aside: Mutex::default(),
        };
        Some(Box::leak(Box::new(ring)))
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Hands the ring to thread `thread`; `fresh`: for a new recorder (its old entries are
    /// forgotten and no longer counted).
    pub fn adopt(&self, thread: u32, fresh: bool) {
        self.thread.store(thread, Ordering::Relaxed);
        if fresh {
            let next = self.next.load(Ordering::Relaxed);
            self.base.store(next, Ordering::Relaxed);
            self.floor.store(next, Ordering::Relaxed);
            *lock(&self.aside) = Aside::default();
        }
    }

    /// Writes the next entry (by the owning thread only; `head.thread` is replaced by the
    /// owner's); returns where it lies. Inlined into the recording call, so that the entry's
    /// fields go straight from the caller's registers to the slot: copying them through the
    /// stack stalled on store forwarding, a third of the cost.
    #[inline(always)]
    pub fn push(&'static self, head: &Head, shapes: &Packing<'_>) -> Place {
        use Ordering::Relaxed;
        let id = self.next.load(Relaxed);
        let cursor = self.cursor.load(Relaxed);
        let (index, lap) = (cursor as u32, (cursor >> 32) as u32);
        let slot = &self.slots[index as usize];
        if !slot.write(id, head, self.thread.load(Relaxed), shapes) {
            let mut aside = lock(&self.aside);
            aside.prune((id + 1).saturating_sub(self.slots.len() as u64));
            aside.shapes.insert(id, shapes.words());
        }
        let following = if index as usize + 1 == self.slots.len() {
            ((lap.wrapping_add(1) as u64) << 32, 0)
        } else {
            (cursor + 1, index as usize + 1)
        };
        self.cursor.store(following.0, Relaxed);
        prefetch(&self.slots[following.1]);
        self.next.store(id + 1, Ordering::Release);
        Place {
            ring: self,
            id,
            index,
            lap,
        }
    }

    fn slot(&self, id: u64) -> &Slot {
        &self.slots[(id % self.slots.len() as u64) as usize]
    }

    fn tag(&self, id: u64) -> u64 {
        lap_tag((id / self.slots.len() as u64) as u32)
    }

    /// What a dump reads of this ring (see [`Snapshot`]).
    pub fn snapshot(&self) -> Snapshot {
        let next = self.next.load(Ordering::Acquire);
        let cap = self.slots.len() as u64;
        let floor = self.floor.load(Ordering::Relaxed);
        let oldest = next.saturating_sub(cap).max(floor);
        let aside = lock(&self.aside);
        // Newest first, stopping at the first entry that is no longer (or not yet) whole.
        let mut entries: Vec<Entry> = (oldest..next)
            .rev()
            .map_while(|id| self.entry(id, &aside))
            .collect();
        entries.reverse();
        let first = entries.first().map_or(next, |e| e.local_id);
        Snapshot {
            count: next - self.base.load(Ordering::Relaxed),
            truncated: first > floor,
            entries,
        }
    }

    /// Entry `id`, if its slot holds it whole.
    fn entry(&self, id: u64, aside: &Aside) -> Option<Entry> {
        let r = self.slot(id).read().filter(|r| r.id == id)?;
        let (started_ms, ended) = self.slot(id).times(self.tag(id));
        let completed_ms = ended.filter(|e| !e.1).map(|e| e.0);
        let failed = ended.is_some_and(|e| e.1);
        Some(Entry {
            record_id: 0,
            local_id: id,
            head: r.head,
            started_ms: started_ms.or(completed_ms),
            completed_ms,
            retired: ended.is_some(),
            error: failed.then(|| aside.errors.get(&id).cloned()).flatten(),
            shapes: (r.shapes)
                .or_else(|| aside.shapes.get(&id).cloned())
                .unwrap_or_default(),
        })
    }

    /// The `pg_id`s of the entries held (read slot by slot, without copying entries).
    pub fn pg_ids(&self) -> BTreeSet<u64> {
        let next = self.next.load(Ordering::Acquire);
        let oldest =
            (next.saturating_sub(self.slots.len() as u64)).max(self.floor.load(Ordering::Relaxed));
        (oldest..next)
            .filter_map(|id| self.slot(id).pg_id())
            .map(u64::from)
            .collect()
    }

    /// Forgets every entry held (ids keep counting).
    pub fn forget(&self) {
        self.floor
            .store(self.next.load(Ordering::Acquire), Ordering::Relaxed);
    }
}

/// What a dump reads of one ring.
pub(crate) struct Snapshot {
    /// Entries the current recorder's owners wrote into the ring in all (forgotten ones
    /// included).
    pub count: u64,
    /// The newest entries, oldest first, without a gap: reading stops at the first entry that
    /// is not whole (being written, or overwritten while the ring was read).
    pub entries: Vec<Entry>,
    /// Older entries than `entries` were written and are not forgotten: the ring overwrote
    /// them (or moved on while read), so other rings' entries older than this ring's first
    /// cannot be placed among this ring's.
    pub truncated: bool,
}

/// Where an entry lies: its ring, id, slot index and lap (what a start or end needs to find
/// it again without dividing; 24 bytes, so that a trace moves cheaply).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    ring: &'static Ring,
    id: u64,
    index: u32,
    /// The lap, wrapping (only its low bits make the tag).
    lap: u32,
}

impl Place {
    #[inline]
    pub fn slot(&self) -> &'static Slot {
        &self.ring.slots[self.index as usize]
    }

    /// The entry's id in its ring.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The tag of the entry's lap in its time words.
    pub fn tag(&self) -> u64 {
        lap_tag(self.lap)
    }

    /// The entry started at `ms` (monotonic milliseconds).
    #[inline]
    pub fn mark_started(&self, ms: u64) {
        self.slot().mark_started(self.id(), self.tag(), ms);
    }

    /// The entry ended at `ms`: completed (`error` `None`) or failed with `error`.
    #[inline]
    pub fn mark_ended(&self, ms: u64, error: Option<&str>) {
        if let Some(e) = error {
            self.keep_error(e);
        }
        self.slot()
            .mark_ended(self.id(), self.tag(), ms, error.is_some());
    }

    #[cold]
    fn keep_error(&self, error: &str) {
        let ring = self.ring;
        let mut aside = lock(&ring.aside);
        let oldest = ring.next.load(Ordering::Acquire);
        aside.prune(oldest.saturating_sub(ring.slots.len() as u64));
        aside.errors.insert(self.id(), error.to_string());
    }
}

/// Asks the CPU to bring `slot` (both its cache lines) into the cache now, while the op just
/// recorded runs: the next `push` overwrites it, and the slot, last written one lap ago, is
/// usually out of the cache by then.
fn prefetch(slot: &Slot) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = (slot as *const Slot).cast::<i8>();
        // SAFETY: a prefetch is a hint that never faults and changes no memory; `p` and
        // `p + 64` lie inside one slot (a `Slot` is 128 bytes, 64-aligned). (Rust ≥ 1.87
        // calls the intrinsic safe; 1.82 needs the block.)
        #[allow(unused_unsafe)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = slot;
}

/// `capacity` zeroed slots. Zeroed memory from the allocator is typically fresh pages that
/// cost nothing until written, as PyTorch's reserved ring costs nothing until filled.
fn zeroed_slots(capacity: usize) -> Option<Box<[Slot]>> {
    let layout = std::alloc::Layout::array::<Slot>(capacity).ok()?;
    if layout.size() == 0 {
        return None;
    }
    // SAFETY: `layout` has a non-zero size. An all-zero `Slot` is a valid one (it holds only
    // atomic integers, for which zero is valid), so `capacity` zeroed `Slot`s are initialised;
    // the box frees them with the same layout (`Layout::array::<Slot>(capacity)`) that
    // `Box<[Slot]>` computes for a slice of that length.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<Slot>();
        if p.is_null() {
            return None;
        }
        Some(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            p, capacity,
        )))
    }
}
