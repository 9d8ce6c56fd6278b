//! Fuzzes the TCPStore request decoder: arbitrary bytes, fed in arbitrary splits, must never
//! panic, never buffer past the request cap, and every decoded request must re-encode to bytes
//! that decode to the same request.
//!
//! Run: `cargo +nightly fuzz run frame_decoder` (from this directory's parent).
#![no_main]

use c10d_store::tcp::protocol::{Decoder, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else { return };
    let split = usize::from(split).max(1);
    let limits = Limits { max_key_len: 128, max_payload: 1024, max_keys: 32, max_request: 8192 };
    let mut d = Decoder::new(limits);
    for chunk in data.chunks(split) {
        let mut input = chunk;
        loop {
            match d.decode(&mut input) {
                Ok(Some(req)) => {
                    let bytes = req.encode();
                    let mut again = Decoder::new(Limits::default());
                    let mut b = &bytes[..];
                    let back = again.decode(&mut b).expect("re-encoded request decodes");
                    assert_eq!(back.as_ref(), Some(&req));
                    assert!(b.is_empty());
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(input.is_empty());
        assert!(d.buffered() <= 8192 + 8 * 64);
    }
});
