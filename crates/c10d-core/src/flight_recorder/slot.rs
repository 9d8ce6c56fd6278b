//! One entry of a ring, written by the ring's owning thread and read by dumps on any thread
//! without a lock: a sequence lock. The owner marks the slot "being written", stores the
//! fields, then marks it whole; a reader keeps what it read only when the mark was the same
//! whole one before and after. On x86 every step is a plain load or store: recording takes no
//! atomic read-modify-write.
//!
//! An op's start and end are written later, by whichever thread runs or completes it, each
//! as one word that carries the entry's lap tag beside the time: a late write for an entry
//! the ring has since overwritten (the op outlived a whole lap of its thread's ring) carries
//! an older lap's tag, and readers ignore it.

use super::entry::Head;
use super::shapes::Packing;
use crate::op_type::OpType;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Shape words kept in the slot; longer packings are kept beside the ring.
pub(crate) const INLINE_WORDS: usize = 7;
/// `words` of a slot whose shapes are kept beside the ring.
const SPILLED: u32 = 0xff;

/// Bits of a time word: lap tag (22) | failed (1) | milliseconds (41, ~70 years of uptime).
const TAG_SHIFT: u32 = 42;
const TAG_MASK: u64 = (1 << (64 - TAG_SHIFT)) - 1;
const FAILED: u64 = 1 << 41;
const MS_MASK: u64 = FAILED - 1;

/// The tag of the entries of lap `lap` of a ring, in the top bits of a time word.
pub(crate) fn lap_tag(lap: u32) -> u64 {
    (lap as u64 & TAG_MASK) << TAG_SHIFT
}

/// One entry: 128 bytes, two cache lines.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct Slot {
    /// 0: never written; `(id + 1) << 1 | 1`: entry `id` being written; `(id + 1) << 1`:
    /// entry `id` whole.
    seq: AtomicU64,
    created_ms: AtomicU64,
    collective_seq_id: AtomicU64,
    op_id: AtomicU64,
    /// Time words (see the module documentation); 0: none.
    started: AtomicU64,
    ended: AtomicU64,
    p2p_seq_id: AtomicU32,
    pg_id: AtomicU32,
    timeout_ms: AtomicU32,
    peer: AtomicU32,
    thread: AtomicU32,
    /// Op code | shape words << 8 (`SPILLED`: beside the ring).
    op_words: AtomicU32,
    shapes: [AtomicU64; INLINE_WORDS],
}

/// What a reader got of a whole slot.
pub(crate) struct Read {
    pub id: u64,
    pub head: Head,
    /// The inline shape words; `None`: kept beside the ring.
    pub shapes: Option<Vec<u64>>,
}

fn whole(id: u64) -> u64 {
    (id + 1) << 1
}

impl Slot {
    /// Writes entry `id` of thread `thread`, by the ring's owner only (`rings`
    /// gives each ring one owning thread). Returns false when the shapes did not fit the slot
    /// (the caller keeps `shapes.words()` beside the ring).
    #[inline(always)]
    pub fn write(&self, id: u64, h: &Head, thread: u32, shapes: &Packing<'_>) -> bool {
        use Ordering::Relaxed;
        self.seq.store(whole(id) | 1, Relaxed);
        fence(Ordering::Release);
        self.created_ms.store(h.created_ms, Relaxed);
        self.collective_seq_id.store(h.collective_seq_id, Relaxed);
        self.op_id.store(h.op_id, Relaxed);
        // A late mark of the entry before carries another lap's tag; zeroing also keeps a
        // word never marked since from matching when the 22-bit tag wraps.
        self.started.store(0, Relaxed);
        self.ended.store(0, Relaxed);
        self.p2p_seq_id.store(h.p2p_seq_id, Relaxed);
        self.pg_id.store(h.pg_id, Relaxed);
        self.timeout_ms.store(h.timeout_ms, Relaxed);
        self.peer.store(h.peer, Relaxed);
        self.thread.store(thread, Relaxed);
        let words = match shapes {
            Packing::One(_) => self.write_shapes(shapes),
            Packing::Many { .. } => self.write_many_shapes(shapes),
        };
        let inline = words != SPILLED;
        self.op_words
            .store(h.op.code() as u32 | words << 8, Relaxed);
        self.seq.store(whole(id), Ordering::Release);
        inline
    }

