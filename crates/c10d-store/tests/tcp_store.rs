//! TcpStore client + server behaviours (pytorch-behaviours.md §1 items that apply to TCPStore).

use c10d_core::ErrorKind;
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn master(world: Option<usize>) -> TcpStore {
    TcpStore::new(
        "127.0.0.1",
        0,
        TcpStoreOptions {
            world_size: world,
            is_master: true,
            timeout: T,
            wait_for_workers: world.is_some(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn client(port: u16) -> TcpStore {
    TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: T,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn set_get_add_and_num_keys() {
    let s = master(Some(1));
    assert_eq!(s.num_keys().unwrap(), 1, "init key");
    for d in [1, 2, 3] {
        s.add("key", d).unwrap();
    }
    s.set("key0", b"value0").unwrap();
    s.add("key3", 1).unwrap();
    s.set("key1", b"value1").unwrap();
    s.add("key3", 2).unwrap();
    s.set("key2", b"value2").unwrap();
    for d in 3..=6 {
        s.add("key3", d).unwrap();
    }
    assert_eq!(s.get("key").unwrap(), b"6");
    assert_eq!(s.get("key3").unwrap(), b"21");
    assert_eq!(s.add("key3", 0).unwrap(), 21);
    for i in 0..3 {
        assert_eq!(
            s.get(&format!("key{i}")).unwrap(),
            format!("value{i}").as_bytes()
        );
    }
    assert_eq!(s.num_keys().unwrap(), 6);
    s.set("-key3", b"7").unwrap();
    assert_eq!(s.get("-key3").unwrap(), b"7");
    assert!(s.delete_key("-key3").unwrap());
    assert_eq!(s.num_keys().unwrap(), 6);
    assert!(s.check(&["key3"]).unwrap());
    assert!(!s.check(&["Randomkey3"]).unwrap());
    assert!(s.check(&[]).unwrap());
    assert!(!s.delete_key("never").unwrap());
    let mut keys = s.list_keys().unwrap();
    keys.sort();
    assert_eq!(keys, ["key", "key0", "key1", "key2", "key3"]);
    s.add("neg", -3).unwrap();
    assert_eq!(s.get("neg").unwrap(), b"-3");
}

#[test]
fn num_keys_without_world_size_and_delete_sequence() {
    let s = master(None);
    assert_eq!(s.num_keys().unwrap(), 0);
    let s = master(Some(1));
    for _ in 0..3 {
        s.add("key", 1).unwrap();
    }
    s.set("key0", b"v0").unwrap();
    s.add("key3", 1).unwrap();
    s.set("key1", b"v1").unwrap();
    assert_eq!(s.num_keys().unwrap(), 5);
    assert!(s.delete_key("key").unwrap());
    assert_eq!(s.num_keys().unwrap(), 4);
    s.set_timeout(Duration::from_millis(300));
    assert_eq!(s.get("key").unwrap_err().kind(), ErrorKind::Store);
    s.delete_key("key0").unwrap();
    s.delete_key("key3").unwrap();
    assert_eq!(s.num_keys().unwrap(), 2);
    s.set("key4", b"v4").unwrap();
    assert_eq!(s.num_keys().unwrap(), 3);
    assert_eq!(s.get("key1").unwrap(), b"v1");
    assert_eq!(s.get("key4").unwrap(), b"v4");
}

#[test]
fn compare_set_append_multi() {
    let s = master(None);
    assert_eq!(s.compare_set("k", b"x", b"y").unwrap(), b"x");
    assert!(!s.check(&["k"]).unwrap());
    assert_eq!(s.compare_set("k", b"", b"v").unwrap(), b"v");
    assert_eq!(s.compare_set("k", b"nope", b"w").unwrap(), b"v");
    assert_eq!(s.compare_set("k", b"v", b"w").unwrap(), b"w");
    assert_eq!(s.get("k").unwrap(), b"w");
    assert!(s.has_extended_api());
    s.set("foo", b"po").unwrap();
    s.append("foo", b"tato").unwrap();
    assert_eq!(s.get("foo").unwrap(), b"potato");
    s.append("new", b"x").unwrap();
    assert_eq!(s.get("new").unwrap(), b"x");
    s.multi_set(&["foo", "bar"], &[b"po", b"tato"]).unwrap();
    assert_eq!(
        s.multi_get(&["bar", "foo"]).unwrap(),
        vec![b"tato".to_vec(), b"po".to_vec()]
    );
    // Large value round trip (1 MiB).
    let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    s.set("big", &big).unwrap();
    assert_eq!(s.get("big").unwrap(), big);
}

#[test]
fn wait_timeouts_and_connection_reuse() {
    let s = master(None);
    let t0 = Instant::now();
    let e = s
        .wait_timeout(&["bad_key"], Duration::from_millis(250))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store);
    assert_eq!(e.to_string(), "wait timeout after 250ms, keys: /bad_key");
    assert!(t0.elapsed() >= Duration::from_millis(240));
    // Still usable.
    s.set("k", b"1").unwrap();
    s.wait_timeout(&["k"], Duration::from_secs(10)).unwrap();
    let e = s
        .wait_timeout(&["k", "x1", "x2"], Duration::from_millis(50))
        .unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 50ms, keys: /k, /x1, /x2");
    // PyTorch quirk: timeout 0 fails at once even for an existing key.
    let e = s.wait_timeout(&["k"], Duration::ZERO).unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 0ms, keys: /k");
    assert_eq!(s.get("k").unwrap(), b"1");
    s.set_timeout(Duration::from_millis(100));
    let e = s.get("missing").unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 100ms, keys: /missing");
    s.set_timeout(T);
    assert_eq!(s.get("k").unwrap(), b"1");
}

#[test]
fn wait_is_woken_by_another_client() {
    let s = master(None);
    let c = client(s.port());
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        c.set("key1", b"v").unwrap();
    });
    let t0 = Instant::now();
    s.wait_timeout(&["key1"], Duration::from_secs(30)).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(20));
    h.join().unwrap();
}

#[test]
fn queues() {
    let s = master(None);
    assert!(!s.check(&["q"]).unwrap());
    assert_eq!(s.queue_len("q").unwrap(), 0);
    s.queue_push("q", b"1").unwrap();
    s.queue_push("q", b"2").unwrap();
    assert!(s.check(&["q"]).unwrap());
    assert_eq!(s.queue_len("q").unwrap(), 2);
    s.wait(&["q"]).unwrap();
    assert_eq!(s.queue_pop("q", true).unwrap(), b"1");
    assert_eq!(s.queue_pop("q", false).unwrap(), b"2");
    assert!(!s.check(&["q"]).unwrap());
    assert_eq!(s.queue_len("q").unwrap(), 0);
    let e = s.queue_pop("q", false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueEmpty);
    assert_eq!(e.to_string(), "queue is empty");
    s.set_timeout(Duration::from_millis(10));
    let e = s.queue_pop("q", true).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store);
    assert!(e.to_string().contains("timeout"));
    s.set_timeout(T);
    // Two cloned handles exchange messages both ways.
    let a = s.clone_store().unwrap();
    let b = s.clone_store().unwrap();
    let h = std::thread::spawn(move || {
        let m = b.queue_pop("to_b", true).unwrap();
        b.queue_push("to_a", &[m, b"!".to_vec()].concat()).unwrap();
    });
    a.queue_push("to_b", b"hi").unwrap();
    assert_eq!(a.queue_pop("to_a", true).unwrap(), b"hi!");
    h.join().unwrap();
}

