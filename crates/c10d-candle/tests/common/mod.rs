//! Ranks as threads for the tests and the benchmark of c10d-candle: each its own `World` on
//! "gloo" over one `HashStore`.

use c10d_store::{HashStore, Store};
use c10d_world::{InitOptions, World};
use std::sync::Arc;
use std::time::Duration;

/// Runs `f(world, rank)` on `n` threads with an initialised gloo `World` each (one `HashStore`,
/// every wait bounded by `timeout`); returns the results in rank order.
pub fn ranks<R: Send + 'static>(
    n: usize,
    timeout: Duration,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    store.set_timeout(timeout);
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (store, f) = (store.clone(), f.clone());
            std::thread::spawn(move || {
                let w = World::new();
                w.init_process_group(InitOptions {
                    backend: Some("gloo".into()),
                    store: Some(store),
                    rank: Some(r),
                    world_size: Some(n),
                    timeout: Some(timeout),
                    ..Default::default()
                })
                .unwrap();
                let out = f(&w, r);
                w.destroy_process_group(None).unwrap();
                out
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}
