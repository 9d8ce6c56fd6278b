//! One client connection speaking the TCPStore protocol: connecting with PyTorch's retry loop
//! and backoff, the VALIDATE + PING handshake (with the job's secret and TLS), and the framed
//! requests and replies of each command.

use crate::auth::{self, AuthSecret};
use crate::store::DEFAULT_STORE_TIMEOUT;
use crate::tcp::protocol::{cmd, put_keys, STOP_WAITING, VALIDATE_MAGIC, WAIT_CANCELED};
use crate::tls::{TlsConfig, TlsSession};
use c10d_core::{DistError, Result};
use rand::RngExt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// What a connection must prove and how it is protected: the job's secret and TLS.
#[derive(Clone, Debug, Default)]
pub(super) struct Security {
    pub(super) auth: Option<AuthSecret>,
    pub(super) tls: Option<TlsConfig>,
}

/// One client connection speaking the TCPStore protocol.
pub(super) struct Client {
    pub(super) sock: TcpStream,
    /// The TLS session over `sock`, when the store uses TLS.
    pub(super) tls: Option<TlsSession>,
    pub(super) rcvtimeo: Option<Duration>,
    pub(super) broken: Option<String>,
    pub(super) desc: String,
    pub(super) buf: Vec<u8>,
    /// Received bytes not consumed yet (replies arrive strictly in request order, so reading
    /// ahead is safe and saves a syscall per length-prefixed reply).
    pub(super) rbuf: Box<[u8]>,
    pub(super) rpos: usize,
    pub(super) rlen: usize,
}

pub(super) fn err_broken(desc: &str, why: &str) -> DistError {
    DistError::network(format!(
        "the connection to the TCPStore server at {desc} is unusable after an earlier error: {why}"
    ))
}

/// Timeout of plain request I/O for a store timeout `t`: `t`, or the 300 s default when `t` is
/// zero (PyTorch's "do not wait" applies to WAIT only).
pub(super) fn io_timeout_for(t: Duration) -> Duration {
    if t.is_zero() {
        DEFAULT_STORE_TIMEOUT
    } else {
        t
    }
}

/// The first interval of PyTorch's `ExponentialBackoffWithJitter`.
pub(super) const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Exponential backoff with ±50 % uniform jitter (500 ms, ×1.5, capped at 60 s).
pub(super) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Backoff {
            next: BACKOFF_INITIAL,
        }
    }

    pub(super) fn next_interval(&mut self) -> Duration {
        let base = self.next.as_secs_f64();
        let jitter = rand::rng().random_range(-0.5..=0.5) * base;
        self.next = Duration::from_secs_f64((base * 1.5).min(BACKOFF_MAX.as_secs_f64()));
        Duration::from_secs_f64((base + jitter).max(0.0))
    }
}

/// Strips brackets from "[::1]".
pub(super) fn bare_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// One read from the store's connection, decrypted when it uses TLS.
pub(super) fn sock_read(
    sock: &mut TcpStream,
    tls: &mut Option<TlsSession>,
    b: &mut [u8],
) -> io::Result<usize> {
    match tls {
        Some(t) => t.read(sock, b),
        None => sock.read(b),
    }
}

pub(super) enum Attempt {
    /// Could not open a TCP connection (retry, report as connect time-out).
    Connect(String),
    /// Connected but the VALIDATE/PING handshake failed (retry, report this error).
    Handshake(DistError),
    /// Authentication failed or is missing: retrying cannot help (report at once).
    Refused(DistError),
}

