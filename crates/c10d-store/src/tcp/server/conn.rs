//! One client connection of the server: its socket, what it sent that is not yet parsed, and
//! its queued output (`Out`: pieces shared with the store's values where large).

use super::*;
use crate::tls::TlsSession;

pub(super) struct Conn {
    pub(super) sock: TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) validated: bool,
    /// Bytes of the VALIDATE request seen so far (must be exactly `00 ce f7 85 3c`).
    pub(super) magic_seen: usize,
    pub(super) decoder: Decoder,
    pub(super) out: Out,
    /// Registrations still outstanding for the current WAIT/BARRIER.
    pub(super) awaiting: usize,
    /// Keys this connection is registered on (for CANCEL_WAIT / close).
    pub(super) wait_keys: Vec<Vec<u8>>,
    /// Reading paused because too much output is pending.
    pub(super) read_paused: bool,
    /// Registered for WRITABLE (output could not be written completely).
    pub(super) want_write: bool,
    /// Received bytes not yet decoded because output backed up (≤ one read chunk).
    pub(super) pending_in: Vec<u8>,
    /// The authentication handshake, while the client has not answered it.
    pub(super) auth: Option<super::handshake::Pending>,
    /// The TLS session over `sock`, when the server uses TLS.
    pub(super) tls: Option<TlsSession>,
    /// While the TLS handshake or the authentication is under way: when the connection is
    /// closed unless both are done.
    pub(super) setup_until: Option<std::time::Instant>,
}

impl Conn {
    /// Whether the connection still owes its TLS handshake or its authentication answer.
    pub(super) fn in_setup(&self) -> bool {
        self.auth.is_some() || self.tls.as_ref().is_some_and(|t| t.is_handshaking())
    }
}

impl Conn {
    /// Consumes this connection's registration on `key`; true when that was the last key its
    /// WAIT/BARRIER awaited (STOP_WAITING is then queued and the connection needs a flush).
    pub(super) fn release(&mut self, key: &[u8]) -> bool {
        if let Some(pos) = self.wait_keys.iter().position(|k| k == key) {
            self.wait_keys.swap_remove(pos);
        }
        if self.awaiting == 0 {
            return false;
        }
        self.awaiting -= 1;
        if self.awaiting == 0 {
            self.out.tail.push(STOP_WAITING);
            return true;
        }
        false
    }
}

/// Pending output above which the server stops reading a connection until it drains.
pub(super) const OUT_HIGH_WATER: usize = 16 << 20;
/// Bytes a MULTI_SET buffers before its complete pairs are applied (the rest follows in pieces).
pub(super) const MULTI_SET_PIECE: usize = 64 << 20;
/// Values at least this long are referenced by a reply instead of copied into it.
pub(super) const SHARE_MIN: usize = 64 * 1024;

/// One queued piece of output.
pub(super) enum Seg {
    Owned(Vec<u8>),
    /// A stored value, referenced (an overwrite or delete meanwhile does not change the reply).
    Shared(Arc<Vec<u8>>),
}

impl Seg {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Seg::Owned(v) => v,
            Seg::Shared(v) => v,
        }
    }
}

/// Pending output of a connection: queued segments, then `tail`, where small replies are
/// appended. `tail` is written only while no segment is queued, so the order is kept.
#[derive(Default)]
pub(super) struct Out {
    pub(super) segs: VecDeque<Seg>,
    /// Bytes of `segs[0]` already written.
    pub(super) pos: usize,
    /// Unwritten bytes in `segs`.
    pub(super) queued: usize,
    pub(super) tail: Vec<u8>,
    pub(super) tail_pos: usize,
}

impl Out {
    /// Unwritten bytes.
    pub(super) fn pending(&self) -> usize {
        self.queued + self.tail.len() - self.tail_pos
    }

    /// Appends a length-prefixed value: copied when small, referenced when large.
    pub(super) fn push_value(&mut self, v: &Arc<Vec<u8>>) {
        put_u64(&mut self.tail, v.len() as u64);
        if v.len() < SHARE_MIN {
            self.tail.extend_from_slice(v);
            return;
        }
        if self.tail_pos < self.tail.len() {
            let mut t = std::mem::take(&mut self.tail);
            if self.segs.is_empty() {
                self.pos = self.tail_pos;
            } else {
                debug_assert_eq!(self.tail_pos, 0);
            }
            self.queued += t.len() - self.tail_pos;
            if t.capacity() > 2 * t.len() + 256 {
                t.shrink_to_fit();
            }
            self.segs.push_back(Seg::Owned(t));
        } else {
            self.tail.clear();
        }
        self.tail_pos = 0;
        self.queued += v.len();
        self.segs.push_back(Seg::Shared(v.clone()));
    }

    /// Writes until the socket would block or nothing is left.
    pub(super) fn write_to(
        &mut self,
        sock: &mut TcpStream,
        tls: &mut Option<TlsSession>,
    ) -> std::result::Result<(), String> {
        loop {
            let n = {
                let mut bufs: [IoSlice<'_>; 64] = [IoSlice::new(&[]); 64];
                let mut k = 0;
                for (i, seg) in self.segs.iter().enumerate().take(bufs.len()) {
                    let from = if i == 0 { self.pos } else { 0 };
                    bufs[k] = IoSlice::new(&seg.bytes()[from..]);
                    k += 1;
                }
                if k < bufs.len() && self.tail_pos < self.tail.len() {
                    bufs[k] = IoSlice::new(&self.tail[self.tail_pos..]);
                    k += 1;
                }
                if k == 0 {
                    break;
                }
                let sent = match tls {
                    Some(t) => t.write_vectored(sock, &bufs[..k]),
                    None => sock.write_vectored(&bufs[..k]),
                };
                match sent {
                    Ok(0) => return Err("write returned 0".into()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(format!("write failed: {e}")),
                }
            };
            self.advance(n);
        }
        // Everything written (with TLS: encrypted; the session sends the rest when it can).
        if let Some(t) = tls {
            match t.flush(sock) {
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                    return Err(format!("write failed: {e}"))
                }
                _ => {}
            }
        }
        self.tail.clear();
        self.tail_pos = 0;
        if self.tail.capacity() > 1 << 20 {
            self.tail.shrink_to(CHUNK);
        }
        Ok(())
    }

    pub(super) fn advance(&mut self, mut n: usize) {
        while n > 0 {
            if let Some(front) = self.segs.front() {
                let left = front.bytes().len() - self.pos;
                if n < left {
                    self.pos += n;
                    self.queued -= n;
                    return;
                }
                n -= left;
                self.queued -= left;
                self.pos = 0;
                self.segs.pop_front();
            } else {
                self.tail_pos += n;
                return;
            }
        }
    }
}
