//! Rendezvous URLs (pytorch-behaviours.md §1 items 14–15): `env://`, `tcp://`, `file://` and
//! their errors, as PyTorch's `rendezvous` handlers give them.
//!
//! Run: `cargo test -p c10d-store --test rendezvous_urls`.

#![allow(unused_imports)]
use c10d_core::{DistError, ErrorKind};
use c10d_store::{
    store_barrier, FileStore, HashStore, PrefixStore, Store, TcpStore, TcpStoreOptions,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

use c10d_store::{rendezvous, rendezvous_with_env, Rendezvous};
use std::collections::HashMap;

const LONG: Duration = Duration::from_secs(60);

/// A port that was free a moment ago (bound on 127.0.0.1:0, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |k| m.get(k).cloned()
}

fn err(r: Result<Rendezvous, DistError>) -> DistError {
    match r {
        Ok(_) => panic!("rendezvous unexpectedly succeeded"),
        Err(e) => e,
    }
}

#[test]
fn unknown_scheme_and_node_specific_arguments() {
    let e = err(rendezvous("invalid://", None, None, LONG));
    assert_eq!(e.to_string(), "No rendezvous handler for invalid://");
    assert_eq!(e.kind(), ErrorKind::Dist);
    let e = err(rendezvous("/no/scheme", None, None, LONG));
    assert_eq!(e.to_string(), "No rendezvous handler for ://");
    for (r, w) in [(Some(0), None), (None, Some(1)), (Some(0), Some(1))] {
        let url = "file:///tmp/x?rank=0&world_size=1";
        let e = err(rendezvous(url, r, w, LONG));
        assert_eq!(
            e.to_string(),
            format!("The url: {url} has node-specific arguments(rank, world_size) already.")
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let url = "tcp://127.0.0.1:1?world_size=1";
        let e = err(rendezvous(url, r, w, LONG));
        assert!(e.to_string().contains("has node-specific arguments"), "{e}");
    }
}

#[test]
fn file_url_errors() {
    let pre = "Error initializing torch.distributed using file:// rendezvous: ";
    let cases = [
        ("file://?rank=0&world_size=1", "path missing"),
        (
            "file:///tmp/c10d_never_created?world_size=2",
            "rank parameter missing",
        ),
        (
            "file:///tmp/c10d_never_created?rank=0",
            "world size parameter missing",
        ),
    ];
    for (url, what) in cases {
        let e = err(rendezvous(url, None, None, LONG));
        assert_eq!(e.to_string(), format!("{pre}{what}"), "{url}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    // rank/world_size given as arguments fill the query
    let e = err(rendezvous("file://", Some(0), Some(1), LONG));
    assert_eq!(e.to_string(), format!("{pre}path missing"));
    assert!(!std::path::Path::new("/tmp/c10d_never_created").exists());
}

#[test]
fn tcp_url_errors() {
    let pre = "Error initializing torch.distributed using tcp:// rendezvous: ";
    let cases = [
        ("tcp://127.0.0.1?rank=0&world_size=1", "port number missing"),
        (
            "tcp://127.0.0.1:?rank=0&world_size=1",
            "port number missing",
        ),
        (
            "tcp://127.0.0.1:23456?world_size=1",
            "rank parameter missing",
        ),
        (
            "tcp://127.0.0.1:23456?rank=0",
            "world size parameter missing",
        ),
    ];
    for (url, what) in cases {
        let e = err(rendezvous(url, None, None, LONG));
        assert_eq!(e.to_string(), format!("{pre}{what}"), "{url}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    let e = err(rendezvous("tcp://127.0.0.1:23456", None, Some(1), LONG));
    assert_eq!(e.to_string(), format!("{pre}rank parameter missing"));
    let e = err(rendezvous(
        "tcp://127.0.0.1:23456?rank=x&world_size=1",
        None,
        None,
        LONG,
    ));
    assert!(e.to_string().starts_with(pre), "{e}");
    let e = err(rendezvous(
        "tcp://127.0.0.1:23456?rank=2&world_size=2",
        None,
        None,
        LONG,
    ));
    assert!(
        e.to_string()
            .contains("rank 2 is out of range for world_size 2"),
        "{e}"
    );
}

#[test]
fn env_url_errors() {
    let pre = "Error initializing torch.distributed using env:// rendezvous: ";
    let msg = |v: &str| format!("{pre}environment variable {v} expected, but not set");
    let check = |env: &[(&str, &str)], url: &str, var: &str| {
        let e = err(rendezvous_with_env(url, None, None, LONG, &env_of(env)));
        assert_eq!(e.to_string(), msg(var), "env {env:?}");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    };
    check(&[], "env://", "RANK");
    check(&[("RANK", "")], "env://", "RANK");
    check(&[("RANK", "0")], "env://", "WORLD_SIZE");
    check(&[("RANK", "0"), ("WORLD_SIZE", "")], "env://", "WORLD_SIZE");
    check(
        &[("RANK", "0"), ("WORLD_SIZE", "1")],
        "env://",
        "MASTER_ADDR",
    );
    check(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
        ],
        "env://",
        "MASTER_PORT",
    );
    check(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", ""),
            ("MASTER_PORT", "1"),
        ],
        "env://",
        "MASTER_ADDR",
    );
    // query values replace RANK / WORLD_SIZE
    check(&[], "env://?rank=0&world_size=1", "MASTER_ADDR");
    // arguments too
    let e = err(rendezvous_with_env(
        "env://",
        Some(0),
        Some(1),
        LONG,
        &env_of(&[]),
    ));
    assert_eq!(e.to_string(), msg("MASTER_ADDR"));
    let env = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "70000"),
    ];
    let e = err(rendezvous_with_env(
        "env://",
        None,
        None,
        LONG,
        &env_of(&env),
    ));
    assert_eq!(
        e.to_string(),
        "port must have value from 0 to 65535 but was 70000."
    );
}

#[test]
fn env_rendezvous_world_one_and_query_override() {
    let env = env_of(&[
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "0"),
        ("RANK", "5"),
        ("WORLD_SIZE", "9"),
    ]);
    let r = rendezvous_with_env("env://?rank=0&world_size=1", None, None, LONG, &env).unwrap();
    assert_eq!((r.rank, r.world_size), (0, 1));
    r.store.set("k", b"v").unwrap();
    assert_eq!(r.store.get("k").unwrap(), b"v");
    assert_eq!(r.store.num_keys().unwrap(), 2, "user key + init/");
    assert_eq!(
        r.store.timeout(),
        LONG,
        "rendezvous timeout becomes the store timeout"
    );
}

