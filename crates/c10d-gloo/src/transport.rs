//! Connection set-up: a full mesh of stream connections, one per pair of ranks.
//!
//! Every rank listens on TCP port 0 of its chosen address and publishes `"<ip>:<port>"` under
//! the key `gloo/addr/<rank>` of the (already group-prefixed) store. Rank `r` connects to every
//! rank below it and accepts from every rank above it; by induction on the rank nobody waits on
//! a rank that is itself waiting, so set-up cannot deadlock. The connecting side sends a hello
//! (magic, group name, its rank, group size); the accepting side checks all three and answers
//! `OK` or an error text, so a rank of another group or of a differently sized group fails
//! both sides with a clear message. Every step is bounded by the group timeout.
//!
//! # Same-host peers
//!
//! With [`crate::GlooOptions::local_unix_sockets`] (default on, Linux), each rank also listens on
//! an abstract Unix-domain socket and publishes `"<boot id> <name>"` under `gloo/local/<rank>`.
//! A peer that booted the same kernel connects there instead of TCP (falling back to TCP when
//! that fails, e.g. in another network namespace). Why: on loopback the TCP stack (segmentation,
//! ACKs, softirqs, locking) costs about as much CPU as the data copies themselves; a Unix stream
//! moves the same bytes with the same two copies and none of that, measured 1.5–2.5× the
//! throughput of loopback TCP on the 2-core development machine. Frames, matching and faults
//! are identical on both kinds of connection.

use c10d_core::{DistError, Result};
use c10d_store::Store;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use c10d_store::auth::{AuthSecret, ServerHandshake, ANSWER_LEN};
use c10d_store::tls::{TlsConfig, TlsSession};

const HELLO_MAGIC: u32 = 0x61F0_C10D;

/// One established connection to a peer: TCP, or a Unix stream to a peer on this host. The one
/// connection type of the crate: the set-up uses it blocking (handshake), the engine
/// non-blocking under `mio` (registered by its descriptor).
///
/// With TLS (TCP connections of a TLS group) the bytes pass through a [`TlsSession`]: a write
/// may leave ciphertext unsent ([`Conn::has_unsent`]), which [`Conn::flush_unsent`] sends when
/// the socket is writable again.
pub(crate) struct Conn {
    sock: socket2::Socket,
    /// A Unix stream: the peer is on this host.
    local: bool,
    tls: Option<TlsSession>,
}

impl Read for Conn {
    /// Reads what is there (non-blocking in the engine), decrypted under TLS.
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let mut s = &self.sock;
        match &mut self.tls {
            Some(t) => t.read(&mut s, b),
            None => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[std::io::IoSlice::new(b)])
    }

    /// Writes what the socket takes of `iov` (under TLS: what the session accepts).
    fn write_vectored(&mut self, iov: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        let mut s = &self.sock;
        match &mut self.tls {
            Some(t) => t.write_vectored(&mut s, iov),
            None => s.write_vectored(iov),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_unsent()
    }
}

impl Conn {
    fn tcp(s: TcpStream) -> Conn {
        Conn {
            sock: s.into(),
            local: false,
            tls: None,
        }
    }

    fn unix(s: UnixStream) -> Conn {
        Conn {
            sock: s.into(),
            local: true,
            tls: None,
        }
    }

    /// Whether the connection is encrypted.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether ciphertext of earlier writes waits for the socket (TLS only).
    pub(crate) fn has_unsent(&self) -> bool {
        self.tls.as_ref().is_some_and(TlsSession::has_unsent)
    }

    /// Sends ciphertext that earlier writes left (`WouldBlock` while the socket is full).
    pub(crate) fn flush_unsent(&mut self) -> std::io::Result<()> {
        let mut s = &self.sock;
        match &mut self.tls {
            Some(t) => t.flush(&mut s),
            None => Ok(()),
        }
    }

    /// Runs `session`'s handshake (blocking, bounded by the socket's time-outs) and keeps it.
    fn start_tls(&mut self, mut session: TlsSession) -> std::io::Result<()> {
        let mut s = &self.sock;
        session.handshake(&mut s)?;
        self.tls = Some(session);
        Ok(())
    }

