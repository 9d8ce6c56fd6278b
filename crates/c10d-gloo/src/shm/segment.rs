//! The shared-memory segment: mapping it, its per-rank control lines and slots, publishing
//! and awaiting arrival numbers (futex), the checks of a peer's process, and how much room
//! `/dev/shm` has (`statvfs`). All of the module's `unsafe` lives here; the algorithms
//! (`ops.rs`) and the op protocol (`sync.rs`) use only what this file makes safe.

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Largest message per rank that goes through shared memory in groups of up to 8 ranks
/// (cross-memory attach takes over at 2 MiB by default); larger groups (where all-reduce's
/// medium algorithm, all-pairs, is not used) have at most [`SMALL_SLOT_BYTES`]. A segment's
/// slots are sized to the ops that use them (see `fit.rs`), so a segment is at most 16 slots of
/// 2 MiB = 32 MiB, and usually far less.
pub(crate) const SLOT_BYTES: usize = 2 * 1024 * 1024;
/// The largest slot of groups of more than 8 ranks, and the smallest slot of any segment.
pub(crate) const SMALL_SLOT_BYTES: usize = 64 * 1024;
/// Largest group that uses it.
pub(crate) const MAX_RANKS: usize = 16;
/// How long a waiting rank spins on its peer's line before yielding, when the host has a core
/// per rank and the peer last ran on another one (a time, not a count: a pause lasts 10 to 140
/// cycles depending on the CPU).
pub(crate) const SPIN: Duration = Duration::from_micros(50);
/// Spinning worth doing: none when the group's ranks outnumber this host's CPUs (a spinning
/// rank would take the core the awaited peer needs), else [`SPIN`].
pub(crate) fn spin_limit(n: usize) -> Duration {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > cpus {
        Duration::ZERO
    } else {
        SPIN
    }
}

/// One rank's control line (64 bytes, asserted below).
#[repr(C, align(64))]
pub(crate) struct Line {
    pub(crate) seq: AtomicU32,
    pub(crate) sleepers: AtomicU32,
    pub(crate) pid: AtomicI32,
    /// The published op per slot parity (as the data), compared by every peer: op code |
    /// dtype code << 8, total bytes, PyTorch sequence number.
    pub(crate) kind: [AtomicU32; 2],
    pub(crate) total: [AtomicU64; 2],
    pub(crate) pseq: [AtomicU64; 2],
    /// The CPU this rank ran on at its last arrival, plus one (0: not known); see
    /// [`current_cpu`].
    pub(crate) cpu: AtomicI32,
}

const _: () = assert!(std::mem::size_of::<Line>() == 64);

/// A mapped segment and this rank's op counter.
pub(crate) struct Segment {
    pub(crate) base: *mut u8,
    pub(crate) len: usize,
    pub(crate) n: usize,
    /// Bytes of each of the 2 n slots.
    pub(crate) slot: usize,
    /// Arrivals published so far (equal on every rank between ops).
    pub(crate) ops: u32,
    /// Ops run so far, and the first arrival of the last one (slot reuse, see `run`).
    pub(crate) op_index: u32,
    pub(crate) prev_first: u32,
    /// Spinning before yielding (see [`spin_limit`]).
    pub(crate) spin: Duration,
    /// This rank published an arrival and has not yet woken its sleepers (see
    /// [`wake_sleepers`]).
    pub(crate) unwoken: std::cell::Cell<bool>,
}

// SAFETY: the mapping is process-wide memory owned by this value; it is only used by the thread
// that drives the group's engine (the engine is behind a mutex).
unsafe impl Send for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe a mapping made by `map` and unmapped only here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The largest slot a group of `n` ranks may have (equal on every rank).
pub(crate) fn slot_bytes(n: usize) -> usize {
    if n <= 8 {
        SLOT_BYTES
    } else {
        SMALL_SLOT_BYTES
    }
}

/// Bytes of a segment of `n` ranks with slots of `slot` bytes: a 64-byte line and two slots
/// per rank.
pub(crate) fn seg_len(n: usize, slot: usize) -> usize {
    n * 64 + n * 2 * slot
}

impl Segment {
    pub(crate) fn line(&self, r: usize) -> &Line {
        assert!(r < self.n, "shared-memory line {r} of {}", self.n);
        // SAFETY: line r lies in the mapped header (r < n, checked), 64-byte aligned (page-aligned base);
        // the fields are atomics, so shared access from several processes is sound.
        unsafe { &*(self.base.add(r * 64) as *const Line) }
    }

