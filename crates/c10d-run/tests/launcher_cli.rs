//! End-to-end tests of the `c10drun` launcher with shell programs as workers: environment,
//! output prefixes, the store it hosts, failure summaries, SIGTERM→SIGKILL escalation, signal
//! forwarding and two-node runs on 127.0.0.1.

mod launcher_util;
use launcher_util::*;
use std::time::{Duration, Instant};

#[test]
fn sets_torchrun_environment_and_prefixes_lines() {
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            "0",
            "--run-id",
            "job7",
            "sh",
            "-c",
            "echo \"env R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE RR=$ROLE_RANK A=$MASTER_ADDR P=$MASTER_PORT ID=$TORCHELASTIC_RUN_ID S=$TORCHELASTIC_USE_AGENT_STORE\"; echo \"to stderr $RANK\" >&2; printf 'no newline %s' $RANK",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    let mut port = None;
    for r in 0..3 {
        let line = out
            .stdout_line_with(&format!("[rank {r}]: env "))
            .unwrap_or_else(|| panic!("no env line for rank {r}: {out}"));
        let expect = format!("R={r} L={r} W=3 LW=3 G=0 GW=1 RR={r} A=127.0.0.1 P=");
        assert!(line.contains(&expect), "rank {r}: {line}");
        assert!(line.ends_with("ID=job7 S=True"), "rank {r}: {line}");
        let p: u16 = line
            .split("P=")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_ne!(p, 0);
        assert!(
            port.is_none() || port == Some(p),
            "ranks disagree on MASTER_PORT"
        );
        port = Some(p);
        assert!(
            out.stderr.contains(&format!("[rank {r}]: to stderr {r}\n")),
            "{out}"
        );
        assert!(
            out.stdout
                .contains(&format!("[rank {r}]: no newline {r}\n")),
            "{out}"
        );
    }
    // --master-port 0: the chosen port is announced.
    assert!(
        out.stderr
            .contains(&format!("store listening on 127.0.0.1:{}", port.unwrap())),
        "{out}"
    );
}

#[test]
fn store_is_served_while_workers_run() {
    // Each worker connects to MASTER_PORT with bash's /dev/tcp: succeeds only if the launcher
    // hosts a listening store there.
    if !std::path::Path::new("/bin/bash").exists() {
        println!("skipped: no /bin/bash");
        return;
    }
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "bash",
            "-c",
            "exec 3<>/dev/tcp/$MASTER_ADDR/$MASTER_PORT && echo connected",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.stdout.contains("[rank 0]: connected") && out.stdout.contains("[rank 1]: connected"),
        "{out}"
    );
}

#[test]
fn no_prefix_option_passes_lines_unchanged() {
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--no-prefix",
            "sh",
            "-c",
            "echo plain$RANK",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.stdout.lines().any(|l| l == "plain0") && out.stdout.lines().any(|l| l == "plain1"),
        "{out}"
    );
}

#[test]
fn failing_rank_stops_the_others_and_is_named_with_its_exit_code() {
    let t0 = Instant::now();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            "0",
            "sh",
            "-c",
            "if [ \"$RANK\" = 1 ]; then sleep 0.3; echo dying; exit 3; fi; echo waiting; exec sleep 120",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "survivors were not stopped promptly"
    );
    assert!(out.stdout.contains("[rank 1]: dying"), "{out}");
    let summary = out.summary();
    assert!(
        summary.contains("root cause (first observed failure):"),
        "{out}"
    );
    assert!(summary.contains("rank 1 (local_rank 1, pid "), "{out}");
    assert!(summary.contains("): exit code 3"), "{out}");
    // The survivors ended by the launcher's SIGTERM, and say so.
    for r in [0, 2] {
        assert!(
            summary.contains(&format!("rank {r} (local_rank {r}, pid "))
                && summary.contains("signal SIGTERM (stopped by c10drun)"),
            "rank {r} not reported as stopped: {out}"
        );
    }
}

#[test]
fn rank_killed_by_a_signal_is_named_with_the_signal() {
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "sh",
            "-c",
            "if [ \"$RANK\" = 0 ]; then kill -KILL $$; fi; exec sleep 120",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(out.code, Some(1), "{out}");
    let summary = out.summary();
    assert!(
        summary.contains("rank 0 (local_rank 0, pid ") && summary.contains("): signal SIGKILL"),
        "{out}"
    );
    assert!(summary.contains("rank 1 (local_rank 1"), "{out}");
}

