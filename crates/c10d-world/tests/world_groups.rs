//! Group management behaviours of pytorch-behaviours.md §3: naming, tags, non-members,
//! subgroups, split_group, destroy/re-init, rank translation, registry.

use c10d_testing::world as world_common;

use c10d_core::{ErrorKind, Tensor};
use c10d_world::{hash_ranks_to_str, GroupMember, GroupOptions, Rank, SplitOptions, World};
use std::time::Duration;
use world_common::*;

fn grp(w: &World, ranks: &[usize]) -> GroupMember {
    w.new_group(Some(ranks), GroupOptions::default()).unwrap()
}

#[test]
fn naming_counter_and_non_members() {
    let out = run(3, |w, r| {
        assert_eq!(w.world_group().unwrap().group_name(), "0");
        assert_eq!(w.group_count(), 1);
        let g1 = grp(w, &[0, 1]);
        let g2 = w
            .new_group(
                None,
                GroupOptions {
                    group_desc: Some("mine".into()),
                    ..Default::default()
                },
            )
            .unwrap();
        let g3 = grp(w, &[2]);
        assert_eq!(w.group_count(), 4, "counter advances on every rank");
        if r == 2 {
            assert!(g1.is_non_member());
            assert_eq!(g1.sentinel_value(), Some(-100));
            assert_eq!(w.get_rank(Some(&g1)).unwrap(), -1);
            assert_eq!(w.get_world_size(Some(&g1)).unwrap(), -1);
            // collectives on a non-member group only warn
            let t = Tensor::from_vec(vec![1.0f32]);
            w.all_reduce(&t).group(&g1).run().unwrap();
            // PyTorch returns None; start() gives a Work that is already done
            let work = w.all_reduce(&t).group(&g1).start().unwrap();
            assert!(work.is_completed() && work.is_success());
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0]);
        } else {
            let pg = g1.group().unwrap();
            assert_eq!(pg.group_name(), "1");
            assert_eq!(pg.group_desc(), "undefined");
            assert_eq!(w.get_rank(Some(&g1)).unwrap(), r as i64);
            let t = Tensor::from_vec(vec![(r + 1) as f32]);
            w.all_reduce(&t).group(&g1).run().unwrap();
            assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0]);
        }
        assert_eq!(g2.group().unwrap().group_name(), "2");
        assert_eq!(g2.group().unwrap().group_desc(), "mine");
        if r == 2 {
            assert_eq!(g3.group().unwrap().group_name(), "3");
        }
        // WORLD + g2 + (g1 or g3)
        w.get_pg_count()
    });
    assert_eq!(out, vec![3, 3, 3]);
}

#[test]
fn hashed_names_for_local_synchronization_match_pytorch() {
    let out = run(3, |w, r| {
        for _ in 0..5 {
            grp(w, &[0, 1, 2]);
        }
        assert_eq!(w.group_count(), 6);
        let opts = GroupOptions {
            use_local_synchronization: true,
            ..Default::default()
        };
        if r < 2 {
            let g = w.new_group(Some(&[0, 1]), opts.clone()).unwrap();
            let name = g.group().unwrap().group_name().to_string();
            // two groups with the same members coexist
            let g2 = w.new_group(Some(&[0, 1]), opts).unwrap();
            assert_ne!(g2.group().unwrap().group_name(), name);
            let t = Tensor::from_vec(vec![1i64]);
            w.all_reduce(&t).group(&g2).run().unwrap();
            assert_eq!(t.to_vec::<i64>().unwrap(), vec![2]);
            name
        } else {
            // non-members get the sentinel at once, without advancing the counter
            let g = w.new_group(Some(&[0, 1]), opts).unwrap();
            assert!(g.is_non_member());
            assert_eq!(w.group_count(), 6);
            String::new()
        }
    });
    assert!(
        out[0].starts_with("3722ef32") && out[0].ends_with("7206"),
        "{}",
        out[0]
    );
    assert_eq!(out[0], out[1]);
    assert_eq!(out[0], hash_ranks_to_str(&[0, 1], 6));
}

