//! `TcpStoreServer`: a single-threaded `mio` event loop speaking PyTorch's TCPStore protocol
//! (libuv-backend semantics, `shared/docs/store-protocol.md` §1–§3).
//!
//! Every connection has its own incremental [`Decoder`]; requests are applied atomically in
//! arrival order. Waiters (WAIT, BARRIER, blocking queue pops) are parked per key and woken by
//! the write that satisfies them — there is no polling. A protocol violation or a limit
//! violation closes only the offending connection (logged at `warn`).
//!
//! # Limits
//!
//! PyTorch's libuv server's (`TCPStoreLibUvBackend.cpp`: `MAX_STRING_LEN`, `MAX_PAYLOAD_LEN`,
//! `MAX_KEY_COUNT`), also [`ServerOptions`]' defaults: a key of at most 8192 bytes, a value of at
//! most 8 MiB, at most 131,072 keys in one CHECK, WAIT, MULTI_GET or MULTI_SET. Anything over
//! them closes the connection, as PyTorch's does (our client refuses such a request before
//! sending it, with an error naming the limit). There is no limit on a request's or a reply's
//! total size; memory stays bounded per connection by other means:
//! - a key list (CHECK, WAIT, MULTI_GET) is held until complete: at most 131,072 × (8192 + 8)
//!   bytes, about 1 GiB, for the largest request the limits allow (PyTorch's server holds it
//!   too);
//! - a MULTI_SET buffers at most 64 MiB (or one key and value, if larger): past that, its
//!   complete pairs are applied as they arrive, in order, so other clients may see the first
//!   pairs of a very large MULTI_SET before the last ones (smaller ones are applied at once);
//! - a reply references stored values of 64 KiB or more instead of copying them (a MULTI_GET
//!   reply of any size costs memory for its small values only; it shows the values as they
//!   were when the request arrived);
//! - while more than 16 MiB of replies wait for a slow reader, the server stops reading that
//!   connection until they drain (back-pressure, no reply is dropped).
//!
//! # At the file-descriptor limit
//!
//! Readiness is edge-triggered, so a connection left in the listen backlog after a failed
//! accept would wait for the next client. The server keeps one spare descriptor (`/dev/null`):
//! when accept fails with EMFILE/ENFILE it closes the spare, accepts and at once closes every
//! queued connection, and reopens the spare. Those clients see the connection closed and retry
//! (PyTorch's client and ours do, with backoff), and are served as soon as descriptors free up.
//! Should the spare be unavailable, accepting is retried whenever a connection closes and every
//! 50 ms until the backlog is drained.

use super::protocol::{
    parse_stoll, put_bytes, put_i64, put_u64, Decoder, Limits, Request, STOP_WAITING,
    VALIDATE_MAGIC,
};
use crate::auth::AuthSecret;
use crate::tls::TlsConfig;
use c10d_core::{DistError, Result};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

mod commands;
mod conn;
mod handshake;
use conn::*;