    /// Whether the peer is on this host (a Unix stream).
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    /// Shuts both directions down (the peer reads EOF).
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        self.sock.set_nonblocking(on)
    }

    /// The descriptor (for `mio` registration, `poll`, socket options).
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.sock.as_raw_fd()
    }

    fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        self.sock.set_read_timeout(t)?;
        self.sock.set_write_timeout(t)
    }
    /// No Nagle (TCP), optional big kernel buffers. A TCP socket keeps the kernel's buffer
    /// autotuning when the system caps (`net.core.rmem_max`/`wmem_max`) are below `buf`:
    /// a capped fixed size would be smaller than what autotuning reaches.
    fn tune(&self, buf: usize) -> Result<()> {
        let (sock, tcp) = (&self.sock, !self.local);
        if tcp {
            sock.set_tcp_nodelay(true)?;
        }
        let cap = |f: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/core/{f}"))
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0)
        };
        if buf > 0 && (!tcp || (cap("rmem_max") >= buf && cap("wmem_max") >= buf)) {
            sock.set_send_buffer_size(buf)?;
            sock.set_recv_buffer_size(buf)?;
        }
        Ok(())
    }
}

/// The listening sockets of one rank.
pub(crate) struct Listeners {
    tcp: TcpListener,
    unix: Option<(UnixListener, String)>,
}

/// Binds a TCP listener on `addr`, port 0, and (when `local`) an abstract Unix listener.
pub(crate) fn listen(addr: IpAddr, local: bool) -> Result<Listeners> {
    let dom = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(dom, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SockAddr::from(SocketAddr::new(addr, 0)))
        .map_err(|e| {
            DistError::network(format!("ProcessGroupGloo: cannot listen on {addr}:0: {e}"))
                .with_io_source(e)
        })?;
    s.listen(1024)?;
    let unix = if local { listen_unix() } else { None };
    Ok(Listeners {
        tcp: s.into(),
        unix,
    })
}

#[cfg(target_os = "linux")]
fn listen_unix() -> Option<(UnixListener, String)> {
    use std::os::linux::net::SocketAddrExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let name = format!(
        "c10d-gloo.{}.{nanos}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    let l = UnixListener::bind_addr(&addr).ok()?;
    Some((l, name))
}

#[cfg(not(target_os = "linux"))]
fn listen_unix() -> Option<(UnixListener, String)> {
    None
}

#[cfg(target_os = "linux")]
fn connect_unix(name: &str) -> std::io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&addr)
}

#[cfg(not(target_os = "linux"))]
fn connect_unix(_name: &str) -> std::io::Result<UnixStream> {
    Err(std::io::Error::other("abstract Unix sockets need Linux"))
}

/// Identifies the running kernel: equal on every process of one host (one boot).
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn addr_key(rank: usize) -> String {
    format!("gloo/addr/{rank}")
}
fn local_key(rank: usize) -> String {
    format!("gloo/local/{rank}")
}

/// Publishes this rank's listen addresses in the store (the local one first, so that a peer
/// that sees the TCP address also sees it).
pub(crate) fn publish(store: &dyn Store, rank: usize, l: &Listeners) -> Result<()> {
    let local = match (&l.unix, boot_id()) {
        (Some((_, name)), Some(b)) => format!("{b} {name}"),
        _ => String::new(),
    };
    store.set(&local_key(rank), local.as_bytes())?;
    let a = l.tcp.local_addr()?;
    store.set(&addr_key(rank), a.to_string().as_bytes())
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Who we are, for the handshake and error texts.
pub(crate) struct MeshSpec<'a> {
    pub group_name: &'a str,
    pub rank: usize,
    pub size: usize,
    pub timeout: Duration,
    pub socket_buffer_bytes: usize,
    /// Polled while waiting: true once the group was aborted or shut down (lazy init runs on
    /// the engine, and `abort()` must not wait for the whole set-up timeout).
    pub aborted: &'a (dyn Fn() -> bool + 'a),
    /// The job's secret: each connection proves it (challenge–response, `c10d_store::auth`)
    /// before the hello; the accepting rank challenges.
    pub auth: Option<&'a AuthSecret>,
    /// TLS for TCP connections: the connecting rank is the TLS client; the handshake comes
    /// first, the secret's challenge and the hello then pass inside it.
    pub tls: Option<&'a TlsConfig>,
}

