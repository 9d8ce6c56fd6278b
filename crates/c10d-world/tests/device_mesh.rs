//! DeviceMesh on ranks as threads: every group of 1-, 2- and 3-D meshes on 4 and 8 ranks
//! checked against the grid (the ranks that share all other coordinates) and by value with
//! all_reduce along each dimension over gloo; slicing, flatten and unflatten; meshes smaller
//! than the world; explicit layouts and `from_group`; per-dimension backends; the split path
//! of a world bound to a device; PyTorch's error texts; and the cross-rank argument check.

mod mesh_common;
use c10d_testing::world as world_common;

use c10d_core::Tensor;
use c10d_world::{
    hash_ranks_to_str, BackendOverride, DeviceMesh, GroupMember, InitOptions, MeshArray,
    MeshOptions, World,
};
use mesh_common::{coord, line};
use std::time::Duration;
use world_common::*;

fn ranks_of(w: &World, g: &GroupMember) -> Vec<usize> {
    w.get_process_group_ranks(g.group()).unwrap()
}

/// Checks a mesh of `shape` on this rank: coordinate, each dimension's members, local rank,
/// description and an all_reduce along it (sum of rank+1 over the line).
fn check_mesh(w: &World, rank: usize, shape: &[usize], names: &[&str]) {
    let m = w.init_device_mesh("cpu", shape, Some(names)).unwrap();
    assert_eq!(m.get_coordinate(), Some(coord(rank, shape)), "{m}");
    assert_eq!(m.shape(), shape);
    assert_eq!(m.ndim(), shape.len());
    for (d, name) in names.iter().enumerate() {
        let g = m.get_group(*name).unwrap();
        let want = line(rank, shape, d);
        assert_eq!(
            ranks_of(w, &g),
            want,
            "rank {rank} mesh {shape:?} dim {name}"
        );
        assert_eq!(m.get_local_rank(d).unwrap(), coord(rank, shape)[d]);
        assert_eq!(m.size_of(d).unwrap(), shape[d]);
        if want.len() < shape.iter().product() {
            assert_eq!(g.group().unwrap().group_desc(), format!("mesh_{name}"));
        }
        let t = Tensor::from_vec(vec![(rank + 1) as i64; 3]);
        w.all_reduce(&t).group(&g).run().unwrap();
        let sum: usize = want.iter().map(|r| r + 1).sum();
        assert_eq!(
            t.to_vec::<i64>().unwrap(),
            vec![sum as i64; 3],
            "dim {name}"
        );
    }
}

#[test]
fn meshes_on_8_thread_ranks_match_the_grid_and_reduce_along_each_dimension() {
    run_gloo(
        8,
        |_| {},
        |w, r| {
            check_mesh(w, r, &[8], &["a"]);
            check_mesh(w, r, &[2, 4], &["dp", "tp"]);
            check_mesh(w, r, &[4, 2], &["dp", "tp"]);
            check_mesh(w, r, &[2, 2, 2], &["pp", "dp", "tp"]);
        },
    );
}

#[test]
fn meshes_on_4_thread_ranks_match_the_grid_and_reduce_along_each_dimension() {
    run_gloo(
        4,
        |_| {},
        |w, r| {
            check_mesh(w, r, &[4], &["a"]);
            check_mesh(w, r, &[2, 2], &["dp", "tp"]);
            check_mesh(w, r, &[1, 4], &["dp", "tp"]);
            check_mesh(w, r, &[2, 1, 2], &["pp", "dp", "tp"]);
        },
    );
}

