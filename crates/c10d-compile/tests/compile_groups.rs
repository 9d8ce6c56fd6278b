//! The compile-side groups and the exchanges on them, ranks as threads (PyTorch's
//! `torch/_dynamo/distributed.py` behaviour and the compile oracles of
//! test_dynamo_distributed.py: per-rank batch sizes [5,8,6] vs [6,6,3] → identical merged views
//! and equal compile decisions on every rank; one rank's guard miss → all miss).

mod common;

use c10d_compile::{
    exchange::sha256, CompileGroupKind, CompileGroups, Dim, FrameState, InputState, Sizes,
    COMPILE_PG_TAG, COMPILE_SYNC_PG_TAG, GUARD_PG_TAG,
};
use c10d_world::GroupMember;
use common::{run, ToyJit, TIMEOUT};

fn enabled(w: &c10d_world::World) -> CompileGroups<'_> {
    let cg = CompileGroups::new(w);
    cg.set_enable_compiler_collectives(Some(true));
    cg.set_enable_guard_collectives(Some(true));
    cg
}

#[test]
fn groups_are_none_unless_enabled_and_initialized() {
    let w = c10d_world::World::new();
    let cg = CompileGroups::new(&w);
    cg.set_enable_compiler_collectives(Some(true));
    cg.set_enable_guard_collectives(Some(true));
    // Not initialized.
    assert!(cg.get_compile_pg().unwrap().is_none());
    assert!(cg.get_guard_pg().unwrap().is_none());
    assert!(cg.get_compile_sync_pg().unwrap().is_none());
    run(2, "store", |w, _r| {
        let cg = CompileGroups::new(w);
        cg.set_enable_compiler_collectives(Some(false));
        cg.set_enable_guard_collectives(Some(false));
        assert!(cg.get_compile_pg().unwrap().is_none());
        assert!(cg.get_guard_pg().unwrap().is_none());
        assert!(cg.get_compile_sync_pg().unwrap().is_none());
        // Disabled: the exchanges answer locally, without communicating.
        let fs = FrameState::new("f").with_int("n", 3);
        assert_eq!(cg.compiler_collective(&fs).unwrap(), fs);
        assert!(!cg.guard_collective(false).unwrap().all_hit);
        assert!(cg.cache_hit_collective(true).unwrap());
        assert_eq!(w.get_pg_count(), 1, "no group was created");
    });
}

#[test]
fn groups_are_tagged_cached_and_sync_is_gloo() {
    run(3, "store", |w, r| {
        let cg = enabled(w);
        let c = cg.get_compile_pg().unwrap().unwrap();
        let g = cg.get_guard_pg().unwrap().unwrap();
        let s = cg.get_compile_sync_pg().unwrap().unwrap();
        assert_eq!(w.get_group_tag(&c).unwrap(), COMPILE_PG_TAG);
        assert_eq!(w.get_group_tag(&g).unwrap(), GUARD_PG_TAG);
        assert_eq!(w.get_group_tag(&s).unwrap(), COMPILE_SYNC_PG_TAG);
        for pg in [&c, &g, &s] {
            assert_eq!(pg.size(), 3);
            assert_eq!(pg.rank(), r);
            assert_eq!(w.get_process_group_ranks(Some(pg)).unwrap(), vec![0, 1, 2]);
        }
        // The compile and guard groups use the default backend; compile-sync is always gloo
        // with the default group's timeout.
        assert_eq!(
            w.get_backend(Some(&GroupMember::Group(c.clone()))).unwrap(),
            "store"
        );
        assert_eq!(
            w.get_backend(Some(&GroupMember::Group(s.clone()))).unwrap(),
            "gloo"
        );
        assert_eq!(s.default_backend().unwrap().timeout(), TIMEOUT);
        // Cached: the same objects again, no new group.
        let n = w.get_pg_count();
        assert!(cg.get_compile_pg().unwrap().unwrap().ptr_eq(&c));
        assert!(cg.get(CompileGroupKind::Guard).unwrap().unwrap().ptr_eq(&g));
        assert!(cg.get_compile_sync_pg().unwrap().unwrap().ptr_eq(&s));
        assert_eq!(w.get_pg_count(), n);
        // Found by tag and ranks, like `_find_pg_by_ranks_and_tag`.
        assert!(w
            .find_pg_by_ranks_and_tag(COMPILE_PG_TAG, &[0, 1, 2])
            .unwrap()
            .ptr_eq(&c));
    });
}

