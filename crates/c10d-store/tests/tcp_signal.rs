//! A signal delivered to a thread blocked in `wait` must not break the wait (EINTR is retried).
//! Own test binary: it installs a process-wide signal handler.

use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::os::unix::thread::JoinHandleExt;
use std::time::{Duration, Instant};

extern "C" fn on_signal(_: libc::c_int) {}

#[test]
fn wait_survives_signals() {
    // SAFETY: installs a handler that does nothing, without SA_RESTART so blocking calls see EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let srv = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = srv.port();
    let opts = TcpStoreOptions {
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let waiter = TcpStore::new("127.0.0.1", port, opts.clone()).unwrap();
    let setter = TcpStore::new("127.0.0.1", port, opts).unwrap();
    let h = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = waiter.wait_timeout(&["key1"], Duration::from_secs(30));
        (r, t0.elapsed())
    });
    let tid = h.as_pthread_t();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: the thread is alive until it is joined below; SIGUSR1 has a no-op handler.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
    }
    setter.set("key1", b"v").unwrap();
    let (r, took) = h.join().unwrap();
    r.unwrap();
    assert!(
        took >= Duration::from_millis(250),
        "wait returned early: {took:?}"
    );
    // A short wait interrupted by signals still times out on time with the usual error.
    let w2 = setter.clone_store().unwrap();
    let h = std::thread::spawn(move || w2.wait_timeout(&["never"], Duration::from_millis(400)));
    let tid = h.as_pthread_t();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: as above.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
    }
    let e = h.join().unwrap().unwrap_err();
    assert_eq!(e.to_string(), "wait timeout after 400ms, keys: /never");
}
