//! `c10drun` with torchrun's command line: `--standalone`, `.py` programs under python3, `-m`,
//! `--no-python`, `--max-restarts`, error files in the failure summary, log redirection,
//! `--local-ranks-filter`, `--nproc-per-node cpu`, refused options, and an agent whose store
//! goes away (killed or frozen) exiting in bounded time.

mod launcher_util;
use launcher_util::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "c10drun-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn has_python3() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("skipped: no python3 on PATH");
    }
    ok
}

const ENV_PY: &str = r#"import os
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "ROLE_NAME", "TORCHELASTIC_RUN_ID"]
print("env " + " ".join(k + "=" + os.environ.get(k, "-") for k in keys))
print("errfile " + os.environ.get("TORCHELASTIC_ERROR_FILE", "-"))
"#;

#[test]
fn standalone_runs_a_py_script_under_python3() {
    if !has_python3() {
        return;
    }
    let d = Scratch::new("standalone");
    let script = d.file("train.py", ENV_PY);
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc_per_node=2",
            "--role",
            "trainer",
            &script,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    let mut files = Vec::new();
    for r in 0..2 {
        let l = out
            .stdout_line_with(&format!("[rank {r}]: env "))
            .unwrap_or_else(|| panic!("no env line for rank {r}: {out}"));
        assert!(
            l.contains(&format!(
                "RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="
            )),
            "{l}"
        );
        assert!(
            l.contains("TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_USE_AGENT_STORE=True ROLE_NAME=trainer"),
            "{l}"
        );
        assert!(
            !l.contains("MASTER_PORT=0 ") && !l.contains("TORCHELASTIC_RUN_ID=none"),
            "{l}"
        );
        let f = out
            .stdout_line_with(&format!("[rank {r}]: errfile "))
            .unwrap();
        let f = f.rsplit(' ').next().unwrap().to_string();
        assert!(f.ends_with(&format!("/{r}/error.json")), "{f}");
        files.push(f);
    }
    assert_ne!(files[0], files[1]);
    // The temporary log directory is gone.
    assert!(!Path::new(&files[0]).parent().unwrap().exists(), "{out}");
}

#[test]
fn module_runs_python3_dash_m() {
    if !has_python3() {
        return;
    }
    let d = Scratch::new("module");
    d.file("c10d_test_mod.py", ENV_PY);
    let job = spawn(
        &c10drun(),
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "c10d_test_mod",
        ],
        &[("PYTHONPATH", d.0.to_str().unwrap())],
    );
    let out = job.finish(Duration::from_secs(60));
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("[rank 1]: env RANK=1"), "{out}");
}

#[test]
fn no_python_runs_a_py_named_program_as_given() {
    let d = Scratch::new("nopy");
    let prog = d.file("tool.py", "#!/bin/sh\necho \"shell $RANK\"\n");
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--no-python",
            &prog,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.stdout.contains("[rank 0]: shell 0") && out.stdout.contains("[rank 1]: shell 1"),
        "{out}"
    );
    if has_python3() {
        // Without --no-python the same file goes to python3, which rejects shell syntax.
        let out = run_c10drun(&["--standalone", &prog], Duration::from_secs(60));
        assert_eq!(out.code, Some(1), "{out}");
        assert!(out.stderr.contains("SyntaxError"), "{out}");
    }
}

#[test]
fn max_restarts_restarts_the_group_after_a_failure() {
    let prog = "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then echo first-try-fails; exit 3; fi; \
                if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi; \
                echo \"ok rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS\"";
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--no-python",
            "sh",
            "-c",
            prog,
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("[rank 1]: first-try-fails"), "{out}");
    for r in 0..2 {
        assert!(
            out.stdout
                .contains(&format!("[rank {r}]: ok rank={r} restart=1 max=1")),
            "{out}"
        );
    }
    assert!(
        out.summary()
            .contains("worker group failed (attempt 1 of 2); restarting it"),
        "{out}"
    );
    // No restarts left: the second failure ends the job.
    let out = run_c10drun(
        &[
            "--standalone",
            "--max-restarts",
            "1",
            "sh",
            "-c",
            "echo try $TORCHELASTIC_RESTART_COUNT; exit 4",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stdout.contains("try 0") && out.stdout.contains("try 1"),
        "{out}"
    );
    assert!(out.summary().contains("job failed:"), "{out}");
}