/// Longest single blocking wait of the set-up, so that an abort is noticed promptly.
const SLICE: Duration = Duration::from_millis(100);
/// Time a connecting peer gets to send its hello (it sends it right after connecting); a
/// silent stray connection (port scanner, health check) must not stall the set-up.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the full mesh. Returns `peers[p]` = the connection to rank `p` (`None` at our rank).
///
/// # Errors
/// [`DistError::Network`] for connect/accept failures or time-outs, [`DistError::Backend`] for a
/// handshake mismatch (group name, size or rank), store errors from the address look-ups.
pub(crate) fn connect_mesh(
    store: &dyn Store,
    listeners: &Listeners,
    spec: &MeshSpec<'_>,
) -> Result<Vec<Option<Conn>>> {
    let mut mesh = MeshBuilder {
        store,
        listeners,
        spec,
        deadline: deadline_after(spec.timeout),
        my_boot: boot_id(),
        peers: (0..spec.size).map(|_| None).collect(),
    };
    for p in 0..spec.rank {
        let conn = mesh.connect_to(p)?;
        mesh.peers[p] = Some(conn);
    }
    mesh.accept_higher_ranks()?;
    for s in mesh.peers.iter().flatten() {
        s.set_timeouts(None)?;
        s.tune(spec.socket_buffer_bytes)?;
    }
    Ok(mesh.peers)
}

/// The state of one [`connect_mesh`] call.
struct MeshBuilder<'a> {
    store: &'a dyn Store,
    listeners: &'a Listeners,
    spec: &'a MeshSpec<'a>,
    deadline: Instant,
    my_boot: Option<String>,
    peers: Vec<Option<Conn>>,
}

/// The fixed-size head of a hello: magic, rank, group size, length of the group name.
pub(crate) struct HelloHead {
    pub(crate) magic: u32,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) name_len: usize,
}

/// The hello a connecting rank sends: [`HelloHead`] (little endian: u32, u64, u64, u32) then
/// the group name's bytes.
fn encode_hello(spec: &MeshSpec<'_>) -> Vec<u8> {
    let mut hello = Vec::new();
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&(spec.rank as u64).to_le_bytes());
    hello.extend_from_slice(&(spec.size as u64).to_le_bytes());
    hello.extend_from_slice(&(spec.group_name.len() as u32).to_le_bytes());
    hello.extend_from_slice(spec.group_name.as_bytes());
    hello
}

fn decode_hello_head(head: &[u8; 24]) -> HelloHead {
    HelloHead {
        magic: u32::from_le_bytes(head[0..4].try_into().expect("4")),
        rank: u64::from_le_bytes(head[4..12].try_into().expect("8")) as usize,
        size: u64::from_le_bytes(head[12..20].try_into().expect("8")) as usize,
        name_len: u32::from_le_bytes(head[20..24].try_into().expect("4")) as usize,
    }
}

