//! The elastic rendezvous (`--nnodes MIN:MAX`, `--rdzv-backend c10d`) on 127.0.0.1 with shell
//! programs as workers: a node arriving at MAX waits as a spare and ends with the job; a
//! failure of live nodes counts against `--max-restarts` (and restarts with
//! `TORCHELASTIC_RESTART_COUNT` raised), past it the job fails. Joining and leaving nodes,
//! with real collectives, are tested across network namespaces in `launcher_elastic_world`.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

/// `c10drun` for a node of a `nnodes` elastic job whose store is at 127.0.0.1:`port` ("0":
/// this node hosts it and picks the port), running `sh -c script`.
fn node(nnodes: &str, port: &str, extra: &[&str], script: &str) -> Job {
    let extra = [&["--nnodes", nnodes][..], extra].concat();
    spawn_c10drun(&refs(&node_args(port, &extra, script)))
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The command line of [`node`] (`extra` must give `--nnodes`).
fn node_args(port: &str, extra: &[&str], script: &str) -> Vec<String> {
    let endpoint = format!("127.0.0.1:{port}");
    let args = [
        &[
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
    args.iter().map(|a| a.to_string()).collect()
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

/// Two live nodes, a worker fails on one: both agents count it (`TORCHELASTIC_RESTART_COUNT`
/// 1 on both sides afterwards, one restart in each summary), and the restarted round runs.
#[test]
fn a_failure_on_one_of_two_live_nodes_counts_on_both() {
    // Rank 0 takes 1.5 s to stop, so its agent looks at the failure well after the failing
    // node's agent decided: both must still call it a failure.
    let script = "echo \"attempt rc=$TORCHELASTIC_RESTART_COUNT rank=$RANK ws=$WORLD_SIZE\"; \
                  if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then \
                    if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; \
                    trap 'sleep 1.5; exit 0' TERM; sleep 30 & wait; fi";
    let extra = ["--max-restarts", "1", "--nnodes", "2:3"];
    let args = |port: &str| node_args(port, &extra, script);
    let mut a = spawn_c10drun(&refs(&args("0")));
    let port = a.wait_for_store_port("127.0.0.1", Duration::from_secs(30));
    let b = spawn_c10drun(&refs(&args(&port)));
    let (oa, ob) = (
        a.finish(Duration::from_secs(90)),
        b.finish(Duration::from_secs(90)),
    );
    // Node ranks follow arrival at the rendezvous, which either node may reach first.
    for r in 0..2 {
        let line = format!("attempt rc=1 rank={r} ws=2");
        assert!(
            oa.stdout.contains(&line) || ob.stdout.contains(&line),
            "no node restarted rank {r}:\n{oa}\n{ob}"
        );
    }
    for o in [&oa, &ob] {
        assert_eq!(o.code, Some(0), "{o}");
        assert!(o.stdout.contains("attempt rc=1 rank="), "{o}");
        assert!(
            o.summary()
                .contains("worker group failed (restart 1 of 1); restarting it"),
            "{o}"
        );
    }
}