/// Options of a standalone [`TcpStoreServer`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Address to bind; `None` = all interfaces, dual-stack `::` with a `0.0.0.0` fallback
    /// (PyTorch's behaviour).
    pub host: Option<String>,
    /// Port; 0 lets the OS pick one (read it back with [`TcpStoreServer::port`]).
    pub port: u16,
    /// Expected number of workers (informational: logged when the `init/` counter reaches it).
    pub world_size: Option<usize>,
    /// Largest value accepted, bytes (default 8 MiB, PyTorch's limit). Larger → connection
    /// closed.
    pub max_payload: usize,
    /// Longest key accepted, bytes (default 8192).
    pub max_key_len: usize,
    /// Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET (default 131072).
    pub max_keys: usize,
    /// The job's secret: every connection must prove it knows it before any request is read
    /// ([`crate::auth`]). `None` = the secret file named by `C10D_AUTH_SECRET_FILE`, if set;
    /// else no authentication (PyTorch's clients can connect).
    pub auth: Option<AuthSecret>,
    /// TLS ([`crate::tls`]): every connection must complete a TLS handshake with a
    /// certificate of the job's CA before anything it sends is read. `None` = the files named
    /// by `C10D_TLS_CERT_FILE`, `C10D_TLS_KEY_FILE`, `C10D_TLS_CA_FILE`, if set; else plain TCP.
    pub tls: Option<TlsConfig>,
    /// How long a connection may take to complete its TLS handshake and answer the
    /// authentication challenge before it is closed (default
    /// [`crate::auth::HANDSHAKE_TIMEOUT`], 10 s).
    pub handshake_timeout: std::time::Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            host: None,
            port: 0,
            world_size: None,
            max_payload: Limits::DEFAULT.max_payload,
            max_key_len: Limits::DEFAULT.max_key_len,
            max_keys: Limits::DEFAULT.max_keys,
            auth: None,
            tls: None,
            handshake_timeout: crate::auth::HANDSHAKE_TIMEOUT,
        }
    }
}

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
/// Read chunk size.
const CHUNK: usize = 64 * 1024;

/// The running server shared by every handle (`TcpStoreServer`, master `TcpStore`s). Stops when
/// the last handle is dropped.
pub(crate) struct ServerHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ServerHandle {
    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A standalone TCPStore server (PyTorch's `TCPServer`, libuv flavour). Serves until dropped or
/// [`TcpStoreServer::stop`]ped; open connections are closed then.
///
/// Memory per connection is bounded without limiting a request's or reply's total size (bytes
/// are stored as they arrive, never pre-allocated from a length field): see the module docs,
/// "Limits".
pub struct TcpStoreServer {
    pub(crate) handle: Arc<ServerHandle>,
}

impl std::fmt::Debug for TcpStoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TCPServer(port={})", self.port())
    }
}

impl TcpStoreServer {
    /// Binds and starts the event-loop thread.
    ///
    /// # Errors
    /// [`DistError::Network`] "The server socket has failed to listen on any local network
    /// address. port: P, ..." when binding fails (e.g. port in use); [`DistError::InvalidArgument`]
    /// for an unresolvable `host`.
    pub fn bind(opts: ServerOptions) -> Result<TcpStoreServer> {
        let listener = bind_listener(opts.host.as_deref(), opts.port)?;
        Ok(TcpStoreServer {
            handle: start(listener, &opts)?,
        })
    }

    /// Adopts an already bound socket (`master_listen_fd`). The descriptor is duplicated, the
    /// caller keeps ownership of `fd`. `port` 0 accepts any bound port.
    ///
    /// # Errors
    /// [`DistError::Network`] when `fd` is not a bound TCP socket or is bound to another port.
    pub fn from_listen_fd(fd: RawFd, port: u16, opts: ServerOptions) -> Result<TcpStoreServer> {
        // SAFETY: dup only reads the descriptor table; a negative result is handled below.
        let dup = unsafe { libc::dup(fd) };
        if dup < 0 {
            return Err(DistError::network(format!(
                "master_listen_fd {fd} is invalid: {}",
                io::Error::last_os_error()
            )));
        }
        // SAFETY: `dup` is a fresh descriptor that we own exclusively from here on.
        let sock = unsafe { socket2::Socket::from_raw_fd(dup) };
        let addr = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| {
                DistError::network(format!("master_listen_fd {fd} is not a bound TCP socket"))
            })?;
        if port != 0 && addr.port() != port {
            return Err(DistError::network(format!(
                "master_listen_fd {fd} is bound to port {} but the store was given port {port}",
                addr.port()
            )));
        }
        sock.listen(BACKLOG).map_err(|e| {
            DistError::network(format!(
                "The server socket has failed to listen on master_listen_fd {fd}: {e}"
            ))
            .with_io_source(e)
        })?;
        let std_l: std::net::TcpListener = sock.into();
        Ok(TcpStoreServer {
            handle: start(std_l, &opts)?,
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.handle.port()
    }

    /// The bound address (`[::]:P` when dual-stack).
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.addr
    }

