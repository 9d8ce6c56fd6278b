//! The flight recorder through real gloo jobs (ranks as threads, one process-wide recorder):
//! states, sequence numbers and sizes of what ran, and a timed-out op with its error and dump.

mod common;

use c10d_core::flight_recorder::{Dump, DumpEntry};
use c10d_core::*;
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use common::*;
use std::time::Duration;

fn named(name: &str) -> GlooOptions {
    GlooOptions {
        group_name: name.into(),
        group_desc: format!("{name}-desc"),
        ..opts()
    }
}

/// This rank's entries in the process's recorder.
fn entries_of(pg: &ProcessGroupGloo) -> Vec<DumpEntry> {
    let id = pg.flight_recorder().pg_id();
    FlightRecorder::global()
        .unwrap()
        .dump()
        .entries
        .into_iter()
        .filter(|e| e.pg_id == id)
        .collect()
}

#[test]
fn records_what_ran_with_pytorchs_names_and_sequence_numbers() {
    let entries = run_world(2, named("fr-ran"), |r, pg| {
        let t = Tensor::from_vec(vec![1f32; 256]);
        pg.all_reduce(std::slice::from_ref(&t), &Default::default())
            .unwrap()
            .wait()
            .unwrap();
        let x = Tensor::from_vec(vec![r as i64; 3]);
        let w = if r == 0 {
            pg.send(&[x], 1, 7).unwrap()
        } else {
            pg.recv(&[x], 0, 7).unwrap()
        };
        w.wait().unwrap();
        let outs: Vec<Tensor> = (0..2).map(|_| Tensor::zeros(DType::F32, &[4, 2])).collect();
        let ins = [Tensor::zeros(DType::F32, &[4, 2])];
        pg.all_gather(&[outs], &ins, &Default::default())
            .unwrap()
            .wait()
            .unwrap();
        pg.barrier(&Default::default()).unwrap().wait().unwrap();
        entries_of(&pg)
    });
    for (r, es) in entries.iter().enumerate() {
        let names: Vec<&str> = es.iter().map(|e| e.profiling_name.as_str()).collect();
        let p2p = if r == 0 {
            "gloo:send 0->1"
        } else {
            "gloo:recv 1<-0"
        };
        assert_eq!(
            names,
            ["gloo:all_reduce", p2p, "gloo:all_gather", "gloo:barrier"]
        );
        let seqs: Vec<(u64, u64, u64)> = es
            .iter()
            .map(|e| (e.collective_seq_id, e.p2p_seq_id, e.op_id))
            .collect();
        assert_eq!(seqs, [(1, 0, 1), (1, 1, 2), (2, 1, 3), (3, 1, 4)]);
        let p2p: Vec<bool> = es.iter().map(|e| e.is_p2p).collect();
        assert_eq!(p2p, [false, true, false, false]);
        for e in es {
            assert_eq!(e.state, "completed", "{e:?}");
            assert!(e.retired && e.error.is_none());
            assert_eq!(e.process_group, ("fr-ran".into(), "fr-ran-desc".into()));
            assert_eq!(e.timeout_ms, 60_000);
            let (s, c) = (e.time_discovered_started_ns, e.time_discovered_completed_ns);
            assert!(e.time_created_ns <= s.unwrap() && s.unwrap() <= c.unwrap());
        }
        assert_eq!(es[0].input_sizes, vec![vec![256]]);
        assert_eq!(es[0].output_sizes, vec![vec![256]]);
        assert_eq!(es[0].input_dtypes, ["Float"]);
        assert_eq!(es[1].input_sizes, vec![vec![3]]);
        assert_eq!(es[1].output_dtypes, ["Long"]);
        assert_eq!(es[2].input_sizes, vec![vec![4, 2]]);
        assert_eq!(es[2].output_sizes, vec![vec![4, 2], vec![4, 2]]);
        assert!(es[3].input_sizes.is_empty());
    }
    let d = FlightRecorder::global().unwrap().dump();
    assert_eq!(d.pg_config["fr-ran"].ranks, "[0, 1]");
    assert_eq!(d.pg_config["fr-ran"].desc, "fr-ran-desc");
}

