//! Groups that span hosts run the two-level all-reduce: two network namespaces act as two
//! hosts (see `netns`), two `c10d-bench` ranks in each (env:// rendezvous on host 0), every
//! element of every result checked. Rank 0 must report the host map it learnt ("two-level
//! all_reduce over 2 hosts of 2 ranks"), so the test fails if the group silently stayed on the
//! flat algorithms. Needs root and `ip netns`; skips with a printed reason otherwise.

use c10d_testing::netns;
use netns::Hosts;
use std::process::Output;

const BENCH: &str = env!("CARGO_BIN_EXE_c10d-bench");

/// Runs a 4-rank `c10d-bench` job (ranks 0, 1 on host 0; 2, 3 on host 1) with `args`; every
/// rank's output. The store listens on host 0's private address: a fixed port is safe there,
/// as the namespace exists only for this test.
fn job(hosts: &Hosts, port: u16, args: &[&str], env: &[(&str, &str)]) -> Vec<Output> {
    let kids: Vec<_> = (0..4)
        .map(|r| {
            hosts
                .rank_command(r / 2, BENCH, r, 4, 2, port)
                .args(args)
                .args(["--timeout", "60"])
                .env("RUST_LOG", "c10d_gloo=info")
                .envs(env.iter().copied())
                .spawn()
                .expect("spawn c10d-bench")
        })
        .collect();
    kids.into_iter()
        .map(|k| k.wait_with_output().expect("wait for c10d-bench"))
        .collect()
}

/// Every rank succeeded, every element was right, and rank 0 logged `host_map`.
fn check(outs: &[Output], what: &str, host_map: &str) {
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "{what}: rank {r} failed ({}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let table = String::from_utf8_lossy(&outs[0].stdout);
    let rows: Vec<&str> = table.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(!rows.is_empty(), "{what}: no results:\n{table}");
    for row in rows {
        assert_eq!(
            row.split_whitespace().last(),
            Some("0"),
            "{what}: wrong elements: {row}"
        );
    }
    let log = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        log.contains(host_map),
        "{what}: rank 0 did not learn the host map:\n{log}"
    );
}

#[test]
fn all_reduce_across_two_hosts_is_two_level_and_exact() {
    let Some(hosts) = Hosts::or_skip("twolevel", 3) else {
        return;
    };
    let sizes = ["-b", "4K", "-e", "2M", "-f", "8", "-n", "3", "-w", "1"];
    let cma = "two-level all_reduce over 2 hosts of 2 ranks (cross-memory attach inside hosts)";
    let sum = [&["all_reduce"][..], &sizes].concat();
    check(&job(&hosts, 29_500, &sum, &[]), "float sum", cma);
    let avg = [&["all_reduce", "-d", "double", "-o", "avg"][..], &sizes].concat();
    check(&job(&hosts, 29_501, &avg, &[]), "double avg", cma);
    // One rank without cross-memory attach: the hosts' phases go over sockets.
    let max = [&["all_reduce", "-d", "int32", "-o", "max"][..], &sizes].concat();
    let sockets = "two-level all_reduce over 2 hosts of 2 ranks\n";
    let outs = job(&hosts, 29_502, &max, &[("C10D_GLOO_CMA", "0")]);
    check(&outs, "int32 max, sockets inside hosts", sockets);
}

#[test]
fn all_reduce_across_two_hosts_pipelined_odd_sizes_are_exact() {
    // Sizes of several pipeline chunks per segment and odd element counts (the segments,
    // chunks and pieces differ by one element), on two dtypes and ops; every element checked.
    let Some(hosts) = Hosts::or_skip("twolevelodd", 5) else {
        return;
    };
    let cma = "two-level all_reduce over 2 hosts of 2 ranks (cross-memory attach inside hosts)";
    let iters = ["-n", "2", "-w", "1"];
    let float = ["all_reduce", "-b", "9000004", "-e", "9000004"];
    let sum = [&float[..], &iters].concat();
    check(&job(&hosts, 29_505, &sum, &[]), "float sum, odd count", cma);
    let bf16 = [
        "all_reduce",
        "-d",
        "bfloat16",
        "-o",
        "max",
        "-b",
        "3000002",
        "-e",
        "9000006",
    ];
    let max = [&bf16[..], &["-f", "3"], &iters].concat();
    check(
        &job(&hosts, 29_506, &max, &[]),
        "bfloat16 max, odd counts",
        cma,
    );
}

#[test]
fn all_reduce_across_two_hosts_over_tls_is_exact() {
    // The job's store and every TCP connection between the hosts are encrypted (C10D_TLS_*);
    // inside a host the ranks still share memory.
    let Some(hosts) = Hosts::or_skip("twoleveltls", 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f = c10d_store::tls::create_job_files(dir.path()).unwrap();
    let (cert, key, ca) = (
        f.cert.display().to_string(),
        f.key.display().to_string(),
        f.ca.display().to_string(),
    );
    let env = [
        ("C10D_TLS_CERT_FILE", cert.as_str()),
        ("C10D_TLS_KEY_FILE", key.as_str()),
        ("C10D_TLS_CA_FILE", ca.as_str()),
    ];
    let args = [
        "all_reduce",
        "-b",
        "4K",
        "-e",
        "4M",
        "-f",
        "32",
        "-n",
        "3",
        "-w",
        "1",
    ];
    let cma = "two-level all_reduce over 2 hosts of 2 ranks (cross-memory attach inside hosts)";
    check(&job(&hosts, 29_503, &args, &env), "float sum over TLS", cma);
    // A rank without the files cannot join: it is refused by the store at once (the
    // others, left waiting for it, are stopped).
    let out = plain_rank_fails(&hosts, 29_504, &args, &env);
    assert!(!out.status.success(), "a rank without TLS joined");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requires TLS"), "rank 3 without TLS:\n{err}");
}

/// As [`job`] with rank 3 started without the TLS variables; rank 3's output (the other
/// ranks are killed once it ended).
fn plain_rank_fails(hosts: &Hosts, port: u16, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut kids: Vec<_> = (0..4)
        .map(|r| {
            let mut c = hosts.rank_command(r / 2, BENCH, r, 4, 2, port);
            c.args(args).args(["--timeout", "30"]);
            if r != 3 {
                c.envs(env.iter().copied());
            }
            c.spawn().expect("spawn c10d-bench")
        })
        .collect();
    let out = kids
        .pop()
        .unwrap()
        .wait_with_output()
        .expect("wait for rank 3");
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    out
}
