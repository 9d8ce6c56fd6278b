//! Connection set-up: a full mesh of TCP connections, one per pair of ranks.
//!
//! Every rank listens on port 0 of its chosen address and publishes `"<ip>:<port>"` under the
//! key `gloo/addr/<rank>` of the (already group-prefixed) store. Rank `r` connects to every rank
//! below it and accepts from every rank above it; by induction on the rank nobody waits on a
//! rank that is itself waiting, so set-up cannot deadlock. The connecting side sends a hello
//! (magic, group name, its rank, group size); the accepting side checks all three and answers
//! `OK` or an error text, so a rank of another group or of a differently sized group fails
//! both sides with a clear message. Every step is bounded by the group timeout.

use c10d_core::{DistError, Result};
use c10d_store::Store;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

const HELLO_MAGIC: u32 = 0x61F0_C10D;

/// Binds a listener on `addr`, port 0.
pub(crate) fn listen(addr: IpAddr) -> Result<TcpListener> {
    let dom = if addr.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let s = Socket::new(dom, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.bind(&SockAddr::from(SocketAddr::new(addr, 0)))
        .map_err(|e| DistError::network(format!("ProcessGroupGloo: cannot listen on {addr}:0: {e}")))?;
    s.listen(1024)?;
    Ok(s.into())
}

fn addr_key(rank: usize) -> String {
    format!("gloo/addr/{rank}")
}

/// Publishes this rank's listen address in the store.
pub(crate) fn publish(store: &dyn Store, rank: usize, listener: &TcpListener) -> Result<()> {
    let a = listener.local_addr()?;
    store.set(&addr_key(rank), a.to_string().as_bytes())
}

/// Tunes an established connection: no Nagle, optional big buffers.
pub(crate) fn tune(s: &TcpStream, buf: usize) -> Result<()> {
    s.set_nodelay(true)?;
    if buf > 0 {
        let sock = socket2::SockRef::from(s);
        sock.set_send_buffer_size(buf)?;
        sock.set_recv_buffer_size(buf)?;
    }
    Ok(())
}

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Who we are, for the handshake and error texts.
pub(crate) struct MeshSpec<'a> {
    pub group_name: &'a str,
    pub rank: usize,
    pub size: usize,
    pub timeout: Duration,
    pub socket_buffer_bytes: usize,
}

/// Builds the full mesh. Returns `peers[p]` = the connection to rank `p` (`None` at our rank).
///
/// # Errors
/// [`DistError::Network`] for connect/accept failures or time-outs, [`DistError::Backend`] for a
/// handshake mismatch (group name, size or rank), store errors from the address look-ups.
pub(crate) fn connect_mesh(store: &dyn Store, listener: &TcpListener, spec: &MeshSpec<'_>) -> Result<Vec<Option<TcpStream>>> {
    let deadline = Instant::now() + spec.timeout;
    let ctx = |m: String| format!("ProcessGroupGloo (group {}, rank {}): {m}", spec.group_name, spec.rank);
    let mut peers: Vec<Option<TcpStream>> = (0..spec.size).map(|_| None).collect();
    // 1. Connect to every lower rank.
    for p in 0..spec.rank {
        let key = addr_key(p);
        store.wait_timeout(&[&key], left(deadline)).map_err(|e| {
            DistError::network(ctx(format!("rank {p} did not publish its address within {}ms: {e}", spec.timeout.as_millis())))
        })?;
        let addr_s = String::from_utf8_lossy(&store.get(&key)?).to_string();
        let addr: SocketAddr = addr_s
            .parse()
            .map_err(|e| DistError::network(ctx(format!("bad address '{addr_s}' published by rank {p}: {e}"))))?;
        let stream = loop {
            match TcpStream::connect_timeout(&addr, left(deadline).min(Duration::from_secs(5))) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    log::debug!("connect to rank {p} at {addr}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(DistError::network(ctx(format!("cannot connect to rank {p} at {addr}: {e}")))),
            }
        };
        stream.set_read_timeout(Some(left(deadline)))?;
        stream.set_write_timeout(Some(left(deadline)))?;
        let mut hello = Vec::new();
        hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello.extend_from_slice(&(spec.rank as u64).to_le_bytes());
        hello.extend_from_slice(&(spec.size as u64).to_le_bytes());
        hello.extend_from_slice(&(spec.group_name.len() as u32).to_le_bytes());
        hello.extend_from_slice(spec.group_name.as_bytes());
        let mut s = stream;
        s.write_all(&hello).map_err(|e| DistError::network(ctx(format!("handshake with rank {p} failed: {e}"))))?;
        let reply = read_frame(&mut s).map_err(|e| DistError::network(ctx(format!("handshake with rank {p} failed: {e}"))))?;
        if reply != b"OK" {
            return Err(DistError::backend(ctx(format!(
                "rank {p} refused the connection: {}",
                String::from_utf8_lossy(&reply)
            ))));
        }
        peers[p] = Some(s);
    }
    // 2. Accept from every higher rank.
    listener.set_nonblocking(true)?;
    let mut missing = spec.size - 1 - spec.rank;
    while missing > 0 {
        let (mut s, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                if Instant::now() >= deadline {
                    let absent: Vec<String> =
                        (spec.rank + 1..spec.size).filter(|p| peers[*p].is_none()).map(|p| p.to_string()).collect();
                    return Err(DistError::network(ctx(format!(
                        "timed out after {}ms waiting for rank(s) {} to connect",
                        spec.timeout.as_millis(),
                        absent.join(", ")
                    ))));
                }
                wait_readable(listener, Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(DistError::network(ctx(format!("accept failed: {e}")))),
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(left(deadline)))?;
        s.set_write_timeout(Some(left(deadline)))?;
        let mut head = [0u8; 24];
        if let Err(e) = s.read_exact(&mut head) {
            log::warn!("{}", ctx(format!("dropping connection from {from}: bad hello: {e}")));
            continue;
        }
        let magic = u32::from_le_bytes(head[0..4].try_into().expect("4"));
        let prank = u64::from_le_bytes(head[4..12].try_into().expect("8")) as usize;
        let psize = u64::from_le_bytes(head[12..20].try_into().expect("8")) as usize;
        let nlen = u32::from_le_bytes(head[20..24].try_into().expect("4")) as usize;
        if magic != HELLO_MAGIC || nlen > 1 << 20 {
            log::warn!("{}", ctx(format!("dropping connection from {from}: not a c10d-gloo peer")));
            continue;
        }
        let mut name = vec![0u8; nlen];
        s.read_exact(&mut name)?;
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
            Some(format!("handshake mismatch: unexpected connection claiming rank {prank} (to rank {})", spec.rank))
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
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)?;
        tune(s, spec.socket_buffer_bytes)?;
    }
    Ok(peers)
}

fn write_frame(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
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

/// Blocks until the listener is readable or `d` passes (poll(2); no spinning).
fn wait_readable(l: &TcpListener, d: Duration) {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, d.as_millis() as i32) };
}
