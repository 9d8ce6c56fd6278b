//! End-to-end test of the `c10d-store` binary: `serve` plus every client op.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_c10d-store");

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve() -> (Server, u16) {
    let mut child = Command::new(BIN)
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let srv = Server(child);
    let rest = line
        .trim()
        .strip_prefix("c10d-store listening on 127.0.0.1:")
        .unwrap_or_else(|| panic!("bad line {line:?}"));
    (srv, rest.parse().unwrap())
}

fn op(port: u16, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--timeout-ms",
            "20000",
        ])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(port: u16, args: &[&str]) -> String {
    let (s, o, e) = op(port, args);
    assert!(s, "{args:?} failed: {e}");
    o
}

#[test]
fn cli_end_to_end() {
    let (_srv, port) = serve();
    assert_eq!(ok(port, &["set", "a", "hello"]), "");
    assert_eq!(ok(port, &["get", "a"]), "hello");
    assert_eq!(ok(port, &["add", "n", "5"]), "5\n");
    assert_eq!(ok(port, &["add", "n", "-7"]), "-2\n");
    assert_eq!(ok(port, &["check", "a", "n"]), "true\n");
    assert_eq!(ok(port, &["check", "a", "zz"]), "false\n");
    assert_eq!(ok(port, &["wait", "a"]), "");
    assert_eq!(ok(port, &["num-keys"]), "2\n");
    assert_eq!(ok(port, &["compare-set", "cs", "", "v1"]), "v1");
    assert_eq!(ok(port, &["compare-set", "cs", "x", "v2"]), "v1");
    assert_eq!(ok(port, &["append", "a", "!"]), "");
    assert_eq!(ok(port, &["multi-set", "m1", "1", "m2", "22"]), "");
    assert_eq!(ok(port, &["multi-get", "m1", "m2", "a"]), "1\n22\nhello!\n");
    assert_eq!(ok(port, &["delete", "a"]), "true\n");
    assert_eq!(ok(port, &["delete", "a"]), "false\n");
    let (s, _, e) = op(port, &["wait", "nokey", "--timeout-ms", "200"]);
    assert!(!s);
    assert!(e.contains("wait timeout after 200ms, keys: /nokey"), "{e}");
    let (s, _, e) = op(port, &["multi-set", "k"]);
    assert!(!s && !e.is_empty());
}

#[test]
fn cli_reports_connect_failure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(BIN)
        .args([
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--timeout-ms",
            "300",
            "num-keys",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("The client socket has timed out after 300ms"),
        "{e}"
    );
}