impl MeshBuilder<'_> {
    /// Prefixes an error text with the group and our rank.
    fn ctx(&self, m: String) -> String {
        format!(
            "ProcessGroupGloo (group {}, rank {}): {m}",
            self.spec.group_name, self.spec.rank
        )
    }

    fn check_aborted(&self) -> Result<()> {
        if (self.spec.aborted)() {
            return Err(DistError::backend(self.ctx(
                "the group was aborted or shut down while connecting".to_string(),
            )));
        }
        Ok(())
    }

    /// Connects to the lower rank `p`: waits for its address, dials (local socket when on the
    /// same host, else TCP) and says hello.
    fn connect_to(&self, p: usize) -> Result<Conn> {
        self.wait_for_address(p)?;
        let mut s = match self.dial_local(p)? {
            Some(c) => c,
            None => self.dial_tcp(p)?,
        };
        s.set_timeouts(Some(left(self.deadline)))?;
        if let (Some(tls), false) = (self.spec.tls, s.is_local()) {
            s.start_tls(tls.client_session()).map_err(|e| {
                DistError::network(self.ctx(format!(
                    "TLS handshake with rank {p} failed: {e} (does it use TLS with a certificate of the job's CA?)"
                )))
            })?;
        }
        if let Some(secret) = self.spec.auth {
            let desc = self.ctx(format!("rank {p}"));
            c10d_store::auth::client_handshake(&mut s, secret, &desc)?;
        }
        self.say_hello(p, &mut s)?;
        Ok(s)
    }

    /// Waits (in abortable slices) until rank `p` has published its address.
    fn wait_for_address(&self, p: usize) -> Result<()> {
        let key = addr_key(p);
        loop {
            self.check_aborted()?;
            let t0 = Instant::now();
            let Err(e) = self
                .store
                .wait_timeout(&[&key], left(self.deadline).min(SLICE))
            else {
                return Ok(());
            };
            if self.store.check(&[&key])? {
                return Ok(());
            }
            if Instant::now() >= self.deadline {
                return Err(DistError::network(self.ctx(format!(
                    "rank {p} did not publish its address within {}ms: {e}",
                    self.spec.timeout.as_millis()
                ))));
            }
            if t0.elapsed() < SLICE / 2 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Connects to rank `p`'s local socket when it booted our kernel; `None` otherwise or when
    /// that fails (the caller falls back to TCP).
    fn dial_local(&self, p: usize) -> Result<Option<Conn>> {
        if self.listeners.unix.is_none() {
            return Ok(None);
        }
        let local = String::from_utf8_lossy(&self.store.get(&local_key(p))?).to_string();
        let (Some((b, name)), Some(mine)) = (local.split_once(' '), &self.my_boot) else {
            return Ok(None);
        };
        if b != mine {
            return Ok(None);
        }
        match connect_unix(name) {
            Ok(s) => Ok(Some(Conn::unix(s))),
            Err(e) => {
                log::debug!(
                    "{}",
                    self.ctx(format!(
                        "local socket of rank {p} unreachable ({e}); using TCP"
                    ))
                );
                Ok(None)
            }
        }
    }

    /// Connects to rank `p`'s published TCP address, retrying until the deadline.
    fn dial_tcp(&self, p: usize) -> Result<Conn> {
        let addr_s = String::from_utf8_lossy(&self.store.get(&addr_key(p))?).to_string();
        let addr: SocketAddr = addr_s.parse().map_err(|e| {
            DistError::network(
                self.ctx(format!("bad address '{addr_s}' published by rank {p}: {e}")),
            )
        })?;
        loop {
            match TcpStream::connect_timeout(&addr, left(self.deadline).min(Duration::from_secs(5)))
            {
                Ok(s) => return Ok(Conn::tcp(s)),
                Err(e) if Instant::now() < self.deadline => {
                    self.check_aborted()?;
                    log::debug!("connect to rank {p} at {addr}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(DistError::network(
                        self.ctx(format!("cannot connect to rank {p} at {addr}: {e}")),
                    ))
                }
            }
        }
    }

    /// Sends our hello to rank `p` and reads its `OK` (or its error text).
    fn say_hello(&self, p: usize, s: &mut Conn) -> Result<()> {
        let failed =
            |e| DistError::network(self.ctx(format!("handshake with rank {p} failed: {e}")));
        s.write_all(&encode_hello(self.spec)).map_err(failed)?;
        let reply = read_frame(s).map_err(failed)?;
        if reply != b"OK" {
            return Err(DistError::backend(self.ctx(format!(
                "rank {p} refused the connection: {}",
                String::from_utf8_lossy(&reply)
            ))));
        }
        Ok(())
    }

    /// Accepts from every higher rank, on either listener, checking each one's hello.
    fn accept_higher_ranks(&mut self) -> Result<()> {
        self.listeners.tcp.set_nonblocking(true)?;
        if let Some((u, _)) = &self.listeners.unix {
            u.set_nonblocking(true)?;
        }
        let mut missing = self.spec.size - 1 - self.spec.rank;
        while missing > 0 {
            let Some((mut s, from)) = self.accept_one()? else {
                continue;
            };
            if !self.encrypt(&mut s, &from) || !self.authenticate(&mut s, &from) {
                continue;
            }
            let Some((head, name)) = self.read_hello(&mut s, &from) else {
                continue;
            };
            if let Some(msg) = self.hello_problem(&head, &name) {
                let _ = write_frame(&mut s, msg.as_bytes());
                if name == self.spec.group_name && head.size == self.spec.size {
                    // Our group and size but a rank that cannot connect to us (ours or lower,
                    // out of range, already here): an impostor or a stray; the real rank may
                    // still come. (Another group or size is a misconfigured job: fail now.)
                    log::warn!(
                        "{}",
                        self.ctx(format!("dropping connection from {from}: {msg}"))
                    );
                    continue;
                }
                return Err(DistError::backend(self.ctx(msg)));
            }
            write_frame(&mut s, b"OK")?;
            self.peers[head.rank] = Some(s);
            missing -= 1;
        }
        Ok(())
    }

    /// One accept on either listener: the connection (blocking again, hello time-out set) and
    /// where it came from, or `None` after a short wait when nobody is connecting.
    fn accept_one(&self) -> Result<Option<(Conn, String)>> {
        let accepted = match self.listeners.tcp.accept() {
            Ok((s, from)) => Ok((Conn::tcp(s), from.to_string())),
            Err(e) => match &self.listeners.unix {
                Some((u, _)) if e.kind() == std::io::ErrorKind::WouldBlock => u
                    .accept()
                    .map(|(s, _)| (Conn::unix(s), "a local socket".to_string())),
                _ => Err(e),
            },
        };
        let (s, from) = match accepted {
            Ok(x) => x,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted =>
            {
                self.check_aborted()?;
                if Instant::now() >= self.deadline {
                    return Err(self.accept_timed_out());
                }
                wait_readable(self.listeners, Duration::from_millis(50));
                return Ok(None);
            }
            Err(e) => return Err(DistError::network(self.ctx(format!("accept failed: {e}")))),
        };
        s.set_nonblocking(false)?;
        s.set_timeouts(Some(left(self.deadline).min(HELLO_TIMEOUT)))?;
        Ok(Some((s, from)))
    }

    /// The time-out error naming the higher ranks that never connected.
    fn accept_timed_out(&self) -> DistError {
        let absent: Vec<String> = (self.spec.rank + 1..self.spec.size)
            .filter(|p| self.peers[*p].is_none())
            .map(|p| p.to_string())
            .collect();
        DistError::network(self.ctx(format!(
            "timed out after {}ms waiting for rank(s) {} to connect",
            self.spec.timeout.as_millis(),
            absent.join(", ")
        )))
    }

    /// With TLS, runs the server side of the TLS handshake on an accepted TCP connection; false
    /// (logged, connection dropped) when it fails or does not finish within the hello time-out.
    fn encrypt(&self, s: &mut Conn, from: &str) -> bool {
        let (Some(tls), false) = (self.spec.tls, s.is_local()) else {
            return true;
        };
        match s.start_tls(tls.server_session()) {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "{}",
                    self.ctx(format!(
                        "dropping connection from {from}: TLS handshake failed: {e}"
                    ))
                );
                false
            }
        }
    }

    /// With a secret, challenges an accepted connection; false (logged, connection dropped)
    /// when it does not answer rightly within the hello time-out. A stranger is no reason to
    /// fail the group: the rank keeps accepting.
    fn authenticate(&self, s: &mut Conn, from: &str) -> bool {
        let Some(secret) = self.spec.auth else {
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
        log::warn!(
            "{}",
            self.ctx(format!(
                "dropping connection from {from}: authentication failed: {why}"
            ))
        );
        false
    }

    /// Reads a peer's hello; `None` (logged, connection dropped) when it is not a c10d-gloo
    /// hello or arrives incomplete.
    fn read_hello(&self, s: &mut Conn, from: &str) -> Option<(HelloHead, String)> {
        read_hello(s)
            .map_err(|why| {
                log::warn!(
                    "{}",
                    self.ctx(format!("dropping connection from {from}: {why}"))
                );
            })
            .ok()
    }

    /// Why a well-formed hello is refused (other group, other size, unexpected rank), if it is.
    fn hello_problem(&self, h: &HelloHead, name: &str) -> Option<String> {
        hello_problem(self.spec, &|p| self.peers[p].is_some(), h, name)
    }
}

