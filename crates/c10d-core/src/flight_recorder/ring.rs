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
    pub fn new(capacity: usize) -> Ring {
        Ring {
            entries: Vec::new(),
            capacity,
            next_id: 0,
        }
    }

    /// Stores `e` with the next record id (returned), evicting the oldest entry when full.
    pub fn push(&mut self, mut e: Entry) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        e.record_id = id;
        if self.entries.len() < self.capacity {
            self.entries.push(e);
        } else {
            let slot = (id % self.capacity as u64) as usize;
            self.entries[slot] = e;
        }
        id
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
