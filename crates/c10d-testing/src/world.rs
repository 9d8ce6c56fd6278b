//! Shared helpers of the world-level tests (c10d-world, c10d-ddp, c10d-candle): N ranks as
//! threads, each with its own `World`, over one `HashStore`, using the store-backed test backend
//! registered as "store" (or gloo: [`run_gloo`], [`ranks`]); ranks as processes.

use crate::StoreBackend;
use c10d_store::{HashStore, Store};
use c10d_world::{register_backend, InitOptions, World};
use std::sync::{Arc, Once};
use std::time::Duration;

/// Registers the test backends once: "store" (cpu) and "storex" (cpu, extended API).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        register_backend(
            "store",
            StoreBackend::creator("store"),
            Some(&[c10d_core::DeviceType::Cpu]),
            false,
        );
        register_backend(
            "storex",
            StoreBackend::creator("storex"),
            Some(&[c10d_core::DeviceType::Cpu]),
            true,
        );
    });
}

/// A fresh shared store with a short timeout (tests must fail fast, not hang).
pub fn store() -> Arc<dyn Store> {
    let s = HashStore::new();
    s.set_timeout(Duration::from_secs(20));
    Arc::new(s)
}

/// Init options for `rank` of `n` over `store` with the "store" backend and a 20 s op timeout.
pub fn opts(store: &Arc<dyn Store>, rank: usize, n: usize) -> InitOptions {
    InitOptions {
        backend: Some("store".into()),
        store: Some(store.clone()),
        world_size: Some(n),
        rank: Some(rank),
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    }
}

/// Runs `f(world, rank)` on `n` threads, each with an initialised `World`; returns the results in
/// rank order. A panic in any rank fails the test with that rank's message.
pub fn run<R: Send + 'static>(
    n: usize,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    run_with(n, |_w, _r| {}, f)
}

/// As [`run`], with `setup(world, rank)` called before `init_process_group`.
pub fn run_with<R: Send + 'static>(
    n: usize,
    setup: impl Fn(&World, usize) + Send + Sync + 'static,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    register();
    let store = store();
    let f = Arc::new(f);
    let setup = Arc::new(setup);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (store, f, setup) = (store.clone(), f.clone(), setup.clone());
            std::thread::Builder::new()
                .name(format!("rank{r}"))
                .spawn(move || {
                    let w = World::new();
                    setup(&w, r);
                    w.init_process_group(opts(&store, r, n))
                        .expect("init_process_group");
                    let out = f(&w, r);
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

/// Runs `f(world, rank)` on `n` threads over the real gloo backend (`setup` before init); the
/// ranks meet in a store barrier before `destroy_process_group` (see `world_gloo.rs`).
pub fn run_gloo<R: Send + 'static>(
    n: usize,
    setup: impl Fn(&World) + Send + Sync + 'static,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    run_gloo_as(n, "gloo", setup, f)
}

/// As [`run_gloo`] with another backend string over gloo (`"cuda:gloo"`: device tensors only).
pub fn run_gloo_as<R: Send + 'static>(
    n: usize,
    backend: &'static str,
    setup: impl Fn(&World) + Send + Sync + 'static,
    f: impl Fn(&World, usize) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let s = store();
    let f = Arc::new(f);
    let setup = Arc::new(setup);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (s, f, setup) = (s.clone(), f.clone(), setup.clone());
            let barrier = s.clone();
            std::thread::Builder::new()
                .name(format!("gloo-rank{r}"))
                .spawn(move || {
                    let w = World::new();
                    setup(&w);
                    w.init_process_group(InitOptions {
                        backend: Some(backend.into()),
                        store: Some(s),
                        world_size: Some(n),
                        rank: Some(r),
                        timeout: Some(Duration::from_secs(30)),
                        ..Default::default()
                    })
                    .expect("init gloo");
                    let out = f(&w, r);
                    c10d_store::store_barrier(
                        barrier.as_ref(),
                        "run_gloo_end",
                        n,
                        Duration::from_secs(60),
                    )
                    .unwrap();
                    w.destroy_process_group(None).unwrap();
                    out
                })
                .unwrap()
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        .collect()
}

/// This test binary started again as rank `rank` of a `world`-rank env:// job (the store of
/// rank 0's agent on 127.0.0.1:`port`), running only the test `test`, with `child_var` set so
/// that the test knows it is the child; stdout and stderr piped.
pub fn rank_command(
    test: &str,
    child_var: &str,
    port: u16,
    rank: usize,
    world: usize,
    run_id: &str,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(child_var, "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .env("TORCHELASTIC_RUN_ID", run_id)
        .env_remove("TORCH_DISTRIBUTED_DEBUG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

/// A job store on 127.0.0.1 (a free port) hosted by the test itself, as a launcher's agent
/// store is (the ranks get `TORCHELASTIC_USE_AGENT_STORE=True` from [`rank_command`]).
pub fn store_server() -> c10d_store::TcpStoreServer {
    c10d_store::TcpStoreServer::bind(c10d_store::ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap()
}

/// Spawns `cmd` (stdout piped, as [`rank_command`] makes it); every line it prints reaches
/// `tx` tagged with `slot`. Returns the child and the reader thread.
pub fn spawn_lines(
    mut cmd: std::process::Command,
    slot: usize,
    tx: &std::sync::mpsc::Sender<(usize, String)>,
) -> (std::process::Child, std::thread::JoinHandle<()>) {
    use std::io::{BufRead, BufReader};
    let mut k = cmd.spawn().unwrap();
    let out = k.stdout.take().unwrap();
    let tx = tx.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send((slot, line));
        }
    });
    (k, reader)
}

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