#[test]
fn barrier_native() {
    let s = master(None);
    s.barrier("b1", 1, Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    let e = s.barrier("b2", 2, Duration::from_millis(100)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store);
    assert_eq!(e.to_string(), "barrier timeout after 100ms, key: b2");
    assert!(t0.elapsed() >= Duration::from_millis(90));
    let hs: Vec<_> = (0..4)
        .map(|_| {
            let c = client(s.port());
            std::thread::spawn(move || c.barrier("b4", 4, Duration::from_secs(30)))
        })
        .collect();
    for h in hs {
        h.join().unwrap().unwrap();
    }
    // Clone shares data.
    let c = s.clone_store().unwrap();
    c.set("via_clone", b"1").unwrap();
    assert_eq!(s.get("via_clone").unwrap(), b"1");
}

#[test]
fn server_port_errors_and_world_size() {
    let s = master(None);
    assert_ne!(s.port(), 0);
    assert!(s.is_master());
    let e = TcpStore::new(
        "127.0.0.1",
        s.port(),
        TcpStoreOptions {
            is_master: true,
            timeout: T,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network);
    assert!(
        e.to_string()
            .starts_with("The server socket has failed to listen on any local network address"),
        "{e}"
    );
    assert!(e.to_string().contains(&s.port().to_string()));
    let e = TcpStore::new(
        "127.0.0.1",
        0,
        TcpStoreOptions {
            world_size: Some(0),
            is_master: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(e.to_string(), "TCPStore world size cannot be 0");
    let t0 = Instant::now();
    let e = TcpStore::new(
        "127.0.0.1",
        0,
        TcpStoreOptions {
            world_size: Some(2),
            is_master: true,
            timeout: Duration::from_millis(1500),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Store);
    assert_eq!(
        e.to_string(),
        "Timed out after 2 seconds waiting for clients. 1/2 clients joined."
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    TcpStore::new(
        "127.0.0.1",
        0,
        TcpStoreOptions {
            world_size: Some(2),
            is_master: true,
            timeout: T,
            wait_for_workers: false,
            ..Default::default()
        },
    )
    .unwrap();
}

#[test]
fn world_of_five_with_master_listen_fd() {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fd = l.as_raw_fd();
    let m = std::thread::spawn(move || {
        let m = TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                world_size: Some(5),
                is_master: true,
                timeout: T,
                master_listen_fd: Some(fd),
                ..Default::default()
            },
        )
        .unwrap();
        m.set("key", b"value").unwrap();
        (m, l)
    });
    let hs: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let c = TcpStore::new(
                    "127.0.0.1",
                    port,
                    TcpStoreOptions {
                        world_size: Some(5),
                        timeout: T,
                        ..Default::default()
                    },
                )
                .unwrap();
                assert_eq!(c.get("key").unwrap(), b"value");
                c.set(&format!("new_key{i}"), format!("new_value{i}").as_bytes())
                    .unwrap();
                assert_eq!(
                    c.compare_set(
                        &format!("new_key{i}"),
                        format!("new_value{i}").as_bytes(),
                        format!("next_value{i}").as_bytes()
                    )
                    .unwrap(),
                    format!("next_value{i}").as_bytes()
                );
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let (m, _l) = m.join().unwrap();
    m.set_timeout(Duration::from_millis(200));
    assert_eq!(
        m.get("init/").unwrap_err().kind(),
        ErrorKind::Store,
        "init/ is not under the / prefix"
    );
    assert_eq!(m.num_keys().unwrap(), 1 + 1 + 4);
    assert!(format!("{m:?}").contains(&format!("server=TCPServer(port={port})")));
}

#[test]
fn multi_tenant_shares_one_server() {
    let a = master(None);
    let port = a.port();
    let mk = || {
        TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                is_master: true,
                multi_tenant: true,
                timeout: T,
                ..Default::default()
            },
        )
    };
    // `a` was not multi-tenant, so a multi-tenant bind on its port fails like PyTorch.
    assert_eq!(mk().unwrap_err().kind(), ErrorKind::Network);
    drop(a);
    let m1 = TcpStore::new(
        "127.0.0.1",
        0,
        TcpStoreOptions {
            is_master: true,
            multi_tenant: true,
            timeout: T,
            ..Default::default()
        },
    )
    .unwrap();
    let port = m1.port();
    let m2 = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            is_master: true,
            multi_tenant: true,
            timeout: T,
            ..Default::default()
        },
    )
    .unwrap();
    m1.set("shared", b"1").unwrap();
    drop(m1);
    assert_eq!(m2.get("shared").unwrap(), b"1");
}