#[test]
fn file_two_ranks_share_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rdzv");
    let url = format!("file://{}", path.display());
    let r0 = rendezvous(&format!("{url}?world_size=2&rank=0"), None, None, LONG).unwrap();
    let r1 = rendezvous(&url, Some(1), Some(2), LONG).unwrap();
    assert_eq!(
        (r0.rank, r0.world_size, r1.rank, r1.world_size),
        (0, 2, 1, 2)
    );
    r0.store.set("from0", b"a").unwrap();
    r1.store.set("from1", b"b").unwrap();
    assert_eq!(r1.store.get("from0").unwrap(), b"a");
    assert_eq!(r0.store.get("from1").unwrap(), b"b");
    assert_eq!(r0.store.num_keys().unwrap(), 3);
    drop(r0);
    assert!(path.exists());
    drop(r1);
    assert!(
        !path.exists(),
        "FileStore(path, world_size=2) removes the file after both close"
    );
}

#[test]
fn tcp_two_ranks_share_keys() {
    let port = free_port();
    let url = format!("tcp://127.0.0.1:{port}?rank=0&world_size=2");
    let t = std::thread::spawn(move || rendezvous(&url, None, None, LONG));
    let r1 = rendezvous(&format!("tcp://localhost:{port}"), Some(1), Some(2), LONG).unwrap();
    let r0 = t.join().unwrap().unwrap();
    assert_eq!(
        (r0.rank, r1.rank, r0.world_size, r1.world_size),
        (0, 1, 2, 2)
    );
    r0.store.set("from0", b"a").unwrap();
    r1.store.set("from1", b"b").unwrap();
    assert_eq!(r1.store.get("from0").unwrap(), b"a");
    assert_eq!(r0.store.get("from1").unwrap(), b"b");
    assert_eq!(r0.store.num_keys().unwrap(), 3, "two user keys + init/");
    // A 100 ms timeout set after rendezvous; the client stays usable.
    r1.store.set_timeout(ms(100));
    let e = r1.store.get("the_key").unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 100ms, keys: /the_key");
    assert_eq!(r1.store.get("from1").unwrap(), b"b");
    // use_libuv=0 selects PyTorch's legacy backend name; the store still works.
    let r = rendezvous(
        "tcp://127.0.0.1:0?rank=0&world_size=1&use_libuv=0",
        None,
        None,
        LONG,
    )
    .unwrap();
    r.store.set("x", b"y").unwrap();
    assert_eq!(r.store.get("x").unwrap(), b"y");
}

