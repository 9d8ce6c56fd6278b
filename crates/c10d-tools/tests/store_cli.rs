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
    serve_with(&[])
}

/// `serve` on 127.0.0.1, any port, with `global` options before it (`--auth-secret-file F`).
fn serve_with(global: &[&str]) -> (Server, u16) {
    serve_env(global, &[])
}

/// As [`serve_with`], with `env` in the server's environment.
fn serve_env(global: &[&str], env: &[(&str, &std::path::Path)]) -> (Server, u16) {
    let mut child = Command::new(BIN)
        .args(global)
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .envs(env.iter().copied())
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

/// `new-secret` makes an owner-only secret file (never overwriting one); a server started
/// with it refuses a client without it and admits one with it.
#[test]
fn cli_new_secret_and_an_authenticated_server() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("job.secret");
    let made = Command::new(BIN)
        .args(["new-secret", secret.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(std::fs::read(&secret).unwrap().len(), 32);
    let again = Command::new(BIN)
        .args(["new-secret", secret.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !again.status.success(),
        "an existing secret was overwritten"
    );

    let (_server, port) = serve_with(&["--auth-secret-file", secret.to_str().unwrap()]);
    let addr = format!("127.0.0.1:{port}");
    let client = |auth: bool, args: &[&str]| {
        let mut cmd = Command::new(BIN);
        if auth {
            cmd.args(["--auth-secret-file", secret.to_str().unwrap()]);
        }
        cmd.args(["--addr", &addr, "--timeout-ms", "3000"])
            .args(args);
        cmd.env_remove("C10D_AUTH_SECRET_FILE").output().unwrap()
    };
    let refused = client(false, &["set", "k", "v"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("requires authentication"),
        "{refused:?}"
    );
    assert!(client(true, &["set", "k", "v"]).status.success());
    let got = client(true, &["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout), "v");
}

/// `new-tls` makes a job's TLS files (the key owner-only; never overwriting); a server started
/// with them in its environment refuses a plain client and serves one with them.
#[test]
fn cli_new_tls_and_a_tls_server() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let made = Command::new(BIN)
        .args(["new-tls", tls.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let (ca, cert, key) = (
        tls.join("ca.pem"),
        tls.join("cert.pem"),
        tls.join("key.pem"),
    );
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let again = Command::new(BIN)
        .args(["new-tls", tls.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !again.status.success(),
        "existing TLS files were overwritten"
    );

    let env = [
        ("C10D_TLS_CA_FILE", ca.as_path()),
        ("C10D_TLS_CERT_FILE", cert.as_path()),
        ("C10D_TLS_KEY_FILE", key.as_path()),
    ];
    let (_server, port) = serve_env(&[], &env);
    let addr = format!("127.0.0.1:{port}");
    let client = |with_tls: bool, args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["--addr", &addr, "--timeout-ms", "3000"])
            .args(args);
        for (k, v) in &env {
            if with_tls {
                cmd.env(k, v);
            } else {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap()
    };
    let refused = client(false, &["set", "k", "v"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("requires TLS"),
        "{refused:?}"
    );
    assert!(client(true, &["set", "k", "v"]).status.success());
    let got = client(true, &["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout), "v");
}