impl Client {
    /// Connects with PyTorch's retry loop and performs the VALIDATE + PING handshake.
    pub(super) fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        sec: &Security,
    ) -> Result<Client> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut backoff = Backoff::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let limit = remaining.max(Duration::from_millis(100));
            let last = match Self::connect_once(host, port, limit, sec) {
                Ok(c) => {
                    // Later writes get the store timeout (the handshake used the connect budget).
                    c.sock.set_write_timeout(Some(io_timeout_for(timeout)))?;
                    return Ok(c);
                }
                Err(Attempt::Refused(e)) => return Err(e),
                Err(a) => a,
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(match last {
                    Attempt::Connect(why) => {
                        log::debug!("TCPStore connect to ({host}, {port}) failed: {why}");
                        DistError::network(format!(
                            "The client socket has timed out after {}ms while trying to connect to ({host}, {port}).",
                            timeout.as_millis()
                        ))
                    }
                    Attempt::Handshake(e) | Attempt::Refused(e) => e,
                });
            }
            std::thread::sleep(backoff.next_interval().min(remaining));
        }
    }

    pub(super) fn connect_once(
        host: &str,
        port: u16,
        limit: Duration,
        sec: &Security,
    ) -> std::result::Result<Client, Attempt> {
        let addrs: Vec<SocketAddr> = (bare_host(host), port)
            .to_socket_addrs()
            .map_err(|e| Attempt::Connect(format!("cannot resolve {host}: {e}")))?
            .collect();
        let mut last = format!("no address for {host}");
        let mut sock = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, limit) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        let sock = sock.ok_or(Attempt::Connect(last))?;
        let _ = sock.set_nodelay(true);
        let desc = format!("({host}, {port})");
        let mut c = Client {
            sock,
            tls: None,
            rcvtimeo: None,
            broken: None,
            desc,
            buf: Vec::with_capacity(256),
            rbuf: vec![0u8; 16 * 1024].into_boxed_slice(),
            rpos: 0,
            rlen: 0,
        };
        if sec.auth.is_some() || sec.tls.is_some() {
            c.sock
                .set_read_timeout(Some(limit))
                .map_err(|e| Attempt::Handshake(e.into()))?;
            c.sock
                .set_write_timeout(Some(limit))
                .map_err(|e| Attempt::Handshake(e.into()))?;
        }
        if let Some(tls) = &sec.tls {
            let mut t = tls.client_session();
            t.handshake(&mut c.sock).map_err(|e| {
                let why = if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    // A read timeout: a silent peer, not a certificate problem.
                    format!(
                        "no answer within {} ms (the store is stopped or overloaded, or the connection stalled)",
                        limit.as_millis()
                    )
                } else {
                    format!("{e} (does the server use TLS with a certificate of the job's CA?)")
                };
                Attempt::Refused(DistError::network(format!(
                    "TLS handshake with the store at {} failed: {why}",
                    c.desc
                )))
            })?;
            c.tls = Some(t);
        }
        if let Some(secret) = &sec.auth {
            let desc = format!("the store at {}", c.desc);
            let r = match &mut c.tls {
                Some(t) => auth::client_handshake(&mut t.over(&mut c.sock), secret, &desc),
                None => auth::client_handshake(&mut c.sock, secret, &desc),
            };
            r.map_err(Attempt::Refused)?;
        }
        c.handshake(limit).map_err(|e| {
            if e.message().contains("requires authentication")
                || e.message().contains("requires TLS")
            {
                Attempt::Refused(e)
            } else {
                Attempt::Handshake(e)
            }
        })?;
        Ok(c)
    }

    pub(super) fn handshake(&mut self, limit: Duration) -> Result<()> {
        let nonce = std::process::id();
        let mut b = Vec::with_capacity(10);
        b.push(cmd::VALIDATE);
        b.extend_from_slice(&VALIDATE_MAGIC.to_le_bytes());
        b.push(cmd::PING);
        b.extend_from_slice(&nonce.to_le_bytes());
        self.sock.set_write_timeout(Some(limit))?;
        self.send(&b)?;
        self.set_rcvtimeo(limit)?;
        let mut r = [0u8; 4];
        self.read_exact(&mut r)?;
        let got = u32::from_le_bytes(r);
        if crate::tls::is_tls_alert(&r) {
            return Err(DistError::network(format!(
                "the store at {} {}",
                self.desc,
                crate::tls::requires_tls()
            )));
        }
        if auth::is_challenge(&r) {
            return Err(DistError::network(format!(
                "the store at {} requires authentication: set {} to the job's secret file",
                self.desc,
                auth::SECRET_FILE_ENV
            )));
        }
        if got != nonce {
            return Err(DistError::network(format!(
                "Ping failed, invalid value returned from server. Expected: {nonce}, Got: {got}"
            )));
        }
        Ok(())
    }

    pub(super) fn check_usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(err_broken(&self.desc, why)),
            None => Ok(()),
        }
    }

    pub(super) fn fail(&mut self, e: DistError) -> DistError {
        if self.broken.is_none() {
            self.broken = Some(e.message().to_string());
        }
        e
    }

    pub(super) fn set_rcvtimeo(&mut self, t: Duration) -> Result<()> {
        let t = t.max(Duration::from_millis(1));
        if self.rcvtimeo != Some(t) {
            self.sock.set_read_timeout(Some(t))?;
            self.rcvtimeo = Some(t);
        }
        Ok(())
    }

    pub(super) fn send(&mut self, b: &[u8]) -> Result<()> {
        self.check_usable()?;
        let sent = match &mut self.tls {
            Some(t) => t.over(&mut self.sock).write_all(b),
            None => self.sock.write_all(b),
        };
        match sent {
            Ok(()) => Ok(()),
            Err(e) => {
                let e = DistError::network(format!(
                    "Failed to send to the TCPStore server at {}: {e}",
                    self.desc
                ))
                .with_io_source(e);
                Err(self.fail(e))
            }
        }
    }

    /// Encodes a request with `f` into the reusable request buffer and sends it.
    pub(super) fn send_with(&mut self, f: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        let mut b = std::mem::take(&mut self.buf);
        b.clear();
        f(&mut b);
        let r = self.send(&b);
        self.buf = b;
        r
    }

    pub(super) fn eof_error(&mut self) -> DistError {
        let e = DistError::network(format!(
            "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash? (server {})",
            self.desc
        ));
        self.fail(e)
    }

    /// One `read` into the read-ahead buffer (which must be empty). `Ok(false)` = timed out.
    pub(super) fn fill(&mut self) -> Result<bool> {
        debug_assert_eq!(self.rpos, self.rlen);
        loop {
            match sock_read(&mut self.sock, &mut self.tls, &mut self.rbuf) {
                Ok(0) => return Err(self.eof_error()),
                Ok(n) => {
                    self.rpos = 0;
                    self.rlen = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(false)
                }
                Err(e) => {
                    let e = DistError::network(format!(
                        "Failed to recv from the TCPStore server at {}: {e}",
                        self.desc
                    ))
                    .with_io_source(e);
                    return Err(self.fail(e));
                }
            }
        }
    }

    /// Reads exactly `buf.len()` bytes with the current receive timeout (EINTR retried).
    pub(super) fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            if self.rpos == self.rlen {
                if buf.len() - got >= self.rbuf.len() {
                    // Large payload: read straight into the destination.
                    match sock_read(&mut self.sock, &mut self.tls, &mut buf[got..]) {
                        Ok(0) => return Err(self.eof_error()),
                        Ok(n) => {
                            got += n;
                            continue;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) => {}
                        Err(e) => {
                            let e = DistError::network(format!(
                                "Failed to recv from the TCPStore server at {}: {e}",
                                self.desc
                            ))
                            .with_io_source(e);
                            return Err(self.fail(e));
                        }
                    }
                } else if self.fill()? {
                    continue;
                }
                let e = DistError::network(format!(
                    "Socket Timeout: no reply from the TCPStore server at {} within {}ms",
                    self.desc,
                    self.rcvtimeo.unwrap_or_default().as_millis()
                ));
                return Err(self.fail(e));
            }
            let n = (self.rlen - self.rpos).min(buf.len() - got);
            buf[got..got + n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
            self.rpos += n;
            got += n;
        }
        Ok(())
    }

    pub(super) fn recv_u8(&mut self) -> Result<u8> {
        let mut b = [0u8; 1];
        self.read_exact(&mut b)?;
        Ok(b[0])
    }

    pub(super) fn recv_i64(&mut self) -> Result<i64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(i64::from_le_bytes(b))
    }

    /// Reads a length-prefixed byte vector, growing the buffer as bytes arrive (a bogus length
    /// from a broken server cannot make us allocate it up front).
    pub(super) fn recv_bytes(&mut self) -> Result<Vec<u8>> {
        let len = self.recv_i64()? as u64;
        let mut v = Vec::with_capacity((len as usize).min(1 << 20));
        // Grow by at most what already arrived (64 KiB first), reading straight into `v`.
        while (v.len() as u64) < len {
            let have = v.len();
            let step = (len - have as u64).min(have.max(64 * 1024) as u64) as usize;
            v.resize(have + step, 0);
            self.read_exact(&mut v[have..])?;
        }
        Ok(v)
    }

    /// Waits up to `timeout` for the first reply byte of a WAIT/BARRIER. `None` = timed out.
    /// `timeout` zero does not wait at all (PyTorch's `poll(0)` quirk).
    pub(super) fn wait_first_byte(&mut self, timeout: Duration) -> Result<Option<u8>> {
        if timeout.is_zero() {
            return Ok(None);
        }
        let deadline = Instant::now() + timeout;
        let mut first = true;
        loop {
            if self.rpos < self.rlen {
                self.rpos += 1;
                return Ok(Some(self.rbuf[self.rpos - 1]));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(None);
            }
            // The receive timeout already equals `timeout` in the common case (a store-timeout
            // wait); re-arming it would cost a syscall for microseconds of accuracy.
            if !(first && self.rcvtimeo == Some(timeout)) {
                self.set_rcvtimeo(remaining)?;
            }
            first = false;
            // Timed out or interrupted (EINTR is retried inside) → loop re-checks the deadline.
            self.fill()?;
        }
    }

    /// CANCEL_WAIT after a timed-out WAIT: the reply is `01`, or `00 01` when the wake-up raced.
    pub(super) fn cancel_wait(&mut self, io_timeout: Duration) -> Result<()> {
        self.send(&[cmd::CANCEL_WAIT])?;
        self.set_rcvtimeo(io_timeout)?;
        let mut b = self.recv_u8()?;
        if b == STOP_WAITING {
            b = self.recv_u8()?;
        }
        if b != WAIT_CANCELED {
            let e = DistError::network(format!("wait_canceled response is expected, got {b}"));
            return Err(self.fail(e));
        }
        Ok(())
    }

    /// WAIT on wire keys; `Ok(false)` when it timed out (and was cancelled).
    pub(super) fn wait_keys(
        &mut self,
        keys: &[Vec<u8>],
        timeout: Duration,
        io_timeout: Duration,
    ) -> Result<bool> {
        self.send_with(|b| {
            b.push(cmd::WAIT);
            put_keys(b, keys);
        })?;
        self.finish_wait(timeout, io_timeout)
    }

    pub(super) fn finish_wait(&mut self, timeout: Duration, io_timeout: Duration) -> Result<bool> {
        match self.wait_first_byte(timeout)? {
            Some(STOP_WAITING) => Ok(true),
            Some(b) => {
                let e = DistError::network(format!("Stop_waiting response is expected, got {b}"));
                Err(self.fail(e))
            }
            None => {
                self.cancel_wait(io_timeout)?;
                Ok(false)
            }
        }
    }
}