#[test]
fn failure_summary_shows_the_workers_own_error() {
    if !has_python3() {
        return;
    }
    // What torch's @record writes (torch.distributed.elastic.multiprocessing.errors), without torch.
    let d = Scratch::new("errfile");
    let script = d.file(
        "fail.py",
        r#"import json, os, sys, time
if os.environ["RANK"] == "1":
    tb = 'Traceback (most recent call last):\n  File "fail.py", line 9, in <module>\n    main()\nValueError: boom from rank 1\n'
    with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
        json.dump({"message": {"message": "ValueError: boom from rank 1",
                               "extraInfo": {"py_callstack": tb, "timestamp": str(int(time.time()))}}}, f)
    sys.exit(1)
time.sleep(60)
"#,
    );
    let out = run_c10drun(
        &["--standalone", "--nproc-per-node", "2", &script],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(1), "{out}");
    let s = out.summary();
    assert!(
        s.contains("rank 1 (local_rank 1, pid ") && s.contains("): exit code 1"),
        "{out}"
    );
    assert!(
        s.contains("error_file: /") && s.contains("/1/error.json"),
        "{out}"
    );
    assert!(
        s.contains("      Traceback (most recent call last):"),
        "{out}"
    );
    assert!(s.contains("      ValueError: boom from rank 1"), "{out}");

    // No error file (a Rust program): the panic message from its stderr.
    let out = run_c10drun(
        &[
            "--standalone",
            "sh",
            "-c",
            "echo noise >&2; echo \"thread 'main' panicked at src/main.rs:7:5:\" >&2; echo 'rank 0 lost its peer' >&2; \
             echo 'note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace' >&2; exit 101",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(1), "{out}");
    let s = out.summary();
    assert!(s.contains("error_file: <N/A>; panic:"), "{out}");
    assert!(
        s.contains("      thread 'main' panicked at src/main.rs:7:5:"),
        "{out}"
    );
    assert!(s.contains("      rank 0 lost its peer"), "{out}");
    let detail: Vec<&str> = s
        .lines()
        .filter(|l| l.starts_with("c10drun:     "))
        .collect();
    assert!(
        !detail
            .iter()
            .any(|l| l.contains("noise") || l.contains("RUST_BACKTRACE")),
        "{out}"
    );
}

#[test]
fn local_ranks_filter_redirects_and_tee() {
    let d = Scratch::new("logs");
    let logdir = d.0.to_str().unwrap().to_string();
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc-per-node",
            "3",
            "--local-ranks-filter",
            "0,2",
            "--log-dir",
            &logdir,
            "--redirects",
            "0:3",
            "--tee",
            "1:1",
            "sh",
            "-c",
            "echo out$RANK; echo err$RANK >&2",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    // Rank 0: redirected to files only; rank 1: filtered out; rank 2: console.
    assert!(
        !out.stdout.contains("out0") && !out.stderr.contains("err0"),
        "{out}"
    );
    assert!(
        !out.stdout.contains("out1") && !out.stderr.contains("err1"),
        "{out}"
    );
    assert!(
        out.stdout.contains("[rank 2]: out2") && out.stderr.contains("[rank 2]: err2"),
        "{out}"
    );
    let job: Vec<_> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(job.len(), 1, "{job:?}");
    let read = |lr: usize, f: &str| {
        std::fs::read_to_string(job[0].join("attempt_0").join(lr.to_string()).join(f)).ok()
    };
    assert_eq!(read(0, "stdout.log").as_deref(), Some("out0\n"));
    assert_eq!(read(0, "stderr.log").as_deref(), Some("err0\n"));
    // --tee 1:1 = stdout of local rank 1 to its file (console filtered out by --local-ranks-filter).
    assert_eq!(read(1, "stdout.log").as_deref(), Some("out1\n"));
    assert_eq!(read(1, "stderr.log"), None);
    assert_eq!(read(2, "stdout.log"), None);
}

#[test]
fn nproc_per_node_cpu_starts_one_worker_per_cpu() {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let out = run_c10drun(
        &[
            "--standalone",
            "--nproc_per_node=cpu",
            "sh",
            "-c",
            "echo w $LOCAL_WORLD_SIZE",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.contains(&format!("w {n}")))
            .count(),
        n,
        "{out}"
    );
}

#[test]
fn unsupported_or_unknown_options_are_refused_not_run() {
    let d = Scratch::new("refused");
    let marker = d.0.join("ran");
    let m = marker.to_str().unwrap();
    for (args, msg) in [
        (
            vec!["--logs-specs", "x", "touch", m],
            "torchrun's option --logs-specs is not supported by c10drun yet",
        ),
        (
            vec!["--numa_binding=node", "touch", m],
            "torchrun's option --numa-binding is not supported by c10drun yet",
        ),
        (
            vec!["--event-log-handler", "console", "touch", m],
            "only 'null' is available",
        ),
        (
            vec!["--signals-to-handle", "SIGTERM,SIGNOPE", "touch", m],
            "unknown signal 'SIGNOPE'",
        ),
        (vec!["--bogus", "touch", m], "unknown option '--bogus'"),
        (
            vec!["--nnodes", "1:4", "touch", m],
            "elastic node counts need --rdzv-backend c10d",
        ),
        (
            vec!["--standalone", "--nnodes", "1:2", "touch", m],
            "elastic node counts need --rdzv-backend c10d",
        ),
        (
            vec![
                "--nnodes",
                "1:2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "192.0.2.1:0",
                "touch",
                m,
            ],
            "port 0 (pick a free port) needs the node that hosts the store",
        ),
        (
            vec![
                "--rdzv-backend",
                "etcd",
                "--rdzv-endpoint",
                "h:1",
                "touch",
                m,
            ],
            "--rdzv-backend etcd is not supported",
        ),
        (
            vec!["-m", "--no-python", "touch", m],
            "cannot be used together",
        ),
        (
            vec!["--rdzv-conf", "nonsense=1", "touch", m],
            "--rdzv-conf: unknown key 'nonsense'",
        ),
    ] {
        let out = run_c10drun(&args, Duration::from_secs(30));
        assert_eq!(out.code, Some(1), "{args:?}: {out}");
        assert!(out.stderr.contains(msg), "{args:?}: {out}");
    }
    assert!(
        !marker.exists(),
        "a refused command line started the program"
    );
}

/// torchrun 2.15's options that c10drun used to refuse: the line prefix template, duplicated
/// filtered lines, virtual local ranks, extra forwarded signals, the shutdown timeout and the
/// local address.
#[test]
fn torchrun_2_15_logging_signal_and_rank_options() {
    let d = Scratch::new("opts");
    let logs = d.0.join("logs");
    let script = "trap 'echo got USR1 $RANK; exit 0' USR1; echo \"apple $RANK LR=$LOCAL_RANK CVD=$CUDA_VISIBLE_DEVICES\"; echo pear; echo ready >&2; while true; do sleep 0.05; done";
    let mut job = spawn(
        &c10drun(),
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "--role",
            "trainer",
            "--log-line-prefix-template",
            "${role_name}:${rank}/${local_rank}| ",
            "--duplicate-stdout-filters",
            "apple,kiwi",
            "--log-dir",
            logs.to_str().unwrap(),
            "--virtual-local-rank",
            "--signals-to-handle",
            "SIGTERM,SIGUSR1",
            "--shutdown-timeout",
            "3",
            "--local-addr",
            "10.0.0.9",
            "sh",
            "-c",
            script,
        ],
        &[("CUDA_VISIBLE_DEVICES", "4,6")],
    );
    job.wait_for_stdout("trainer:1/1| apple 1 LR=0 CVD=6", Duration::from_secs(30));
    job.wait_for_stdout("trainer:0/0| apple 0 LR=0 CVD=4", Duration::from_secs(30));
    job.wait_for_stderr("trainer:1/1| ready", Duration::from_secs(30));
    job.signal(libc::SIGUSR1);
    let out = job.finish(Duration::from_secs(30));
    assert!(out.stdout.contains("trainer:0/0| got USR1 0"), "{out}");
    assert!(out.stdout.contains("trainer:1/1| got USR1 1"), "{out}");
    let filtered: Vec<_> = walk(&logs)
        .into_iter()
        .filter(|p| p.ends_with("filtered_stdout.log"))
        .collect();
    assert_eq!(filtered.len(), 1, "{filtered:?}");
    let text = std::fs::read_to_string(&filtered[0]).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "trainer:0/0| apple 0 LR=0 CVD=4",
            "trainer:1/1| apple 1 LR=0 CVD=6"
        ],
        "{text}"
    );
}

