//! The `c10d-store` command line against real PyTorch (gated on C10D_TORCH_PYTHON):
//! - its client ops on PyTorch's own TCPStore server (libuv and legacy);
//! - two PyTorch ranks run `init_process_group("gloo")` + all_reduce through `env://` with
//!   `TORCHELASTIC_USE_AGENT_STORE=True` against `c10d-store serve`.

use c10d_testing::interop as interop_common;

use c10d_store::{Store, TcpStore, TcpStoreOptions};
use interop_common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_c10d-store");

fn cli_on_pytorch_server(backend: &str) {
    let Some(py) = torch_python() else { return };
    let (_g, port) = pytorch_server(&py, backend);
    let s = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            world_size: Some(1),
            timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .unwrap();
    s.set("key", b"6").unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(BIN)
            .args([
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--timeout-ms",
                "20000",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cli {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(cli(&["get", "key"]), "6");
    assert_eq!(cli(&["add", "key", "1"]), "7\n");
    cli(&["set", "from_cli", "x"]);
    assert_eq!(s.get("from_cli").unwrap(), b"x");
    assert_eq!(cli(&["check", "from_cli"]), "true\n");
}

#[test]
fn cli_drives_pytorch_libuv_server() {
    cli_on_pytorch_server("libuv");
}

#[test]
fn cli_drives_pytorch_legacy_server() {
    cli_on_pytorch_server("legacy");
}

#[test]
fn gloo_ranks_rendezvous_on_our_cli_server() {
    let Some(py) = torch_python() else { return };
    let mut srv = Command::new(BIN)
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--world-size",
            "2",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut srv, Duration::from_secs(30));
    let _srv = Guard(srv);
    let port = line.trim().rsplit_once(':').unwrap().1.to_string();
    let ranks: Vec<Guard> = (0..2)
        .map(|r| {
            Guard(
                Command::new(&py)
                    .arg(script("tcp_gloo_rank.py"))
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .env("RANK", r.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                    .env("GLOO_SOCKET_IFNAME", "lo")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    for (r, g) in ranks.into_iter().enumerate() {
        let (ok, out, err) = finish(g, Duration::from_secs(240));
        assert!(
            ok && out.contains(&format!("rank {r} OK")),
            "rank {r} failed\nstdout:\n{out}\nstderr:\n{err}"
        );
    }
    // The job's keys are visible through our client.
    let c = TcpStore::new(
        "127.0.0.1",
        port.parse().unwrap(),
        TcpStoreOptions {
            timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(c.num_keys().unwrap() > 0);
}
