//! Restarts under `c10drun`, with a program that rendezvouses as users' programs do:
//! `init_process_group` over env:// (the agent store, `TORCHELASTIC_USE_AGENT_STORE=True`), an
//! all_reduce, a store barrier; rank 1 then exits with code 5 on every attempt but the last
//! (rank 0 waits until the launcher stops it).
//! Each attempt must rendezvous afresh: a restarted worker that found the previous attempt's
//! keys (a dead peer's address, a passed barrier) would fail or finish early. This test binary
//! re-runs itself as the workers.

mod launcher_util;
use c10d_core::Tensor;
use c10d_world as dist;
use launcher_util::*;
use std::time::Duration;

const CHILD: &str = "C10D_RESTART_CHILD";
/// The attempts rank 1 fails (so the job needs `--max-restarts` ≥ this).
const FAILS: &str = "C10D_RESTART_FAILS";
/// Set: the worker checks that the launcher's store refuses a client without TLS.
const CHECK_TLS: &str = "C10D_RESTART_CHECK_TLS";

fn child_main() {
    let attempt: u32 = std::env::var("TORCHELASTIC_RESTART_COUNT")
        .unwrap()
        .parse()
        .unwrap();
    let fails: u32 = std::env::var(FAILS).unwrap().parse().unwrap();
    if std::env::var_os(CHECK_TLS).is_some() {
        refused_without_tls();
    }
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    })
    .unwrap();
    let r = dist::get_rank(None).unwrap();
    let n = dist::get_world_size(None).unwrap();
    let t = Tensor::from_vec(vec![(r + 1) as f32; 4]);
    dist::all_reduce(&t).run().unwrap();
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), "end", n as usize, Duration::from_secs(30)).unwrap();
    let sum = t.to_vec::<f32>().unwrap()[0];
    println!("attempt {attempt} rank {r} sum {sum}");
    // Both lines are out before anyone stops.
    c10d_store::store_barrier(ds.as_ref(), "printed", n as usize, Duration::from_secs(30)).unwrap();
    if attempt < fails {
        if r == 1 {
            std::process::exit(5);
        }
        // Rank 0 waits to be stopped: a job whose workers all succeeded on one node does not
        // restart there (as under torchrun).
        std::thread::sleep(Duration::from_secs(120));
    }
    dist::destroy_process_group(None).unwrap();
}

/// A store client without TLS, at the address the launcher gave us, is refused.
fn refused_without_tls() {
    let host = std::env::var("MASTER_ADDR").unwrap();
    let port: u16 = std::env::var("MASTER_PORT").unwrap().parse().unwrap();
    // `tls: None` reads the environment: hide it for this one client (the worker is still
    // single-threaded here), then put it back.
    let vars = [
        "C10D_TLS_CERT_FILE",
        "C10D_TLS_KEY_FILE",
        "C10D_TLS_CA_FILE",
    ];
    let saved: Vec<_> = vars.iter().map(std::env::var_os).collect();
    for v in vars {
        std::env::remove_var(v);
    }
    let plain = c10d_store::TcpStore::new(
        &host,
        port,
        c10d_store::TcpStoreOptions {
            timeout: Duration::from_secs(10),
            wait_for_workers: false,
            tls: None,
            ..Default::default()
        },
    );
    for (v, x) in vars.iter().zip(saved) {
        std::env::set_var(v, x.expect("set by the test"));
    }
    let e = plain.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        e.contains("requires TLS"),
        "a plain client was not refused: {e:?}"
    );
}

fn is_child() -> bool {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return true;
    }
    false
}

/// Every attempt 0..=fails printed both ranks' correct sums.
fn assert_every_attempt_ran(out: &Output, fails: u32) {
    for a in 0..=fails {
        for r in 0..2 {
            let want = format!("attempt {a} rank {r} sum 3\n");
            assert!(out.stdout.contains(&want), "missing {want:?}: {out}");
        }
    }
}

