//! Entry points of the cargo-fuzz targets in the repository's `fuzz/` directory (nightly
//! Rust); not a stable API. Bounded runs of the same checks are unit tests (`wire.rs`,
//! `transport.rs`).

use crate::wire::{Header, HDR};

/// Decodes the first 64 bytes (`HDR`) of `bytes` as a frame header, as the receive path
/// does before it trusts a byte of the frame. A header that decodes must encode back to bytes
/// that decode to the same header; anything else must be an error text, never a panic.
///
/// # Panics
/// On a violation of the above (the fuzzer's finding).
pub fn frame_header(bytes: &[u8]) {
    let Some(b) = bytes.get(..HDR) else {
        return;
    };
    match Header::decode(b) {
        Ok(h) => assert_eq!(Header::decode(&h.encode()), Ok(h)),
        Err(e) => assert!(!e.is_empty()),
    }
}

/// Reads `bytes` as a hello arriving at rank 0 of a group "g" of 4 ranks, as the accepting
/// side of the mesh does: each outcome is a hello from rank 1, 2 or 3 of this group, or a
/// reason to drop the connection or refuse the hello (never a panic, and never more than the
/// 1 MiB name cap allocated).
///
/// # Panics
/// On a violation of the above (the fuzzer's finding).
pub fn hello(bytes: &[u8]) {
    let me = crate::transport::hello::Who {
        group_name: "g".to_string(),
        rank: 0,
        size: 4,
    };
    let Ok((head, name)) = crate::transport::hello::read_hello(&mut &bytes[..]) else {
        return;
    };
    assert!(name.len() <= 4 << 20);
    if crate::transport::hello::hello_problem(&me, &|_| false, &head, &name).is_none() {
        assert!(name == "g" && head.size == 4 && (1..4).contains(&head.rank));
    }
}

/// A seeded xorshift64* generator: the bounded runs of the checks above draw the same inputs
/// on every run.
#[cfg(test)]
pub(crate) fn seeded(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
