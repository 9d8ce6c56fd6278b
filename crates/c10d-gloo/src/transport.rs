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

const HELLO_MAGIC: u32 = 0x61F0_C10D;

/// One established connection.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Conn::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }
    fn read_exact(&mut self, b: &mut [u8]) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.read_exact(b),
            Conn::Unix(s) => s.read_exact(b),
        }
    }
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.write_all(b),
            Conn::Unix(s) => s.write_all(b),
        }
    }
    /// No Nagle (TCP), optional big kernel buffers. A TCP socket keeps the kernel's buffer
    /// autotuning when the system caps (`net.core.rmem_max`/`wmem_max`) are below `buf`:
    /// a capped fixed size would be smaller than what autotuning reaches.
    fn tune(&self, buf: usize) -> Result<()> {
        let (sock, tcp) = match self {
            Conn::Tcp(s) => {
                s.set_nodelay(true)?;
                (socket2::SockRef::from(s), true)
            }
            Conn::Unix(s) => (socket2::SockRef::from(s), false),
        };
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
    let deadline = crate::engine::deadline_after(spec.timeout);
    let ctx = |m: String| {
        format!(
            "ProcessGroupGloo (group {}, rank {}): {m}",
            spec.group_name, spec.rank
        )
    };
    let mut peers: Vec<Option<Conn>> = (0..spec.size).map(|_| None).collect();
    let my_boot = boot_id();
    let aborted = || -> Result<()> {
        if (spec.aborted)() {
            return Err(DistError::backend(ctx(
                "the group was aborted or shut down while connecting".to_string(),
            )));
        }
        Ok(())
    };
    // 1. Connect to every lower rank.
    #[allow(clippy::needless_range_loop)]
    for p in 0..spec.rank {
        let key = addr_key(p);
        loop {
            aborted()?;
            let t0 = Instant::now();
            match store.wait_timeout(&[&key], left(deadline).min(SLICE)) {
                Ok(()) => break,
                Err(e) => {
                    if store.check(&[&key])? {
                        break;
                    }
                    if Instant::now() >= deadline {
                        return Err(DistError::network(ctx(format!(
                            "rank {p} did not publish its address within {}ms: {e}",
                            spec.timeout.as_millis()
                        ))));
                    }
                    if t0.elapsed() < SLICE / 2 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
        let mut conn = None;
        if listeners.unix.is_some() {
            let local = String::from_utf8_lossy(&store.get(&local_key(p))?).to_string();
            if let (Some((b, name)), Some(mine)) = (local.split_once(' '), &my_boot) {
                if b == mine {
                    match connect_unix(name) {
                        Ok(s) => conn = Some(Conn::Unix(s)),
                        Err(e) => log::debug!(
                            "{}",
                            ctx(format!(
                                "local socket of rank {p} unreachable ({e}); using TCP"
                            ))
                        ),
                    }
                }
            }
        }
        let mut s = match conn {
            Some(c) => c,
            None => {
                let addr_s = String::from_utf8_lossy(&store.get(&key)?).to_string();
                let addr: SocketAddr = addr_s.parse().map_err(|e| {
                    DistError::network(ctx(format!(
                        "bad address '{addr_s}' published by rank {p}: {e}"
                    )))
                })?;
                loop {
                    match TcpStream::connect_timeout(
                        &addr,
                        left(deadline).min(Duration::from_secs(5)),
                    ) {
                        Ok(s) => break Conn::Tcp(s),
                        Err(e) if Instant::now() < deadline => {
                            aborted()?;
                            log::debug!("connect to rank {p} at {addr}: {e}; retrying");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(e) => {
                            return Err(DistError::network(ctx(format!(
                                "cannot connect to rank {p} at {addr}: {e}"
                            ))))
                        }
                    }
                }
            }
        };
        s.set_timeouts(Some(left(deadline)))?;
        let mut hello = Vec::new();
        hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello.extend_from_slice(&(spec.rank as u64).to_le_bytes());
        hello.extend_from_slice(&(spec.size as u64).to_le_bytes());
        hello.extend_from_slice(&(spec.group_name.len() as u32).to_le_bytes());
        hello.extend_from_slice(spec.group_name.as_bytes());
        s.write_all(&hello)
            .map_err(|e| DistError::network(ctx(format!("handshake with rank {p} failed: {e}"))))?;
        let reply = read_frame(&mut s)
            .map_err(|e| DistError::network(ctx(format!("handshake with rank {p} failed: {e}"))))?;
        if reply != b"OK" {
            return Err(DistError::backend(ctx(format!(
                "rank {p} refused the connection: {}",
                String::from_utf8_lossy(&reply)
            ))));
        }
        peers[p] = Some(s);
    }
    // 2. Accept from every higher rank, on either listener.
    listeners.tcp.set_nonblocking(true)?;
    if let Some((u, _)) = &listeners.unix {
        u.set_nonblocking(true)?;
    }
    let mut missing = spec.size - 1 - spec.rank;
    while missing > 0 {
        let accepted = match listeners.tcp.accept() {
            Ok((s, from)) => Ok((Conn::Tcp(s), from.to_string())),
            Err(e) => match &listeners.unix {
                Some((u, _)) if e.kind() == std::io::ErrorKind::WouldBlock => u
                    .accept()
                    .map(|(s, _)| (Conn::Unix(s), "a local socket".to_string())),
                _ => Err(e),
            },
        };
        let (mut s, from) = match accepted {
            Ok(x) => x,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::Interrupted =>
            {
                aborted()?;
                if Instant::now() >= deadline {
                    let absent: Vec<String> = (spec.rank + 1..spec.size)
                        .filter(|p| peers[*p].is_none())
                        .map(|p| p.to_string())
                        .collect();
                    return Err(DistError::network(ctx(format!(
                        "timed out after {}ms waiting for rank(s) {} to connect",
                        spec.timeout.as_millis(),
                        absent.join(", ")
                    ))));
                }
                wait_readable(listeners, Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(DistError::network(ctx(format!("accept failed: {e}")))),
        };
        match &s {
            Conn::Tcp(t) => t.set_nonblocking(false)?,
            Conn::Unix(u) => u.set_nonblocking(false)?,
        }
        s.set_timeouts(Some(left(deadline).min(HELLO_TIMEOUT)))?;
        let mut head = [0u8; 24];
        if let Err(e) = s.read_exact(&mut head) {
            log::warn!(
                "{}",
                ctx(format!("dropping connection from {from}: bad hello: {e}"))
            );
            continue;
        }
        let magic = u32::from_le_bytes(head[0..4].try_into().expect("4"));
        let prank = u64::from_le_bytes(head[4..12].try_into().expect("8")) as usize;
        let psize = u64::from_le_bytes(head[12..20].try_into().expect("8")) as usize;
        let nlen = u32::from_le_bytes(head[20..24].try_into().expect("4")) as usize;
        if magic != HELLO_MAGIC || nlen > 1 << 20 {
            log::warn!(
                "{}",
                ctx(format!(
                    "dropping connection from {from}: not a c10d-gloo peer"
                ))
            );
            continue;
        }
        let mut name = vec![0u8; nlen];
        if let Err(e) = s.read_exact(&mut name) {
            log::warn!(
                "{}",
                ctx(format!("dropping connection from {from}: bad hello: {e}"))
            );
            continue;
        }
        let name = String::from_utf8_lossy(&name).to_string();
        let problem = if name != spec.group_name {
            Some(format!(
                "handshake mismatch: rank {prank} belongs to group '{name}' but rank {} belongs to group '{}'",
                spec.rank, spec.group_name
            ))
        } else if psize != spec.size {
            Some(format!(
                "handshake mismatch: rank {prank} has group size {psize} but rank {} has group size {}",
                spec.rank, spec.size
            ))
        } else if prank <= spec.rank || prank >= spec.size || peers[prank].is_some() {
            Some(format!(
                "handshake mismatch: unexpected connection claiming rank {prank} (to rank {})",
                spec.rank
            ))
        } else {
            None
        };
        if let Some(msg) = problem {
            let _ = write_frame(&mut s, msg.as_bytes());
            return Err(DistError::backend(ctx(msg)));
        }
        write_frame(&mut s, b"OK")?;
        peers[prank] = Some(s);
        missing -= 1;
    }
    for s in peers.iter().flatten() {
        s.set_timeouts(None)?;
        s.tune(spec.socket_buffer_bytes)?;
    }
    Ok(peers)
}

fn write_frame(s: &mut Conn, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

fn read_frame(s: &mut Conn) -> std::io::Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)?;
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