#[test]
fn new_group_argument_errors() {
    run(3, |w, _r| {
        let e = w
            .new_group(Some(&[0, 0]), GroupOptions::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("ranks list must not contain duplicate entries, got [0, 0]"),
            "{e}"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = w
            .new_group(Some(&[0, 5]), GroupOptions::default())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Rank 5 is out of range. Valid ranks are 0 to 2 (world_size=3)"
        );
        let e = w
            .new_group(Some(&[0, 1, 2, 3]), GroupOptions::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("the new group's world size should be less or equal"),
            "{e}"
        );
        let e = w
            .new_group_with_tag(Some(&[-1]), GroupOptions::default(), None)
            .unwrap_err();
        assert!(e.to_string().starts_with("Rank -1 is out of range"), "{e}");
        let e = w
            .new_group(
                Some(&[0]),
                GroupOptions {
                    backend: Some("nope".into()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("Unknown backend"), "{e}");
    });
}

#[test]
fn unsorted_ranks_keep_list_order() {
    let out = run(3, |w, r| {
        let g = w
            .new_group(
                Some(&[2, 0, 1]),
                GroupOptions {
                    sort_ranks: false,
                    ..Default::default()
                },
            )
            .unwrap();
        let pg = g.group().unwrap().clone();
        assert_eq!(w.get_process_group_ranks(Some(&pg)).unwrap(), vec![2, 0, 1]);
        let t = Tensor::from_vec(vec![r as i64]);
        w.broadcast(&t, Rank::Group(0)).group(&g).run().unwrap(); // group rank 0 = global 2
        (w.get_rank(Some(&g)).unwrap(), t.to_vec::<i64>().unwrap()[0])
    });
    assert_eq!(out, vec![(1, 2), (2, 2), (0, 2)]);
}

#[test]
fn rank_translation() {
    run(3, |w, r| {
        let world = w.world_group().unwrap();
        assert_eq!(w.get_group_rank(&world, 2).unwrap(), 2);
        assert_eq!(w.get_global_rank(&world, 1).unwrap(), 1);
        let g = grp(w, &[1]);
        if r == 1 {
            let pg = g.group().unwrap().clone();
            assert_eq!(w.get_group_rank(&pg, 1).unwrap(), 0);
            assert_eq!(w.get_global_rank(&pg, 0).unwrap(), 1);
            assert_eq!(w.get_process_group_ranks(Some(&pg)).unwrap(), vec![1]);
            let e = w.get_group_rank(&pg, 0).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("Global rank 0 is not part of group"),
                "{e}"
            );
            let e = w.get_global_rank(&pg, 3).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("Group rank 3 is not part of group"),
                "{e}"
            );
            w.destroy_process_group(Some(&g)).unwrap();
            let e = w.get_group_rank(&pg, 1).unwrap_err();
            assert!(
                e.to_string().contains(
                    "is not registered, please create group with torch.distributed.new_group API"
                ),
                "{e}"
            );
            let e = w.destroy_process_group(Some(&g)).unwrap_err();
            assert_eq!(e.to_string(), "Invalid process group specified");
        } else {
            // destroying the sentinel is a no-op
            w.destroy_process_group(Some(&g)).unwrap();
        }
    });
}

#[test]
fn tags_and_lookup() {
    run(3, |w, _r| {
        let world = w.world_group().unwrap();
        assert_eq!(w.get_group_tag(&world).unwrap(), "ptd:0");
        assert!(w
            .find_pg_by_ranks_and_tag("", &[0, 1, 2])
            .unwrap()
            .ptr_eq(&world));
        let a = w
            .new_group_with_tag(Some(&[0, 1, 2]), GroupOptions::default(), Some("t"))
            .unwrap();
        let c0 = w.group_count();
        let b = w
            .new_group_with_tag(Some(&[0, 1, 2]), GroupOptions::default(), Some("t"))
            .unwrap();
        assert_eq!(
            w.group_count(),
            c0 + 1,
            "a tagged lookup still advances the counter"
        );
        assert_eq!(a, b, "same tag + ranks → same group object");
        let c = w
            .new_group_with_tag(Some(&[0, 1, 2]), GroupOptions::default(), Some("u"))
            .unwrap();
        assert_ne!(a, c);
        let d = grp(w, &[0, 1, 2]);
        assert_ne!(a, d);
        let apg = a.group().unwrap();
        assert_eq!(w.get_group_tag(apg).unwrap(), "t");
        assert_eq!(
            w.get_group_tag(d.group().unwrap()).unwrap(),
            format!("ptd:{}", d.group().unwrap().group_name())
        );
        assert!(w
            .find_pg_by_ranks_and_tag("t", &[0, 1, 2])
            .unwrap()
            .ptr_eq(apg));
        assert!(w
            .find_pg_by_ranks_and_tag("user:t", &[0, 1, 2])
            .unwrap()
            .ptr_eq(apg));
        let e = w.find_or_create_pg_by_ranks_and_tag("", &[0, 2], 2);
        // rank 1 is not in [0, 2]
        if w.rank().unwrap() == 1 {
            assert!(e
                .unwrap_err()
                .to_string()
                .contains("rankset doesn't include the current node"));
        } else {
            assert_eq!(
                e.unwrap_err().to_string(),
                "Cannot automatically create PG with empty tag"
            );
        }
        let g = w
            .find_or_create_pg_by_ranks_and_tag("x", &[0, 1, 2], 3)
            .unwrap();
        let g2 = w
            .find_or_create_pg_by_ranks_and_tag("x", &[2, 1, 0], 3)
            .unwrap();
        assert!(g.ptr_eq(&g2));
    });
}

