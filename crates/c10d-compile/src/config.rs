//! The switches that turn the compile-side groups on, as PyTorch's compiler config:
//! `torch._dynamo.config.enable_compiler_collectives` (environment `TORCH_COMPILER_COLLECTIVES=1`)
//! and `torch.compiler.set_enable_guard_collectives(...)`.
//!
//! Each switch has a process-wide value set here and an optional per-[`crate::CompileGroups`]
//! override (ranks run as threads of one process each hold their own handle, so tests can turn a
//! switch on for one world without touching the others).

use std::sync::atomic::{AtomicU8, Ordering};

/// Environment variable that enables compiler collectives (`"1"` = on), PyTorch's name.
pub const TORCH_COMPILER_COLLECTIVES: &str = "TORCH_COMPILER_COLLECTIVES";

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static COMPILER_COLLECTIVES: AtomicU8 = AtomicU8::new(UNSET);
static GUARD_COLLECTIVES: AtomicU8 = AtomicU8::new(UNSET);

fn encode(v: Option<bool>) -> u8 {
    match v {
        None => UNSET,
        Some(false) => OFF,
        Some(true) => ON,
    }
}

fn decode(v: u8) -> Option<bool> {
    match v {
        OFF => Some(false),
        ON => Some(true),
        _ => None,
    }
}

/// Sets `enable_compiler_collectives` for the whole process (`None` = back to the environment).
/// Governs the compile group and the compile-sync group.
pub fn set_enable_compiler_collectives(on: Option<bool>) {
    COMPILER_COLLECTIVES.store(encode(on), Ordering::SeqCst);
}

/// `enable_compiler_collectives`: the process-wide setting, else `TORCH_COMPILER_COLLECTIVES=1`.
pub fn enable_compiler_collectives() -> bool {
    decode(COMPILER_COLLECTIVES.load(Ordering::SeqCst))
        .unwrap_or_else(|| std::env::var(TORCH_COMPILER_COLLECTIVES).is_ok_and(|v| v.trim() == "1"))
}

/// `torch.compiler.set_enable_guard_collectives(on)` for the whole process (`None` = default,
/// off). Governs the guard group.
pub fn set_enable_guard_collectives(on: Option<bool>) {
    GUARD_COLLECTIVES.store(encode(on), Ordering::SeqCst);
}

/// Whether guard collectives are enabled process-wide (default off, as in PyTorch).
pub fn enable_guard_collectives() -> bool {
    decode(GUARD_COLLECTIVES.load(Ordering::SeqCst)).unwrap_or(false)
}