    /// Stops serving (same as dropping; with other handles to the same server, e.g. a
    /// multi-tenant `TcpStore`, the server lives on until the last one goes).
    pub fn stop(self) {}
}

/// Listen backlog: at least 4096 so a large world's simultaneous connects are not dropped.
const BACKLOG: i32 = if libc::SOMAXCONN > 4096 {
    libc::SOMAXCONN
} else {
    4096
};

fn listen_error(port: u16, detail: &str) -> DistError {
    DistError::network(format!(
        "The server socket has failed to listen on any local network address. port: {port}, {detail}"
    ))
}

fn try_bind(addr: SocketAddr, v6only: Option<bool>) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(v) = v6only {
        sock.set_only_v6(v)?;
    }
    sock.set_reuse_address(true)?;
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    Ok(sock.into())
}

/// Binds like PyTorch: dual-stack `::` first, `0.0.0.0` as fallback; or the given host.
pub(crate) fn bind_listener(host: Option<&str>, port: u16) -> Result<std::net::TcpListener> {
    match host {
        None | Some("") | Some("*") => {
            let six = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
            match try_bind(six, Some(false)) {
                Ok(l) => Ok(l),
                Err(e6) => {
                    let four = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
                    try_bind(four, None).map_err(|e4| {
                        listen_error(
                            port,
                            &format!("useIpv6: true, error: {e6}; useIpv6: false, error: {e4}"),
                        )
                    })
                }
            }
        }
        Some(h) => {
            let h = h.trim_start_matches('[').trim_end_matches(']');
            let addrs: Vec<SocketAddr> = (h, port)
                .to_socket_addrs()
                .map_err(|e| {
                    DistError::invalid(format!("cannot resolve server host {h}: {e}"))
                        .with_io_source(e)
                })?
                .collect();
            let mut last = String::from("no address");
            for a in addrs {
                match try_bind(a, if a.is_ipv6() { Some(false) } else { None }) {
                    Ok(l) => return Ok(l),
                    Err(e) => last = format!("address: {a}, error: {e}"),
                }
            }
            Err(listen_error(port, &last))
        }
    }
}

pub(crate) fn start(
    listener: std::net::TcpListener,
    opts: &ServerOptions,
) -> Result<Arc<ServerHandle>> {
    let addr = listener.local_addr()?;
    // The one place every listener (bound here or adopted) is made non-blocking for mio.
    listener.set_nonblocking(true)?;
    let poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let stop = Arc::new(AtomicBool::new(false));
    let secret = AuthSecret::given_or_env(opts.auth.as_ref())?;
    let limits = Limits {
        max_key_len: opts.max_key_len,
        max_payload: opts.max_payload,
        max_keys: opts.max_keys,
        max_request: MULTI_SET_PIECE,
    };
    let mut lp = EventLoop {
        poll,
        listener: TcpListener::from_std(listener),
        conns: HashMap::new(),
        next_id: 0,
        kv: HashMap::new(),
        queues: HashMap::new(),
        waiters: HashMap::new(),
        limits,
        world_size: opts.world_size,
        stop: stop.clone(),
        dirty: Vec::new(),
        reserve: open_reserve(),
        accept_retry: false,
        secret,
        tls: TlsConfig::given_or_env(opts.tls.as_ref())?,
        handshake_timeout: opts.handshake_timeout,
        handshakes: VecDeque::new(),
    };
    lp.poll
        .registry()
        .register(&mut lp.listener, LISTENER, Interest::READABLE)?;
    let thread = std::thread::Builder::new()
        .name(format!("c10d-store-server:{}", addr.port()))
        .spawn(move || lp.run())
        .map_err(|e| {
            DistError::network(format!("cannot start the store server thread: {e}"))
                .with_io_source(e)
        })?;
    log::debug!("c10d-store server listening on {addr}");
    Ok(Arc::new(ServerHandle {
        addr,
        stop,
        waker,
        thread: Mutex::new(Some(thread)),
    }))
}

struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    conns: HashMap<usize, Conn>,
    next_id: usize,
    /// Values are shared so that a reply can reference them instead of copying (see [`Out`]).
    kv: HashMap<Vec<u8>, Arc<Vec<u8>>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key → connection ids registered on it (duplicates allowed).
    waiters: HashMap<Vec<u8>, Vec<usize>>,
    limits: Limits,
    world_size: Option<usize>,
    stop: Arc<AtomicBool>,
    /// Connections that got output from someone else's request and need a flush.
    dirty: Vec<usize>,
    /// A descriptor kept open to be given up at the descriptor limit (see the module docs).
    reserve: Option<std::fs::File>,
    /// The job's secret, when connections must authenticate.
    secret: Option<AuthSecret>,
    /// TLS, when connections must be encrypted.
    tls: Option<TlsConfig>,
    handshake_timeout: std::time::Duration,
    /// (deadline, connection) of the handshakes under way, oldest first.
    handshakes: VecDeque<(std::time::Instant, usize)>,
    /// An accept failed for want of resources and the backlog could not be shed: it may hold
    /// connections, so accepting is retried after every wake-up of the loop (a connection
    /// closing frees a descriptor) and at least every [`ACCEPT_RETRY`].
    accept_retry: bool,
}

/// How often a failed accept is retried while descriptors stay exhausted.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

fn open_reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null")
        .map_err(|e| log::debug!("c10d-store server: no reserve descriptor: {e}"))
        .ok()
}

/// Accept errors that mean "out of descriptors or memory" (the connection stays queued).
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

enum Fatal {
    Closed,
    Error(String),
}