#[test]
fn workers_ignoring_sigterm_get_sigkill_after_the_stop_timeout() {
    let t0 = Instant::now();
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--stop-timeout",
            "1",
            "sh",
            "-c",
            "if [ \"$RANK\" = 1 ]; then sleep 0.3; exit 9; fi; trap '' TERM; sleep 120",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert!(
        out.stderr
            .contains("still running 1.0 s after SIGTERM; sending SIGKILL"),
        "{out}"
    );
    let summary = out.summary();
    assert!(summary.contains("exit code 9"), "{out}");
    assert!(
        summary.contains("rank 0 (local_rank 0, pid ")
            && summary.contains("signal SIGKILL (stopped by c10drun)"),
        "{out}"
    );
}

#[test]
fn sigterm_to_the_launcher_is_forwarded_to_the_workers() {
    let mut job = spawn_c10drun(&[
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "sh",
        "-c",
        "echo ready; exec sleep 120",
    ]);
    job.wait_for_stdout("[rank 0]: ready", Duration::from_secs(60));
    job.wait_for_stdout("[rank 1]: ready", Duration::from_secs(60));
    job.signal(libc::SIGTERM);
    let out = job.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(128 + libc::SIGTERM), "{out}");
    assert!(
        out.stderr
            .contains("received SIGTERM, forwarding it to the workers"),
        "{out}"
    );
    assert!(
        out.summary()
            .contains("root cause: c10drun received SIGTERM"),
        "{out}"
    );
}

#[test]
fn missing_program_is_a_clear_error() {
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "/nonexistent/c10d-program",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("cannot start rank 0 (/nonexistent/c10d-program)"),
        "{out}"
    );
}

#[test]
fn bad_arguments_are_rejected() {
    let out = run_c10drun(
        &[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-port",
            "0",
            "true",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("--master-port 0 (pick a free port) only works on node 0"),
        "{out}"
    );
    let out = run_c10drun(
        &["--nnodes", "2", "--node-rank", "2", "true"],
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("--node-rank 2 is out of range for --nnodes 2"),
        "{out}"
    );
    let out = run_c10drun(&["--nproc-per-node", "0", "true"], Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out}");
}

/// Starts node 0 with `--master-port 0`, reads the announced port, then starts node 1.
fn two_nodes(cmd: &str, extra: &[&str]) -> (Output, Output) {
    let run_id = format!("t{}", std::process::id());
    let mut a0 = vec![
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "--run-id",
        &run_id,
        "--rdzv-timeout",
        "60",
    ];
    a0.extend_from_slice(extra);
    a0.extend_from_slice(&["sh", "-c", cmd]);
    let mut n0 = spawn_c10drun(&a0);
    let port = n0.wait_for_store_port("127.0.0.1", Duration::from_secs(60));
    let mut a1 = vec![
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--run-id",
        &run_id,
        "--rdzv-timeout",
        "60",
    ];
    a1.extend_from_slice(extra);
    a1.extend_from_slice(&["sh", "-c", cmd]);
    let n1 = spawn_c10drun(&a1);
    let o1 = n1.finish(Duration::from_secs(120));
    let o0 = n0.finish(Duration::from_secs(120));
    (o0, o1)
}

#[test]
fn two_nodes_share_one_store_and_number_ranks_globally() {
    let (o0, o1) = two_nodes(
        "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE G=$GROUP_RANK GW=$GROUP_WORLD_SIZE\"",
        &[],
    );
    assert_eq!(o0.code, Some(0), "node 0: {o0}");
    assert_eq!(o1.code, Some(0), "node 1: {o1}");
    for (r, o) in [(0, &o0), (1, &o0), (2, &o1), (3, &o1)] {
        let expect = format!("[rank {r}]: R={r} L={} W=4 G={} GW=2", r % 2, r / 2);
        assert!(o.stdout.contains(&expect), "missing '{expect}': {o}");
    }
}

#[test]
fn a_failure_on_one_node_stops_the_other_node() {
    let (o0, o1) = two_nodes(
        "if [ \"$RANK\" = 3 ]; then sleep 0.5; exit 5; fi; exec sleep 120",
        &["--stop-timeout", "5"],
    );
    assert_eq!(o1.code, Some(1), "node 1: {o1}");
    assert!(
        o1.summary().contains("rank 3 (local_rank 1, pid ") && o1.summary().contains("exit code 5"),
        "{o1}"
    );
    assert_eq!(o0.code, Some(1), "node 0: {o0}");
    assert!(
        o0.summary()
            .contains("root cause: another node failed: rank 3 on node 1: exit code 5"),
        "{o0}"
    );
}
