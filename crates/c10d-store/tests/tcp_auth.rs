//! Authenticated stores (`c10d_store::auth`): a shared secret admits clients; a wrong secret,
//! no secret, or no answer at all is refused before any request is read, with a clear error on
//! the client and the connection closed; a flood of silent connections does not slow a client
//! with the secret. PyTorch's client: `interop_auth.rs`.

use c10d_store::{AuthSecret, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn secret(tag: &str) -> AuthSecret {
    AuthSecret::from_bytes(format!("0123456789abcdef-{tag}").as_bytes()).unwrap()
}

fn server(auth: Option<AuthSecret>, handshake: Duration) -> TcpStoreServer {
    TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        auth,
        handshake_timeout: handshake,
        ..Default::default()
    })
    .unwrap()
}

fn client(port: u16, auth: Option<AuthSecret>, timeout: Duration) -> c10d_store::Result<TcpStore> {
    TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout,
            wait_for_workers: false,
            auth,
            ..Default::default()
        },
    )
}

#[test]
fn the_right_secret_is_admitted_and_others_are_refused_at_once() {
    let srv = server(Some(secret("job")), Duration::from_secs(10));
    let good = client(srv.port(), Some(secret("job")), Duration::from_secs(10)).unwrap();
    good.set("k", b"v").unwrap();
    assert_eq!(good.get("k").unwrap(), b"v");
    let twin = good.clone_store().unwrap(); // a later connection authenticates too
    assert_eq!(twin.get("k").unwrap(), b"v");

    let t0 = Instant::now();
    let e = client(srv.port(), Some(secret("other")), Duration::from_secs(20)).unwrap_err();
    assert!(e.message().contains("authentication failed"), "{e}");
    let e = client(srv.port(), None, Duration::from_secs(20)).unwrap_err();
    assert!(e.message().contains("requires authentication"), "{e}");
    assert!(e.message().contains("C10D_AUTH_SECRET_FILE"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "refusals were retried: {:?}",
        t0.elapsed()
    );
    // The server still serves the admitted client.
    good.set("k2", b"w").unwrap();
    assert_eq!(good.num_keys().unwrap(), 2);
}

#[test]
fn a_client_with_a_secret_does_not_talk_to_a_server_without_one() {
    let srv = server(None, Duration::from_secs(10));
    let e = client(srv.port(), Some(secret("job")), Duration::from_secs(1)).unwrap_err();
    assert!(
        e.message().contains("did not ask for authentication"),
        "{e}"
    );
}

#[test]
fn silent_connections_are_closed_at_the_deadline_and_do_not_slow_others() {
    let srv = server(Some(secret("job")), Duration::from_millis(500));
    let mut silent: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(("127.0.0.1", srv.port())).unwrap())
        .collect();
    let t0 = Instant::now();
    let good = client(srv.port(), Some(secret("job")), Duration::from_secs(10)).unwrap();
    for i in 0..100 {
        good.set(&format!("k{i}"), b"v").unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Each silent connection got the challenge, then was closed at its deadline.
    for s in silent.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut all = Vec::new();
        s.read_to_end(&mut all).unwrap();
        assert!(all.starts_with(b"C10DAUTH"), "{all:?}");
    }
    assert_eq!(good.num_keys().unwrap(), 100);
}

#[test]
fn the_secret_file_comes_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    let from_file = AuthSecret::create_file(&path).unwrap();
    assert!(
        AuthSecret::create_file(&path).is_err(),
        "an existing file is never overwritten"
    );
    let srv = server(Some(from_file), Duration::from_secs(10));
    // A child process with only the environment variable is admitted.
    let me = std::env::current_exe().unwrap();
    let out = Command::new(me)
        .args(["--exact", "env_child", "--nocapture", "--ignored"])
        .env("C10D_AUTH_SECRET_FILE", &path)
        .env("C10D_AUTH_TEST_PORT", srv.port().to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ENV CHILD OK"),
        "{text}"
    );
}

/// Run by `the_secret_file_comes_from_the_environment` in a child process.
#[test]
#[ignore]
fn env_child() {
    let Ok(port) = std::env::var("C10D_AUTH_TEST_PORT") else {
        return;
    };
    let s = client(port.parse().unwrap(), None, Duration::from_secs(10)).unwrap();
    s.set("from-env", b"1").unwrap();
    println!("ENV CHILD OK");
}

/// Random answers of random lengths (some longer than an answer, some cut short by a close)
/// never admit a connection, never stall the server, and never reach the request parser.
#[test]
fn random_answers_are_refused_and_the_server_keeps_serving() {
    use rand::{RngExt, SeedableRng};
    let srv = server(Some(secret("job")), Duration::from_secs(2));
    let good = client(srv.port(), Some(secret("job")), Duration::from_secs(10)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    for i in 0..200 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut challenge = [0u8; c10d_store::auth::CHALLENGE_LEN];
        s.read_exact(&mut challenge).unwrap();
        let len = rng.random_range(0..200usize);
        let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        use std::io::Write;
        let _ = s.write_all(&junk);
        if len < c10d_store::auth::ANSWER_LEN {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "attempt {i}: a random answer got a reply {rest:?}"
        );
        if i % 50 == 0 {
            good.set(&format!("alive{i}"), b"1").unwrap();
        }
    }
    assert_eq!(good.num_keys().unwrap(), 4);
}