    /// Writes the shape words if they fit; returns their count, or `SPILLED`.
    #[inline(always)]
    fn write_shapes(&self, shapes: &Packing<'_>) -> u32 {
        let len = shapes.len();
        if len > INLINE_WORDS {
            return SPILLED;
        }
        let inline = &self.shapes[..len];
        shapes.write(|i, w| inline[i].store(w, Ordering::Relaxed));
        len as u32
    }

    /// [`Slot::write_shapes`] for several tensors, kept out of line so that recording the
    /// common in-place op stays short.
    #[inline(never)]
    fn write_many_shapes(&self, shapes: &Packing<'_>) -> u32 {
        self.write_shapes(shapes)
    }

    /// The whole entry this slot holds, or `None` when it holds none or is being written
    /// (after a few tries).
    pub fn read(&self) -> Option<Read> {
        (0..4).find_map(|_| self.try_read())
    }

    fn try_read(&self) -> Option<Read> {
        use Ordering::Relaxed;
        let seq = self.seq.load(Ordering::Acquire);
        if seq == 0 || seq & 1 == 1 {
            return None;
        }
        let op_words = self.op_words.load(Relaxed);
        let head = Head {
            created_ms: self.created_ms.load(Relaxed),
            collective_seq_id: self.collective_seq_id.load(Relaxed),
            op_id: self.op_id.load(Relaxed),
            p2p_seq_id: self.p2p_seq_id.load(Relaxed),
            pg_id: self.pg_id.load(Relaxed),
            timeout_ms: self.timeout_ms.load(Relaxed),
            peer: self.peer.load(Relaxed),
            op: OpType::from_code(op_words as u8).unwrap_or(OpType::Unknown),
            thread: self.thread.load(Relaxed),
        };
        let words = (op_words >> 8) as usize;
        let shapes = (words != SPILLED as usize).then(|| {
            let n = words.min(INLINE_WORDS);
            self.shapes[..n].iter().map(|w| w.load(Relaxed)).collect()
        });
        fence(Ordering::Acquire);
        (self.seq.load(Relaxed) == seq).then_some(Read {
            id: (seq >> 1) - 1,
            head,
            shapes,
        })
    }

    /// The `pg_id` of the entry the slot holds whole, if any (one field: no torn read).
    pub fn pg_id(&self) -> Option<u32> {
        let seq = self.seq.load(Ordering::Acquire);
        (seq != 0 && seq & 1 == 0).then(|| self.pg_id.load(Ordering::Relaxed))
    }

    /// Whether the slot holds entry `id` now (a start or end for an overwritten entry is not
    /// written; the tag covers a lap that happens between this check and the write).
    fn holds(&self, id: u64) -> bool {
        self.seq.load(Ordering::Relaxed) == whole(id)
    }

    /// Entry `id` (lap tag `tag`) started at `ms`.
    pub fn mark_started(&self, id: u64, tag: u64, ms: u64) {
        if self.holds(id) {
            self.started
                .store(tag | (ms & MS_MASK).max(1), Ordering::Relaxed);
        }
    }

    /// Entry `id` (lap tag `tag`) ended at `ms`, completed or failed.
    pub fn mark_ended(&self, id: u64, tag: u64, ms: u64, failed: bool) {
        if self.holds(id) {
            self.store_ended(tag, ms, failed);
        }
    }

    /// Stores the end word of lap tag `tag` whoever the slot holds now.
    pub(super) fn store_ended(&self, tag: u64, ms: u64, failed: bool) {
        let failed = if failed { FAILED } else { 0 };
        let word = tag | failed | (ms & MS_MASK).max(1);
        self.ended.store(word, Ordering::Relaxed);
    }

    /// (started ms, (ended ms, failed)) of the entry of lap tag `tag`, where written.
    pub fn times(&self, tag: u64) -> (Option<u64>, Option<(u64, bool)>) {
        let mine = |w: u64| (w != 0 && w & !(FAILED | MS_MASK) == tag).then_some(w);
        let started = mine(self.started.load(Ordering::Relaxed)).map(|w| w & MS_MASK);
        let ended =
            mine(self.ended.load(Ordering::Relaxed)).map(|w| (w & MS_MASK, w & FAILED != 0));
        (started, ended)
    }
}