#[test]
fn destroyed_world_forgets_its_groups() {
    register_and_run_reinit();
}

fn register_and_run_reinit() {
    common::register();
    let store = common::store();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let store = store.clone();
            std::thread::spawn(move || {
                let w = c10d_world::World::new();
                let cg = enabled(&w);
                let p = |s: &str| {
                    std::sync::Arc::new(c10d_store::PrefixStore::new(s, store.clone()))
                        as std::sync::Arc<dyn c10d_store::Store>
                };
                w.init_process_group(common::opts("store", &p("first"), r, 2))
                    .unwrap();
                let first = cg.get_compile_pg().unwrap().unwrap();
                assert!(cg.guard_collective(true).unwrap().all_hit);
                w.destroy_process_group(None).unwrap();
                assert!(cg.get_compile_pg().unwrap().is_none(), "world destroyed");
                w.init_process_group(common::opts("store", &p("second"), r, 2))
                    .unwrap();
                let second = cg.get_compile_pg().unwrap().unwrap();
                assert!(!second.ptr_eq(&first), "a fresh group after re-init");
                assert_eq!(w.get_group_tag(&second).unwrap(), COMPILE_PG_TAG);
                // Destroying just the cached group also makes the next call create a new one.
                w.destroy_process_group(Some(&GroupMember::Group(second.clone())))
                    .unwrap();
                let third = cg.get_compile_pg().unwrap().unwrap();
                assert!(!third.ptr_eq(&second));
                let merged = cg
                    .compiler_collective(&FrameState::new("f").with_int("n", r as i64))
                    .unwrap();
                assert_eq!(merged.inputs["n"], InputState::Int(Dim::Dynamic));
                c10d_store::store_barrier(p("second").as_ref(), "end", 2, TIMEOUT).unwrap();
                w.destroy_process_group(None).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    }
}

/// The Dynamo oracle: per-rank batch sizes [5,8,6] vs [6,6,3] → every rank compiles at the same
/// steps and ends with the same merged view.
#[test]
fn compiler_collective_batch_sizes_oracle() {
    let batches = [[5usize, 8, 6], [6, 6, 3]];
    let out = run(2, "gloo", move |w, r| {
        let cg = enabled(w);
        let mut jit = ToyJit::default();
        for b in batches[r] {
            let seen = FrameState::new("forward").with_tensor("L['x']", &[b, 4]);
            jit.call(&cg, &seen).unwrap();
        }
        (jit.compiled_at, jit.compiled.unwrap())
    });
    assert_eq!(
        out[0], out[1],
        "identical decisions and views on every rank"
    );
    assert_eq!(
        out[0].0,
        vec![0],
        "one compile, dim 0 dynamic from the start"
    );
    assert_eq!(
        out[0].1.inputs["L['x']"],
        InputState::Tensor(Sizes::Dims(vec![Dim::Dynamic, Dim::Static(4)]))
    );
    // Without the collectives the ranks recompile at different steps (the deadlock hazard).
    let local: Vec<Vec<usize>> = batches
        .iter()
        .map(|bs| {
            let w = c10d_world::World::new();
            let cg = CompileGroups::new(&w);
            cg.set_enable_compiler_collectives(Some(false));
            let mut jit = ToyJit::default();
            for &b in bs {
                jit.call(
                    &cg,
                    &FrameState::new("forward").with_tensor("L['x']", &[b, 4]),
                )
                .unwrap();
            }
            jit.compiled_at
        })
        .collect();
    assert_ne!(local[0], local[1]);
}

/// Scalars [3,3,7] vs [3,4,9]; dimension-count mismatch; int on one rank, tensor on another;
/// `xs[rank]` (a per-rank value); three ranks.
#[test]
fn compiler_collective_other_oracles() {
    let out = run(3, "gloo", |w, r| {
        let cg = enabled(w);
        let scalars = [[3i64, 3, 7], [3, 4, 9], [3, 3, 3]];
        let mut jit = ToyJit::default();
        for v in scalars[r] {
            jit.call(&cg, &FrameState::new("f").with_int("L['n']", v))
                .unwrap();
        }
        let rank_dims = cg
            .compiler_collective(&FrameState::new("g").with_tensor("L['x']", &vec![2; 2 + r % 2]))
            .unwrap();
        let mixed = FrameState::new("h");
        let mixed = if r == 0 {
            mixed.with_int("L['y']", 1)
        } else {
            mixed.with_tensor("L['y']", &[1])
        };
        let mixed = cg.compiler_collective(&mixed).unwrap();
        let xs = [10, 20, 30];
        let per_rank = cg
            .compiler_collective(&FrameState::new("k").with_int("L['xs'][rank]", xs[r]))
            .unwrap();
        (
            jit.compiled_at,
            jit.compiled.unwrap(),
            rank_dims,
            mixed,
            per_rank,
        )
    });
    assert!(
        out.iter().all(|o| o == &out[0]),
        "identical on every rank: {out:?}"
    );
    let (compiled_at, scalar, rank_dims, mixed, per_rank) = &out[0];
    assert_eq!(compiled_at, &vec![0, 1], "recompiled together at step 1");
    assert_eq!(scalar.inputs["L['n']"], InputState::Int(Dim::Dynamic));
    assert_eq!(
        rank_dims.inputs["L['x']"],
        InputState::Tensor(Sizes::DynamicRank)
    );
    assert_eq!(mixed.inputs["L['y']"], InputState::Dynamic);
    assert_eq!(per_rank.dynamic_inputs(), vec!["L['xs'][rank]"]);
}

#[test]
fn compiler_collective_names_disagreeing_ranks() {
    let out = run(3, "store", |w, r| {
        let cg = enabled(w);
        let frame = if r == 1 { "g" } else { "f" };
        let e1 = cg
            .compiler_collective(&FrameState::new(frame).with_int("a", 1))
            .unwrap_err()
            .to_string();
        let mut fs = FrameState::new("f").with_int("a", 1);
        if r == 2 {
            fs = fs.with_int("b", 2);
        }
        let e2 = cg.compiler_collective(&fs).unwrap_err().to_string();
        (e1, e2)
    });
    for (e1, e2) in out {
        assert!(
            e1.contains("ranks disagree on the frame being compiled")
                && e1.contains("ranks [0, 2]: \"f\"")
                && e1.contains("ranks [1]: \"g\""),
            "{e1}"
        );
        assert!(
            e2.contains("ranks disagree on the inputs of frame \"f\"") && e2.contains("ranks [2]"),
            "{e2}"
        );
    }
}

#[test]
fn guard_collective_one_miss_is_all_miss() {
    let out = run(4, "store", |w, r| {
        let cg = enabled(w);
        let all = cg.guard_collective(true).unwrap();
        let one = cg.guard_collective(r != 2).unwrap();
        (all, one)
    });
    for (all, one) in out {
        assert!(all.all_hit && all.missed.is_empty());
        assert!(!one.all_hit);
        assert_eq!(one.missed, vec![2]);
    }
}

/// One rank's input size changes mid-run: the guard collective makes every rank recompile at
/// that step, so compile counts stay equal.
#[test]
fn guard_collective_keeps_compile_counts_equal() {
    let out = run(2, "store", |w, r| {
        let cg = enabled(w);
        let mut jit = ToyJit::default();
        for step in 0..4 {
            let b = if r == 1 && step >= 2 { 16 } else { 8 };
            jit.call(&cg, &FrameState::new("f").with_tensor("L['x']", &[b]))
                .unwrap();
        }
        jit.compiled_at
    });
    assert_eq!(out[0], out[1]);
    assert_eq!(out[0], vec![0, 2]);
}

#[test]
fn compile_sync_digests_and_cache_hits() {
    let out = run(3, "store", |w, r| {
        let cg = enabled(w);
        let same = cg.compile_sync_digests(b"joint graph v1").unwrap();
        let artifact = if r == 2 {
            "joint graph v2"
        } else {
            "joint graph v1"
        };
        let diff = cg.compile_sync_digests(artifact.as_bytes()).unwrap();
        let hit_all = cg.cache_hit_collective(true).unwrap();
        let hit_some = cg.cache_hit_collective(r != 0).unwrap();
        let objs: Vec<(usize, String)> = cg
            .compile_sync_all_gather_object(&(r, format!("choice{r}")))
            .unwrap();
        (same, diff, hit_all, hit_some, objs)
    });
    for (same, diff, hit_all, hit_some, objs) in out {
        assert_eq!(same.ensure_identical().unwrap(), sha256(b"joint graph v1"));
        assert_eq!(diff.differing_ranks(), vec![2]);
        let e = diff.ensure_identical().unwrap_err().to_string();
        assert!(e.contains("ranks [2] differ from rank 0"), "{e}");
        assert!(hit_all);
        assert!(!hit_some, "one miss → all miss");
        assert_eq!(objs[1], (1, "choice1".to_string()));
        assert_eq!(objs.len(), 3);
    }
}