/// Reads a hello from `s` (at most 1 MiB of group name); `Err` says why it is not one.
pub(crate) fn read_hello(s: &mut impl Read) -> std::result::Result<(HelloHead, String), String> {
    let mut head = [0u8; 24];
    s.read_exact(&mut head)
        .map_err(|e| format!("bad hello: {e}"))?;
    let head = decode_hello_head(&head);
    if head.magic != HELLO_MAGIC || head.name_len > 1 << 20 {
        return Err("not a c10d-gloo peer".to_string());
    }
    let mut name = vec![0u8; head.name_len];
    s.read_exact(&mut name)
        .map_err(|e| format!("bad hello: {e}"))?;
    Ok((head, String::from_utf8_lossy(&name).to_string()))
}

/// Why rank `me.rank` refuses a well-formed hello (other group, other size, a rank that is not
/// above ours or already `connected`), if it does.
pub(crate) fn hello_problem(
    me: &MeshSpec<'_>,
    connected: &dyn Fn(usize) -> bool,
    h: &HelloHead,
    name: &str,
) -> Option<String> {
    let (prank, psize) = (h.rank, h.size);
    if name != me.group_name {
        Some(format!(
            "handshake mismatch: rank {prank} belongs to group '{name}' but rank {} belongs to group '{}'",
            me.rank, me.group_name
        ))
    } else if psize != me.size {
        Some(format!(
            "handshake mismatch: rank {prank} has group size {psize} but rank {} has group size {}",
            me.rank, me.size
        ))
    } else if prank <= me.rank || prank >= me.size || connected(prank) {
        Some(format!(
            "handshake mismatch: unexpected connection claiming rank {prank} (to rank {})",
            me.rank
        ))
    } else {
        None
    }
}

