//! TLS stores (`c10d_store::tls`): clients with a certificate of the job's CA are served over
//! an encrypted connection; a plain client, a client of another CA, and a silent connection
//! are refused before any request is read, with a clear error, and do not disturb the others.
//! A TLS client meeting a plain server fails at once. Secret and TLS together work.

use c10d_store::tls::{create_job_files, TlsConfig, TlsFiles};
use c10d_store::{AuthSecret, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A fresh CA and certificate in a temporary directory (kept alive by the returned guard).
fn job_tls() -> (TlsConfig, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let files = create_job_files(dir.path()).unwrap();
    (TlsConfig::from_files(&files).unwrap(), dir)
}

fn server(tls: Option<TlsConfig>, auth: Option<AuthSecret>, handshake: Duration) -> TcpStoreServer {
    TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        tls,
        auth,
        handshake_timeout: handshake,
        ..Default::default()
    })
    .unwrap()
}

fn client(
    port: u16,
    tls: Option<TlsConfig>,
    auth: Option<AuthSecret>,
    timeout: Duration,
) -> c10d_store::Result<TcpStore> {
    TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout,
            wait_for_workers: false,
            tls,
            auth,
            ..Default::default()
        },
    )
}

#[test]
fn a_client_of_the_jobs_ca_is_served_over_tls() {
    let (tls, _dir) = job_tls();
    let srv = server(Some(tls.clone()), None, Duration::from_secs(10));
    let st = client(srv.port(), Some(tls), None, Duration::from_secs(10)).unwrap();
    st.set("k", b"v").unwrap();
    assert_eq!(st.get("k").unwrap(), b"v");
    // A value larger than the session's send buffer and the server's read chunk, both ways.
    let big: Vec<u8> = (0..(3 << 20) + 7).map(|i| (i * 31 % 251) as u8).collect();
    st.set("big", &big).unwrap();
    assert_eq!(st.get("big").unwrap(), big);
    assert_eq!(st.add("n", 5).unwrap(), 5);
    let twin = st.clone_store().unwrap();
    assert_eq!(twin.add("n", 1).unwrap(), 6);
    // A WAIT answered by another client's SET.
    let waiter = std::thread::spawn(move || twin.wait_timeout(&["late"], Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(50));
    st.set("late", b"x").unwrap();
    waiter.join().unwrap().unwrap();
}

#[test]
fn strangers_are_refused_at_once_and_the_job_goes_on() {
    let (tls, _dir) = job_tls();
    let (other_ca, _dir2) = job_tls();
    let srv = server(Some(tls.clone()), None, Duration::from_secs(10));
    let good = client(srv.port(), Some(tls), None, Duration::from_secs(10)).unwrap();
    good.set("k", b"v").unwrap();

    let t0 = Instant::now();
    let e = client(srv.port(), None, None, Duration::from_secs(20)).unwrap_err();
    assert!(e.message().contains("requires TLS"), "{e}");
    assert!(e.message().contains("C10D_TLS_CERT_FILE"), "{e}");
    let e = client(srv.port(), Some(other_ca), None, Duration::from_secs(20)).unwrap_err();
    assert!(e.message().contains("TLS handshake with the store"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "retried: {:?}",
        t0.elapsed()
    );

    // Nothing the strangers sent was applied; the admitted client goes on.
    assert_eq!(good.num_keys().unwrap(), 1);
    assert_eq!(good.get("k").unwrap(), b"v");
}

#[test]
fn a_tls_client_does_not_talk_to_a_plain_server() {
    let (tls, _dir) = job_tls();
    let srv = server(None, None, Duration::from_secs(10));
    let t0 = Instant::now();
    let e = client(srv.port(), Some(tls), None, Duration::from_secs(20)).unwrap_err();
    assert!(e.message().contains("TLS handshake with the store"), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "retried: {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_silent_connection_is_closed_at_the_handshake_deadline() {
    let (tls, _dir) = job_tls();
    let srv = server(Some(tls.clone()), None, Duration::from_millis(300));
    let mut silent = TcpStream::connect(("127.0.0.1", srv.port())).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 16];
    assert_eq!(
        silent.read(&mut b).unwrap(),
        0,
        "expected the server to close"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    let st = client(srv.port(), Some(tls), None, Duration::from_secs(10)).unwrap();
    st.set("k", b"v").unwrap();
}

#[test]
fn tls_and_the_job_secret_together() {
    let (tls, _dir) = job_tls();
    let secret = AuthSecret::from_bytes(b"0123456789abcdef-job").unwrap();
    let wrong = AuthSecret::from_bytes(b"0123456789abcdef-bad").unwrap();
    let srv = server(
        Some(tls.clone()),
        Some(secret.clone()),
        Duration::from_secs(10),
    );
    let st = client(
        srv.port(),
        Some(tls.clone()),
        Some(secret),
        Duration::from_secs(10),
    )
    .unwrap();
    st.set("k", b"v").unwrap();
    let e = client(srv.port(), Some(tls), Some(wrong), Duration::from_secs(10)).unwrap_err();
    assert!(e.message().contains("authentication failed"), "{e}");
    assert_eq!(st.get("k").unwrap(), b"v");
}

#[test]
fn bad_tls_files_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let files = create_job_files(dir.path()).unwrap();
    // Never overwritten.
    assert!(create_job_files(dir.path()).is_err());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = TlsConfig::from_files(&files).unwrap_err();
    assert!(e.message().contains("readable by other users"), "{e}");
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let swapped = TlsFiles {
        cert: files.ca.clone(),
        ..files.clone()
    };
    let e = TlsConfig::from_files(&swapped).unwrap_err();
    assert!(e.message().contains("ca.pem"), "{e}");
}

#[test]
fn a_silent_store_fails_the_tls_handshake_at_the_timeout_saying_so() {
    let (tls, _dir) = job_tls();
    // Accepts and never answers (a stopped store, a stalled connection).
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let _hold = std::thread::spawn(move || {
        let held: Vec<_> = l.incoming().take(1).collect();
        std::thread::sleep(Duration::from_secs(5));
        drop(held);
    });
    let t0 = Instant::now();
    let e = client(port, Some(tls), None, Duration::from_millis(500)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let m = e.message();
    assert!(
        m.contains(&format!(
            "TLS handshake with the store at (127.0.0.1, {port}) failed: no answer within"
        )) && !m.contains("certificate"),
        "{m}"
    );
}
