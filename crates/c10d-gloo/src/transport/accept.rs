//! The accepting side: one thread per group accepts its higher peers' connections whenever they
//! come, checks each on a short-lived thread of its own (TLS, the job's secret, the hello: a
//! silent connection holds up nobody else) and hands the good ones to the engine through a
//! [`Mailbox`], waking it. It runs independently of the engine, so a rank that dials
//! us is answered even while our engine is busy, idle or itself dialling.

use super::hello::{hello_problem, read_hello, write_frame, HelloHead, Who};
use super::{wait_readable, Conn, Listeners, SLICE};
use c10d_core::DistError;
use c10d_store::auth::{AuthSecret, ServerHandshake, ANSWER_LEN};
use c10d_store::tls::TlsConfig;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Time a connecting peer gets to finish its handshake and hello (it sends them right after
/// connecting); a silent stray connection (port scanner, health check) must not stall others.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// What the accept thread hands over, and how it is told to stop.
#[derive(Default)]
pub(crate) struct Mailbox {
    /// Something waits in `inner` (checked without the lock on every wake of the engine:
    /// submissions wake it far more often than connections arrive).
    mail: AtomicBool,
    inner: Mutex<Inbox>,
    arrived_cv: Condvar,
}

#[derive(Default)]
struct Inbox {
    /// Accepted, checked connections not taken by the engine yet: (peer rank, connection).
    conns: Vec<(usize, Conn)>,
    /// A hello of another group or size: the job is misconfigured, the group fails with this.
    refused: Option<DistError>,
    stop: bool,
}

impl Mailbox {
    /// The connections accepted since the last call, and a refusal that fails the group.
    pub(crate) fn take(&self) -> (Vec<(usize, Conn)>, Option<DistError>) {
        if !self.mail.swap(false, Ordering::Acquire) {
            return (Vec::new(), None);
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (std::mem::take(&mut g.conns), g.refused.take())
    }

    /// Blocks until something arrives or `deadline` passes (the eager set-up waits here).
    pub(crate) fn wait(&self, deadline: Instant) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let left = deadline.saturating_duration_since(Instant::now());
        if g.conns.is_empty() && g.refused.is_none() && !left.is_zero() {
            let _ = self.arrived_cv.wait_timeout(g, left.min(SLICE));
        }
    }

    /// Ends the accept thread (within [`SLICE`]); later connections are refused by the kernel.
    pub(crate) fn stop(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
    }

    fn stopped(&self) -> bool {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).stop
    }

    fn deliver(&self, p: usize, c: Conn) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.conns.push((p, c));
        self.mail.store(true, Ordering::Release);
        self.arrived_cv.notify_all();
    }

    fn refuse(&self, e: DistError) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.refused.get_or_insert(e);
        self.mail.store(true, Ordering::Release);
        self.arrived_cv.notify_all();
    }
}

/// What the accept thread checks connections against.
pub(crate) struct Acceptor {
    pub me: Who,
    pub socket_buffer_bytes: usize,
    pub auth: Option<AuthSecret>,
    pub tls: Option<TlsConfig>,
    pub mailbox: Arc<Mailbox>,
    /// Wakes the engine (its poll set's waker) after a delivery.
    pub wake: Box<dyn Fn() + Send + Sync>,
}

impl Acceptor {
    /// Starts the group's accept thread on `listeners`; it ends when the mailbox is stopped.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub(crate) fn spawn(self, listeners: Listeners) -> std::io::Result<()> {
        listeners.tcp.set_nonblocking(true)?;
        if let Some((u, _)) = &listeners.unix {
            u.set_nonblocking(true)?;
        }
        let name = format!("c10d-accept-{}", self.me.rank);
        let me = Arc::new(Admission {
            acceptor: self,
            accepted: Mutex::default(),
        });
        std::thread::Builder::new()
            .name(name)
            .spawn(move || me.run(&listeners))
            .map(|_| ())
    }
}

/// The accept thread's state, shared with the threads that check each connection.
struct Admission {
    acceptor: Acceptor,
    /// Ranks whose connection was accepted (or is being answered "OK").
    accepted: Mutex<HashSet<usize>>,
}

