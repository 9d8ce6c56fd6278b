//! vLLM's pickled `ncclUniqueId` against CPython itself: the bytes CPython writes for vLLM's
//! class (defined as vLLM defines it, in a module of the same path under a temporary directory,
//! since vLLM cannot be installed here) decode to the id at protocols 3, 4 and 5; our encoding
//! is byte-identical to CPython's protocol-4 pickle, and CPython loads it back into the same id.

use c10d_nccl::pickled_id::{decode, encode, ID_BYTES, VLLM_MODULE};
use std::io::Write;
use std::process::{Command, Stdio};

/// vLLM's definition (`pynccl_wrapper.py`).
const CLASS: &str = "import ctypes\nclass ncclUniqueId(ctypes.Structure):\n    _fields_ = [(\"internal\", ctypes.c_byte * 128)]\n";

/// A directory holding `vllm/.../pynccl_wrapper.py`, to put on `PYTHONPATH`.
fn stand_in() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut path = dir.path().to_path_buf();
    let parts: Vec<&str> = VLLM_MODULE.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        path.push(p);
        std::fs::create_dir_all(&path).expect("package dir");
        std::fs::write(path.join("__init__.py"), "").expect("__init__");
    }
    std::fs::write(path.join(format!("{}.py", parts[parts.len() - 1])), CLASS).expect("module");
    dir
}

/// Runs `script` under python3 with the stand-in on the path, `input` on stdin; its stdout.
fn python(dir: &tempfile::TempDir, script: &str, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 is needed for this test (cargo xtask test installs it)");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().expect("python3");
    assert!(out.status.success(), "python3 failed: {:?}", out.status);
    out.stdout
}

fn id() -> [u8; ID_BYTES] {
    std::array::from_fn(|i| (i * 101 % 256) as u8)
}

#[test]
fn cpython_pickles_decode_and_ours_are_cpythons() {
    let dir = stand_in();
    let make = format!(
        "import sys, pickle\nfrom {VLLM_MODULE} import ncclUniqueId\nraw = sys.stdin.buffer.read()\nu = ncclUniqueId()\nfor i, b in enumerate(raw): u.internal[i] = b - 256 if b > 127 else b\nproto = int(sys.argv[1]) if len(sys.argv) > 1 else 4\nsys.stdout.buffer.write(pickle.dumps(u, protocol=proto))\n"
    );
    for proto in [3, 4, 5] {
        let script = format!("import sys; sys.argv = ['x', '{proto}']\n{make}");
        let bytes = python(&dir, &script, &id());
        assert_eq!(decode(&bytes).unwrap(), id(), "protocol {proto}");
        if proto == 4 {
            assert_eq!(bytes, encode(&id()), "our encoding differs from CPython's");
        }
    }
    let load = format!(
        "import sys, pickle\nfrom {VLLM_MODULE} import ncclUniqueId\nu = pickle.loads(sys.stdin.buffer.read())\nassert type(u) is ncclUniqueId\nsys.stdout.buffer.write(bytes(b % 256 for b in u.internal))\n"
    );
    assert_eq!(python(&dir, &load, &encode(&id())), id().to_vec());
}