    fn slot(&self, r: usize, parity: u32) -> *mut u8 {
        assert!(
            r < self.n && parity < 2,
            "shared-memory slot ({r}, {parity}) of {}",
            self.n
        );
        let off = self.n * 64 + (r * 2 + parity as usize) * self.slot;
        // SAFETY: the offset lies inside the mapping (r < n, parity < 2: checked).
        unsafe { self.base.add(off) }
    }

    /// Maps the object `name` (created when `create`), sized for `n` ranks with slots of
    /// `slot` bytes.
    ///
    /// # Errors
    /// `shm_open`, `ftruncate`, `posix_fallocate` (`ENOSPC`: `/dev/shm` is full) or `mmap`
    /// failed; a created name is removed again.
    pub(crate) fn map(
        name: &CString,
        n: usize,
        slot: usize,
        create: bool,
    ) -> std::io::Result<Segment> {
        let len = seg_len(n, slot);
        let flags = if create {
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR
        } else {
            libc::O_RDWR
        };
        // SAFETY: `name` is a valid C string; the returned descriptor is closed below.
        let fd = unsafe { libc::shm_open(name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if create {
            if let Err(e) = reserve(fd, len) {
                // SAFETY: closing our own descriptor and removing the name we just created.
                unsafe {
                    libc::close(fd);
                    libc::shm_unlink(name.as_ptr());
                }
                return Err(e);
            }
        } else if let Err(e) = check_size(fd, len) {
            // SAFETY: closing our own descriptor.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        // SAFETY: a shared read-write mapping of `len` bytes of the object; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        let e = std::io::Error::last_os_error();
        // SAFETY: the mapping keeps the object alive; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            if create {
                // SAFETY: removing the name we just created (nobody else has it yet).
                unsafe { libc::shm_unlink(name.as_ptr()) };
            }
            return Err(e);
        }
        Ok(Segment {
            base: p.cast(),
            len,
            n,
            slot,
            ops: 0,
            op_index: 0,
            prev_first: 0,
            spin: spin_limit(n),
            unwoken: std::cell::Cell::new(false),
        })
    }
}

/// Removes the name of a segment this process created (existing mappings stay valid).
pub(crate) fn unlink(name: &CString) {
    // SAFETY: `name` is a valid C string; unlinking only removes the name.
    unsafe { libc::shm_unlink(name.as_ptr()) };
}

/// Sizes a fresh object to `len` bytes and reserves its pages, so that a full /dev/shm is a
/// clean error here rather than SIGBUS at the first touch of the mapping.
pub(crate) fn reserve(fd: libc::c_int, len: usize) -> std::io::Result<()> {
    // SAFETY: `fd` is an open shared-memory object of ours.
    if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; posix_fallocate returns the error number instead of setting errno.
    match unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) } {
        0 => Ok(()),
        rc => Err(std::io::Error::from_raw_os_error(rc)),
    }
}

/// Copies `data` into slot (r, parity) at byte `at`.
pub(crate) fn write_slot(seg: &Segment, r: usize, parity: u32, at: usize, data: &[u8]) {
    assert!(at + data.len() <= seg.slot, "shared-memory slot overflow");
    // SAFETY: slot (r, parity) is this rank's and holds `seg.slot` bytes (checked above); no peer
    // reads these bytes before this rank's next arrival (peers read other ranges of it in
    // all-pairs' reduce step), and every peer finished the op that used it last (`begin`).
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), seg.slot(r, parity).add(at), data.len())
    };
}

/// Largest copy [`prefetch_for_write`] prepares: from 16 KiB up it made 2-rank all_reduces
/// 5–7 % slower (its requests compete with the caller's and the next op's).
const PREFETCH_MAX: usize = 4 * 1024;

