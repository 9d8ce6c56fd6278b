//! The ring of the last `capacity` entries: entry `id` lives in slot `id % capacity` until
//! entry `id + capacity` overwrites it.

use super::entry::Entry;

#[derive(Debug)]
pub(crate) struct Ring {
    entries: Vec<Entry>,
    capacity: usize,
    next_id: u64,
}

impl Ring {
    /// Reserves the whole ring up front when the allocator allows (untouched pages cost
    /// nothing), so that filling the first lap never moves the entries: growing a 256 KiB
    /// vector while ops run was most of the recorder's cost in a process's first 2000 ops.
    pub fn new(capacity: usize) -> Ring {
        let mut entries = Vec::new();
        // A refused reservation (an absurd `TORCH_FR_BUFFER_SIZE`) leaves the vector to grow.
        let _ = entries.try_reserve_exact(capacity);
        Ring {
            entries,
            capacity,
            next_id: 0,
        }
    }

    /// Writes the next entry with `fill` in its slot (overwriting the oldest entry when full;
    /// `fill` sets every field but `record_id`) and returns its record id. Filling in place
    /// spares building the 128-byte entry aside and moving it in.
    pub fn push_with(&mut self, fill: impl FnOnce(&mut Entry)) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let slot = (id % self.capacity.max(1) as u64) as usize;
        if self.entries.len() < self.capacity {
            self.entries.push(Entry::default());
        } else {
            self.prefetch((slot + 1) % self.capacity);
        }
        let e = &mut self.entries[slot];
        e.record_id = id;
        fill(e);
        id
    }

    /// Asks the CPU to bring slot `slot` (both its cache lines) into the cache now, while the
    /// op just recorded runs: the next `push` overwrites it, and the slot, last written one
    /// lap ago, is usually out of the cache by then. Measured (`perf annotate`, 1 KiB
    /// all-reduce): without this, most of `record`'s time was that miss, taken when the old
    /// entry is dropped.
    fn prefetch(&self, slot: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = self.entries[slot..].as_ptr().cast::<i8>();
            // SAFETY: a prefetch is a hint that never faults and changes no memory; `p` and
            // `p + 64` lie inside the slot `&self.entries[slot]` (an `Entry` is 128 bytes,
            // 64-aligned). (Rust ≥ 1.87 calls the intrinsic safe; 1.82 needs the block.)
            #[allow(unused_unsafe)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    /// The entry with record id `id`, unless it was overwritten since.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Entry> {
        if self.capacity == 0 {
            return None;
        }
        let slot = (id % self.capacity as u64) as usize;
        self.entries.get_mut(slot).filter(|e| e.record_id == id)
    }

    /// Copies of the entries, oldest first.
    /// Writes a completion handed off by [`super::handoff::Handoff`]: `(record_id,
    /// started_ns, completed_ns)`, `started_ns` 0 when the slot already holds the start.
    /// Nothing when the entry was overwritten meanwhile.
    pub fn complete(&mut self, done: Option<(u64, u64, u64)>) {
        let Some((id, started, completed)) = done else {
            return;
        };
        if let Some(e) = self.get_mut(id) {
            e.retired = true;
            if started != 0 {
                e.time_started_ns = started;
            }
            if e.time_started_ns == 0 {
                e.time_started_ns = completed;
            }
            e.time_completed_ns = completed;
        }
    }

    pub fn snapshot(&self) -> Vec<Entry> {
        let split = if self.entries.len() < self.capacity {
            0
        } else {
            (self.next_id % self.capacity.max(1) as u64) as usize
        };
        let (new, old) = self.entries.split_at(split);
        old.iter().chain(new).cloned().collect()
    }

    /// The `pg_id`s of the entries kept.
    pub fn pg_ids(&self) -> std::collections::BTreeSet<u64> {
        self.entries.iter().map(|e| e.pg_id as u64).collect()
    }

    /// Forgets every entry (record ids keep counting).
    pub fn clear(&mut self) {
        self.entries.clear();
        // Keep `id % capacity` slot arithmetic valid: the next id starts a fresh lap.
        let cap = self.capacity.max(1) as u64;
        self.next_id = self.next_id.div_ceil(cap) * cap;
    }
}
