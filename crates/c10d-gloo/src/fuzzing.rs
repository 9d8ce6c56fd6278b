//! Entry points of the cargo-fuzz targets in the repository's `fuzz/` directory (nightly
//! Rust); not a stable API. A bounded run of the same checks is a unit test of `wire.rs`.

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
