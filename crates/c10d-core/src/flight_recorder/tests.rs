use super::*;
use crate::dtype::DType;
use crate::op_type::OpType;
use crate::tensor::Tensor;
use std::time::Duration;

fn recorder(size: usize, prefix: &str) -> Arc<FlightRecorder> {
    FlightRecorder::new(FrConfig {
        buffer_size: size,
        dump_prefix: prefix.to_string(),
        dump_on_failure: true,
        dump_signal: None,
    })
}

fn all_reduce(seq: u64, t: &[Tensor]) -> OpRecord<'_> {
    OpRecord {
        op: OpType::Allreduce,
        collective_seq_id: seq,
        p2p_seq_id: 0,
        op_id: seq,
        peer: None,
        inputs: t,
        outputs: t,
        timeout: Duration::from_millis(1500),
    }
}

/// The `collective_seq_id`s of the recorder's dump, oldest first.
fn seqs(fr: &FlightRecorder) -> Vec<u64> {
    fr.dump()
        .entries
        .iter()
        .map(|e| e.collective_seq_id)
        .collect()
}

fn temp_prefix(tag: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("c10d-fr-unit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let prefix = format!("{}/trace_", dir.display());
    (dir, prefix)
}

#[test]
fn keeps_the_last_n_entries_oldest_first() {
    let fr = recorder(3, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "default_pg", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 4])];
    for seq in 1..=5 {
        g.record(&all_reduce(seq, &t)).unwrap().finished(Ok(()));
    }
    let d = fr.dump();
    let ids: Vec<u64> = d.entries.iter().map(|e| e.record_id).collect();
    assert_eq!(ids, [2, 3, 4]);
    let in_order: Vec<u64> = d.entries.iter().map(|e| e.collective_seq_id).collect();
    assert_eq!(in_order, [3, 4, 5]);
    // One more wraps again.
    g.record(&all_reduce(6, &t)).unwrap();
    assert_eq!(seqs(&fr), [4, 5, 6]);
}

#[test]
fn a_trace_of_an_overwritten_entry_changes_nothing() {
    let fr = recorder(2, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 4])];
    let old = g.record(&all_reduce(1, &t)).unwrap();
    g.record(&all_reduce(2, &t)).unwrap();
    g.record(&all_reduce(3, &t)).unwrap();
    old.started();
    old.finished(Ok(()));
    let states: Vec<String> = fr.dump().entries.iter().map(|e| e.state.clone()).collect();
    assert_eq!(states, ["scheduled", "scheduled"]);
}

#[test]
fn size_zero_and_paused_record_nothing() {
    let fr = recorder(0, "/nonexistent/x_");
    assert!(!fr.is_enabled());
    fr.set_enabled(true);
    assert!(!fr.is_enabled(), "a size-0 recorder stays off");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 1);
    let t = [Tensor::from_vec(vec![0f32; 4])];
    assert!(g.record(&all_reduce(1, &t)).is_none());
    assert!(fr.dump().entries.is_empty());

    let fr = recorder(4, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 1);
    fr.set_enabled(false);
    assert!(g.record(&all_reduce(1, &t)).is_none());
    fr.set_enabled(true);
    assert!(g.record(&all_reduce(2, &t)).is_some());
    assert_eq!(fr.dump().entries.len(), 1);
}

