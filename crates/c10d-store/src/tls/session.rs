//! One TLS connection's state over a byte transport the caller owns (a socket, blocking or
//! non-blocking): plaintext in and out, ciphertext to and from the transport.
//!
//! The rules a non-blocking caller relies on:
//! - `read` returns plaintext already decrypted before touching the transport; it returns
//!   `WouldBlock` only when the transport has nothing more (so an edge-triggered caller that
//!   reads until `WouldBlock` misses nothing), and `Ok(0)` at the end of the stream.
//! - `write_vectored` first sends what earlier writes left encrypted but unsent; while any of
//!   that remains it accepts nothing (`WouldBlock`). Plaintext it accepts is encrypted at once
//!   (the caller may reuse its buffers), at most `SEND_BUFFER` (256 KiB) a call.
//! - After a write, [`TlsSession::has_unsent`] says whether ciphertext still waits for the
//!   transport: the caller must call [`TlsSession::flush`] again when the transport becomes
//!   writable, even if it has nothing new to write.

use rustls::Connection;
use std::io::{self, IoSlice, Read, Write};

/// Plaintext one write accepts at most (encrypted records then wait in the session).
pub const SEND_BUFFER: usize = 256 * 1024;

/// The state of one TLS connection (see the module docs for its I/O rules).
pub struct TlsSession {
    conn: Connection,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsSession(handshaking={})", self.conn.is_handshaking())
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl TlsSession {
    pub(super) fn new(mut conn: Connection) -> TlsSession {
        conn.set_buffer_limit(Some(SEND_BUFFER));
        TlsSession { conn }
    }

    /// Runs the handshake to its end over a blocking transport (its time-outs bound it).
    ///
    /// # Errors
    /// The transport's errors (`TimedOut`/`WouldBlock` when its time-out passes), and
    /// `InvalidData` naming the TLS problem (e.g. a peer certificate of another CA, a peer that
    /// speaks no TLS); `UnexpectedEof` when the peer closed the connection.
    pub fn handshake<S: Read + Write>(&mut self, io: &mut S) -> io::Result<()> {
        while self.conn.is_handshaking() {
            let (rd, wr) = self.conn.complete_io(io)?;
            if rd == 0 && wr == 0 && self.conn.is_handshaking() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "TLS: the peer closed the connection during the handshake",
                ));
            }
        }
        self.flush(io)
    }

    /// Whether the handshake is still under way.
    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Whether encrypted bytes wait for the transport.
    pub fn has_unsent(&self) -> bool {
        self.conn.wants_write()
    }

    /// Sends waiting ciphertext until none is left (`Ok`) or the transport would block (`Err`
    /// of kind `WouldBlock`).
    ///
    /// # Errors
    /// The transport's errors.
    pub fn flush<S: Write>(&mut self, io: &mut S) -> io::Result<()> {
        while self.conn.wants_write() {
            if self.conn.write_tls(io)? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Reads decrypted bytes into `buf`; `Ok(0)` = end of stream.
    ///
    /// # Errors
    /// The transport's errors (`WouldBlock` when it has nothing yet), `InvalidData` for a
    /// record that fails to decrypt or a TLS alert from the peer.
    pub fn read<S: Read + Write>(&mut self, io: &mut S, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer closed without close_notify: the end of the stream all the same.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            // What earlier writes left unsent goes first: the peer may be waiting for it.
            match self.flush(io) {
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                _ => {}
            }
            let got = self.conn.read_tls(io)?;
            let state = self.conn.process_new_packets().map_err(invalid);
            if self.conn.wants_write() {
                // Handshake messages and alerts go out at once (best effort when non-blocking;
                // `has_unsent` tells the caller).
                match self.flush(io) {
                    Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
                    _ => {}
                }
            }
            state?;
            if got == 0 {
                return Ok(0);
            }
        }
    }

    /// Encrypts up to `SEND_BUFFER` (256 KiB) of `iov` and sends what the transport takes.
    /// Returns the plaintext bytes accepted (all of them are the session's from then on).
    ///
    /// # Errors
    /// `WouldBlock` (nothing accepted) while earlier ciphertext is still unsent; the
    /// transport's errors.
    pub fn write_vectored<S: Write>(
        &mut self,
        io: &mut S,
        iov: &[IoSlice<'_>],
    ) -> io::Result<usize> {
        self.flush(io)?;
        let n = self.conn.writer().write_vectored(iov)?;
        match self.flush(io) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(n),
        }
    }

    /// Sends a close_notify (best effort): the peer reads a clean end of stream.
    pub fn close<S: Write>(&mut self, io: &mut S) {
        self.conn.send_close_notify();
        let _ = self.flush(io);
    }

    /// This session over `io`, as one `Read + Write` stream (blocking transports: writes are
    /// sent completely before they return).
    pub fn over<'a, S: Read + Write>(&'a mut self, io: &'a mut S) -> TlsIo<'a, S> {
        TlsIo { session: self, io }
    }
}

/// A [`TlsSession`] over a blocking transport, as a stream (for handshakes written against
/// `Read + Write`, such as [`crate::auth::client_handshake`]).
pub struct TlsIo<'a, S> {
    session: &'a mut TlsSession,
    io: &'a mut S,
}

impl<S: Read + Write> Read for TlsIo<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.session.read(self.io, buf)
    }
}

impl<S: Read + Write> Write for TlsIo<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = self.session.write_vectored(self.io, iov)?;
        self.session.flush(self.io)?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.session.flush(self.io)?;
        self.io.flush()
    }
}
