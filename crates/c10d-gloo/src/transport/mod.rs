//! Connections between the ranks of a group, made on demand: a rank connects to a peer when an
//! algorithm first needs that peer (ring neighbours, tree parents and children, the leaders of
//! the cross-host phase, all-to-all's pairs when all-to-all runs), never to the whole group.
//!
//! Every rank listens on TCP port 0 of its chosen address (and, with
//! [`crate::GlooOptions::local_unix_sockets`], on an abstract Unix socket) and publishes two
//! store keys when the group is created: where it runs and its Unix socket (`gloo/local/<rank>`,
//! see [`identity`]), then its TCP address (`gloo/addr/<rank>`). Nothing else goes through the
//! store per connection.
//!
//! Of each pair, the higher rank connects ([`dial`]) and the lower accepts ([`accept`], on the
//! group's accept thread, independent of what the lower rank's engine is doing). So a rank that
//! needs a lower peer connects at once (bounded by the op's time-out: the peer's accept thread
//! answers whatever its engine does), and a rank that needs a higher peer queues what it sends
//! to it until that peer connects (when its algorithm reaches the same op); nobody ever waits
//! for a connection while holding up another, so set-up cannot deadlock. The connecting side
//! proves the job's secret and sends a hello (magic, group name, its rank, group size, see
//! [`hello`]); the accepting side checks all three and answers `OK` or an error text, so a rank
//! of another group or of a differently sized group fails both sides with a clear message.
//!
//! # Same-host peers
//!
//! A peer that runs on the same kernel and network namespace (equal [`identity`]) is reached
//! over its abstract Unix socket (falling back to TCP when that fails). Why: on loopback the
//! TCP stack (segmentation, ACKs, softirqs, locking) costs about as much CPU as the data copies
//! themselves; a Unix stream moves the same bytes with the same two copies and none of that,
//! measured 1.5–2.5× the throughput of loopback TCP on the 2-core development machine. Frames,
//! matching and faults are identical on both kinds of connection. The same identities tell the
//! algorithms which peers share this host (shared memory, cross-memory attach, the host map of
//! the two-level algorithms) without connecting to anyone.

pub(crate) mod accept;
pub(crate) mod dial;
pub(crate) mod hello;
pub(crate) mod identity;

use c10d_core::{DistError, Result};
use c10d_store::Store;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use c10d_store::tls::TlsSession;

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

impl Listeners {
    /// The abstract Unix listener's name, when there is one.
    pub(crate) fn unix_name(&self) -> Option<&str> {
        self.unix.as_ref().map(|(_, n)| n.as_str())
    }
}

/// Publishes this rank's identity (with its Unix socket) and then its TCP address in the
/// group's store: two keys, whatever the group's size. The identity goes first, so a peer that
/// sees the address also sees it.
///
/// # Errors
/// Store failures.
pub(crate) fn publish(
    store: &dyn Store,
    rank: usize,
    l: &Listeners,
    mine: &identity::Identity,
) -> Result<()> {
    store.set(&identity::local_key(rank), mine.encode().as_bytes())?;
    let a = l.tcp.local_addr()?;
    store.set(&identity::addr_key(rank), a.to_string().as_bytes())
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

/// Longest single blocking wait of the set-up, so that an abort or a stop is noticed promptly.
pub(crate) const SLICE: Duration = Duration::from_millis(100);

/// Time left until `deadline` (at least 1 ms: a socket time-out of zero means none).
pub(crate) fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Waits until the store holds every key of `keys`, in slices of [`SLICE`] that poll `aborted`,
/// until `deadline`: `Ok(true)` once they are all there, `Ok(false)` when the deadline passed
/// first (the dialler's wait for an address, the wait for every rank's identity).
///
/// # Errors
/// A store failure; [`DistError::Backend`] "`{ctx}`: the group was aborted or shut down while
/// `{what}`" once `aborted` says so.
pub(crate) fn wait_keys(
    store: &dyn Store,
    keys: &[&str],
    deadline: Instant,
    aborted: &dyn Fn() -> bool,
    (ctx, what): (&str, &str),
) -> Result<bool> {
    loop {
        if aborted() {
            return Err(DistError::backend(format!(
                "{ctx}: the group was aborted or shut down while {what}"
            )));
        }
        let t0 = Instant::now();
        if store.wait_timeout(keys, left(deadline).min(SLICE)).is_ok() || store.check(keys)? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        // A store whose wait returns at once with an error must not make this spin.
        if t0.elapsed() < SLICE / 2 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `now + t`, or a deadline a century away when that overflows (`Duration::MAX` = no deadline).
pub(crate) fn deadline_after(t: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(t)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