/// Test `name` of this binary, re-run as the 2 workers of a standalone c10drun job with the
/// launcher options `opts` and the workers' `envs` (the child marker and `fails` added), until
/// it ends or `limit` passes.
fn standalone_job(
    name: &str,
    opts: &[&str],
    fails: u32,
    envs: &[(&str, &str)],
    limit: Duration,
) -> Output {
    let exe = std::env::current_exe().unwrap();
    let args = [
        &["--standalone", "--nproc-per-node", "2"][..],
        opts,
        &["--no-python"],
    ]
    .concat();
    let test = [exe.to_str().unwrap(), name, "--exact", "--nocapture"];
    let fails = fails.to_string();
    let envs = [&[(CHILD, "1"), (FAILS, fails.as_str())][..], envs].concat();
    spawn(&c10drun(), &[&args[..], &test].concat(), &envs).finish(limit)
}

#[test]
fn ten_restarts_in_a_row_each_rendezvous_afresh() {
    if is_child() {
        return;
    }
    let out = standalone_job(
        "ten_restarts_in_a_row_each_rendezvous_afresh",
        &["--max-restarts", "10"],
        10,
        &[],
        Duration::from_secs(240),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert_every_attempt_ran(&out, 10);
    assert!(
        out.summary()
            .contains("worker group failed (attempt 10 of 11); restarting it"),
        "{out}"
    );
}

/// Two nodes (one worker each): the restarted attempts' store is hosted by node 0 and its port
/// reaches node 1 through the agent store.
#[test]
fn restarts_on_two_nodes_share_the_hosts_fresh_store() {
    if is_child() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let name = "restarts_on_two_nodes_share_the_hosts_fresh_store";
    let node = |rank: &str, port: &str| {
        spawn(
            &c10drun(),
            &[
                "--nnodes",
                "2",
                "--node-rank",
                rank,
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                "--max-restarts",
                "3",
                "--no-python",
                exe,
                name,
                "--exact",
                "--nocapture",
            ],
            &[(CHILD, "1"), (FAILS, "3")],
        )
    };
    let mut host = node("0", "0");
    let port = host.wait_for_store_port("127.0.0.1", Duration::from_secs(30));
    let other = node("1", &port);
    let (a, b) = (
        host.finish(Duration::from_secs(180)),
        other.finish(Duration::from_secs(180)),
    );
    assert_eq!(a.code, Some(0), "{a}");
    assert_eq!(b.code, Some(0), "{b}");
    let both = Output {
        code: Some(0),
        stdout: a.stdout.clone() + &b.stdout,
        stderr: a.stderr.clone() + &b.stderr,
    };
    assert_every_attempt_ran(&both, 3);
}

/// `--auth-secret-file`: the launcher's store, the workers' store clients and their gloo mesh
/// all authenticate with the job's secret, and the job runs as without it; a secret file other
/// users can read is refused before anything starts.
#[test]
fn a_job_with_a_secret_file_authenticates_end_to_end() {
    if is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    c10d_store::AuthSecret::create_file(&secret).unwrap();
    let run = || {
        standalone_job(
            "a_job_with_a_secret_file_authenticates_end_to_end",
            &["--auth-secret-file", secret.to_str().unwrap()],
            0,
            &[],
            Duration::from_secs(120),
        )
    };
    let out = run();
    assert_eq!(out.code, Some(0), "{out}");
    assert_every_attempt_ran(&out, 0);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run();
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("chmod 600"), "{out}");
}

/// TLS (`C10D_TLS_*` in the launcher's environment): the launcher's store, the workers' store
/// clients and their mesh (TCP only, so TLS applies between the ranks too) all use it, a restart
/// included, and a plain client is refused by the store the workers use. (It caught a TLS
/// session holding the peer's first frame, read together with the set-up's last reply, that
/// the engine never read: every op timed out.)
#[test]
fn a_job_over_tls_runs_and_restarts() {
    if is_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = c10d_store::tls::create_job_files(&dir.path().join("tls")).unwrap();
    let (cert, key, ca) = (
        f.cert.display().to_string(),
        f.key.display().to_string(),
        f.ca.display().to_string(),
    );
    let out = standalone_job(
        "a_job_over_tls_runs_and_restarts",
        &["--max-restarts", "1"],
        1,
        &[
            (CHECK_TLS, "1"),
            ("C10D_GLOO_TCP_ONLY", "1"),
            ("C10D_TLS_CERT_FILE", &cert),
            ("C10D_TLS_KEY_FILE", &key),
            ("C10D_TLS_CA_FILE", &ca),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert_every_attempt_ran(&out, 1);
}