#[test]
fn registry_resolves_by_name() {
    run(2, |w, _r| {
        let g = grp(w, &[0, 1]).into_group().unwrap();
        assert!(w.resolve_process_group("1").unwrap().ptr_eq(&g));
        assert!(w
            .resolve_process_group("0")
            .unwrap()
            .ptr_eq(&w.world_group().unwrap()));
        let e = w.resolve_process_group("nope").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Could not resolve the process group registered under the name nope"
        );
        w.register_process_group("alias", &g);
        assert!(w.resolve_process_group("alias").unwrap().ptr_eq(&g));
        w.unregister_process_group("alias");
        assert!(w.resolve_process_group("alias").is_err());
    });
}

#[test]
fn subgroups() {
    let out = run(4, |w, r| {
        let e = w
            .new_subgroups(Some(5), None, GroupOptions::default())
            .unwrap_err();
        assert!(e.to_string().contains("must not exceed"), "{e}");
        let e = w
            .new_subgroups(Some(3), None, GroupOptions::default())
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "The world size (4) must be divisible by 'group_size=3'"
        );
        assert!(w
            .new_subgroups(None, None, GroupOptions::default())
            .is_err());
        let (mine, all) = w
            .new_subgroups(Some(2), None, GroupOptions::default())
            .unwrap();
        assert_eq!(all.len(), 2);
        let ranks = w.get_process_group_ranks(Some(&mine)).unwrap();
        let t = Tensor::from_vec(vec![r as i32]);
        w.all_reduce(&t)
            .group(&GroupMember::from(&mine))
            .run()
            .unwrap();
        let e = w
            .new_subgroups_by_enumeration(&[vec![0, 1], vec![1, 2]], GroupOptions::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("Rank 1 has appeared in both subgroup"),
            "{e}"
        );
        let e = w
            .new_subgroups_by_enumeration(&[vec![-1, 0]], GroupOptions::default())
            .unwrap_err();
        assert!(e.to_string().contains("Rank -1 is out of range"), "{e}");
        let (cur, all) = w
            .new_subgroups_by_enumeration(&[vec![0, 3]], GroupOptions::default())
            .unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(cur.is_some(), r == 0 || r == 3);
        (ranks, t.to_vec::<i32>().unwrap()[0])
    });
    assert_eq!(
        out,
        vec![
            (vec![0, 1], 1),
            (vec![0, 1], 1),
            (vec![2, 3], 5),
            (vec![2, 3], 5)
        ]
    );
}

