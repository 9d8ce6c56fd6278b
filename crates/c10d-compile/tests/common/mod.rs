//! Shared helpers of the c10d-compile tests: N ranks as threads, each with its own `World`,
//! over one `HashStore`; and a toy compile loop driven by the compiler and guard collectives.

#![allow(dead_code)]

use c10d_compile::{CompileGroups, FrameState};
use c10d_core::Result;
use c10d_store::{HashStore, Store};
use c10d_testing::StoreBackend;
use c10d_world::{register_backend, InitOptions, World};
use std::sync::{Arc, Once};
use std::time::Duration;

/// Every blocking call in the tests is bounded by this (store waits, backend ops).
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Registers the store-backed test backend "store" (cpu) once.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        register_backend(
            "store",
            StoreBackend::creator("store"),
            Some(&[c10d_core::DeviceType::Cpu]),
            false,
        );
    });
}

/// A fresh shared store with the test timeout.
pub fn store() -> Arc<dyn Store> {
    let s = HashStore::new();
    s.set_timeout(TIMEOUT);
    Arc::new(s)
}

/// Init options for `rank` of `n` over `store` with `backend`.
pub fn opts(backend: &str, store: &Arc<dyn Store>, rank: usize, n: usize) -> InitOptions {
    InitOptions {
        backend: Some(backend.into()),
        store: Some(store.clone()),
        world_size: Some(n),
        rank: Some(rank),
        timeout: Some(TIMEOUT),
        ..Default::default()
    }
}

/// Runs `f(world, rank)` on `n` threads, each with a `World` initialised on `backend` ("gloo"
/// or "store"); ranks meet in a store barrier before `destroy_process_group` (a gloo rank that
/// shuts down right after its last op can fail a slower peer's op). Results in rank order; a
/// panic in any rank fails the test with that rank's message.
pub fn run<R: Send + 'static>(
    n: usize,
    backend: &'static str,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    register();
    let store = store();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (store, f) = (store.clone(), f.clone());
            std::thread::Builder::new()
                .name(format!("rank{r}"))
                .spawn(move || {
                    let w = World::new();
                    w.init_process_group(opts(backend, &store, r, n))
                        .expect("init_process_group");
                    let out = f(&w, r);
                    c10d_store::store_barrier(store.as_ref(), "compile_test_end", n, TIMEOUT)
                        .expect("end barrier");
                    let _ = w.destroy_process_group(None);
                    out
                })
                .expect("spawn")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        .collect()
}

/// A toy JIT with Dynamo's automatic-dynamic policy: it compiles a frame for the inputs it sees,
/// checks guards on each call, and recompiles (with the differing values made dynamic) on a miss.
/// With the collectives on, guards are agreed with the guard collective and states merged with
/// the compiler collective, so all ranks take the same decisions.
#[derive(Default, Debug)]
pub struct ToyJit {
    /// The state the current compiled code is specialised on.
    pub compiled: Option<FrameState>,
    /// Step index of each compilation.
    pub compiled_at: Vec<usize>,
    step: usize,
}

impl ToyJit {
    /// One call of the compiled function with the inputs `seen`.
    pub fn call(&mut self, cg: &CompileGroups<'_>, seen: &FrameState) -> Result<()> {
        let step = self.step;
        self.step += 1;
        if let Some(c) = &self.compiled {
            // Guard collective only when compiled code exists (as Dynamo).
            let hit = c.admits(seen);
            if cg.guard_collective(hit)?.all_hit {
                return Ok(());
            }
        }
        let mut local = seen.clone();
        if let Some(prev) = &self.compiled {
            local.merge_from(prev);
        }
        let merged = cg.compiler_collective(&local)?;
        self.compiled = Some(merged);
        self.compiled_at.push(step);
        Ok(())
    }
}
