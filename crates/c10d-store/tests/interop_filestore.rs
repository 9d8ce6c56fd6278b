//! Interop: a PyTorch `FileStore` and ours share one file, both directions
//! (store-protocol.md §5 and §8).
//!
//! Needs `C10D_TORCH_PYTHON` (a python with torch installed); without it each test prints
//! "skipped: C10D_TORCH_PYTHON not set" and passes. Run:
//! `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-store --test interop_filestore`
//! (or `cargo xtask interop`).

use c10d_store::{FileStore, Store};
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PY_TIMEOUT: Duration = Duration::from_secs(180);

fn torch_python() -> Option<String> {
    match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            None
        }
    }
}

/// Common prelude of every script: `path` and `ws` from argv, a short store timeout.
const PRELUDE: &str = r#"
import sys, datetime, json
import torch.distributed as dist
path = sys.argv[1]
ws = int(sys.argv[2])
def open_store():
    s = dist.FileStore(path, ws)
    s.set_timeout(datetime.timedelta(seconds=60))
    return s
"#;

/// Starts `python -c PRELUDE+body path ws`.
fn spawn_py(python: &str, body: &str, path: &Path, ws: i64) -> Child {
    Command::new(python)
        .arg("-c")
        .arg(format!("{PRELUDE}{body}"))
        .arg(path)
        .arg(ws.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn torch python")
}

/// Waits for the child (killing it after [`PY_TIMEOUT`]), asserts success, returns stdout.
fn finish(mut child: Child) -> String {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let (mut out, mut err) = (String::new(), String::new());
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(
                status.success(),
                "python failed ({status}):\nstdout:\n{out}\nstderr:\n{err}"
            );
            return out;
        }
        if start.elapsed() > PY_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("python did not finish within {PY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_py(python: &str, body: &str, path: &Path, ws: i64) -> String {
    finish(spawn_py(python, body, path, ws))
}

fn json_line(out: &str) -> String {
    out.lines().last().unwrap_or_default().trim().to_owned()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn python_writes_rust_reads() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("store");
    let out = run_py(
        &py,
        r#"
s = open_store()
s.set("a", "b")
s.add("c", 5); s.add("c", 2)
s.compare_set("cs", "", "v1"); s.compare_set("cs", "v1", "v2")
s.compare_set("absent", "x", "y")
s.set("d", "x"); s.delete_key("d")
s.set("-dash", "7")
s.set("bin", b"\x00\xff\x01")
print(s.num_keys())
"#,
        &p,
        -1,
    );
    let py_num_keys: i64 = json_line(&out).parse().unwrap();
    // Python's handle is closed now: its destructor added cleanup/ (world_size -1: file kept).
    assert!(p.exists());
    let s = FileStore::new(&p, None).unwrap();
    s.set_timeout(Duration::from_secs(30));
    assert_eq!(s.get("a").unwrap(), b"b");
    assert_eq!(s.get("c").unwrap(), b"7");
    assert_eq!(s.add("c", 0).unwrap(), 7);
    assert_eq!(s.get("cs").unwrap(), b"v2");
    assert_eq!(s.get("-dash").unwrap(), b"7");
    assert_eq!(s.get("bin").unwrap(), [0u8, 0xff, 1]);
    assert!(!s.check(&["d"]).unwrap(), "deleted by python");
    assert!(
        !s.check(&["absent"]).unwrap(),
        "compare_set on a missing key with expected != '' creates nothing"
    );
    // refcount/, /a, /c, /cs, /-dash, /bin, plus cleanup/ written when python closed.
    assert_eq!(py_num_keys, 6);
    assert_eq!(s.num_keys().unwrap(), py_num_keys + 1);
}

#[test]
fn rust_writes_python_reads() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("store");
    let s = FileStore::new(&p, None).unwrap();
    s.set("a", b"b").unwrap();
    s.add("c", 5).unwrap();
    s.add("c", -2).unwrap();
    s.compare_set("cs", b"", b"v1").unwrap();
    s.compare_set("cs", b"wrong", b"nope").unwrap();
    s.compare_set("cs", b"v1", b"v2").unwrap();
    s.set("d", b"x").unwrap();
    assert!(s.delete_key("d").unwrap());
    s.set("-dash", b"7").unwrap();
    s.set("foo", b"po").unwrap();
    s.append("foo", b"tato").unwrap();
    let ours = s.num_keys().unwrap();
    // Python opens a second handle while ours is still open.
    let out = run_py(
        &py,
        r#"
s = open_store()
r = {
  "a": s.get("a").decode(), "c": s.get("c").decode(), "cs": s.get("cs").decode(),
  "dash": s.get("-dash").decode(), "foo": s.get("foo").decode(),
  "has_d": s.check(["d"]), "add0": s.add("c", 0), "num_keys": s.num_keys(),
  "cs_missing": s.compare_set("missing", "x", "y").decode(),
}
print(json.dumps(r, sort_keys=True))
"#,
        &p,
        -1,
    );
    let want = format!(
        r#"{{"a": "b", "add0": 3, "c": "3", "cs": "v2", "cs_missing": "x", "dash": "7", "foo": "potato", "has_d": false, "num_keys": {ours}}}"#
    );
    assert_eq!(json_line(&out), want);
    assert!(!s.check(&["missing"]).unwrap());
    // Python's destructor added cleanup/.
    assert_eq!(s.num_keys().unwrap(), ours + 1);
}