#[test]
fn split_group_names_order_and_errors() {
    let out = run(3, |w, r| {
        assert_eq!(
            w.split_group(None, &[], SplitOptions::default())
                .unwrap_err()
                .to_string(),
            "split_ranks cannot be None or empty"
        );
        assert_eq!(
            w.split_group(None, &[vec![]], SplitOptions::default())
                .unwrap_err()
                .to_string(),
            "the split group cannot be empty"
        );
        assert_eq!(
            w.split_group(None, &[vec![0, 0]], SplitOptions::default())
                .unwrap_err()
                .to_string(),
            "the split group cannot have duplicate ranks"
        );
        assert!(w
            .split_group(None, &[vec![0, 1, 2, 0]], SplitOptions::default())
            .unwrap_err()
            .to_string()
            .contains("the split group's size should be less or equal"));
        let c = w.group_count();
        let g = w
            .split_group(None, &[vec![1, 0], vec![2]], SplitOptions::default())
            .unwrap();
        let pg = g.group().unwrap().clone();
        let expect = if r < 2 {
            hash_ranks_to_str(&[1, 0], c)
        } else {
            hash_ranks_to_str(&[2], c)
        };
        assert_eq!(pg.group_name(), expect);
        assert_eq!(pg.group_desc(), "default_pg:split:0");
        // inner order preserved: global 1 is group rank 0
        let t = Tensor::from_vec(vec![r as i64 + 10]);
        w.broadcast(&t, Rank::Group(0)).group(&g).run().unwrap();
        let e = w
            .split_group(
                None,
                &[vec![0]],
                SplitOptions {
                    backend: Some("gloo".into()),
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is not present in the parent process group"),
            "{e}"
        );
        let only0 = w
            .split_group(None, &[vec![0]], SplitOptions::default())
            .unwrap();
        assert_eq!(only0.is_non_member(), r != 0);
        (w.get_rank(Some(&g)).unwrap(), t.to_vec::<i64>().unwrap()[0])
    });
    assert_eq!(out, vec![(1, 11), (0, 11), (0, 12)]);
}

#[test]
fn destroy_all_resets_and_reinit() {
    register();
    let s = store();
    let w = World::new();
    w.init_process_group(opts(&s, 0, 1)).unwrap();
    let g = grp(&w, &[0]);
    assert_eq!(g.group().unwrap().group_name(), "1");
    assert_eq!(w.get_pg_count(), 2);
    w.destroy_process_group(Some(&g)).unwrap();
    assert_eq!(w.get_pg_count(), 1);
    assert!(w.resolve_process_group("1").is_err());
    let t = Tensor::from_vec(vec![1.0f32]);
    let e = w.all_reduce(&t).group(&g).run().unwrap_err();
    assert!(
        e.to_string().contains("Invalid process group specified"),
        "{e}"
    );
    w.destroy_process_group(None).unwrap();
    assert_eq!(w.get_pg_count(), 0);
    assert_eq!(w.group_count(), 0);
    let e = w.destroy_process_group(None).unwrap_err();
    assert_eq!(e.to_string(), "Invalid process group specified");
    let s2 = store();
    w.init_process_group(opts(&s2, 0, 1)).unwrap();
    assert_eq!(grp(&w, &[0]).group().unwrap().group_name(), "1");
    w.abort_process_group(None).unwrap();
    assert!(!w.is_initialized());
}

#[test]
fn group_stores_use_pytorch_prefixes() {
    register();
    let s = store();
    let w = World::new();
    w.init_process_group(opts(&s, 0, 1)).unwrap();
    let g = grp(&w, &[0]);
    let t = Tensor::from_vec(vec![1.0f32]);
    w.all_reduce(&t).group(&g).run().unwrap();
    w.all_reduce(&t).run().unwrap();
    // PrefixStore("cpu/", PrefixStore("1/", PrefixStore("0/", store))): a user store is not wrapped
    // in "default_pg" (only rendezvous stores are)
    assert!(s.check(&["0//1//cpu//c0/0"]).unwrap());
    assert!(s.check(&["0//cpu//c0/0"]).unwrap());
    w.destroy_process_group(None).unwrap();
}

#[test]
fn init_barrier_times_out_when_a_rank_is_missing() {
    register();
    let s = store();
    let handles: Vec<_> = (0..3)
        .map(|r| {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = World::new();
                w.set_init_barrier(true);
                let mut o = opts(&s, r, 4);
                o.timeout = Some(Duration::from_secs(2));
                w.init_process_group(o).unwrap_err()
            })
        })
        .collect();
    for h in handles {
        let e = h.join().unwrap();
        assert!(
            e.to_string()
                .contains("Timed out initializing process group in store based barrier"),
            "{e}"
        );
        assert!(e.is_store_error());
    }
}

#[test]
fn extended_api_creators_get_group_details() {
    use c10d_world::{register_backend, BackendCreateArgs};
    use std::sync::{Arc, Mutex};
    register();
    type Seen = Vec<(String, Vec<usize>, String)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let s2 = seen.clone();
    register_backend(
        "spy",
        Arc::new(move |a: &BackendCreateArgs| {
            s2.lock().unwrap().push((
                a.group_name.clone(),
                a.global_ranks_in_group.clone(),
                a.device.to_string(),
            ));
            c10d_testing::StoreBackend::creator("spy")(a)
        }),
        Some(&[c10d_core::DeviceType::Cpu]),
        true,
    );
    assert!(c10d_world::is_backend_available("spy"));
    assert_eq!(
        c10d_world::BackendConfig::parse("spy").unwrap().to_string(),
        "cpu:spy"
    );
    let s = store();
    let w = World::new();
    let mut o = opts(&s, 0, 1);
    o.backend = Some("SPY".into());
    w.init_process_group(o).unwrap();
    grp(&w, &[0]);
    w.destroy_process_group(None).unwrap();
    let v = seen.lock().unwrap().clone();
    assert_eq!(
        v,
        vec![
            ("0".to_string(), vec![], "cpu".to_string()),
            ("1".to_string(), vec![0], "cpu".to_string())
        ]
    );
}