#[test]
fn many_clients_add_concurrently() {
    let m = master(Some(1));
    m.add("counter", 1).unwrap();
    let hs: Vec<_> = (0..16)
        .map(|_| {
            let c = client(m.port());
            std::thread::spawn(move || {
                for _ in 0..200 {
                    c.add("counter", 1).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(m.get("counter").unwrap(), b"3201");
    assert_eq!(m.num_keys().unwrap(), 2);
}

#[test]
fn many_waiters_all_released() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let n = 64;
    let hs: Vec<_> = (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let c = client(port);
                c.set(&format!("k{i}"), b"x").unwrap();
                let keys: Vec<String> = (0..n).map(|j| format!("k{j}")).collect();
                let refs: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
                c.wait_timeout(&refs, Duration::from_secs(60)).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn server_drop_during_blocking_get_is_network_error() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let c = client(srv.port());
    let h = std::thread::spawn(move || c.get("never"));
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    srv.stop();
    let e = h.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[test]
fn connect_times_out_with_pytorch_text() {
    // A port with nothing listening: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t0 = Instant::now();
    let e = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_millis(800),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network);
    assert_eq!(
        e.to_string(),
        format!("The client socket has timed out after 800ms while trying to connect to (127.0.0.1, {port}).")
    );
    assert!(t0.elapsed() >= Duration::from_millis(700) && t0.elapsed() < Duration::from_secs(10));
    let e = TcpStore::new(
        "dnsnotexist.invalid",
        port,
        TcpStoreOptions {
            timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("client socket has timed out after")
            && e.to_string().contains("dnsnotexist"),
        "{e}"
    );
}

#[test]
fn connect_retries_until_server_appears() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let h = std::thread::spawn(move || {
        TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                timeout: T,
                ..Default::default()
            },
        )
    });
    std::thread::sleep(Duration::from_millis(700));
    let srv = TcpStoreServer::bind(ServerOptions {
        port,
        ..Default::default()
    })
    .unwrap();
    let c = h.join().unwrap().unwrap();
    c.set("a", b"1").unwrap();
    drop(srv);
}

#[test]
fn ipv6_and_hostnames() {
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let a = client(port);
    a.set("x", b"1").unwrap();
    for host in ["localhost", "[::1]", "::1"] {
        match TcpStore::new(
            host,
            port,
            TcpStoreOptions {
                timeout: Duration::from_secs(5),
                ..Default::default()
            },
        ) {
            Ok(c) => assert_eq!(c.get("x").unwrap(), b"1"),
            // Hosts without IPv6 loopback: the failure must still be the clean connect error.
            Err(e) => assert!(
                host != "localhost" && e.kind() == ErrorKind::Network,
                "{host}: {e}"
            ),
        }
    }
}
