//! How big a group's segment should be and whether `/dev/shm` has room for it: pure decisions
//! (the `statvfs` that measures the room is `segment::dev_shm_room`), so that they are tested
//! without a small `/dev/shm`.
//!
//! A segment's slot holds one rank's bytes of one op. It is sized to the op that first needs it
//! (the next power of two, at least [`SMALL_SLOT_BYTES`], at most the group's largest slot), and
//! replaced by a bigger one when a later op needs more. A segment must leave an eighth of
//! `/dev/shm` free ([`fits`]): data loaders and other groups share it, and a tmpfs that runs
//! full makes whoever touches a page it could not give die of `SIGBUS`.

use super::segment::{seg_len, slot_bytes, SMALL_SLOT_BYTES};

pub(crate) use super::segment::Room;

/// The slot that holds `bytes` per rank in a group of `n` ranks: the next power of two, at least
/// [`SMALL_SLOT_BYTES`], at most [`slot_bytes`]`(n)` (callers ask only for `bytes` up to that).
pub(crate) fn slot_for(bytes: usize, n: usize) -> usize {
    bytes
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .clamp(SMALL_SLOT_BYTES, slot_bytes(n).max(SMALL_SLOT_BYTES))
}

/// Whether a segment of `len` bytes fits `room`, leaving an eighth of `/dev/shm` free.
pub(crate) fn fits(len: usize, room: Room) -> bool {
    (len as u64).saturating_add(room.size / 8) <= room.free
}

/// The largest slot (a power of two from [`SMALL_SLOT_BYTES`] to `slot_bytes(n)`) whose segment
/// for `n` ranks fits `room`; `None` when not even the smallest does.
pub(crate) fn largest_fit(n: usize, room: Room) -> Option<usize> {
    let mut best = None;
    let mut slot = SMALL_SLOT_BYTES;
    while slot <= slot_bytes(n) && fits(seg_len(n, slot), room) {
        best = Some(slot);
        slot *= 2;
    }
    best
}

/// The largest slot still worth a set-up once one of `slot` bytes found no room: half of it, or
/// 0 (never again) below the smallest slot.
pub(crate) fn limit_after_no_room(slot: usize) -> usize {
    if slot / 2 >= SMALL_SLOT_BYTES {
        slot / 2
    } else {
        0
    }
}

