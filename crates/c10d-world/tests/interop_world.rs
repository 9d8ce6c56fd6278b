//! Interop with real PyTorch (gated on C10D_TORCH_PYTHON): a Rust rank (this process, a
//! `World`) and a PyTorch rank run `init_process_group` + `new_group` over one TcpStore with
//! `TORCH_DIST_INIT_BARRIER=1`. The store-based barriers only complete when both sides use the
//! same store layout (`PrefixStore("default_pg")`, the group-name prefixes, the barrier keys) and
//! the same group names; a key set through PyTorch's default store is then read through ours.
//! Both sides use lazily connected Gloo, so no Gloo traffic crosses languages.
//!
//! Run: `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-world --test interop_world`

use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_world::{GroupOptions, InitOptions, PgOptions, World};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PY: &str = r#"
import os, sys, datetime
os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
port = int(sys.argv[1])
t = datetime.timedelta(seconds=60)
store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=t, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=t)
g = dist.new_group([0, 1])
h = dist.new_group([1])
l = dist.new_group([0, 1], use_local_synchronization=True)
ds = c10d._get_default_store()
ds.set("from_py", b"hello from torch")
got = ds.get("from_rs").decode()
print("NAMES", dist.group.WORLD.group_name, g.group_name, h.group_name, got, flush=True)
print("LOCAL", l.group_name, flush=True)
ds.set("py_done", b"1")
dist.destroy_process_group()
"#;

#[test]
fn rust_and_torch_share_world_layout() {
    let py = match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            return;
        }
    };
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let port = srv.port();
    let mut child = Command::new(py)
        .args(["-c", PY, &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(
        TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                timeout: Duration::from_secs(60),
                wait_for_workers: false,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let w = World::new();
    w.set_init_barrier(true);
    let gloo_opts = c10d_gloo::GlooOptions {
        lazy_init: true,
        ..Default::default()
    };
    let res = (|| -> c10d_core::Result<(String, String, bool, String, String)> {
        w.init_process_group(InitOptions {
            backend: Some("gloo".into()),
            store: Some(store.clone()),
            world_size: Some(2),
            rank: Some(0),
            timeout: Some(Duration::from_secs(60)),
            pg_options: Some(PgOptions {
                timeout: None,
                backend_specific: Some(Arc::new(gloo_opts.clone())),
            }),
            ..Default::default()
        })?;
        let g = w.new_group(
            Some(&[0, 1]),
            GroupOptions {
                pg_options: Some(PgOptions {
                    timeout: None,
                    backend_specific: Some(Arc::new(gloo_opts.clone())),
                }),
                ..Default::default()
            },
        )?;
        let h = w.new_group(Some(&[1]), GroupOptions::default())?;
        // local synchronization: the store-based barrier runs on the group's own prefix store
        // under the SHA-1 name, so it only completes when both sides hash alike.
        let l = w.new_group(
            Some(&[0, 1]),
            GroupOptions {
                use_local_synchronization: true,
                pg_options: Some(PgOptions {
                    timeout: None,
                    backend_specific: Some(Arc::new(gloo_opts.clone())),
                }),
                ..Default::default()
            },
        )?;
        let lname = l.into_group()?.group_name().to_string();
        let ds = w.default_store()?;
        ds.set("from_rs", b"hello from rust")?;
        let got = String::from_utf8_lossy(&ds.get("from_py")?).to_string();
        ds.wait_timeout(&["py_done"], Duration::from_secs(60))?;
        let names = (
            w.world_group()?.group_name().to_string(),
            g.into_group()?.group_name().to_string(),
            h.is_non_member(),
            got,
            lname,
        );
        w.destroy_process_group(None)?;
        Ok(names)
    })();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    let mut err = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = child.wait();
    let names = res.unwrap_or_else(|e| {
        panic!("rust rank failed: {e}\npython stdout: {out}\npython stderr: {err}")
    });
    assert!(
        status.is_some_and(|s| s.success()),
        "python failed: {out}\n{err}"
    );
    let local = c10d_world::hash_ranks_to_str(&[0, 1], 3);
    assert_eq!(
        names,
        (
            "0".to_string(),
            "1".to_string(),
            true,
            "hello from torch".to_string(),
            local.clone()
        )
    );
    assert!(out.contains(&format!("LOCAL {local}")), "{out}\n{err}");
    assert!(out.contains("NAMES 0 1 2 hello from rust"), "{out}\n{err}");
}