#[test]
fn states_timestamps_shapes_and_errors() {
    let fr = recorder(8, "/nonexistent/x_");
    let g = fr.register_group("gloo", "5", "tp", &[3, 7], 1, 2);
    let ins = [Tensor::zeros(DType::F32, &[4, 2])];
    let outs = [
        Tensor::zeros(DType::F32, &[8, 2]),
        Tensor::zeros(DType::I64, &[3]),
    ];
    let rec = OpRecord {
        op: OpType::Allgather,
        collective_seq_id: 1,
        p2p_seq_id: 0,
        op_id: 1,
        peer: None,
        inputs: &ins,
        outputs: &outs,
        timeout: Duration::from_secs(2),
    };
    let a = g.record(&rec).unwrap();
    let e = &fr.dump().entries[0];
    assert_eq!(e.state, "scheduled");
    assert_eq!(e.time_discovered_started_ns, None);
    a.started();
    assert_eq!(fr.dump().entries[0].state, "started");
    a.finished(Ok(()));
    let e = &fr.dump().entries[0];
    assert_eq!(e.state, "completed");
    assert!(e.retired);
    assert!(e.time_discovered_started_ns.unwrap() <= e.time_discovered_completed_ns.unwrap());
    assert!(e.time_created_ns <= e.time_discovered_started_ns.unwrap());
    assert!(e.duration_ms.unwrap() >= 0.0);
    assert_eq!(e.profiling_name, "gloo:all_gather");
    assert_eq!(e.process_group, ("5".to_string(), "tp".to_string()));
    assert_eq!(e.input_sizes, vec![vec![4, 2]]);
    assert_eq!(e.input_dtypes, ["Float"]);
    assert_eq!(e.output_sizes, vec![vec![8, 2], vec![3]]);
    assert_eq!(e.output_dtypes, ["Float", "Long"]);
    assert_eq!(e.timeout_ms, 2000);
    assert!(!e.is_p2p);

    // A failed send: retired, not completed, with its error; the p2p name has group ranks.
    fr.set_dump_prefix("/nonexistent-dir-for-c10d-tests/x_");
    let t = [Tensor::from_vec(vec![1u8; 3])];
    let send = OpRecord {
        op: OpType::Send,
        collective_seq_id: 1,
        p2p_seq_id: 1,
        op_id: 2,
        peer: Some(0),
        inputs: &t,
        outputs: &t,
        timeout: Duration::from_secs(1),
    };
    let s = g.record(&send).unwrap();
    s.started();
    s.finished(Err(&DistError::backend("peer 0 is gone")));
    let e = &fr.dump().entries[1];
    assert_eq!(e.profiling_name, "gloo:send 1->0");
    assert!(e.is_p2p);
    assert_eq!((e.p2p_seq_id, e.op_id), (1, 2));
    assert_eq!(e.state, "started");
    assert!(e.retired);
    assert_eq!(e.time_discovered_completed_ns, None);
    assert_eq!(e.duration_ms, None);
    assert_eq!(e.error.as_deref(), Some("peer 0 is gone"));
    let any = OpRecord {
        op: OpType::RecvAnysource,
        peer: None,
        ..send
    };
    g.record(&any).unwrap();
    assert_eq!(fr.dump().entries[2].profiling_name, "gloo:recv 1<-?");
}

#[test]
fn pg_config_and_status() {
    let fr = recorder(8, "/nonexistent/x_");
    let g0 = fr.register_group("gloo", "0", "default_pg", &[], 2, 4);
    let g1 = fr.register_group("gloo", "1", "undefined", &[0, 2], 1, 2);
    assert_eq!(fr.rank(), Some(2));
    let t = [Tensor::from_vec(vec![0f32; 1])];
    g0.record(&all_reduce(1, &t)).unwrap().finished(Ok(()));
    let a = g0.record(&all_reduce(2, &t)).unwrap();
    a.started();
    g0.record(&all_reduce(3, &t)).unwrap();
    let d = fr.dump();
    assert_eq!(d.version, "2.10");
    assert_eq!(d.pg_config["0"].ranks, "[0, 1, 2, 3]");
    assert_eq!(d.pg_config["1"].rank_list(), Some(vec![0, 2]));
    assert_eq!(d.pg_config["1"].desc, "undefined");
    let s = d.pg_status["0"];
    assert_eq!(
        (
            s.last_enqueued_collective,
            s.last_started_collective,
            s.last_completed_collective
        ),
        (3, 2, 1)
    );
    assert_eq!(d.pg_status["1"].last_enqueued_collective, -1);
    assert_eq!(d.entries[0].pg_id, g0.pg_id());
    assert_eq!(g1.pg_id(), g0.pg_id() + 1);
}

#[test]
fn the_dump_file_is_named_after_the_oldest_live_groups_global_rank() {
    let fr = recorder(8, "/nonexistent/x_");
    let world = fr.register_group("gloo", "0", "default_pg", &[], 2, 4);
    // A subgroup whose own rank (0) is not the global one, registered later.
    let sub = fr.register_group("gloo", "1", "undefined", &[], 0, 2);
    assert_eq!(
        fr.rank(),
        Some(2),
        "the WORLD group's rank, not the latest group's"
    );
    drop(world);
    assert_eq!(fr.rank(), Some(0), "the oldest live group now");
    sub.set_shutting_down();
    assert_eq!(fr.rank(), Some(0), "kept when no group is left");
}