/// Both sides do the §8 op sequence on their own file; the bytes are identical (and equal to
/// the observed vector), before and after the handle is closed.
#[test]
fn file_bytes_match_python_and_vector() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pp, pr) = (dir.path().join("py"), dir.path().join("rs"));
    let out = run_py(
        &py,
        r#"
s = dist.FileStore(path, ws)
s.set("a", "b"); s.add("c", 5); s.compare_set("cs", "", "v"); s.delete_key("a")
print(open(path, "rb").read().hex())
"#,
        &pp,
        2,
    );
    let py_open = json_line(&out);
    let s = FileStore::new(&pr, Some(2)).unwrap();
    s.set("a", b"b").unwrap();
    s.add("c", 5).unwrap();
    s.compare_set("cs", b"", b"v").unwrap();
    s.delete_key("a").unwrap();
    let rs_open = hex(&std::fs::read(&pr).unwrap());
    let vector = "09000000726566636f756e742f0100000031020000002f610100000062020000002f630100000035\
                  030000002f63730100000076030000002d2f6100000000";
    assert_eq!(py_open, vector);
    assert_eq!(rs_open, vector);
    drop(s);
    assert_eq!(
        hex(&std::fs::read(&pr).unwrap()),
        hex(&std::fs::read(&pp).unwrap()),
        "after close"
    );
}

/// Concurrent adds from both processes on one counter: no update is lost (the two sides'
/// `flock`s exclude each other), and each side sees the other's keys while both are open.
#[test]
fn concurrent_adds_and_handshake() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("store");
    let s = FileStore::new(&p, None).unwrap();
    s.set_timeout(Duration::from_secs(60));
    let child = spawn_py(
        &py,
        r#"
s = open_store()
s.get("go")
for _ in range(200):
    s.add("ctr", 1)
s.set("py_done", "1")
s.get("rs_done")
print(s.get("ctr").decode())
"#,
        &p,
        -1,
    );
    s.set("go", b"1").unwrap();
    for _ in 0..200 {
        s.add("ctr", 1).unwrap();
    }
    s.set("rs_done", b"1").unwrap();
    s.wait(&["py_done"]).unwrap();
    let out = finish(child);
    assert_eq!(s.get("ctr").unwrap(), b"400");
    assert_eq!(json_line(&out), "400");
}

/// world_size 2: the file is removed once both handles closed, whichever side closes last.
#[test]
fn cleanup_after_both_close() {
    let Some(py) = torch_python() else { return };
    let dir = tempfile::tempdir().unwrap();

    // Rust closes last: Rust removes the file.
    let p = dir.path().join("rust_last");
    let s = FileStore::new(&p, Some(2)).unwrap();
    run_py(&py, "s = open_store()\ns.set('py', '1')\n", &p, 2);
    assert!(p.exists(), "one of two closed");
    assert_eq!(s.get("py").unwrap(), b"1");
    drop(s);
    assert!(!p.exists(), "removed after both closed");

    // Python closes last: Python removes the file.
    let p = dir.path().join("py_last");
    let child = spawn_py(
        &py,
        "s = open_store()\ns.set('py_up', '1')\ns.get('rust_closed')\n",
        &p,
        2,
    );
    let start = Instant::now();
    while !p.exists() {
        assert!(
            start.elapsed() < PY_TIMEOUT,
            "python never created the file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = FileStore::new(&p, Some(2)).unwrap();
    s.set_timeout(Duration::from_secs(60));
    s.get("py_up").unwrap();
    s.set("rust_closed", b"1").unwrap();
    drop(s);
    finish(child);
    assert!(!p.exists(), "removed after both closed");
}