/// Asks this core's cache for the first `len` bytes (nothing above [`PREFETCH_MAX`]) of slot
/// (r, parity) in a writable state, so that the next copy into it does not wait while the
/// peers' copies of its lines (they read them) are invalidated. Only a hint: the data do not
/// change; nothing off x86-64. Call it once the peers finished reading the slot, or it steals
/// the lines from under them.
pub(crate) fn prefetch_for_write(seg: &Segment, r: usize, parity: u32, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        if len > PREFETCH_MAX {
            return;
        }
        let base = seg.slot(r, parity);
        for off in (0..len.min(seg.slot)).step_by(64) {
            // SAFETY: the address lies in the mapping (off < seg.slot); a prefetch never
            // faults and never changes memory.
            unsafe { _mm_prefetch::<_MM_HINT_ET0>(base.add(off).cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (seg, r, parity, len);
}

/// `len` bytes of slot (p, parity) from byte `at`, once p's arrival for this op was acquired.
pub(crate) fn read_slot(seg: &Segment, p: usize, parity: u32, at: usize, len: usize) -> &[u8] {
    assert!(at + len <= seg.slot, "shared-memory slot overflow");
    // SAFETY: in bounds (checked above); the data was published before p's arrival, which the
    // caller acquired, and is not written again before every rank started the next op.
    unsafe { std::slice::from_raw_parts(seg.slot(p, parity).add(at), len) }
}

/// Publishes op `k` of this rank (and the CPU it runs on), without waking sleepers: a plain
/// store that does not wait for this rank's earlier stores (its slot's data) to reach the
/// other cores, as a full barrier would; [`wake_sleepers`] must follow.
pub(crate) fn publish(line: &Line, k: u32) {
    line.cpu.store(current_cpu(), Ordering::Relaxed);
    line.seq.store(k, Ordering::Release);
}

/// Wakes whoever sleeps on `line`'s `seq` after a [`publish`]. The fence pairs with the
/// sleeper's: it counts itself in `sleepers` (read-modify-write, sequentially consistent) and
/// then reads `seq`; either it sees the new `seq` or this sees it in `sleepers`.
pub(crate) fn wake_sleepers(line: &Line) {
    std::sync::atomic::fence(Ordering::SeqCst);
    if line.sleepers.load(Ordering::Relaxed) > 0 {
        futex_wake(&line.seq);
    }
}

/// The CPU the calling thread runs on, plus one (0 when the kernel does not say): glibc reads
/// it from the thread's restartable-sequence area, a load, not a system call.
pub(crate) fn current_cpu() -> i32 {
    // SAFETY: sched_getcpu takes no arguments and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        0
    } else {
        cpu + 1
    }
}

/// Whether `seq` has reached `k` (wrapping).
pub(crate) fn reached(seq: u32, k: u32) -> bool {
    seq.wrapping_sub(k) as i32 >= 0
}

/// Whether process `pid` exists (signal 0 delivers nothing; only ESRCH means gone).
pub(crate) fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit word in a shared mapping (a non-private futex);
    // the kernel only compares it with `expected` and sleeps at most `timeout`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; waking has no other effect.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// An object of fewer than `len` bytes would raise SIGBUS where the mapping runs past its end:
/// refuse to map it.
fn check_size(fd: libc::c_int, len: usize) -> std::io::Result<()> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` a writable `stat`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if (st.st_size as u64) < len as u64 {
        return Err(std::io::Error::other(format!(
            "the segment holds {} bytes where {len} were expected",
            st.st_size
        )));
    }
    Ok(())
}

/// Size and free bytes of `/dev/shm` (from `statvfs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    /// Bytes of the file system.
    pub size: u64,
    /// Bytes an unprivileged process may still allocate there.
    pub free: u64,
}

/// Total and free bytes of the file system behind `/dev/shm` (where `shm_open` puts its
/// objects), as `statvfs` sees them from this process (its mount namespace).
///
/// # Errors
/// `statvfs` failed (no `/dev/shm`).
pub(crate) fn dev_shm_room() -> std::io::Result<Room> {
    let path = c"/dev/shm";
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a writable `statvfs`.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok(Room {
        size: st.f_blocks as u64 * unit,
        free: st.f_bavail as u64 * unit,
    })
}

/// A random 64-bit number from the kernel (segment names must not be guessable or collide).
pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a writable 8-byte buffer.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if got != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32);
    }
    u64::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_order() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(1, u32::MAX));
        assert!(!reached(u32::MAX, 1));
    }

    #[test]
    fn segments_map_and_vanish_once_unlinked() {
        let name = CString::new(format!(
            "/c10d-shm-test-{}-{:x}",
            std::process::id(),
            rand_u64()
        ))
        .unwrap();
        let a = Segment::map(&name, 2, SMALL_SLOT_BYTES, true).unwrap();
        let b = Segment::map(&name, 2, SMALL_SLOT_BYTES, false).unwrap();
        // SAFETY: unlinking the test's own name.
        unsafe { libc::shm_unlink(name.as_ptr()) };
        assert!(
            Segment::map(&name, 2, SMALL_SLOT_BYTES, false).is_err(),
            "the name must be gone"
        );
        // Both mappings see the same memory.
        publish(a.line(1), 7);
        wake_sleepers(a.line(1));
        assert_eq!(b.line(1).seq.load(Ordering::Acquire), 7);
        // SAFETY: slot (0, 1) of a 2-rank segment holds SMALL_SLOT_BYTES bytes.
        unsafe { *a.slot(0, 1) = 42 };
        // SAFETY: as above, through the other mapping.
        assert_eq!(unsafe { *b.slot(0, 1) }, 42);
        assert_eq!(a.len, seg_len(2, SMALL_SLOT_BYTES));
        assert_eq!(a.slot, SMALL_SLOT_BYTES);
    }
}
