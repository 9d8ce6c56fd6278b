//! `shrink_group` with ranks as threads (one `World` each) over a HashStore: the survivors of a
//! 4-rank gloo world shrink WORLD and a subgroup and go on with collectives; argument errors.
//! The process test (a rank really SIGKILLed mid-training) is `world_shrink_process.rs`.

use c10d_testing::world as world_common;

use c10d_core::Tensor;
use c10d_world::{GroupMember, GroupOptions, World};
use std::time::{Duration, Instant};
use world_common::run_gloo;

fn sum_of(w: &World, value: f32, group: Option<&GroupMember>) -> f32 {
    let t = Tensor::from_vec(vec![value; 16]);
    w.all_reduce(&t).group(group).run().unwrap();
    let v = t.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&x| x == v[0]), "{v:?}");
    v[0]
}

#[test]
fn shrink_world_excluding_rank_2_renumbers_and_reduces() {
    let out = run_gloo(
        4,
        |_| {},
        |w, r| {
            // One step on the full world: 1+2+3+4.
            assert_eq!(sum_of(w, (r + 1) as f32, None), 10.0);
            let old = w.world_group().unwrap();
            if r == 2 {
                let e = w.shrink_group(&[2], None).unwrap_err().to_string();
                assert!(e.contains("Current rank 2 is in the exclusion list"), "{e}");
                // The failed call left its world alone.
                assert_eq!(w.get_world_size(None).unwrap(), 4);
                return None;
            }
            let t0 = Instant::now();
            let g = w.shrink_group(&[2], None).unwrap();
            let took = t0.elapsed();
            let pg = g.group().unwrap().clone();
            // The shrunk group is the new WORLD, ranks renumbered in order: 0,1,3 -> 0,1,2.
            let new_rank = [0, 1, usize::MAX, 2][r];
            assert!(w.world_group().unwrap().ptr_eq(&pg));
            assert_eq!(pg.rank(), new_rank);
            assert_eq!(pg.size(), 3);
            assert_eq!(w.get_rank(None).unwrap(), new_rank as i64);
            assert_eq!(w.get_world_size(None).unwrap(), 3);
            assert_eq!(w.get_process_group_ranks(None).unwrap(), vec![0, 1, 2]);
            assert_eq!(w.get_global_rank(&pg, 2).unwrap(), 2);
            assert_eq!(pg.group_desc(), "default:shrunken");
            assert_ne!(pg.group_name(), old.group_name());
            assert_eq!(
                w.resolve_process_group(pg.group_name()).unwrap().rank(),
                new_rank
            );
            // The old WORLD is gone.
            assert!(w.resolve_process_group(old.group_name()).is_err());
            assert!(w.get_group_rank(&old, 0).is_err());
            // Training goes on: 1+2+4 on the survivors, on WORLD (None) and on the group itself.
            assert_eq!(sum_of(w, (r + 1) as f32, None), 7.0);
            assert_eq!(sum_of(w, (r + 1) as f32, Some(&g)), 7.0);
            // The survivors can create groups of the new world.
            let sub = w.new_group(Some(&[0, 2]), GroupOptions::default()).unwrap();
            if new_rank != 1 {
                assert_eq!(sum_of(w, (r + 1) as f32, Some(&sub)), 5.0);
            } else {
                assert!(sub.is_non_member());
            }
            Some(took)
        },
    );
    let worst = out.iter().flatten().max().unwrap();
    println!("shrink_group (3 thread ranks, gloo): slowest survivor took {worst:?}");
    assert!(*worst < Duration::from_secs(5), "{worst:?}");
}

#[test]
fn shrink_subgroup_keeps_world_and_maps_global_ranks() {
    run_gloo(
        4,
        |_| {},
        |w, r| {
            let g = w
                .new_group(Some(&[1, 2, 3]), GroupOptions::default())
                .unwrap();
            if r == 0 {
                let e = w.shrink_group(&[0], Some(&g)).unwrap_err().to_string();
                assert!(e.contains("not a member of the group"), "{e}");
                return;
            }
            assert_eq!(sum_of(w, r as f32, Some(&g)), 6.0);
            let old = g.group().unwrap().clone();
            if r == 1 {
                // Group rank 0 of g is global rank 1.
                let e = w.shrink_group(&[0], Some(&g)).unwrap_err().to_string();
                assert!(e.contains("Current rank 0 is in the exclusion list"), "{e}");
                return;
            }
            let s = w.shrink_group(&[0], Some(&g)).unwrap();
            let pg = s.group().unwrap().clone();
            assert_eq!(pg.size(), 2);
            assert_eq!(pg.rank(), r - 2);
            assert_eq!(pg.group_desc(), format!("{}:shrunk", old.group_name()));
            assert_eq!(w.get_process_group_ranks(Some(&pg)).unwrap(), vec![2, 3]);
            assert_eq!(w.get_global_rank(&pg, 1).unwrap(), 3);
            assert_eq!(w.get_group_rank(&pg, 2).unwrap(), 0);
            // WORLD is untouched, the old subgroup is gone.
            assert_eq!(w.get_world_size(None).unwrap(), 4);
            assert_eq!(w.get_rank(None).unwrap(), r as i64);
            assert!(w.get_process_group_ranks(Some(&old)).is_err());
            assert_eq!(sum_of(w, r as f32, Some(&s)), 5.0);
        },
    );
}

fn msg(r: c10d_core::Result<GroupMember>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn shrink_argument_errors() {
    // Before init_process_group.
    let e = msg(World::new().shrink_group(&[1], None));
    assert!(
        e.contains("Default process group has not been initialized"),
        "{e}"
    );

    run_gloo(
        4,
        |_| {},
        |w, r| {
            let e = msg(w.shrink_group(&[], None));
            assert!(e.contains("ranks_to_exclude cannot be empty"), "{e}");
            let e = msg(w.shrink_group(&[4], None));
            assert!(
                e.contains("Rank 4 at index 0 is out of bounds for group size 4"),
                "{e}"
            );
            let e = msg(w.shrink_group(&[1, 7], None));
            assert!(
                e.contains("Rank 7 at index 1 is out of bounds for group size 4"),
                "{e}"
            );
            let e = msg(w.shrink_group(&[3, 3], None));
            assert!(
                e.contains("Duplicate rank 3 found in ranks_to_exclude at index 1"),
                "{e}"
            );
            let e = msg(w.shrink_group(&[0, 1, 2, 3], None));
            assert!(e.contains("Cannot exclude all 4 ranks"), "{e}");
            let e = msg(w.shrink_group(&[r], None));
            assert!(
                e.contains(&format!("Current rank {r} is in the exclusion list")),
                "{e}"
            );
            let e = msg(w.shrink_group(&[0], Some(&GroupMember::NonGroupMember)));
            assert!(e.contains("not a member of the group"), "{e}");
            // A group of one rank cannot shrink.
            let solo = w.new_group(
                Some(&[r]),
                GroupOptions {
                    use_local_synchronization: true,
                    ..Default::default()
                },
            );
            let solo = solo.unwrap();
            let e = msg(w.shrink_group(&[0], Some(&solo)));
            assert!(
                e.contains("Cannot shrink a process group with size 1"),
                "{e}"
            );
            // A destroyed group is not registered any more.
            w.destroy_process_group(Some(&solo)).unwrap();
            let e = msg(w.shrink_group(&[0], Some(&solo)));
            assert!(e.contains("is not registered"), "{e}");
            // None of this touched WORLD.
            assert_eq!(w.get_world_size(None).unwrap(), 4);
            assert_eq!(sum_of(w, 1.0, None), 4.0);
        },
    );
}