#[test]
fn slicing_flattening_and_unflattening_reuse_or_make_the_right_groups() {
    run_gloo(
        8,
        |_| {},
        |w, r| {
            let m = w
                .init_device_mesh("cpu", &[2, 2, 2], Some(&["dp", "cp", "tp"]))
                .unwrap();
            let shape = [2, 2, 2];
            // a slice shares the root's groups: no group is created
            let before = w.group_count();
            let dp_tp = m.slice(&["dp", "tp"]).unwrap();
            assert_eq!(w.group_count(), before);
            assert!(dp_tp.get_group("tp").unwrap() == m.get_group("tp").unwrap());
            let c = coord(r, &shape);
            assert_eq!(dp_tp.get_coordinate(), Some(vec![c[0], c[2]]));
            assert_eq!(dp_tp.mesh().unwrap().shape(), &[2, 2]);
            assert!(
                m.slice(&["dp", "cp", "tp"]).unwrap().get_group(0).unwrap()
                    == m.get_group(0).unwrap()
            );
            // flatten dp × cp: the ranks sharing tp's coordinate
            let flat = m.slice(&["dp", "cp"]).unwrap().flatten(None).unwrap();
            let g = flat.group().unwrap();
            let want: Vec<usize> = (0..8).filter(|x| x % 2 == r % 2).collect();
            assert_eq!(ranks_of(w, &g), want);
            let t = Tensor::from_vec(vec![r as f32]);
            w.all_reduce(&t).group(&g).run().unwrap();
            assert_eq!(
                t.to_vec::<f32>().unwrap()[0],
                want.iter().sum::<usize>() as f32
            );
            // the root finds it by name; flattening again makes nothing
            assert!(m.get_group("dp_cp").unwrap() == g);
            assert!(m.slice(&["dp_cp"]).unwrap().group().unwrap() == g);
            let n = w.group_count();
            let again = m
                .slice(&["dp", "cp"])
                .unwrap()
                .flatten(Some("dp_cp"))
                .unwrap();
            assert!(again.group().unwrap() == g);
            assert_eq!(w.group_count(), n);
            // a different layout under a used name is refused
            let e = m
                .slice(&["cp", "tp"])
                .unwrap()
                .flatten(Some("dp_cp"))
                .unwrap_err();
            assert!(e.to_string().contains("has been created before"), "{e}");
            // unflatten a world-sized 1-D mesh into the same grid
            let world = w.init_device_mesh("cpu", &[8], Some(&["world"])).unwrap();
            let u = world
                .unflatten("world", &[2, 2, 2], &["x", "y", "z"])
                .unwrap();
            for d in 0..3 {
                assert_eq!(ranks_of(w, &u.get_group(d).unwrap()), line(r, &shape, d));
            }
            let t = Tensor::from_vec(vec![1i32]);
            w.all_reduce(&t)
                .group(&u.get_group("y").unwrap())
                .run()
                .unwrap();
            assert_eq!(t.to_vec::<i32>().unwrap(), vec![2]);
        },
    );
}

#[test]
fn a_mesh_smaller_than_the_world_leaves_the_other_ranks_outside() {
    let out = run(4, |w, r| {
        let m = w.init_device_mesh("cpu", &[2], Some(&["a"])).unwrap();
        match r {
            0 | 1 => {
                assert_eq!(m.get_coordinate(), Some(vec![r]));
                assert_eq!(ranks_of(w, &m.group().unwrap()), vec![0, 1]);
            }
            _ => {
                assert_eq!(m.get_coordinate(), None);
                let e = m.get_group("a").unwrap_err().to_string();
                assert!(
                    e.contains(&format!("rank {r} is not part of the DeviceMesh")),
                    "{e}"
                );
            }
        }
        w.group_count()
    });
    assert!(
        out.iter().all(|&c| c == out[0]),
        "every rank made the same groups"
    );
}

