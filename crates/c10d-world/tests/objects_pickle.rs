//! Object collectives pickle as PyTorch does, checked against CPython (`python3`): what Rust
//! writes, `pickle.loads` reads; what `pickle.dumps` writes (protocols 3 to 5) Rust reads; a
//! pickle that calls a function or a class the reader does not know is refused, never run.

use c10d_world::objects::{decode, encode};
use std::io::Write;
use std::process::{Command, Stdio};

/// What a weight-sync control plane sends: names, shapes and dtype names.
type Manifest = Vec<(String, Vec<i64>, String)>;

fn manifest() -> Manifest {
    vec![
        ("layers.0.weight".into(), vec![256, 128], "float32".into()),
        ("layers.0.bias".into(), vec![256], "bfloat16".into()),
    ]
}

const PY_MANIFEST: &str =
    "[('layers.0.weight', [256, 128], 'float32'), ('layers.0.bias', [256], 'bfloat16')]";

fn python(script: &str, input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3 is needed for this test (cargo xtask test installs it)");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3: {:?}", out.status);
    out.stdout
}

#[test]
fn rust_and_cpython_read_each_others_objects() {
    let ours = encode(&manifest()).unwrap();
    let check = format!(
        "import sys, pickle\nobj = pickle.loads(sys.stdin.buffer.read())\nwant = {PY_MANIFEST}\nsys.stdout.write('ok' if [tuple(x) for x in obj] == want else repr(obj))"
    );
    assert_eq!(python(&check, &ours), b"ok");
    for proto in [3, 4, 5] {
        let dump = format!(
            "import sys, pickle\nsys.stdout.buffer.write(pickle.dumps({PY_MANIFEST}, protocol={proto}))"
        );
        let theirs: Manifest = decode(&python(&dump, b"")).unwrap();
        assert_eq!(theirs, manifest(), "protocol {proto}");
    }
}

#[test]
fn pickles_that_name_code_are_refused() {
    let cases = [
        "import os, sys, pickle\nclass P:\n    def __reduce__(self): return (os.system, ('true',))\nsys.stdout.buffer.write(pickle.dumps(P()))",
        "import sys, pickle, collections\nsys.stdout.buffer.write(pickle.dumps(collections.OrderedDict(a=1)))",
    ];
    for script in cases {
        let e = decode::<serde_pickle::Value>(&python(script, b"")).unwrap_err();
        // Our refusal, carrying serde-pickle's own (about the global it will not call).
        assert!(
            e.message()
                .contains("calls of unknown callables are refused"),
            "{e}"
        );
        assert!(e.message().to_lowercase().contains("global"), "{e}");
    }
}