impl Admission {
    fn run(self: &Arc<Self>, l: &Listeners) {
        while !self.acceptor.mailbox.stopped() {
            match accept_one(l) {
                Ok(Some((s, from))) => self.admit_apart(s, from),
                Ok(None) => wait_readable(l, SLICE),
                // (Out of descriptors, say: the listener stays readable; do not spin.)
                Err(()) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Checks the connection on a thread of its own, so that one that stays silent (a port
    /// scanner, a health check) holds up nobody else for its [`HELLO_TIMEOUT`]; where no
    /// thread can be had, checks it here.
    fn admit_apart(self: &Arc<Self>, s: Conn, from: String) {
        let me = Arc::clone(self);
        let slot = Arc::new(Mutex::new(Some((s, from))));
        let theirs = Arc::clone(&slot);
        let spawned = std::thread::Builder::new()
            .name(format!("c10d-admit-{}", self.acceptor.me.rank))
            .spawn(move || {
                if let Some((s, from)) = take(&theirs) {
                    me.admit(s, &from);
                }
            });
        if spawned.is_err() {
            if let Some((s, from)) = take(&slot) {
                self.admit(s, &from);
            }
        }
    }

    /// Checks one connection; a good one goes to the mailbox, a stranger is dropped (logged),
    /// a rank of another group or size fails the group.
    fn admit(&self, mut s: Conn, from: &str) {
        let a = &self.acceptor;
        if s.set_nonblocking(false).is_err() || s.set_timeouts(Some(HELLO_TIMEOUT)).is_err() {
            return;
        }
        if !a.encrypt(&mut s, from) || !a.authenticate(&mut s, from) {
            return;
        }
        let (head, name) = match read_hello(&mut s) {
            Ok(h) => h,
            Err(why) => return a.drop_conn(from, &why),
        };
        if let Some(msg) = self.claim(&head, &name) {
            let _ = write_frame(&mut s, msg.as_bytes());
            return a.refused(from, msg, &head, &name);
        }
        let ok = write_frame(&mut s, b"OK")
            .and_then(|()| s.set_timeouts(None))
            .map_err(|e| e.to_string())
            .and_then(|()| s.tune(a.socket_buffer_bytes).map_err(|e| e.to_string()));
        if let Err(e) = ok {
            self.taken().remove(&head.rank);
            return a.drop_conn(from, &format!("handshake failed: {e}"));
        }
        a.mailbox.deliver(head.rank, s);
        (a.wake)();
    }

    /// The hello's problem, or none: then its rank is taken, so that a second connection
    /// claiming it (checked at the same time on another thread) is refused.
    fn claim(&self, head: &HelloHead, name: &str) -> Option<String> {
        let mut taken = self.taken();
        let problem = hello_problem(&self.acceptor.me, &|p| taken.contains(&p), head, name);
        if problem.is_none() {
            taken.insert(head.rank);
        }
        problem
    }

    /// The ranks taken so far, locked.
    fn taken(&self) -> std::sync::MutexGuard<'_, HashSet<usize>> {
        self.accepted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a slot holds, taken once (by the checking thread, or here when none could start).
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

impl Acceptor {
    /// Our group and size but a rank that cannot connect to us (ours or lower, out of range,
    /// already here): an impostor or a stray, the real rank may still come. Another group or
    /// size is a misconfigured job: the group fails.
    fn refused(&self, from: &str, msg: String, head: &HelloHead, name: &str) {
        if name == self.me.group_name && head.size == self.me.size {
            return self.drop_conn(from, &msg);
        }
        self.mailbox.refuse(DistError::backend(self.me.ctx(msg)));
        (self.wake)();
    }

    fn drop_conn(&self, from: &str, why: &str) {
        log::warn!(
            "{}",
            self.me
                .ctx(format!("dropping connection from {from}: {why}"))
        );
    }

    /// With TLS, the server side of the handshake on a TCP connection; false (logged) when it
    /// fails or does not finish within the hello time-out.
    fn encrypt(&self, s: &mut Conn, from: &str) -> bool {
        let (Some(tls), false) = (&self.tls, s.is_local()) else {
            return true;
        };
        match s.start_tls(tls.server_session()) {
            Ok(()) => true,
            Err(e) => {
                self.drop_conn(from, &format!("TLS handshake failed: {e}"));
                false
            }
        }
    }

    /// With a secret, challenges the connection; false (logged) when it does not answer rightly
    /// within the hello time-out. A stranger is no reason to fail the group.
    fn authenticate(&self, s: &mut Conn, from: &str) -> bool {
        let Some(secret) = &self.auth else {
            return true;
        };
        let hs = ServerHandshake::new();
        let mut answer = [0u8; ANSWER_LEN];
        let proof = s
            .write_all(&hs.challenge())
            .and_then(|()| s.read_exact(&mut answer))
            .map(|()| hs.answer(secret, &answer));
        let why = match proof {
            Ok(Some(proof)) => match s.write_all(&proof) {
                Ok(()) => return true,
                Err(e) => e.to_string(),
            },
            Ok(None) => "wrong secret".to_string(),
            Err(e) => format!("no answer ({e})"),
        };
        self.drop_conn(from, &format!("authentication failed: {why}"));
        false
    }
}

/// One accept on either listener: the connection and where it came from, `None` when nobody
/// is connecting, `Err` when an accept failed (logged; the thread keeps accepting).
#[allow(clippy::result_unit_err)]
fn accept_one(l: &Listeners) -> Result<Option<(Conn, String)>, ()> {
    let failed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
        _ => {
            log::debug!("c10d-gloo: accept failed: {e}");
            Err(())
        }
    };
    match l.tcp.accept() {
        Ok((s, from)) => return Ok(Some((Conn::tcp(s), from.to_string()))),
        Err(e) => failed(e)?,
    };
    let Some((u, _)) = l.unix.as_ref() else {
        return Ok(None);
    };
    match u.accept() {
        Ok((s, _)) => Ok(Some((Conn::unix(s), "a local socket".to_string()))),
        Err(e) => failed(e),
    }
}