#[test]
fn explicit_layouts_and_meshes_over_existing_groups() {
    run(4, |w, r| {
        // ranks placed by hand: rows [3, 1] and [0, 2]
        let arr = MeshArray::from_rows(&[vec![3, 1], vec![0, 2]]).unwrap();
        let m = DeviceMesh::new_in(w, "cpu", arr.clone(), MeshOptions::named(&["r", "c"])).unwrap();
        let pos = arr.ranks().iter().position(|&x| x == r).unwrap();
        assert_eq!(m.get_coordinate(), Some(vec![pos / 2, pos % 2]));
        let mut row = arr.ranks()[pos / 2 * 2..pos / 2 * 2 + 2].to_vec();
        row.sort();
        assert_eq!(ranks_of(w, &m.get_group("c").unwrap()), row);
        assert_eq!(m.mesh().unwrap(), arr);
        // preserve_rank_order keeps the mesh's order inside each group
        let kept = DeviceMesh::new_in(
            w,
            "cpu",
            arr.clone(),
            MeshOptions {
                preserve_rank_order: true,
                ..MeshOptions::named(&["r", "c"])
            },
        )
        .unwrap();
        let row = arr.ranks()[pos / 2 * 2..pos / 2 * 2 + 2].to_vec();
        assert_eq!(ranks_of(w, &kept.get_group("c").unwrap()), row);
        // a mesh over groups that exist
        let rows = w
            .new_subgroups(Some(2), None, Default::default())
            .unwrap()
            .0;
        let cols = w
            .new_subgroups_by_enumeration(&[vec![0, 2], vec![1, 3]], Default::default())
            .unwrap()
            .0
            .unwrap()
            .into_group()
            .unwrap();
        let grid = MeshArray::from_rows(&[vec![0, 1], vec![2, 3]]).unwrap();
        let fg = DeviceMesh::from_group(
            w,
            &[cols.clone(), rows.clone()],
            "cpu",
            Some(grid.clone()),
            Some(&["dp", "tp"]),
        )
        .unwrap();
        assert!(fg.get_group("tp").unwrap().group().unwrap().ptr_eq(&rows));
        assert_eq!(fg.get_coordinate(), Some(coord(r, &[2, 2])));
        // groups in the wrong dimensions are refused (PyTorch would accept them silently)
        let e = DeviceMesh::from_group(
            w,
            &[rows.clone(), cols.clone()],
            "cpu",
            Some(grid),
            Some(&["dp", "tp"]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("from_group: group"), "{e}");
        let one =
            DeviceMesh::from_group(w, std::slice::from_ref(&rows), "cpu", None, Some(&["tp"]))
                .unwrap();
        assert_eq!(
            one.mesh().unwrap().ranks(),
            ranks_of(w, &GroupMember::Group(rows.clone()))
        );
    });
}

#[test]
fn pytorchs_error_texts() {
    run(4, |w, _r| {
        let err = |e: c10d_core::Result<DeviceMesh<'_>>| e.unwrap_err().to_string();
        assert_eq!(
            err(w.init_device_mesh("cpu", &[2, 2], Some(&["a", "a"]))),
            "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in mesh_dim_names ('a', 'a')"
        );
        assert_eq!(
            err(w.init_device_mesh("cpu", &[2, 2], Some(&["a"]))),
            "mesh_shape and mesh_dim_names should have same length! Found len(mesh_dim_names): 1 and len(mesh_shape):2."
        );
        assert!(err(w.init_device_mesh("cuda:0", &[4], None))
            .starts_with("Device type with index is not supported but got cuda:0."));
        assert_eq!(
            err(w.init_device_mesh("cpu", &[3, 2], None)),
            "Mesh should not be bigger than default world size 4, but found 6 ranks!"
        );
        let m = w
            .init_device_mesh("cpu", &[2, 2], Some(&["dp", "tp"]))
            .unwrap();
        assert!(m
            .group()
            .unwrap_err()
            .to_string()
            .starts_with("Found the DeviceMesh have 2 dimensions"));
        assert_eq!(
            m.get_group("pp").unwrap_err().to_string(),
            "Mesh dimension 'pp' does not exist. Available mesh dimensions are: mesh_dim_names=('dp', 'tp')"
        );
        assert_eq!(
            err(m.slice(&["tp", "dp"])),
            "Invalid mesh_dim_names ('tp', 'dp') specified. Mesh dim indices should be in ascending order."
        );
        assert_eq!(
            err(m.slice(&["pp"])),
            "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names are ['dp', 'tp']."
        );
        assert_eq!(
            err(m.slice(&["dp", "dp"])),
            "Slicing overlapping dim_names ('dp', 'dp') is not allowed."
        );
        assert!(err(m.flatten(Some("dp"))).starts_with(
            "dp already exists for submesh of the DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))."
        ));
        assert_eq!(
            err(m.unflatten(2, &[2], &["x"])),
            "dim 2 specified in `_unflatten` is out of range 2"
        );
        assert_eq!(
            err(m.unflatten("tp", &[4], &["x"])),
            "The product of mesh_sizes=(4,) is 4, but the original dimension at dim=1 has size 2. These must be equal for unflatten to work correctly."
        );
        assert_eq!(
            err(m.unflatten("tp", &[2, 1], &["x"])),
            "mesh_dim_names must have same length as mesh_sizes in _unflatten!"
        );
        let unnamed = w.init_device_mesh("cpu", &[4], None).unwrap();
        assert_eq!(
            err(unnamed.slice(&["a"])),
            "Cannot slice a DeviceMesh without mesh_dim_names!"
        );
        assert_eq!(
            err(unnamed.flatten(None)),
            "Cannot flatten a DeviceMesh without mesh_dim_names!"
        );
        assert_eq!(format!("{unnamed}"), "DeviceMesh((4,), 'cpu', stride=(1,))");
        let bad_key = MeshOptions {
            backend_override: vec![("pp".into(), BackendOverride::backend("store"))],
            ..MeshOptions::named(&["dp", "tp"])
        };
        assert_eq!(
            err(w.init_device_mesh_with("cpu", &[2, 2], bad_key)),
            "Found invalid keys in backend_override: got [\"pp\"], expected integers in range [0, 2) or one of ('dp', 'tp')"
        );
        let twice = MeshOptions {
            backend_override: vec![
                ("0".into(), BackendOverride::backend("store")),
                ("dp".into(), BackendOverride::backend("store")),
            ],
            ..MeshOptions::named(&["dp", "tp"])
        };
        assert_eq!(
            err(w.init_device_mesh_with("cpu", &[2, 2], twice)),
            "Found redundant dim index 0 and name dp in backend_override"
        );
        assert_eq!(
            err(DeviceMesh::from_group(w, &[], "cpu", None, None)),
            "Expects at least one ProcessGroup to be passed"
        );
        let g = w.world_group().unwrap();
        assert_eq!(
            err(DeviceMesh::from_group(
                w,
                &[g.clone(), g.clone()],
                "cpu",
                None,
                None
            )),
            "Must pass mesh if passing multiple ProcessGroups"
        );
        assert_eq!(
            err(DeviceMesh::from_group(
                w,
                std::slice::from_ref(&g),
                "cpu",
                Some(MeshArray::from(vec![3, 2, 1, 0])),
                None
            )),
            "Invalid mesh [3, 2, 1, 0] for ProcessGroup with ranks [0, 1, 2, 3]"
        );
    });
}

#[test]
fn per_dimension_backends() {
    run(4, |w, _r| {
        let opts = MeshOptions {
            backend_override: vec![("tp".into(), BackendOverride::backend("storex"))],
            ..MeshOptions::named(&["dp", "tp"])
        };
        let m = w.init_device_mesh_with("cpu", &[2, 2], opts).unwrap();
        assert_eq!(
            w.get_backend(Some(&m.get_group("tp").unwrap())).unwrap(),
            "storex"
        );
        assert_eq!(
            w.get_backend(Some(&m.get_group("dp").unwrap())).unwrap(),
            "store"
        );
        // a world-sized dimension with an override gets a group of its own
        let opts = MeshOptions {
            backend_override: vec![("0".into(), BackendOverride::backend("storex"))],
            ..Default::default()
        };
        let all = w.init_device_mesh_with("cpu", &[4], opts).unwrap();
        let g = all.group().unwrap();
        assert!(!g.group().unwrap().ptr_eq(&w.world_group().unwrap()));
        assert_eq!(w.get_backend(Some(&g)).unwrap(), "storex");
    });
}

#[test]
fn a_world_bound_to_a_device_splits_once_per_dimension() {
    register();
    let s = store();
    let hs: Vec<_> = (0..4)
        .map(|r| {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = World::new();
                w.init_process_group(InitOptions {
                    device_id: Some(c10d_core::Device::Cuda(0)),
                    ..opts(&s, r, 4)
                })
                .unwrap();
                let c = w.group_count();
                let m = w
                    .init_device_mesh("cuda", &[2, 2], Some(&["dp", "tp"]))
                    .unwrap();
                // split_group names: sha1 of the first group's ranks or this rank's, and the counter
                let dp = m.get_group("dp").unwrap();
                let tp = m.get_group("tp").unwrap();
                let col: Vec<usize> = vec![r % 2, r % 2 + 2];
                let row: Vec<usize> = vec![r / 2 * 2, r / 2 * 2 + 1];
                assert_eq!(dp.group().unwrap().group_name(), hash_ranks_to_str(&col, c));
                assert_eq!(
                    tp.group().unwrap().group_name(),
                    hash_ranks_to_str(&row, c + 1)
                );
                assert_eq!(w.get_process_group_ranks(dp.group()).unwrap(), col);
                let t = Tensor::from_vec(vec![r as i64]);
                w.all_reduce(&t).group(&tp).run().unwrap();
                assert_eq!(
                    t.to_vec::<i64>().unwrap(),
                    vec![row.iter().sum::<usize>() as i64]
                );
                w.destroy_process_group(None).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn ranks_that_disagree_fail_together_naming_the_rank_and_argument() {
    let out = run(4, |w, r| {
        let shape: &[usize] = if r == 2 { &[4, 1] } else { &[2, 2] };
        let e = w
            .init_device_mesh("cpu", shape, Some(&["dp", "tp"]))
            .unwrap_err();
        let names: &[&str] = if r == 3 { &["x", "y"] } else { &["dp", "tp"] };
        let e2 = w.init_device_mesh("cpu", &[2, 2], Some(names)).unwrap_err();
        // the keys of a check are gone once it is over, and a good call works afterwards
        let m = w
            .init_device_mesh("cpu", &[2, 2], Some(&["dp", "tp"]))
            .unwrap();
        (e.to_string(), e2.to_string(), m.get_coordinate())
    });
    for (r, (e, e2, c)) in out.iter().enumerate() {
        assert_eq!(
            e,
            "init_device_mesh: rank 2 passed mesh_shape=[4, 1] but rank 0 passed mesh_shape=[2, 2]; every rank must pass the same arguments"
        );
        assert_eq!(
            e2,
            "init_device_mesh: rank 3 passed mesh_dim_names=('x', 'y') but rank 0 passed mesh_dim_names=('dp', 'tp'); every rank must pass the same arguments"
        );
        assert_eq!(c, &Some(coord(r, &[2, 2])));
    }
}

#[test]
fn a_rank_that_never_comes_fails_the_check_within_the_store_timeout() {
    register();
    let s = store();
    s.set_timeout(Duration::from_secs(1));
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = World::new();
                w.init_process_group(opts(&s, r, 2)).unwrap();
                if r == 1 {
                    return String::new();
                }
                let t = std::time::Instant::now();
                let e = w
                    .init_device_mesh("cpu", &[2], None)
                    .unwrap_err()
                    .to_string();
                assert!(t.elapsed() < Duration::from_secs(10));
                e
            })
        })
        .collect();
    let msgs: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        msgs[0].contains("init_device_mesh: rank 0 waited"),
        "{}",
        msgs[0]
    );
    assert!(msgs[0].contains("ranks [1]"), "{}", msgs[0]);
}