#[test]
fn a_timed_out_op_is_retired_with_its_error_and_dumped() {
    let dir = std::env::temp_dir().join(format!("c10d-gloo-fr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let fr = FlightRecorder::global().unwrap();
    fr.set_dump_prefix(format!("{}/rank_", dir.display()));
    let pgs = make_world(2, named("fr-timeout"));
    let (p0, p1) = (pgs[0].clone(), pgs[1].clone());
    let ok = Tensor::from_vec(vec![1f32; 8]);
    let both: Vec<_> = [&p0, &p1]
        .iter()
        .map(|pg| {
            pg.all_reduce(&[ok.deep_clone().unwrap()], &Default::default())
                .unwrap()
        })
        .collect();
    both.iter().for_each(|w| w.wait().unwrap());
    // Rank 1 never joins the second all-reduce: rank 0's times out.
    let opts = AllreduceOptions {
        timeout: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let err = p0
        .all_reduce(&[Tensor::from_vec(vec![1f32; 8])], &opts)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(err.to_string().contains("Timed out"), "{err}");
    let es = entries_of(&p0);
    assert_eq!(es.len(), 2);
    assert_eq!(es[0].state, "completed");
    let e = &es[1];
    assert_eq!((e.collective_seq_id, e.state.as_str()), (2, "started"));
    assert!(e.retired);
    assert_eq!(e.time_discovered_completed_ns, None);
    assert_eq!(e.timeout_ms, 300);
    assert_eq!(e.error.as_deref(), Some(err.message()));
    let d = FlightRecorder::global().unwrap().dump();
    let s = d.pg_status[&p0.flight_recorder().pg_id().to_string()];
    assert_eq!(
        (
            s.last_enqueued_collective,
            s.last_started_collective,
            s.last_completed_collective
        ),
        (2, 2, 1)
    );
    // The dump was written before the error reached us (both ranks share this process, so the
    // file carries the rank registered last).
    let path = dir.join(format!("rank_{}", fr.rank().unwrap()));
    let dumped = Dump::read(&path).unwrap();
    let failed = dumped
        .entries
        .iter()
        .find(|x| x.record_id == e.record_id)
        .expect("the failed op is in the dump");
    assert_eq!(failed.error, e.error);
    drop((p0, p1, pgs));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A blocking collective that finds the engine free runs at once on the caller's thread and is
/// recorded at its first wait for a peer, not at submission: it must still be in a dump taken
/// while it hangs, and an op that never waits (in a group of one) must be recorded when it
/// ends.
#[test]
fn blocking_ops_run_at_once_are_recorded_before_they_can_hang() {
    let pgs = make_world(2, named("fr-blocking"));
    let blocking = |timeout: Option<Duration>| AllreduceOptions {
        async_op: false,
        timeout,
        ..Default::default()
    };
    run_on(pgs.clone(), move |_, pg| {
        let t = Tensor::from_vec(vec![1f32; 256]);
        let w = pg.all_reduce(std::slice::from_ref(&t), &blocking(None));
        w.unwrap().wait().unwrap();
        let b = BroadcastOptions {
            async_op: false,
            ..Default::default()
        };
        pg.broadcast(&[t], &b).unwrap().wait().unwrap();
    });
    // Rank 1 never joins: rank 0's third op hangs until its timeout.
    let p0 = pgs[0].clone();
    let hung = std::thread::spawn(move || {
        let t = Tensor::from_vec(vec![1f32; 256]);
        let opts = blocking(Some(Duration::from_secs(3)));
        p0.all_reduce(&[t], &opts).unwrap().wait().unwrap_err()
    });
    let third = |pg: &ProcessGroupGloo| {
        entries_of(pg)
            .into_iter()
            .find(|e| e.collective_seq_id == 3)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let seen = loop {
        match third(&pgs[0]) {
            Some(e) => break e,
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            None => panic!("the hanging op is not in the dump"),
        }
    };
    assert_eq!((seen.state.as_str(), seen.retired), ("started", false));
    let err = hung.join().unwrap();
    assert!(err.to_string().contains("Timed out"), "{err}");
    // The third op ran on another thread: entries of different threads created in the same
    // clock tick are merged by ring, not by op (see the recorder's docs), so order by op here.
    let mut es = entries_of(&pgs[0]);
    es.sort_by_key(|e| e.op_id);
    let ops: Vec<(&str, &str)> = es
        .iter()
        .map(|e| (e.profiling_name.as_str(), e.state.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("gloo:all_reduce", "completed"),
            ("gloo:broadcast", "completed"),
            ("gloo:all_reduce", "started"),
        ]
    );
    assert!(es[2].retired && es[2].error.is_some());
    assert_eq!(entries_of(&pgs[1]).len(), 2);
    let alone = make_world(1, named("fr-alone")).remove(0);
    for _ in 0..10 {
        let t = Tensor::from_vec(vec![1f32; 4]);
        alone
            .all_reduce(&[t], &blocking(None))
            .unwrap()
            .wait()
            .unwrap();
    }
    let es = entries_of(&alone);
    assert_eq!(es.len(), 10);
    assert!(es.iter().all(|e| e.state == "completed"), "{es:?}");
}