impl EventLoop {
    fn run(&mut self) {
        let mut events = Events::with_capacity(1024);
        let mut buf = vec![0u8; CHUNK];
        while !self.stop.load(Ordering::SeqCst) {
            let timeout = self.poll_timeout();
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("c10d-store server: poll failed: {e}; stopping");
                break;
            }

            for ev in events.iter() {
                match ev.token() {
                    WAKER => {}
                    LISTENER => self.accept(),
                    Token(id) => {
                        if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                            self.flush_conn(id);
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            // With a FIN/error already signalled no further edge comes: read to EOF.
                            let read_all = ev.is_read_closed() || ev.is_error();
                            self.serve_conn(id, &mut buf, read_all);
                        }
                    }
                }
                self.flush_dirty();
            }
            if self.accept_retry {
                self.accept();
            }
            self.expire_handshakes();
        }
        log::debug!(
            "c10d-store server stopping, closing {} connections",
            self.conns.len()
        );
    }

    fn accept(&mut self) {
        let retrying = std::mem::take(&mut self.accept_retry);
        loop {
            match self.listener.accept() {
                Ok((mut sock, peer)) => {
                    let _ = sock.set_nodelay(true);
                    let id = self.next_id;
                    self.next_id = (self.next_id + 1) % (usize::MAX - 16);
                    // WRITABLE interest is added only while output is blocked (see flush_conn):
                    // otherwise every ACK would wake the loop for nothing.
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut sock, Token(id), Interest::READABLE)
                    {
                        log::warn!(
                            "c10d-store server: cannot register connection from {peer}: {e}"
                        );
                        continue;
                    }
                    self.conns.insert(
                        id,
                        Conn {
                            sock,
                            peer,
                            validated: false,
                            magic_seen: 0,
                            decoder: Decoder::new(self.limits),
                            out: Out::default(),
                            awaiting: 0,
                            wait_keys: Vec::new(),
                            read_paused: false,
                            want_write: false,
                            pending_in: Vec::new(),
                            auth: None,
                            tls: self.tls.as_ref().map(TlsConfig::server_session),
                            setup_until: None,
                        },
                    );
                    self.start_setup(id);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.reserve.is_none() {
                        self.reserve = open_reserve();
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Reset while queued: on to the next one.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) if out_of_resources(&e) => {
                    // Readiness is edge-triggered: the queued connections would wait for the
                    // next client. Turn them away now, or retry soon when that is impossible.
                    // (Linux reports EMFILE before looking at the queue: after shedding, the
                    // next connection's readiness event brings us back.)
                    self.accept_retry = !self.shed_backlog(&e, retrying);
                    return;
                }
                Err(e) => {
                    log::warn!("c10d-store server: accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// At the descriptor limit: gives up the reserve descriptor, accepts and at once closes
    /// every queued connection (their clients see the connection closed and retry, as with
    /// PyTorch's server), and takes the reserve back. False when there was no reserve or it
    /// could not be taken back (accepting is then retried later).
    fn shed_backlog(&mut self, why: &io::Error, retrying: bool) -> bool {
        let Some(reserve) = self.reserve.take() else {
            if !retrying {
                log::warn!("c10d-store server: accept failed: {why}; retrying");
            }
            return false;
        };
        drop(reserve);
        let mut shed = 0usize;
        loop {
            match self.listener.accept() {
                Ok((sock, _)) => {
                    drop(sock);
                    shed += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(_) => break,
            }
        }
        self.reserve = open_reserve();
        log::warn!(
            "c10d-store server: out of descriptors ({why}) with {} connections open: closed {shed} \
             new connection(s) so that their clients retry",
            self.conns.len()
        );
        self.reserve.is_some()
    }

    fn close(&mut self, id: usize, why: &str) {
        if let Some(mut c) = self.conns.remove(&id) {
            if why.is_empty() {
                log::debug!("c10d-store server: client {} disconnected", c.peer);
            } else {
                log::warn!("c10d-store server: dropping client {}: {why}", c.peer);
            }
            let _ = self.poll.registry().deregister(&mut c.sock);
            for k in c.wait_keys.drain(..) {
                self.unregister(&k, id);
            }
        }
    }

    fn unregister(&mut self, key: &[u8], id: usize) {
        if let Some(list) = self.waiters.get_mut(key) {
            list.retain(|&w| w != id);
            if list.is_empty() {
                self.waiters.remove(key);
            }
        }
    }

    /// Reads and serves everything available on connection `id`.
    fn serve_conn(&mut self, id: usize, buf: &mut [u8], read_all: bool) {
        if let Err(f) = self.serve_inner(id, buf, read_all) {
            match f {
                Fatal::Closed => self.close(id, ""),
                Fatal::Error(e) => self.close(id, &e),
            }
            return;
        }
        self.flush_conn(id);
    }

    fn serve_inner(
        &mut self,
        id: usize,
        buf: &mut [u8],
        read_all: bool,
    ) -> std::result::Result<(), Fatal> {
        // Input left over when output backed up is served first.
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.pending_in.is_empty() {
                let p = std::mem::take(&mut c.pending_in);
                if self.process_input(id, &p)? {
                    return Ok(());
                }
            }
        }
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
            if c.out.pending() > OUT_HIGH_WATER {
                c.read_paused = true;
                return Ok(());
            }
            c.read_paused = false;
            let got = match &mut c.tls {
                Some(t) => t.read(&mut c.sock, buf),
                None => c.sock.read(buf),
            };
            let n = match got {
                Ok(0) => return Err(Fatal::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Fatal::Error(format!("read failed: {e}"))),
            };
            let mut input = &buf[..n];
            if let (Some(p), Some(secret)) = (c.auth.as_mut(), self.secret.as_ref()) {
                match p.absorb(secret, &mut input) {
                    handshake::Step::More => {}
                    handshake::Step::Done(proof) => {
                        c.out.tail.extend_from_slice(&proof);
                        c.auth = None;
                    }
                    handshake::Step::Refused => {
                        return Err(Fatal::Error("authentication failed (wrong secret)".into()))
                    }
                }
            }
            if c.auth.is_some() {
                continue;
            }
            if !c.validated {
                let magic = {
                    let mut m = [0u8; 5];
                    m[1..].copy_from_slice(&VALIDATE_MAGIC.to_le_bytes());
                    m
                };
                let take = (5 - c.magic_seen).min(input.len());
                if input[..take] != magic[c.magic_seen..c.magic_seen + take] {
                    return Err(Fatal::Error(
                        "client did not start with a valid VALIDATE request (bad magic)".into(),
                    ));
                }
                c.magic_seen += take;
                input = &input[take..];
                if c.magic_seen == 5 {
                    c.validated = true;
                }
            }
            // A short read drained the socket: on Linux an edge-triggered epoll reports the next
            // arrival, so skip the read that would only return EAGAIN.
            // (Not so with TLS: the session may hold more, decrypted or not.)
            let drained = n < buf.len() && c.tls.is_none();
            if self.process_input(id, input)? {
                return Ok(());
            }
            if drained && !read_all && cfg!(target_os = "linux") {
                return Ok(());
            }
        }
    }

    /// Decodes and applies requests from `input`. When the connection's pending output passes
    /// the high-water mark, the rest of `input` is kept (at most one read chunk) and `Ok(true)`
    /// says reading is paused until the output drains.
    fn process_input(&mut self, id: usize, mut input: &[u8]) -> std::result::Result<bool, Fatal> {
        loop {
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(true);
            };
            if c.out.pending() > OUT_HIGH_WATER {
                c.pending_in.extend_from_slice(input);
                c.read_paused = true;
                return Ok(true);
            }
            let req = match c.decoder.decode(&mut input) {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(false),
                Err(e) => return Err(Fatal::Error(format!("protocol error: {e}"))),
            };
            self.handle(id, req).map_err(Fatal::Error)?;
        }
    }

    /// The append point of connection `id`'s output.
    fn out(&mut self, id: usize) -> &mut Vec<u8> {
        &mut self.conn_out(id).tail
    }

    fn conn_out(&mut self, id: usize) -> &mut Out {
        &mut self
            .conns
            .get_mut(&id)
            .expect("connection exists while serving it")
            .out
    }

    fn flush_dirty(&mut self) {
        while let Some(id) = self.dirty.pop() {
            self.flush_conn(id);
        }
    }

    /// Writes pending output of `id`; resumes reading when it drains below the high-water mark.
    fn flush_conn(&mut self, id: usize) {
        let mut resume = false;
        let registry = self.poll.registry();
        let res: std::result::Result<(), String> = (|| {
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
            c.out.write_to(&mut c.sock, &mut c.tls)?;
            let pending = c.out.pending() > 0 || c.tls.as_ref().is_some_and(|t| t.has_unsent());
            if pending != c.want_write {
                let interest = if pending {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    Interest::READABLE
                };
                registry
                    .reregister(&mut c.sock, Token(id), interest)
                    .map_err(|e| format!("reregister failed: {e}"))?;
                c.want_write = pending;
            }
            resume = c.read_paused && c.out.pending() <= OUT_HIGH_WATER;
            Ok(())
        })();
        if let Err(e) = res {
            self.close(id, &e);
        } else if resume {
            let mut buf = vec![0u8; CHUNK];
            self.serve_conn(id, &mut buf, true);
        }
    }
}

/// Process-global registry of multi-tenant servers, keyed by port (`multi_tenant=True`).
static REGISTRY: Mutex<Vec<(u16, Weak<ServerHandle>)>> = Mutex::new(Vec::new());

/// Returns the live multi-tenant server on `port`, or binds a new one with `bind` and registers it.
pub(crate) fn multi_tenant_server(
    port: u16,
    bind: impl FnOnce() -> Result<Arc<ServerHandle>>,
) -> Result<Arc<ServerHandle>> {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.retain(|(_, w)| w.strong_count() > 0);
    if port != 0 {
        if let Some(h) = reg
            .iter()
            .find(|(p, _)| *p == port)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(h);
        }
    }
    let h = bind()?;
    reg.push((h.port(), Arc::downgrade(&h)));
    Ok(h)
}
