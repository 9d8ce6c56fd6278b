//! Fuzzes the CPU backend's connection hello, as the accepting rank reads it
//! (`c10d_gloo::fuzzing::hello`): any bytes are a hello of this group or a reason to drop or
//! refuse the connection, never a panic or an unbounded allocation.
//!
//! Run: `cargo +nightly fuzz run gloo_hello` (from this directory's parent).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| c10d_gloo::fuzzing::hello(data));