fn write_frame(s: &mut Conn, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

fn read_frame(s: &mut Conn) -> std::io::Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)?;
    if l == c10d_store::auth::MAGIC[..4] {
        return Err(std::io::Error::other(format!(
            "the peer requires authentication: set {} to the job's secret file",
            c10d_store::auth::SECRET_FILE_ENV
        )));
    }
    if c10d_store::tls::is_tls_alert(&l) {
        return Err(std::io::Error::other(format!(
            "the peer {}",
            c10d_store::tls::requires_tls()
        )));
    }
    let n = u32::from_le_bytes(l) as usize;
    if n > 1 << 20 {
        return Err(std::io::Error::other("handshake reply too long"));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Blocks until a listener is readable or `d` passes (poll(2); no spinning).
fn wait_readable(l: &Listeners, d: Duration) {
    let mut pfds = vec![libc::pollfd {
        fd: l.tcp.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    if let Some((u, _)) = &l.unix {
        pfds.push(libc::pollfd {
            fd: u.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
    }
    // SAFETY: `pfds` is a valid array of pollfd for the duration of the call.
    unsafe {
        libc::poll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            d.as_millis() as i32,
        )
    };
}

/// `now + t`, or a deadline a century away when that overflows (`Duration::MAX` = no deadline).
pub(crate) fn deadline_after(t: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(t)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

#[cfg(test)]
mod fuzz_bounded {
    /// The `gloo_hello` fuzz target's check on 100,000 seeded byte strings of up to 64 bytes,
    /// half of them a hello head (magic, a rank and size near the group's, a short name
    /// length) followed by random bytes.
    #[test]
    fn random_hellos_are_read_or_refused() {
        let mut next = crate::fuzzing::seeded(0x4E11_0C10_D026_0001);
        for i in 0..100_000 {
            let len = (next() % 65) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 {
                let mut h = super::HELLO_MAGIC.to_le_bytes().to_vec();
                h.extend_from_slice(&(next() % 6).to_le_bytes());
                h.extend_from_slice(&(next() % 6).to_le_bytes());
                h.extend_from_slice(&((next() % 4) as u32).to_le_bytes());
                h.append(&mut b);
                b = h;
            }
            crate::fuzzing::hello(&b);
        }
    }
}
