//! Shared helpers: run N ranks as threads over one HashStore.
#![allow(dead_code)]

use c10d_core::{Backend, Collectives, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use std::sync::Arc;
use std::time::Duration;

/// Options for tests: short timeout so a bug fails instead of hanging.
pub fn opts() -> GlooOptions {
    GlooOptions {
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

/// Creates `n` process groups on threads (the constructor blocks until the mesh is up).
pub fn make_world(n: usize, o: GlooOptions) -> Vec<Arc<ProcessGroupGloo>> {
    make_world_with(n, |_| o.clone())
}

/// As [`make_world`], with options per rank.
pub fn make_world_with(n: usize, o: impl Fn(usize) -> GlooOptions) -> Vec<Arc<ProcessGroupGloo>> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let s = store.clone();
            let o = o(r);
            std::thread::spawn(move || ProcessGroupGloo::new(s, r, n, o).expect("create group"))
        })
        .collect();
    hs.into_iter().map(|h| h.join().expect("join")).collect()
}

/// Runs `f(rank, pg)` on one thread per rank and returns the results in rank order.
pub fn run_world<T: Send + 'static>(
    n: usize,
    o: GlooOptions,
    f: impl Fn(usize, Arc<ProcessGroupGloo>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let pgs = make_world(n, o);
    run_on(pgs, f)
}

/// Runs `f` on existing groups.
pub fn run_on<T: Send + 'static>(
    pgs: Vec<Arc<ProcessGroupGloo>>,
    f: impl Fn(usize, Arc<ProcessGroupGloo>) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let f = Arc::new(f);
    let hs: Vec<_> = pgs
        .into_iter()
        .enumerate()
        .map(|(r, pg)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, pg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

pub fn assert_backend(pg: &dyn Backend, n: usize, r: usize) {
    assert_eq!(pg.size(), n);
    assert_eq!(pg.rank(), r);
}

/// The bytes of `t`.
pub fn bytes(t: &Tensor) -> Vec<u8> {
    t.read_bytes(|b| b.to_vec()).unwrap()
}

/// All-reduces `ts[r]` on `pgs[r]` for every rank at once (async, from this thread) and waits.
pub fn all_reduce_each(pgs: &[Arc<ProcessGroupGloo>], ts: &[Tensor]) {
    let opts = c10d_core::AllreduceOptions {
        async_op: true,
        ..Default::default()
    };
    let works: Vec<_> = pgs
        .iter()
        .zip(ts)
        .map(|(pg, t)| pg.all_reduce(std::slice::from_ref(t), &opts).unwrap())
        .collect();
    for w in works {
        w.wait().unwrap();
    }
}