/// The warning of a group whose segment of `slot`-byte slots does not fit `room` (given once per
/// group, by its rank 0): names `/dev/shm`, its size and free bytes, what was needed and what
/// would fit.
pub(crate) fn no_room_text(ctx: &str, n: usize, slot: usize, room: Room) -> String {
    let need = seg_len(n, slot);
    let would = match largest_fit(n, room) {
        Some(s) => format!(
            "at most a segment of {} bytes (slots of {s} bytes) would fit",
            seg_len(n, s)
        ),
        None => format!(
            "not even the smallest segment ({} bytes) would fit",
            seg_len(n, SMALL_SLOT_BYTES)
        ),
    };
    format!(
        "{ctx}: /dev/shm ({} bytes, {} free) has no room for a shared-memory segment of {need} \
         bytes ({n} ranks, slots of {slot} bytes; an eighth of /dev/shm stays free); {would}. \
         This group uses sockets for ops that need it (a larger /dev/shm, e.g. `docker run \
         --shm-size`, gives it shared memory)",
        room.size, room.free
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::segment::SLOT_BYTES;

    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;

    fn room(size: usize, free: usize) -> Room {
        Room {
            size: size as u64,
            free: free as u64,
        }
    }

    #[test]
    fn slots_are_powers_of_two_between_64_kib_and_the_group_limit() {
        assert_eq!(slot_for(1, 2), 64 * KIB);
        assert_eq!(slot_for(KIB, 8), 64 * KIB);
        assert_eq!(slot_for(64 * KIB, 8), 64 * KIB);
        assert_eq!(slot_for(64 * KIB + 4, 8), 128 * KIB);
        assert_eq!(slot_for(MIB, 2), MIB);
        assert_eq!(slot_for(MIB + 1, 2), SLOT_BYTES);
        assert_eq!(slot_for(SLOT_BYTES, 8), SLOT_BYTES);
        // Beyond the group's limit the slot stays at it (the table never asks for more).
        assert_eq!(slot_for(4 * MIB, 8), SLOT_BYTES);
        assert_eq!(slot_for(MIB, 12), SMALL_SLOT_BYTES);
        assert_eq!(slot_for(usize::MAX, 2), SLOT_BYTES);
    }

    #[test]
    fn a_segment_fits_only_leaving_an_eighth_free() {
        let r = room(64 * MIB, 64 * MIB);
        assert!(fits(56 * MIB, r));
        assert!(!fits(56 * MIB + 1, r));
        assert!(!fits(1, room(64 * MIB, 8 * MIB)));
        assert!(fits(0, room(64 * MIB, 8 * MIB)));
        assert!(!fits(1, room(0, 0)));
        assert!(!fits(usize::MAX, r));
    }

    #[test]
    fn the_3d_mesh_of_8_ranks_fits_64_mib_at_1_kib_but_not_with_full_slots() {
        // World (8 ranks) and 12 groups of 2, each with the slot a 1 KiB op asks for.
        let total = seg_len(8, slot_for(KIB, 8)) + 12 * seg_len(2, slot_for(KIB, 2));
        assert!(total < 5 * MIB, "{total}");
        let mut free = 64 * MIB;
        for len in std::iter::once(seg_len(8, slot_for(KIB, 8)))
            .chain(std::iter::repeat_n(seg_len(2, slot_for(KIB, 2)), 12))
        {
            assert!(fits(len, room(64 * MIB, free)));
            free -= len;
        }
        // Before: every group reserved 2 MiB slots at connect time.
        let before = seg_len(8, SLOT_BYTES) + 12 * seg_len(2, SLOT_BYTES);
        assert!(before > 64 * MIB, "{before}");
    }

    #[test]
    fn largest_fit_and_limits() {
        let r = room(64 * MIB, 64 * MIB);
        // 8 ranks, 2 MiB slots: 32 MiB + 512 bytes fits 56 MiB.
        assert_eq!(largest_fit(8, r), Some(SLOT_BYTES));
        // 10 MiB free of 16: 8 MiB usable; 8 ranks × 2 × 256 KiB = 4 MiB fits, 512 KiB (8 MiB +
        // 512) not; of 64 MiB only 2 MiB are usable: 64 KiB slots.
        assert_eq!(largest_fit(8, room(16 * MIB, 10 * MIB)), Some(256 * KIB));
        assert_eq!(largest_fit(8, room(64 * MIB, 10 * MIB)), Some(64 * KIB));
        assert_eq!(largest_fit(2, room(64 * MIB, 8 * MIB)), None);
        assert_eq!(largest_fit(12, r), Some(SMALL_SLOT_BYTES));
        assert_eq!(limit_after_no_room(SLOT_BYTES), MIB);
        assert_eq!(limit_after_no_room(128 * KIB), 64 * KIB);
        assert_eq!(limit_after_no_room(64 * KIB), 0);
    }

    #[test]
    fn the_warning_names_dev_shm_its_size_free_bytes_need_and_fit() {
        let t = no_room_text("G", 8, SLOT_BYTES, room(16 * MIB, 10 * MIB));
        assert!(
            t.starts_with("G: /dev/shm (16777216 bytes, 10485760 free)"),
            "{t}"
        );
        assert!(
            t.contains(&format!("segment of {} bytes", seg_len(8, SLOT_BYTES))),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "at most a segment of {} bytes",
                seg_len(8, 256 * KIB)
            )),
            "{t}"
        );
        let t = no_room_text("G", 2, SMALL_SLOT_BYTES, room(64 * MIB, 0));
        assert!(
            t.contains("not even the smallest segment (262272 bytes)"),
            "{t}"
        );
    }
}
