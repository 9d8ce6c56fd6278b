//! `c10d-fr-trace` on synthetic dumps (a rank that never joined, another op, another size, a
//! rank behind, all well, a missing dump, unreadable input), and dumps of a real gloo job
//! whose rank 2 never joined the third all-reduce: written on timeout by the others, on request
//! and on `SIGUSR1` by rank 2.

mod fr_common;

use c10d_core::flight_recorder::Dump;
use fr_common::*;
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_c10d-fr-trace");

/// Writes `dumps[r]` to `<dir>/trace_<r>`, runs the analyzer on the prefix: (exit code, stdout).
fn analyze(dir: &Path, dumps: Vec<Dump>) -> (i32, String) {
    for (r, d) in dumps.iter().enumerate() {
        d.write(&dir.join(format!("trace_{r}"))).unwrap();
    }
    run(&[dir.join("trace_").to_str().unwrap()])
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap(), text)
}

fn ok3() -> Vec<c10d_core::flight_recorder::DumpEntry> {
    vec![entry(1, "all_reduce", 256), entry(2, "all_reduce", 256)]
}

#[test]
fn names_the_rank_that_never_entered_a_collective() {
    let dir = tempfile::tempdir().unwrap();
    let waiting = || {
        let mut v = ok3();
        v.push(started(entry(3, "all_reduce", 256)));
        dump("[0, 1, 2]", v)
    };
    let (code, out) = analyze(
        dir.path(),
        vec![waiting(), waiting(), dump("[0, 1, 2]", ok3())],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "group 0 (default_pg), ranks 0, 1, 2: dumps from ranks 0, 1, 2; collectives #1..#3"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "rank 2 never entered collective #3 all_reduce [256] Float, which ranks 0, 1 entered \
             (rank 0 started; rank 1 started); last collective entered by rank 2: collective #2 \
             all_reduce [256] Float (completed)"
        ),
        "{out}"
    );
    assert!(
        out.contains("rank 0: collective #3 all_reduce [256] Float is pending: started"),
        "{out}"
    );
    assert!(!out.contains("differs"), "{out}");
}

#[test]
fn names_the_rank_that_ran_another_op_or_size() {
    let dir = tempfile::tempdir().unwrap();
    let with = |op: &str, n: i64| {
        let mut v = ok3();
        v.push(entry(3, op, n));
        dump("[0, 1, 2]", v)
    };
    let dumps = vec![
        with("all_reduce", 256),
        with("broadcast", 256),
        with("all_reduce", 256),
    ];
    let (code, out) = analyze(dir.path(), dumps);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "collective #3 differs between ranks: ranks 0, 2 ran collective #3 all_reduce [256] \
             Float; rank 1 ran collective #3 broadcast [256] Float"
        ),
        "{out}"
    );
    let dumps = vec![
        with("all_reduce", 256),
        with("all_reduce", 256),
        with("all_reduce", 128),
    ];
    let (code, out) = analyze(dir.path(), dumps);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "collective #3 differs between ranks: ranks 0, 1 ran collective #3 all_reduce [256] \
             Float; rank 2 ran collective #3 all_reduce [128] Float"
        ),
        "{out}"
    );
}

#[test]
fn names_the_rank_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mut slow = ok3();
    slow.push(started(entry(3, "all_reduce", 256)));
    let mut fast = ok3();
    fast.push(entry(3, "all_reduce", 256));
    let dumps = vec![dump("[0, 1]", fast), dump("[0, 1]", slow)];
    let (code, out) = analyze(dir.path(), dumps);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "rank 1 is behind: last completed collective is #2, while rank 0 completed up to #3"
        ),
        "{out}"
    );
}

#[test]
fn says_ok_when_all_agree_and_notes_missing_dumps() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = analyze(
        dir.path(),
        vec![dump("[0, 1]", ok3()), dump("[0, 1]", ok3())],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok: every rank completed the same collectives"),
        "{out}"
    );
    // The same two dumps, read as a directory and as files.
    let (code, out) = run(&[dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("read 2 dump(s): ranks 0, 1"), "{out}");
    let (f0, f1) = (dir.path().join("trace_0"), dir.path().join("trace_1"));
    let (code, out) = run(&[f0.to_str().unwrap(), f1.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(&[f0.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("no dump from rank 1 (analysis uses the others)"),
        "{out}"
    );
    // A group of 3 with one dump missing.
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = analyze(
        dir.path(),
        vec![dump("[0, 1, 2]", ok3()), dump("[0, 1, 2]", ok3())],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no dump from rank 2"), "{out}");
}

#[test]
fn unreadable_input_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = run(&[dir.path().join("nothing_").to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no dump files"), "{out}");
    let junk = dir.path().join("trace_0");
    std::fs::write(&junk, b"junk").unwrap();
    let (code, out) = run(&[junk.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not a flight-recorder dump"), "{out}");
}

#[test]
fn real_timeout_dumps_name_the_rank_that_never_joined() {
    if std::env::var_os(CHILD).is_some() {
        return child_main();
    }
    let dir = tempfile::tempdir().unwrap();
    let prefix = run_timeout_job(
        dir.path(),
        "real_timeout_dumps_name_the_rank_that_never_joined",
    );
    for r in 0..N {
        let d = Dump::read(Path::new(&format!("{prefix}{r}"))).unwrap();
        assert_eq!(d.version, "2.10");
        assert_eq!(d.pg_config["0"].ranks, "[0, 1, 2]");
        let seqs: Vec<u64> = d.entries.iter().map(|e| e.collective_seq_id).collect();
        if r == N - 1 {
            assert_eq!(seqs, [1, 2]);
        } else {
            assert_eq!(seqs, [1, 2, 3]);
            let e = &d.entries[2];
            assert_eq!((e.state.as_str(), e.retired), ("started", true));
            assert!(e.error.as_deref().unwrap().contains("Timed out"), "{e:?}");
        }
        assert!(d.entries[..2].iter().all(|e| e.state == "completed"));
    }
    let (code, out) = run(&[&prefix]);
    println!("{out}");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "rank 2 never entered collective #3 all_reduce [256] Float, which ranks 0, 1 entered"
        ),
        "{out}"
    );
    assert!(
        out.contains("rank 0: collective #3 all_reduce [256] Float failed: "),
        "{out}"
    );
    assert!(!out.contains("differs"), "{out}");
}
