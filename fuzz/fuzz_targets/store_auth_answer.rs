//! Fuzzes the store's authentication check (`c10d_store::auth::ServerHandshake::answer`): any
//! answer but the right MAC over this handshake's nonces is refused, never a panic.
//!
//! Run: `cargo +nightly fuzz run store_auth_answer` (from this directory's parent).
#![no_main]

use c10d_store::auth::{AuthSecret, ServerHandshake};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let secret = AuthSecret::from_bytes(b"0123456789abcdef-fuzz").expect("a valid secret");
    let hs = ServerHandshake::new();
    assert!(hs.answer(&secret, data).is_none(), "a random answer was accepted");
});
