//! Connection set-up: the mesh built at construction or, under lazy init, before the first op
//! (`Connector`, see `transport.rs`), installing its sockets in the poll set, and the group's
//! shared-memory segment and verdict.

use super::conn::Peer;
use super::lock::lock;
use super::{Engine, Ident};
use crate::shm::ShmState;
use crate::transport::{self, Conn, MeshSpec};
use c10d_core::Result;
use c10d_store::Store;
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Deferred connection set-up (lazy init) or nothing left to do.
pub(crate) struct Connector {
    pub store: Arc<dyn Store>,
    pub listen_addr: std::net::IpAddr,
    pub timeout: Duration,
    pub socket_buffer_bytes: usize,
    pub local_unix_sockets: bool,
    /// This rank agrees to a shared-memory segment (see `algo::shm`).
    pub shared_memory: bool,
    /// The job's secret: every connection of the mesh proves it before its hello.
    pub auth: Option<c10d_store::AuthSecret>,
    /// TLS for the mesh's TCP connections.
    pub tls: Option<c10d_store::TlsConfig>,
}

impl Connector {
    /// Listens, publishes our addresses and builds the full mesh (see [`transport`]); polls
    /// `aborted` while waiting.
    pub(crate) fn connect(
        &self,
        id: &Ident,
        aborted: &dyn Fn() -> bool,
    ) -> Result<Vec<Option<Conn>>> {
        let listener = transport::listen(self.listen_addr, self.local_unix_sockets)?;
        transport::publish(self.store.as_ref(), id.rank, &listener)?;
        let spec = MeshSpec {
            group_name: &id.group_name,
            rank: id.rank,
            size: id.size,
            timeout: self.timeout,
            socket_buffer_bytes: self.socket_buffer_bytes,
            aborted,
            auth: self.auth.as_ref(),
            tls: self.tls.as_ref(),
        };
        transport::connect_mesh(self.store.as_ref(), &listener, &spec)
    }

    /// The group's shared-memory segment, agreed through the store once the mesh is up (every
    /// rank calls it). Only when every peer is reached over a Unix socket (the same host), which
    /// every rank of the group sees alike (a connection is Unix at both ends or at neither); a
    /// rank that does not allow it still votes.
    pub(crate) fn shared_memory(&self, id: &Ident, conns: &[Option<Conn>]) -> Result<ShmState> {
        let local = conns
            .iter()
            .enumerate()
            .all(|(p, c)| p == id.rank || c.as_ref().is_some_and(Conn::is_local));
        if !local {
            return Ok(ShmState::Off);
        }
        crate::shm::setup(
            self.store.as_ref(),
            id.rank,
            id.size,
            self.shared_memory,
            self.timeout,
        )
    }
}

impl Engine {
    pub(super) fn install(&mut self, streams: Vec<Option<Conn>>) -> Result<()> {
        for (p, s) in streams.into_iter().enumerate() {
            if let Some(s) = s {
                s.set_nonblocking(true)?;
                self.net.poll.registry().register(
                    &mut SourceFd(&s.raw_fd()),
                    Token(p),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                // A TLS session may already hold what the peer sent after the set-up (read
                // with the last handshake record): no readiness event will announce it.
                let tls = s.is_tls();
                self.net.peers[p] = Some(Peer::new(s));
                if tls {
                    self.remember(p);
                }
            }
        }
        self.shared.initialized.store(true, Ordering::Release);
        Ok(())
    }

    /// Installs the group's shared-memory state and publishes the verdict.
    pub(crate) fn set_shm(&mut self, shm: ShmState) {
        let on = matches!(shm, ShmState::On(_));
        self.shared
            .shm
            .store(if on { 1 } else { 2 }, Ordering::Relaxed);
        self.algo.shm = shm;
    }

    pub(super) fn ensure_connected(&mut self) -> Result<()> {
        if let Some(c) = self.connector.take() {
            let shared = self.shared.clone();
            let aborted = move || lock(&shared.queue).stop.is_some();
            let streams = c.connect(&self.id, &aborted)?;
            let shm = c.shared_memory(&self.id, &streams)?;
            self.set_shm(shm);
            self.install(streams)?;
        }
        Ok(())
    }
}
