//! Real processes: this test binary re-runs itself as 3 ranks (env:// init over a TcpStore on
//! 127.0.0.1, port 0, as under c10drun) that use the global world: functional collectives by
//! group name, the compile oracles and compile sync on the compile-side groups (enabled by
//! `TORCH_COMPILER_COLLECTIVES=1`), through the global-world free functions.

mod common;

use c10d_compile::{CompileGroups, FrameState, Funcol};
use c10d_core::Tensor;
use c10d_store::{ServerOptions, TcpStoreServer};
use c10d_world as dist;
use common::ToyJit;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_COMPILE_PROCESS_CHILD";
const N: usize = 3;

fn child_main() {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    })
    .unwrap();
    let r = dist::get_rank(None).unwrap() as usize;
    let f = Funcol::global();
    let t = Tensor::from_vec(vec![r as f32; 4]);
    let avg = f
        .all_reduce(&t, "avg", "0")
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    // Uneven all_to_all_single: rank r sends r+1 rows to each peer.
    let ins = vec![r + 1; N];
    let outs: Vec<usize> = (0..N).map(|j| j + 1).collect();
    let x = Tensor::from_vec(vec![r as i64; (r + 1) * N]);
    let a2a = f
        .all_to_all_single(&x, Some(&outs), Some(&ins), "0")
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    let gathered = f
        .all_gather_into_tensor(&Tensor::from_vec(vec![r as i32]), N, "0")
        .unwrap()
        .to_vec::<i32>()
        .unwrap();

    let cg = CompileGroups::global();
    // Compiler collectives come from TORCH_COMPILER_COLLECTIVES=1 (set by the parent); guard
    // collectives from the explicit setting.
    assert!(c10d_compile::config::enable_compiler_collectives());
    c10d_compile::config::set_enable_guard_collectives(Some(true));
    assert!(c10d_compile::get_compile_pg().unwrap().is_some());
    let batches = [[5usize, 8, 6], [6, 6, 3], [5, 5, 5]];
    let mut jit = ToyJit::default();
    for b in batches[r] {
        jit.call(
            cg,
            &FrameState::new("forward").with_tensor("L['x']", &[b, 4]),
        )
        .unwrap();
    }
    let guard = cg.guard_collective(r != 1).unwrap();
    let digest = cg.compile_sync_digests(b"joint graph").unwrap();
    let hit = cg.cache_hit_collective(r != 2).unwrap();
    println!(
        "RESULT rank={r} avg={avg:?} a2a={a2a:?} gathered={gathered:?} compiled_at={:?} view={:?} guard={} missed={:?} digests_equal={} hit={hit}",
        jit.compiled_at,
        jit.compiled.unwrap().inputs["L['x']"],
        guard.all_hit,
        guard.missed,
        digest.all_equal(),
    );
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), "end", N, Duration::from_secs(30)).unwrap();
    dist::destroy_process_group(None).unwrap();
    assert!(c10d_compile::get_compile_pg().unwrap().is_none());
}

#[test]
fn three_processes_over_tcp_store() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..N)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "three_processes_over_tcp_store",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", srv.port().to_string())
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", N.to_string())
                .env("TORCHELASTIC_USE_AGENT_STORE", "True")
                .env("TORCHELASTIC_RUN_ID", "compile-test")
                .env_remove("TORCH_DISTRIBUTED_DEBUG")
                .env("TORCH_COMPILER_COLLECTIVES", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut done = [None; N];
    while done.iter().any(|d| d.is_none()) && start.elapsed() < Duration::from_secs(90) {
        for (i, k) in kids.iter_mut().enumerate() {
            if done[i].is_none() {
                done[i] = k.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut results = Vec::new();
    for (r, mut k) in kids.into_iter().enumerate() {
        let _ = k.kill();
        let o = k.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "rank {r} failed: {out}\n{err}");
        let line = out
            .lines()
            .find_map(|l| l.find("RESULT ").map(|i| l[i..].to_string()))
            .unwrap_or_else(|| panic!("rank {r}: no RESULT\n{out}\n{err}"));
        results.push(line);
    }
    for (r, line) in results.iter().enumerate() {
        // From rank j: j+1 rows holding j.
        let want_a2a: Vec<String> = (0..N).flat_map(|j| vec![j.to_string(); j + 1]).collect();
        assert!(
            line.contains(&format!("rank={r} avg=[1.0, 1.0, 1.0, 1.0]")),
            "{line}"
        );
        assert!(
            line.contains(&format!("a2a=[{}]", want_a2a.join(", "))),
            "{line}"
        );
        assert!(line.contains("gathered=[0, 1, 2]"), "{line}");
        assert!(
            line.contains("compiled_at=[0] view=Tensor(Dims([Dynamic, Static(4)]))"),
            "{line}"
        );
        assert!(line.contains("guard=false missed=[1]"), "{line}");
        assert!(line.contains("digests_equal=true hit=false"), "{line}");
    }
}
