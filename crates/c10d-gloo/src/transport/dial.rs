//! The connecting side: a rank connects to a lower rank when it first needs it, reading that
//! rank's published addresses from the store, and proves itself (TLS, the job's secret, the
//! hello) before the connection carries frames.

use super::hello::{encode_hello, read_frame, Who};
use super::identity::{addr_key, local_key, Identity};
use super::{connect_unix, left, wait_keys, Conn};
use c10d_core::{DistError, Result};
use c10d_store::auth::AuthSecret;
use c10d_store::tls::TlsConfig;
use c10d_store::Store;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a refused TCP connection is retried: the peer published its address, so its
/// listener exists unless the peer exited (then the error comes after this, not at the op's
/// time-out).
const REFUSED_GRACE: Duration = Duration::from_secs(2);

/// What a rank needs to connect to its lower peers.
pub(crate) struct Dialer {
    pub store: Arc<dyn Store>,
    pub me: Who,
    /// This rank's identity (a peer with the same host is dialled over its Unix socket).
    pub mine: Identity,
    pub socket_buffer_bytes: usize,
    /// The job's secret: the accepting rank challenges, we answer (`c10d_store::auth`).
    pub auth: Option<AuthSecret>,
    /// TLS for TCP connections: the connecting rank is the TLS client.
    pub tls: Option<TlsConfig>,
}

impl Dialer {
    /// Connects to the lower rank `p` before `deadline`: waits for its address, dials (its Unix
    /// socket when on this host, else TCP), runs TLS and the secret's challenge, says hello and
    /// reads the `OK`. `aborted` is polled while waiting.
    ///
    /// # Errors
    /// [`DistError::Network`] when `p` publishes no address, cannot be reached or fails a
    /// handshake before `deadline`; [`DistError::Backend`] when `p` refuses our hello (another
    /// group or size) or the group was aborted.
    pub(crate) fn dial(
        &self,
        p: usize,
        deadline: Instant,
        aborted: &dyn Fn() -> bool,
    ) -> Result<Conn> {
        self.wait_for_address(p, deadline, aborted)?;
        let mut s = match self.dial_local(p)? {
            Some(c) => c,
            None => self.dial_tcp(p, deadline, aborted)?,
        };
        s.set_timeouts(Some(left(deadline)))?;
        if let (Some(tls), false) = (&self.tls, s.is_local()) {
            s.start_tls(tls.client_session()).map_err(|e| {
                DistError::network(self.me.ctx(format!(
                    "TLS handshake with rank {p} failed: {e} (does it use TLS with a certificate of the job's CA?)"
                )))
            })?;
        }
        if let Some(secret) = &self.auth {
            let desc = self.me.ctx(format!("rank {p}"));
            c10d_store::auth::client_handshake(&mut s, secret, &desc)?;
        }
        self.say_hello(p, &mut s)?;
        s.set_timeouts(None)?;
        s.tune(self.socket_buffer_bytes)?;
        Ok(s)
    }

    /// Waits (in abortable slices) until rank `p` has published its address.
    fn wait_for_address(
        &self,
        p: usize,
        deadline: Instant,
        aborted: &dyn Fn() -> bool,
    ) -> Result<()> {
        let key = addr_key(p);
        let name = self.me.name();
        if wait_keys(
            self.store.as_ref(),
            &[&key],
            deadline,
            aborted,
            (&name, "connecting"),
        )? {
            return Ok(());
        }
        Err(DistError::network(self.me.ctx(format!(
            "rank {p} did not publish its address in time (it never joined the group?)"
        ))))
    }

    /// Connects to rank `p`'s Unix socket when it runs on our host; `None` otherwise or when
    /// that fails (the caller falls back to TCP).
    fn dial_local(&self, p: usize) -> Result<Option<Conn>> {
        if self.mine.unix.is_none() {
            return Ok(None);
        }
        let theirs = Identity::decode(&self.store.get(&local_key(p))?);
        let (true, Some(name)) = (self.mine.same_host(&theirs), &theirs.unix) else {
            return Ok(None);
        };
        match connect_unix(name) {
            Ok(s) => Ok(Some(Conn::unix(s))),
            Err(e) => {
                log::debug!(
                    "{}",
                    self.me.ctx(format!(
                        "local socket of rank {p} unreachable ({e}); using TCP"
                    ))
                );
                Ok(None)
            }
        }
    }

    /// Connects to rank `p`'s published TCP address, retrying until the deadline (a refusal
    /// only for [`REFUSED_GRACE`]).
    fn dial_tcp(&self, p: usize, deadline: Instant, aborted: &dyn Fn() -> bool) -> Result<Conn> {
        let addr_s = String::from_utf8_lossy(&self.store.get(&addr_key(p))?).to_string();
        let addr: SocketAddr = addr_s.parse().map_err(|e| {
            DistError::network(
                self.me
                    .ctx(format!("bad address '{addr_s}' published by rank {p}: {e}")),
            )
        })?;
        let refused_until = Instant::now() + REFUSED_GRACE;
        loop {
            let e =
                match TcpStream::connect_timeout(&addr, left(deadline).min(Duration::from_secs(5)))
                {
                    Ok(s) => return Ok(Conn::tcp(s)),
                    Err(e) => e,
                };
            let refused = e.kind() == std::io::ErrorKind::ConnectionRefused;
            let now = Instant::now();
            if now >= deadline || (refused && now >= refused_until) || aborted() {
                return Err(DistError::network(self.me.ctx(format!(
                    "cannot connect to rank {p} at {addr}: {e}{}",
                    if refused {
                        " (its process has exited?)"
                    } else {
                        ""
                    }
                )))
                .with_io_source(e));
            }
            log::debug!("connect to rank {p} at {addr}: {e}; retrying");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends our hello to rank `p` and reads its `OK` (or its error text).
    fn say_hello(&self, p: usize, s: &mut Conn) -> Result<()> {
        let failed =
            |e| DistError::network(self.me.ctx(format!("handshake with rank {p} failed: {e}")));
        s.write_all(&encode_hello(&self.me)).map_err(failed)?;
        let reply = read_frame(s).map_err(failed)?;
        if reply != b"OK" {
            return Err(DistError::backend(self.me.ctx(format!(
                "rank {p} refused the connection: {}",
                String::from_utf8_lossy(&reply)
            ))));
        }
        Ok(())
    }
}