#[test]
fn env_with_agent_store_makes_every_rank_a_client() {
    // The "agent" serves the store on an ephemeral port, as torchrun does.
    let opts = TcpStoreOptions {
        is_master: true,
        timeout: LONG,
        ..TcpStoreOptions::default()
    };
    let agent = TcpStore::new("127.0.0.1", 0, opts).unwrap();
    let port = agent.port().to_string();
    let env_pairs = [
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("WORLD_SIZE", "2"),
    ];
    // Rank 0 would try to bind the agent's port (not multi-tenant-shared) and fail, so a
    // successful rendezvous for both ranks proves both are clients.
    let env: Vec<(String, String)> = env_pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let env = env.clone();
            std::thread::spawn(move || {
                let mut pairs: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let r = rank.to_string();
                pairs.push(("RANK", &r));
                rendezvous_with_env("env://", None, None, LONG, &env_of(&pairs))
            })
        })
        .collect();
    let rs: Vec<Rendezvous> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    rs[0].store.set("a", b"0").unwrap();
    assert_eq!(rs[1].store.get("a").unwrap(), b"0");
    assert_eq!(agent.get("a").unwrap(), b"0");
    assert_eq!(
        agent.num_keys().unwrap(),
        2,
        "a + init/ (both ranks counted in init/)"
    );
    // "True" must be exact; otherwise rank 0 tries to serve the (busy) port itself.
    let mut pairs = env_pairs.to_vec();
    pairs[0] = ("TORCHELASTIC_USE_AGENT_STORE", "1");
    pairs.push(("RANK", "0"));
    let e = err(rendezvous_with_env(
        "env://",
        None,
        None,
        Duration::from_secs(5),
        &env_of(&pairs),
    ));
    assert_eq!(e.kind(), ErrorKind::Network, "{e:?}");
    assert!(e.to_string().contains("failed to listen"), "{e}");
}

#[test]
fn agent_flag_ignored_for_other_addresses() {
    let port = free_port();
    let env = env_of(&[
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ]);
    // tcp:// on another port: rank 0 serves it (would hang as a client with no server).
    let r = rendezvous_with_env(
        &format!("tcp://127.0.0.1:{port}?rank=0&world_size=1"),
        None,
        None,
        Duration::from_secs(10),
        &env,
    )
    .unwrap();
    r.store.set("k", b"v").unwrap();
    assert_eq!(r.store.get("k").unwrap(), b"v");
}

/// init timeout 1 s → the rendezvous store errors in < 3 s (item 15), for each scheme.
#[test]
fn one_second_timeout_fails_fast() {
    let one = Duration::from_secs(1);
    // master waiting for a worker that never comes
    let start = Instant::now();
    let e = err(rendezvous(
        "tcp://127.0.0.1:0?rank=0&world_size=2",
        None,
        None,
        one,
    ));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.kind(), ErrorKind::Store);
    assert_eq!(
        e.to_string(),
        "Timed out after 1 seconds waiting for clients. 1/2 clients joined."
    );
    // client with no server
    let port = free_port();
    let start = Instant::now();
    let e = err(rendezvous(
        &format!("tcp://127.0.0.1:{port}?rank=1&world_size=2"),
        None,
        None,
        one,
    ));
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.kind(), ErrorKind::Network);
    assert!(
        e.to_string().contains("client socket has timed out after"),
        "{e}"
    );
    // file store: a missing key
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "file://{}?rank=0&world_size=1",
        dir.path().join("f").display()
    );
    let r = rendezvous(&url, None, None, one).unwrap();
    let start = Instant::now();
    let e = r.store.get("never").unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        e.to_string(),
        "Timeout waiting for key: never after 1000 ms"
    );
}

#[test]
fn unresolvable_host_times_out() {
    let start = Instant::now();
    let e = err(rendezvous(
        "tcp://dnsnotexist:23456?rank=1&world_size=2",
        None,
        None,
        Duration::from_secs(1),
    ));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(e.kind(), ErrorKind::Network);
    let s = e.to_string();
    assert!(
        s.contains("client socket has timed out after") && s.contains("dnsnotexist"),
        "{s}"
    );
}