#[test]
fn init_barrier_passes_when_all_ranks_arrive() {
    let out = run_with(
        3,
        |w, _r| w.set_init_barrier(true),
        |w, r| {
            let g = grp(w, &[0, 2]);
            let l = if r != 1 {
                w.new_group(
                    Some(&[0, 2]),
                    GroupOptions {
                        use_local_synchronization: true,
                        ..Default::default()
                    },
                )
                .unwrap()
            } else {
                GroupMember::NonGroupMember
            };
            (g.is_non_member(), l.is_non_member())
        },
    );
    assert_eq!(out, vec![(false, false), (true, true), (false, false)]);
}

#[test]
fn node_local_rank_fallback() {
    if std::env::var_os("LOCAL_RANK").is_some() {
        println!("skipped: LOCAL_RANK is set in this environment");
        return;
    }
    assert_eq!(c10d_world::get_node_local_rank(Some(3)).unwrap(), 3);
    let e = c10d_world::get_node_local_rank(None).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("LOCAL_RANK is not in the environment"),
        "{e}"
    );
}

#[test]
fn explicit_group_name_reuse_is_refused() {
    run(2, |w, _r| {
        let o = GroupOptions {
            group_name: Some("mine".into()),
            ..Default::default()
        };
        let g = w.new_group(Some(&[0, 1]), o.clone()).unwrap();
        assert_eq!(g.group().unwrap().group_name(), "mine");
        let e = w.new_group(Some(&[0, 1]), o).unwrap_err();
        assert_eq!(
            e.to_string(),
            "The specified group name has already been created, please use a different group name"
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(w
            .resolve_process_group("mine")
            .unwrap()
            .ptr_eq(g.group().unwrap()));
    });
}

/// Records shutdown/abort calls with the group name the backend was created for.
struct Spy {
    inner: std::sync::Arc<dyn c10d_core::Backend>,
    name: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl c10d_core::Collectives for Spy {
    fn run(&self, op: c10d_core::Op) -> c10d_core::Result<c10d_core::Work> {
        Err(op.unsupported_by("spyshut"))
    }
}

impl c10d_core::Backend for Spy {
    fn name(&self) -> &str {
        "spyshut"
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn device_type(&self) -> c10d_core::DeviceType {
        self.inner.device_type()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&self, t: Duration) {
        self.inner.set_timeout(t)
    }
    fn shutdown(&self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("shutdown {}", self.name));
    }
    fn abort(&self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("abort {}", self.name));
    }
}

#[test]
fn destroy_shuts_down_and_abort_aborts_in_reverse_name_order() {
    use std::sync::{Arc, Mutex};
    register();
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let l2 = log.clone();
    let inner = c10d_testing::StoreBackend::creator("inner");
    c10d_world::register_backend(
        "spyshut",
        Arc::new(move |a: &c10d_world::BackendCreateArgs| {
            let b: Arc<dyn c10d_core::Backend> = Arc::new(Spy {
                inner: inner(a)?.unwrap(),
                name: a.group_name.clone(),
                log: l2.clone(),
            });
            Ok(Some(b))
        }),
        Some(&[c10d_core::DeviceType::Cpu]),
        true,
    );
    let s = store();
    let w = World::new();
    let mut o = opts(&s, 0, 1);
    o.backend = Some("spyshut".into());
    w.init_process_group(o.clone()).unwrap();
    let g1 = grp(&w, &[0]);
    let _g2 = grp(&w, &[0]);
    w.destroy_process_group(Some(&g1)).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["shutdown 1"]);
    w.destroy_process_group(None).unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        vec!["shutdown 1", "shutdown 2", "shutdown 0"]
    );
    log.lock().unwrap().clear();
    let s2 = store();
    o.store = Some(s2);
    w.init_process_group(o).unwrap();
    let g = grp(&w, &[0]);
    w.abort_process_group(Some(&g)).unwrap();
    let e = w.abort_process_group(Some(&g)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Invalid process group specified or has been destroyed."
    );
    w.abort_process_group(None).unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["abort 1", "abort 0"]);
    assert!(!w.is_initialized());
}
