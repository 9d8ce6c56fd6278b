//! Fuzzes the CPU backend's frame-header decoder (`c10d_gloo::fuzzing::frame_header`): any 64
//! bytes decode to a header that round-trips or are refused with a text, never a panic.
//!
//! Run: `cargo +nightly fuzz run gloo_frame_header` (from this directory's parent).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| c10d_gloo::fuzzing::frame_header(data));
