//! [`Dest`]: where the payload of an arriving frame lands (a posted collective or
//! point-to-point buffer, an early or unexpected frame's own buffer, an error text, nowhere),
//! and [`dest_slice`], the bytes of it a read fills. A leaf of the engine: the receive state
//! machine (`conn.rs`) reads into it, matching (`matching.rs`, `p2p.rs`) decides it.

/// Where an arriving frame's payload goes.
pub(super) enum Dest {
    Coll { id: u64, ptr: *mut u8 },
    P2p { id: u64, ptr: *mut u8 },
    Early(Vec<u8>),
    Unexpected(Vec<u8>),
    ErrorText(Vec<u8>),
    Discard,
}

/// The `len` bytes of `dest` from `at`, or `None` where they are to be dropped (a detached
/// destination, an error text longer than its buffer).
pub(super) fn dest_slice(dest: &mut Dest, at: usize, len: usize) -> Option<&mut [u8]> {
    match dest {
        Dest::Coll { ptr, .. } | Dest::P2p { ptr, .. } => {
            // SAFETY: posted destinations stay valid until their id completes or is detached
            // (detaching turns the destination into `Discard` before the memory is released),
            // `at + len` never exceeds the posted length, and the engine is the only writer.
            Some(unsafe { std::slice::from_raw_parts_mut(ptr.add(at), len) })
        }
        Dest::Early(v) | Dest::Unexpected(v) => Some(&mut v[at..at + len]),
        Dest::ErrorText(v) => {
            if at + len <= v.len() {
                Some(&mut v[at..at + len])
            } else {
                None
            }
        }
        Dest::Discard => None,
    }
}
