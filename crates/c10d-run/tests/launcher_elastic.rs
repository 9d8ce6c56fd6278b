//! The elastic rendezvous (`--nnodes MIN:MAX`, `--rdzv-backend c10d`) on 127.0.0.1 with shell
//! programs as workers: a node arriving at MAX waits as a spare and ends with the job; a
//! failure of live nodes counts against `--max-restarts` (and restarts with
//! `TORCHELASTIC_RESTART_COUNT` raised), past it the job fails. Joining and leaving nodes,
//! with real collectives, are tested across network namespaces in c10d-world's
//! `launcher_elastic`.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

/// `c10drun` for a node of a `nnodes` elastic job whose store is at 127.0.0.1:`port` ("0":
/// this node hosts it and picks the port), running `sh -c script`.
fn node(nnodes: &str, port: &str, extra: &[&str], script: &str) -> Job {
    let endpoint = format!("127.0.0.1:{port}");
    let args = [
        &[
            "--nnodes",
            nnodes,
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &endpoint,
            "--rdzv-id",
            "el",
            "--rdzv-conf",
            "last_call_timeout=0.5,keep_alive_interval=0.5,join_timeout=30,read_timeout=5",
            "--stop-timeout",
            "2",
        ][..],
        extra,
        &["sh", "-c", script],
    ]
    .concat();
    spawn_c10drun(&args)
}

#[test]
fn a_node_past_max_waits_as_a_spare_and_ends_with_the_job() {
    let d = tempfile::tempdir().unwrap();
    let stop = d.path().join("stop");
    let script = format!(
        "echo \"ready ws=$WORLD_SIZE rank=$RANK group=$GROUP_RANK/$GROUP_WORLD_SIZE\"; \
         while [ ! -e {} ]; do sleep 0.1; done",
        stop.display()
    );
    let mut a = node("1:2", "0", &[], &script);
    let port = a.wait_for_store_port("127.0.0.1", Duration::from_secs(30));
    a.wait_for_stdout("ready ws=1 rank=0 group=0/1", Duration::from_secs(30));
    let mut b = node("1:2", &port, &[], &script);
    b.wait_for_stdout("ready ws=2 rank=1 group=1/2", Duration::from_secs(30));
    a.wait_for_stdout("ready ws=2 rank=0 group=0/2", Duration::from_secs(30));
    let mut c = node("1:2", &port, &[], &script);
    c.wait_for_stderr("this node waits as a spare", Duration::from_secs(30));
    std::fs::write(&stop, b"").unwrap();
    let (oa, ob, oc) = (
        a.finish(Duration::from_secs(30)),
        b.finish(Duration::from_secs(30)),
        c.finish(Duration::from_secs(30)),
    );
    assert_eq!(oa.code, Some(0), "{oa}");
    assert_eq!(ob.code, Some(0), "{ob}");
    assert_eq!(oc.code, Some(0), "{oc}");
    assert!(
        oc.summary()
            .contains("the job ended before this node got a place in it"),
        "{oc}"
    );
    assert!(!oc.stdout.contains("ready"), "the spare ran workers: {oc}");
}

#[test]
fn failures_count_against_max_restarts() {
    let script =
        "echo \"attempt rc=$TORCHELASTIC_RESTART_COUNT\"; [ $TORCHELASTIC_RESTART_COUNT -ge 1 ]";
    let ok = node("1:2", "0", &["--max-restarts", "1"], script).finish(Duration::from_secs(60));
    assert_eq!(ok.code, Some(0), "{ok}");
    assert!(ok.stdout.contains("attempt rc=0"), "{ok}");
    assert!(ok.stdout.contains("attempt rc=1"), "{ok}");
    assert!(
        ok.summary()
            .contains("worker group failed (restart 1 of 1); restarting it"),
        "{ok}"
    );
    let failed = node("1:2", "0", &[], script).finish(Duration::from_secs(60));
    assert_eq!(failed.code, Some(1), "{failed}");
    assert!(failed.summary().contains("job failed"), "{failed}");
    assert!(!failed.stdout.contains("attempt rc=1"), "{failed}");
}
