//! DeviceMesh layouts against PyTorch itself (gated on C10D_TORCH_PYTHON): PyTorch 2.15 builds a
//! sequence of meshes (1-, 2- and 3-D on 4 and 8 ranks, slices, flattened and unflattened
//! dimensions, an explicit rank layout) for every rank of a world on its "fake" backend and
//! prints each rank's coordinate, mesh and, per dimension, the group's ranks (in group-rank
//! order), name and description. Rust ranks (threads) build the same sequence with
//! `c10d_world::DeviceMesh` and must print the same lines: same groups, same creation order
//! (names are counters), same descriptions.
//!
//! Run: `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-world --test interop_device_mesh`

use c10d_testing::interop as interop_common;
use c10d_testing::world as world_common;

use c10d_world::{DeviceMesh, MeshArray, MeshOptions, World};
use std::process::Command;

const PY: &str = r#"
import sys, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh, DeviceMesh
from torch.testing._internal.distributed.fake_pg import FakeStore

def line(world, rank, case, m):
    c = m.get_coordinate()
    if c is None:
        return f"{world} {rank} {case} coord=None shape={list(m.shape)}"
    gs = []
    for d in range(m.ndim):
        g = m.get_group(d)
        gs.append(f"{dist.get_process_group_ranks(g)}:{g.group_name}:{g.group_desc}")
    return f"{world} {rank} {case} coord={list(c)} shape={list(m.shape)} mesh={m.mesh.flatten().tolist()} groups={' '.join(gs)}"

def run(world, rank):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    out = []
    shapes = {8: [[8], [2, 4], [4, 2], [2, 2, 2]], 4: [[4], [2, 2], [1, 4], [2, 1, 2], [2]]}[world]
    for s in shapes:
        names = tuple("abc"[: len(s)])
        out.append(line(world, rank, f"init{s}", init_device_mesh("cpu", tuple(s), mesh_dim_names=names)))
    if world == 8:
        m = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        out.append(line(world, rank, "slice_dp_tp", m["dp", "tp"]))
        out.append(line(world, rank, "slice_cp", m["cp"]))
        out.append(line(world, rank, "flatten_dp_cp", m["dp", "cp"]._flatten()))
        out.append(line(world, rank, "flatten_cptp", m["cp", "tp"]._flatten("cptp")))
        out.append(line(world, rank, "root_dp_cp", m["dp_cp"]))
        w = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
        out.append(line(world, rank, "unflatten", w._unflatten(0, (2, 2, 2), ("x", "y", "z"))))
        out.append(line(world, rank, "unflatten_mid", m._unflatten("cp", (2, 1), ("c1", "c2"))))
        e = DeviceMesh("cpu", [[7, 5, 3, 1], [6, 4, 2, 0]], mesh_dim_names=("r", "c"))
        out.append(line(world, rank, "explicit", e))
    dist.destroy_process_group()
    return out

for world in (4, 8):
    for r in range(world):
        print("\n".join(run(world, r)))
"#;

/// The line PyTorch's script prints for `mesh` on `rank`.
fn line(w: &World, world: usize, rank: usize, case: &str, m: &DeviceMesh<'_>) -> String {
    let Some(c) = m.get_coordinate() else {
        return format!("{world} {rank} {case} coord=None shape={:?}", m.shape());
    };
    let groups: Vec<String> = m
        .get_all_groups()
        .unwrap()
        .iter()
        .map(|g| {
            let g = g.group().unwrap();
            let ranks = w.get_process_group_ranks(Some(g)).unwrap();
            format!("{ranks:?}:{}:{}", g.group_name(), g.group_desc())
        })
        .collect();
    format!(
        "{world} {rank} {case} coord={c:?} shape={:?} mesh={:?} groups={}",
        m.shape(),
        m.mesh().unwrap().ranks(),
        groups.join(" ")
    )
}