#[test]
fn groups_are_unregistered_at_shutdown_or_drop_once_their_entries_are_gone() {
    let fr = recorder(2, "/nonexistent/x_");
    let t = [Tensor::from_vec(vec![0f32; 1])];
    let live = fr.register_group("gloo", "0", "default_pg", &[], 0, 1);
    let quiet = fr.register_group("gloo", "1", "quiet", &[], 0, 1);
    let busy = fr.register_group("gloo", "2", "busy", &[], 0, 1);
    busy.record(&all_reduce(1, &t)).unwrap().finished(Ok(()));
    drop(quiet);
    busy.set_shutting_down();
    let d = fr.dump();
    let names: Vec<&str> = d.pg_config.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["0", "2"],
        "a group with entries left stays in the dump"
    );
    assert_eq!(d.entries.len(), 1);
    assert_eq!(d.pg_status.len(), 2);
    // Once the ring overwrote busy's entry, registering a group forgets busy.
    live.record(&all_reduce(1, &t)).unwrap();
    live.record(&all_reduce(2, &t)).unwrap();
    let _other = fr.register_group("gloo", "3", "other", &[], 0, 1);
    let names: Vec<String> = fr.dump().pg_config.into_keys().collect();
    assert_eq!(names, ["0", "3"]);
    drop(_other);
    fr.reset();
    let d = fr.dump();
    assert_eq!(d.pg_config.keys().collect::<Vec<_>>(), ["0"]);
    assert_eq!(
        d.pg_status.keys().cloned().collect::<Vec<_>>(),
        [live.pg_id().to_string()]
    );
}

#[test]
fn pickle_round_trips() {
    let fr = recorder(8, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "default_pg", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 256])];
    let a = g.record(&all_reduce(1, &t)).unwrap();
    a.started();
    a.finished(Ok(()));
    g.record(&all_reduce(2, &t)).unwrap();
    let d = fr.dump();
    let bytes = d.to_pickle().unwrap();
    assert_eq!(
        &bytes[..2],
        b"\x80\x02",
        "pickle protocol 2, as PyTorch writes"
    );
    assert_eq!(Dump::from_pickle(&bytes).unwrap(), d);
    let e = Dump::from_pickle(b"not a pickle").unwrap_err();
    assert!(e.to_string().contains("not a flight-recorder dump"), "{e}");
}