/// As torchrun: every option also comes from `PET_<NAME>` (what Kubeflow's PyTorchJob sets),
/// flags from `PET_<NAME>=1`, and unambiguous abbreviations are taken.
#[test]
fn pet_environment_and_abbreviations() {
    let out = spawn(
        &c10drun(),
        &[
            "--max-re",
            "0",
            "sh",
            "-c",
            "echo \"R=$RANK W=$WORLD_SIZE\"",
        ],
        &[("PET_NPROC_PER_NODE", "2"), ("PET_STANDALONE", "1")],
    )
    .finish(Duration::from_secs(30));
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("[rank 1]: R=1 W=2"), "{out}");
    let out = spawn(
        &c10drun(),
        &["--nproc-per", "1", "true"],
        &[("PET_NNODES", "1:2")],
    )
    .finish(Duration::from_secs(30));
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("--nnodes 1:2: elastic node counts need"),
        "{out}"
    );
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn c10d_backend_one_node_and_rdzv_conf() {
    let out = run_c10drun(
        &[
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "--rdzv-id",
            "j1",
            "--rdzv-conf",
            "join_timeout=30,read_timeout=5,last_call_timeout=1",
            "--nproc-per-node",
            "2",
            "sh",
            "-c",
            "echo \"id=$TORCHELASTIC_RUN_ID p=$MASTER_PORT\"",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("[rank 1]: id=j1 p="), "{out}");
    assert!(!out.stdout.contains("p=0\n"), "{out}");
}

/// Starts a 2-node job on 127.0.0.1 (node 0 hosts the store); returns both jobs and the port.
fn two_node_jobs(cmd0: &str, cmd1: &str, extra: &[&str]) -> (Job, Job, String) {
    let run_id = format!("p{}-{}", std::process::id(), extra.len());
    let base = |rank: &'static str, port: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--nproc-per-node",
            "1",
            "--master-port",
            port,
            "--run-id",
            &run_id,
            "--rdzv-timeout",
            "60",
            "--stop-timeout",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let mut a0 = base("0", "0");
    a0.extend(["sh".into(), "-c".into(), cmd0.into()]);
    let a0: Vec<&str> = a0.iter().map(String::as_str).collect();
    let mut n0 = spawn_c10drun(&a0);
    let port = n0.wait_for_store_port("127.0.0.1", Duration::from_secs(60));
    let mut a1 = base("1", &port);
    a1.extend(["sh".into(), "-c".into(), cmd1.into()]);
    let a1: Vec<&str> = a1.iter().map(String::as_str).collect();
    let mut n1 = spawn_c10drun(&a1);
    n0.wait_for_stdout("[rank 0]: started", Duration::from_secs(60));
    n1.wait_for_stdout("[rank 1]: started", Duration::from_secs(60));
    (n0, n1, port)
}

#[test]
fn node_1_exits_when_the_store_host_is_killed() {
    let cmd = "echo started; exec sleep 120";
    let (n0, n1, port) = two_node_jobs(cmd, cmd, &[]);
    let t0 = Instant::now();
    n0.signal(libc::SIGKILL);
    let o1 = n1.finish(Duration::from_secs(60));
    let took = t0.elapsed();
    println!(
        "node 1 exited {:.2} s after node 0's launcher was killed",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "took {took:?}: {o1}");
    assert_eq!(o1.code, Some(1), "{o1}");
    let s = o1.summary();
    assert!(
        s.contains(&format!(
            "root cause: the store at 127.0.0.1:{port} is unreachable"
        )),
        "{o1}"
    );
    assert!(s.contains("signal SIGTERM (stopped by c10drun)"), "{o1}");
    let o0 = n0.finish(Duration::from_secs(10));
    assert_eq!(o0.code, None);
}

#[test]
fn node_1_exits_when_the_store_host_freezes() {
    // SIGSTOP keeps node 0's connections open but silent: what a cut link looks like to node 1.
    // Node 1's workers are healthy: its agent notices the silent store within ~1 s + read_timeout.
    let cmd = "echo started; exec sleep 120";
    let (n0, n1, port) = two_node_jobs(cmd, cmd, &["--rdzv-conf", "read_timeout=2"]);
    let t0 = Instant::now();
    n0.signal(libc::SIGSTOP);
    let o1 = n1.finish(Duration::from_secs(60));
    let took = t0.elapsed();
    println!(
        "node 1 (healthy workers) exited {:.2} s after node 0 froze",
        took.as_secs_f64()
    );
    n0.signal(libc::SIGKILL);
    assert!(took < Duration::from_secs(20), "took {took:?}: {o1}");
    assert_eq!(o1.code, Some(1), "{o1}");
    assert!(
        o1.summary().contains(&format!(
            "root cause: the store at 127.0.0.1:{port} is unreachable"
        )),
        "{o1}"
    );
}

#[test]
fn a_failing_node_does_not_wait_on_a_frozen_store() {
    // Node 1's worker fails on its own after node 0 froze: publishing the failure and the exit
    // barrier must not hold node 1's launcher.
    let (n0, n1, port) = two_node_jobs(
        "echo started; exec sleep 120",
        "echo started; sleep 1; exit 7",
        &["--rdzv-conf", "read_timeout=2"],
    );
    n0.signal(libc::SIGSTOP);
    let t0 = Instant::now();
    let o1 = n1.finish(Duration::from_secs(60));
    let took = t0.elapsed();
    println!(
        "node 1 (failed worker) exited {:.2} s after node 0 froze",
        took.as_secs_f64()
    );
    n0.signal(libc::SIGKILL);
    assert!(took < Duration::from_secs(20), "took {took:?}: {o1}");
    assert_eq!(o1.code, Some(1), "{o1}");
    let s = o1.summary();
    assert!(s.contains("exit code 7"), "{o1}");
    assert!(
        s.contains(&format!("the store at 127.0.0.1:{port} is unreachable")),
        "{o1}"
    );
}
