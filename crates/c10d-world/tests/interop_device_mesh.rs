//! DeviceMesh layouts against PyTorch itself (gated on C10D_TORCH_PYTHON): PyTorch 2.15 builds a
//! sequence of meshes (1-, 2- and 3-D on 4 and 8 ranks, slices, flattened and unflattened
//! dimensions, an explicit rank layout) for every rank of a world on its "fake" backend and
//! prints each rank's coordinate, mesh and, per dimension, the group's ranks (in group-rank
//! order), name and description. Rust ranks (threads) build the same sequence with
//! `c10d_world::DeviceMesh` and must print the same lines: same groups, same creation order
//! (names are counters), same descriptions.
//!
//! Run: `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-world --test interop_device_mesh`

mod world_common;

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
    let py = match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            return;
        }
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