#[test]
fn dump_to_file_needs_a_rank_and_writes_prefix_rank() {
    let (dir, prefix) = temp_prefix("file");
    let fr = recorder(8, &prefix);
    let e = fr.dump_to_file().unwrap_err();
    assert!(e.to_string().contains("rank"), "{e}");
    let _g = fr.register_group("gloo", "0", "default_pg", &[], 3, 4);
    let path = fr.dump_to_file().unwrap();
    assert_eq!(path, PathBuf::from(format!("{prefix}3")));
    assert_eq!(
        Dump::read(&path).unwrap().pg_config["0"].ranks,
        "[0, 1, 2, 3]"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn dumps_written_at_once_by_several_threads_are_each_whole() {
    let (dir, prefix) = temp_prefix("threads");
    let fr = recorder(8, &prefix);
    let _g = fr.register_group("gloo", "0", "default_pg", &[], 1, 2);
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let fr = fr.clone();
            std::thread::spawn(move || (0..25).map(|_| fr.dump_to_file()).collect::<Vec<_>>())
        })
        .collect();
    for w in writers {
        for r in w.join().unwrap() {
            let path = r.unwrap();
            assert_eq!(Dump::read(&path).unwrap().version, DUMP_VERSION);
        }
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "only the dump, no temporary file: {left:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_first_failure_of_a_run_dumps_and_shutdown_does_not() {
    let (dir, prefix) = temp_prefix("fail");
    let fr = recorder(8, &prefix);
    let g = fr.register_group("gloo", "0", "default_pg", &[], 0, 2);
    let path = PathBuf::from(format!("{prefix}0"));
    let t = [Tensor::from_vec(vec![0f32; 1])];
    g.record(&all_reduce(1, &t)).unwrap().finished(Ok(()));
    assert!(!path.exists());
    let err = DistError::backend("Timed out");
    g.record(&all_reduce(2, &t)).unwrap().finished(Err(&err));
    assert_eq!(
        Dump::read(&path).unwrap().entries.len(),
        2,
        "dumped before returning"
    );
    // The next failure of the same run does not rewrite it.
    std::fs::remove_file(&path).unwrap();
    g.record(&all_reduce(3, &t)).unwrap().finished(Err(&err));
    assert!(!path.exists());
    // After a success, a new failure dumps again.
    g.record(&all_reduce(4, &t)).unwrap().finished(Ok(()));
    g.record(&all_reduce(5, &t)).unwrap().finished(Err(&err));
    assert_eq!(Dump::read(&path).unwrap().entries.len(), 5);
    std::fs::remove_file(&path).unwrap();
    // Failures caused by an orderly shutdown never dump.
    g.record(&all_reduce(6, &t)).unwrap().finished(Ok(()));
    g.set_shutting_down();
    g.record(&all_reduce(7, &t)).unwrap().finished(Err(&err));
    assert!(!path.exists());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_held_failure_dumps_when_the_hold_ends_with_the_op_recorded_meanwhile() {
    let (dir, prefix) = temp_prefix("hold");
    let fr = recorder(8, &prefix);
    let g = fr.register_group("gloo", "0", "held", &[], 0, 2);
    let path = PathBuf::from(format!("{prefix}0"));
    let t = [Tensor::from_vec(vec![0f32; 1])];
    let pending = g.record(&all_reduce(1, &t)).unwrap();
    let hold = hold_failure_dumps();
    // Another op of the group fails while this thread runs op 2, not recorded yet.
    pending.finished(Err(&DistError::backend("peer gone")));
    assert!(!path.exists(), "held back");
    // A failure reported on another thread meanwhile is not held.
    let other = fr.register_group("gloo", "1", "other", &[], 0, 2);
    let late = other.record(&all_reduce(1, &t)).unwrap();
    std::thread::spawn(move || late.finished(Err(&DistError::backend("x"))))
        .join()
        .unwrap();
    assert!(path.exists(), "another thread's failure dumps at once");
    std::fs::remove_file(&path).unwrap();
    let op2 = g.record(&all_reduce(2, &t)).unwrap();
    drop(hold);
    op2.finished(Err(&DistError::backend("peer gone")));
    let dumped = Dump::read(&path).unwrap();
    let held: Vec<u64> = (dumped.entries.iter())
        .filter(|e| e.process_group.1 == "held")
        .map(|e| e.collective_seq_id)
        .collect();
    assert_eq!(held, [1, 2], "the dump has the op recorded during the hold");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_op_recorded_late_keeps_its_submission_time_and_status_never_goes_back() {
    let fr = recorder(8, "/nonexistent-dir-for-c10d-tests/x_");
    let g = fr.register_group("gloo", "0", "late", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 1])];
    let submitted = g.stamp().unwrap();
    std::thread::sleep(Duration::from_millis(40));
    g.record_at(&all_reduce(2, &t), Some(submitted)).unwrap();
    g.record(&all_reduce(1, &t)).unwrap();
    let d = fr.dump();
    let created = |seq| {
        let e = d.entries.iter().find(|e| e.collective_seq_id == seq);
        e.unwrap().time_created_ns
    };
    assert!(created(1) >= created(2) + 30_000_000, "{:?}", d.entries);
    let status = d.pg_status[&g.pg_id().to_string()];
    assert_eq!(status.last_enqueued_collective, 2, "not back to 1");
    fr.set_enabled(false);
    assert_eq!(g.stamp(), None);
}

#[test]
fn dump_on_failure_can_be_turned_off() {
    let (dir, prefix) = temp_prefix("off");
    let fr = FlightRecorder::new(FrConfig {
        buffer_size: 8,
        dump_prefix: prefix.clone(),
        dump_on_failure: false,
        dump_signal: None,
    });
    let g = fr.register_group("gloo", "0", "d", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 1])];
    g.record(&all_reduce(1, &t))
        .unwrap()
        .finished(Err(&DistError::backend("x")));
    assert!(!PathBuf::from(format!("{prefix}0")).exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn reset_forgets_entries() {
    let fr = recorder(3, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 1);
    let t = [Tensor::from_vec(vec![0f32; 1])];
    for s in 1..=4 {
        g.record(&all_reduce(s, &t)).unwrap();
    }
    fr.reset();
    assert!(fr.dump().entries.is_empty());
    for s in 5..=8 {
        g.record(&all_reduce(s, &t)).unwrap();
    }
    assert_eq!(seqs(&fr), [6, 7, 8]);
    let ids: Vec<u64> = fr.dump().entries.iter().map(|e| e.record_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

#[test]
fn signal_writes_the_dump() {
    let (dir, prefix) = temp_prefix("sig");
    let fr = recorder(8, &prefix);
    let _g = fr.register_group("gloo", "0", "d", &[], 0, 1);
    fr.install_dump_signal(signal_hook::consts::SIGUSR2)
        .unwrap();
    signal_hook::low_level::raise(signal_hook::consts::SIGUSR2).unwrap();
    let path = PathBuf::from(format!("{prefix}0"));
    // The handler thread writes it; wait for it (bounded), the result is asserted below.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !path.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(Dump::read(&path).unwrap().version, "2.10");
    assert!(fr
        .install_dump_signal(signal_hook::consts::SIGKILL)
        .is_err());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn work_completer_reports_start_completion_and_drop() {
    use crate::work::Work;
    let fr = recorder(8, "/nonexistent-dir-for-c10d-tests/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 1])];
    let (w, mut c) = Work::new(OpType::Allreduce, 0);
    c.set_trace(g.record(&all_reduce(1, &t)));
    c.mark_started();
    assert_eq!(fr.dump().entries[0].state, "started");
    c.complete(Ok(()));
    w.wait().unwrap();
    assert_eq!(fr.dump().entries[0].state, "completed");
    // A completer dropped by a crashed backend fails the entry too.
    let (_w, mut c) = Work::new(OpType::Allreduce, 1);
    c.set_trace(g.record(&all_reduce(2, &t)));
    drop(c);
    let e = &fr.dump().entries[1];
    assert!(e.retired);
    assert_eq!(e.state, "scheduled");
    assert!(e
        .error
        .as_deref()
        .unwrap()
        .contains("dropped by its backend"));
}

#[test]
fn slots_fit_two_cache_lines_and_shapes_round_trip() {
    assert_eq!(std::mem::size_of::<slot::Slot>(), 128);
    let a = Tensor::zeros(DType::F32, &[4, 2]);
    let b = Tensor::zeros(DType::I64, &[3]);
    let c = Tensor::zeros(DType::BF16, &[]);
    let cases: [(&[Tensor], &[Tensor]); 4] = [
        (&[], &[]),
        (std::slice::from_ref(&a), std::slice::from_ref(&a)),
        (&[a.clone(), b.clone()], &[b.clone(), c.clone(), a.clone()]),
        (std::slice::from_ref(&c), &[]),
    ];
    for (ins, outs) in cases {
        let list = |ts: &[Tensor]| -> shapes::Listed {
            ts.iter()
                .map(|t| {
                    let s = t.shape().iter().map(|&d| d as i64).collect();
                    (s, t.dtype().torch_name().to_string())
                })
                .unzip()
        };
        let packing = shapes::Packing::of(ins, outs);
        let decoded = shapes::decode(&packing.words());
        assert_eq!(decoded, (list(ins), list(outs)));
    }
}

#[test]
fn shapes_too_long_for_a_slot_are_kept_beside_it() {
    let fr = recorder(4, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 2);
    let ins = [Tensor::zeros(DType::F32, &[2, 3, 4])];
    let outs: Vec<Tensor> = (0..4)
        .map(|_| Tensor::zeros(DType::F32, &[2, 3, 4]))
        .collect();
    let rec = OpRecord {
        op: OpType::Allgather,
        inputs: &ins,
        outputs: &outs,
        ..all_reduce(1, &ins)
    };
    for seq in 1..=6 {
        g.record(&OpRecord {
            collective_seq_id: seq,
            ..rec
        })
        .unwrap()
        .finished(Ok(()));
    }
    let d = fr.dump();
    assert_eq!(d.entries.len(), 4);
    for e in &d.entries {
        assert_eq!(e.output_sizes, vec![vec![2, 3, 4]; 4]);
        assert_eq!(e.input_sizes, vec![vec![2, 3, 4]]);
    }
}

#[test]
fn timeouts_too_long_for_the_entry_are_capped() {
    let fr = recorder(4, "/nonexistent/x_");
    let g = fr.register_group("gloo", "0", "d", &[], 0, 2);
    let t = [Tensor::from_vec(vec![0f32; 1])];
    for (timeout, ms) in [
        (Duration::MAX, u32::MAX as u64 - 1),
        (Duration::from_millis(1500), 1500),
    ] {
        g.record(&OpRecord {
            timeout,
            ..all_reduce(1, &t)
        });
        assert_eq!(fr.dump().entries.last().unwrap().timeout_ms, ms);
    }
}

#[test]
fn a_late_mark_from_an_earlier_lap_is_ignored() {
    let ring = ring::Ring::leak(2).unwrap();
    let t = [Tensor::from_vec(vec![0f32; 4])];
    let packing = || shapes::Packing::of(&t, &t);
    let old = ring.push(&head(5, 1), &packing());
    ring.push(&head(5, 2), &packing());
    let new = ring.push(&head(5, 3), &packing());
    assert_eq!((old.id(), new.id()), (0, 2));
    assert!(std::ptr::eq(old.slot(), new.slot()));
    assert_ne!(old.tag(), new.tag());
    let entry = |id| {
        let entries = ring.snapshot().entries;
        entries.into_iter().find(|e| e.local_id == id).unwrap()
    };
    assert!(!entry(new.id()).retired);
    new.mark_ended(9, None);
    let e = entry(new.id());
    assert_eq!((e.retired, e.completed_ms), (true, Some(9)));
    // A late end for an overwritten entry is not written at all.
    old.mark_ended(7, Some("late"));
    let e = entry(new.id());
    assert_eq!((e.completed_ms, e.error), (Some(9), None));
    // Even one that passed the "still mine" check just before the overwrite (a thread
    // preempted in between) is never taken for the new entry's: the new entry loses its end
    // mark (shown not completed), it does not show the old one's.
    old.slot().store_ended(old.tag(), 7, true);
    let e = entry(new.id());
    assert_eq!((e.retired, e.completed_ms, e.error), (false, None, None));
}

/// The fixed fields of an all-reduce entry created at `ms` with sequence number `seq`.
fn head(ms: u64, seq: u64) -> entry::Head {
    entry::Head {
        created_ms: ms,
        collective_seq_id: seq,
        op_id: seq,
        p2p_seq_id: 0,
        pg_id: 0,
        timeout_ms: 10,
        peer: entry::NO_PEER,
        op: OpType::Allreduce,
        thread: 0,
    }
}

#[test]
fn threads_record_into_rings_of_their_own_merged_in_time_order() {
    let fr = recorder(64, "/nonexistent/x_");
    let g = Arc::new(fr.register_group("gloo", "0", "d", &[], 0, 2));
    let t = [Tensor::from_vec(vec![0f32; 4])];
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let g = g.clone();
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let tr = g.record(&all_reduce(k * 100 + i, &t)).unwrap();
                    tr.started();
                    tr.finished(Ok(()));
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|h| h.join().unwrap());
    let d = fr.dump();
    assert_eq!(d.entries.len(), 40);
    let ids: Vec<u64> = d.entries.iter().map(|e| e.record_id).collect();
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    assert!(d.entries.iter().all(|e| e.state == "completed"));
    assert!(d
        .entries
        .windows(2)
        .all(|w| w[0].time_created_ns <= w[1].time_created_ns));
    for k in 0..4u64 {
        let mine: Vec<u64> = (d.entries.iter())
            .map(|e| e.collective_seq_id)
            .filter(|s| s / 100 == k)
            .collect();
        assert_eq!(
            mine,
            (0..10).map(|i| k * 100 + i).collect::<Vec<_>>(),
            "a thread's own order"
        );
    }
    // The rings of ended threads are reused, not multiplied: eight threads in all, at most
    // four at once, leave at most four rings.
    (0..4)
        .map(|_| {
            let g = g.clone();
            let t = t.clone();
            std::thread::spawn(move || {
                g.record(&all_reduce(1000, &t));
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .for_each(|h| h.join().unwrap());
    assert!(fr.rings.rings().len() <= 4);
    // Their entries are numbered on.
    let d = fr.dump();
    assert_eq!(d.entries.len(), 44);
    assert_eq!(d.entries.last().unwrap().record_id, 43);
}

#[test]
fn a_merge_keeps_no_entry_older_than_what_a_ring_lost() {
    // Ring 0 holds 2 ops at ms 1; ring 1 wrote 10 ops but only its 2 newest (ms 2) could be
    // read (it moved on while read): ops of ring 1 older than those are gone, so ring 0's
    // cannot be placed among them and are left out; the 2 kept are the 11th and 12th ops.
    let entry = |ms: u64, local_id: u64| entry::Entry {
        record_id: 0,
        local_id,
        head: head(ms, local_id),
        started_ms: None,
        completed_ms: None,
        retired: false,
        error: None,
        shapes: Vec::new(),
    };
    let snaps = || {
        vec![
            ring::Snapshot {
                count: 2,
                entries: vec![entry(1, 0), entry(1, 1)],
                truncated: false,
            },
            ring::Snapshot {
                count: 10,
                entries: vec![entry(2, 8), entry(2, 9)],
                truncated: true,
            },
        ]
    };
    let ids = |v: Vec<entry::Entry>| -> Vec<(u64, u64)> {
        v.iter().map(|e| (e.record_id, e.local_id)).collect()
    };
    assert_eq!(ids(merge(snaps(), 4)), [(10, 8), (11, 9)]);
    // Not truncated: every entry is placed, numbered up to the 12th op.
    let mut whole = snaps();
    whole[1].truncated = false;
    assert_eq!(ids(merge(whole, 4)), [(8, 0), (9, 1), (10, 8), (11, 9)]);
}

#[test]
fn dumps_read_whole_entries_while_threads_record() {
    // Each entry's fields agree with each other (op_id == collective_seq_id, p2p_seq_id names
    // the thread, the shape follows the sequence number); a torn read (a slot read while being
    // rewritten, mixing two entries) would break that.
    let fr = recorder(16, "/nonexistent/x_");
    let g = Arc::new(fr.register_group("gloo", "0", "d", &[], 0, 2));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (1..=3u64)
        .map(|k| {
            let (g, stop) = (g.clone(), stop.clone());
            std::thread::spawn(move || {
                let ts: Vec<[Tensor; 1]> = (1..=5)
                    .map(|d| [Tensor::zeros(DType::F32, &[k as usize, d])])
                    .collect();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let seq = k * 1_000_000_000 + i;
                    let rec = OpRecord {
                        op_id: seq,
                        p2p_seq_id: k,
                        ..all_reduce(seq, &ts[(seq % 5) as usize])
                    };
                    if let Some(tr) = g.record(&rec) {
                        tr.started();
                        tr.finished(Ok(()));
                    }
                }
            })
        })
        .collect();
    // At least 300 dumps, and until 200 entries were checked (writers may start late on a
    // loaded machine); 20 s at most.
    let (mut seen, mut dumps) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while (dumps < 300 || seen < 200) && std::time::Instant::now() < deadline {
        dumps += 1;
        for e in fr.dump().entries {
            let k = e.p2p_seq_id;
            assert_eq!(e.op_id, e.collective_seq_id, "{e:?}");
            assert_eq!(e.collective_seq_id / 1_000_000_000, k, "{e:?}");
            let d = (e.collective_seq_id % 5 + 1) as i64;
            assert_eq!(e.input_sizes, vec![vec![k as i64, d]], "{e:?}");
            seen += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writers.into_iter().for_each(|h| h.join().unwrap());
    assert!(seen >= 200, "only {seen} entries in {dumps} dumps");
}