/// The same sequence as the script, on `world` thread ranks.
fn rust_lines(world: usize) -> Vec<String> {
    let per_rank = world_common::run(world, move |w, rank| {
        let mut out = Vec::new();
        let shapes: &[&[usize]] = match world {
            8 => &[&[8], &[2, 4], &[4, 2], &[2, 2, 2]],
            _ => &[&[4], &[2, 2], &[1, 4], &[2, 1, 2], &[2]],
        };
        for s in shapes {
            let names: Vec<&str> = ["a", "b", "c"][..s.len()].to_vec();
            let m = w.init_device_mesh("cpu", s, Some(&names)).unwrap();
            out.push(line(w, world, rank, &format!("init{s:?}"), &m));
        }
        if world == 8 {
            let m = w
                .init_device_mesh("cpu", &[2, 2, 2], Some(&["dp", "cp", "tp"]))
                .unwrap();
            out.push(line(
                w,
                world,
                rank,
                "slice_dp_tp",
                &m.slice(&["dp", "tp"]).unwrap(),
            ));
            out.push(line(w, world, rank, "slice_cp", &m.slice(&["cp"]).unwrap()));
            let f = m.slice(&["dp", "cp"]).unwrap().flatten(None).unwrap();
            out.push(line(w, world, rank, "flatten_dp_cp", &f));
            let f2 = m
                .slice(&["cp", "tp"])
                .unwrap()
                .flatten(Some("cptp"))
                .unwrap();
            out.push(line(w, world, rank, "flatten_cptp", &f2));
            out.push(line(
                w,
                world,
                rank,
                "root_dp_cp",
                &m.slice(&["dp_cp"]).unwrap(),
            ));
            let wm = w.init_device_mesh("cpu", &[8], Some(&["world"])).unwrap();
            let u = wm.unflatten(0, &[2, 2, 2], &["x", "y", "z"]).unwrap();
            out.push(line(w, world, rank, "unflatten", &u));
            let um = m.unflatten("cp", &[2, 1], &["c1", "c2"]).unwrap();
            out.push(line(w, world, rank, "unflatten_mid", &um));
            let arr = MeshArray::from_rows(&[vec![7, 5, 3, 1], vec![6, 4, 2, 0]]).unwrap();
            let e = DeviceMesh::new_in(w, "cpu", arr, MeshOptions::named(&["r", "c"])).unwrap();
            out.push(line(w, world, rank, "explicit", &e));
        }
        out
    });
    per_rank.concat()
}

#[test]
fn meshes_match_pytorch_layouts_names_and_descriptions() {
    let Some(py) = interop_common::torch_python() else {
        return;
    };
    let out = Command::new(py).args(["-c", PY]).output().unwrap();
    assert!(
        out.status.success(),
        "PyTorch script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let torch: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut ours = rust_lines(4);
    ours.extend(rust_lines(8));
    assert_eq!(torch.len(), ours.len(), "line counts differ");
    for (t, o) in torch.iter().zip(&ours) {
        assert_eq!(o, t, "Rust (left) and PyTorch (right) differ");
    }
}

const MIXED_PY: &str = r#"
import os, sys, datetime
os.environ["TORCH_DIST_INIT_BARRIER"] = "1"
os.environ["TORCH_GLOO_LAZY_INIT"] = "1"
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
port, rank = int(sys.argv[1]), int(sys.argv[2])
t = datetime.timedelta(seconds=60)
store = dist.TCPStore("127.0.0.1", port, world_size=4, is_master=False, timeout=t, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=rank, world_size=4, timeout=t)
m = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp", "pp", "tp"))
f = m["pp", "tp"]._flatten("pt")
names = [m.get_group(d).group_name for d in ("dp", "pp", "tp")] + [f.get_group().group_name]
print("NAMES", " ".join(names), flush=True)
store.set(f"py_done_{rank}", b"1")
dist.destroy_process_group()
"#;

/// One job of two PyTorch ranks (2, 3) and two Rust ranks (0, 1) over one TcpStore, with
/// `TORCH_DIST_INIT_BARRIER=1`: every `new_group` of the mesh (2 × 1 × 2, then "pp" × "tp"
/// flattened) ends in a store-based barrier keyed by the group's name, so the mesh only
/// completes when both languages create the same groups under the same names in the same order.
/// Group timeouts are 60 s, so a disagreement fails instead of waiting 30 minutes. Gloo
/// connects lazily on both sides (no collective runs), since PyTorch's Gloo and ours do not
/// share a wire format.
#[test]
fn pytorch_and_rust_ranks_build_one_mesh_together() {
    use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
    use c10d_world::{BackendOverride, InitOptions, PgOptions};
    use std::sync::Arc;
    use std::time::Duration;
    let Some(py) = interop_common::torch_python() else {
        return;
    };
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let port = srv.port();
    let kids: Vec<_> = [2, 3]
        .iter()
        .map(|r| {
            Command::new(&py)
                .args(["-c", MIXED_PY, &port.to_string(), &r.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let lazy = PgOptions {
        timeout: None,
        backend_specific: Some(Arc::new(c10d_gloo::GlooOptions {
            lazy_init: true,
            ..Default::default()
        })),
    };
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let lazy = lazy.clone();
            std::thread::spawn(move || -> c10d_core::Result<Vec<String>> {
                let opts = TcpStoreOptions {
                    timeout: Duration::from_secs(60),
                    wait_for_workers: false,
                    ..Default::default()
                };
                let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, opts)?);
                let w = World::new();
                w.set_init_barrier(true);
                w.init_process_group(InitOptions {
                    backend: Some("gloo".into()),
                    store: Some(store.clone()),
                    world_size: Some(4),
                    rank: Some(r),
                    timeout: Some(Duration::from_secs(60)),
                    pg_options: Some(lazy.clone()),
                    ..Default::default()
                })?;
                let ov = BackendOverride {
                    backend: None,
                    pg_options: Some(PgOptions {
                        timeout: Some(Duration::from_secs(60)),
                        ..lazy.clone()
                    }),
                };
                let dims = ["dp", "pp", "tp"];
                let opts = MeshOptions {
                    backend_override: dims.iter().map(|d| (d.to_string(), ov.clone())).collect(),
                    check_arguments: false, // PyTorch ranks do not take part in the check
                    ..MeshOptions::named(&dims)
                };
                let m = w.init_device_mesh_with("cpu", &[2, 1, 2], opts)?;
                let f = m.slice(&["pp", "tp"])?.flatten_with(Some("pt"), ov)?;
                let mut names = vec![];
                let groups = [
                    m.get_group("dp")?,
                    m.get_group("pp")?,
                    m.get_group("tp")?,
                    f.group()?,
                ];
                for g in groups {
                    names.push(g.into_group()?.group_name().to_string());
                }
                store.wait_timeout(&["py_done_2", "py_done_3"], Duration::from_secs(60))?;
                w.destroy_process_group(None)?;
                Ok(names)
            })
        })
        .collect();
    let ours: Vec<Vec<String>> = ranks
        .into_iter()
        .map(|h| h.join().unwrap().expect("Rust rank"))
        .collect();
    for (i, mut k) in kids.into_iter().enumerate() {
        let start = std::time::Instant::now();
        while k.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = k.kill();
        let out = k.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "PyTorch rank {}: {text}\n{}",
            i + 2,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = text.lines().find(|l| l.starts_with("NAMES ")).unwrap();
        let theirs: Vec<&str> = line[6..].split(' ').collect();
        // rank 2 = coordinate (1, 0): its dp column is rank 0's, its tp row is not
        assert_eq!(
            theirs[0],
            ours[i][0],
            "dp group of rank {} vs rank {i}",
            i + 2
        );
        assert_ne!(theirs[2], ours[i][2], "tp rows differ");
        assert_ne!(theirs[3], ours[i][3], "flattened rows differ");
    }
    assert_eq!(ours[0][2], ours[1][2], "ranks 0 and 1 share a tp row");
    assert_eq!(ours[0][3], ours[1][3], "and a flattened row");
}
