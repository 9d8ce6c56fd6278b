//! Connections on demand (see `transport`): dialling a lower peer when an algorithm first needs
//! it, adopting the higher peers' connections that the group's accept thread delivers, what the
//! eager set-up connects before the constructor returns (the ring neighbours), the identities
//! that say which peers share this host, and the group's shared-memory segment.

use super::conn::Peer;
use super::lock::lock;
use super::Engine;
use crate::hosts::MAX_MAP_RANKS;
use crate::transport::accept::Mailbox;
use crate::transport::dial::Dialer;
use crate::transport::identity::{self, Identity};
use crate::transport::Conn;
use c10d_core::{DistError, Result};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the engine reaches its peers.
pub(crate) struct Links {
    /// Connects to lower ranks.
    pub dialer: Dialer,
    /// Where the accept thread leaves the higher ranks' connections.
    pub mailbox: Arc<Mailbox>,
    /// The group's time-out: bounds a dial made outside an op, and the identities' read.
    pub timeout: Duration,
    /// Every rank's identity, read once when first needed.
    pub identities: Option<Vec<Identity>>,
}

impl Drop for Links {
    /// Ends the group's accept thread.
    fn drop(&mut self) {
        self.mailbox.stop();
    }
}

impl Engine {
    /// Connects to `p` now when we dial it (a lower rank) and it is not connected yet; a higher
    /// rank connects to us (frames for it wait in its queue, see `push_tx`). A failed dial is
    /// recorded as a lost peer (handled after the current step).
    pub(super) fn connect_peer(&mut self, p: usize) {
        if p == self.id.rank || self.net.peers[p].is_some() || self.faults.failed.is_some() {
            return;
        }
        self.adopt_arrivals();
        if p > self.id.rank || self.net.peers[p].is_some() || self.faults.is_lost(p) {
            return;
        }
        let deadline = self
            .colls
            .deadline
            .unwrap_or_else(|| super::deadline_after(self.links.timeout));
        let shared = self.shared.clone();
        let aborted = move || lock(&shared.queue).stop.is_some();
        match self.links.dialer.dial(p, deadline, &aborted) {
            Ok(c) => self.install_peer(p, c),
            Err(e) => self.unreachable(p, e),
        }
    }

    /// Takes the connections the accept thread delivered (and a refusal, which fails the group).
    pub(super) fn adopt_arrivals(&mut self) {
        let (conns, refused) = self.links.mailbox.take();
        for (p, c) in conns {
            self.install_peer(p, c);
        }
        if let Some(e) = refused {
            self.fail_group(e, false);
        }
    }

    /// Registers `c` as the connection to `p`, sends what waited for it.
    fn install_peer(&mut self, p: usize, c: Conn) {
        let reg = c.set_nonblocking(true).and_then(|()| {
            self.net.poll.registry().register(
                &mut SourceFd(&c.raw_fd()),
                Token(p),
                Interest::READABLE | Interest::WRITABLE,
            )
        });
        if let Err(e) = reg {
            let e = DistError::network(format!(
                "{}: cannot watch the connection to rank {p}: {e}",
                self.ctx()
            ));
            return self.unreachable(p, e);
        }
        // A TLS session may already hold what the peer sent after the set-up (read with the
        // last handshake record): no readiness event will announce it.
        let tls = c.is_tls();
        let mut peer = Peer::new(c);
        peer.tx = self.net.waiting.remove(&p).unwrap_or_default();
        self.net.peers[p] = Some(Box::new(peer));
        self.shared.connections.fetch_add(1, Ordering::Relaxed);
        if tls {
            self.remember(p);
        }
        self.flush(p);
    }

    /// Connects the `peers` the eager set-up wants (the ring neighbours) before `deadline`:
    /// dials the lower ones, waits for the higher ones.
    ///
    /// # Errors
    /// A failed dial, a refusal (another group or size), or [`DistError::Network`] naming the
    /// higher ranks that did not connect in time.
    pub(crate) fn connect_now(&mut self, peers: &[usize], deadline: Instant) -> Result<()> {
        let r = self.id.rank;
        for &p in peers.iter().filter(|&&p| p < r) {
            if self.net.peers[p].is_none() {
                let c = self.links.dialer.dial(p, deadline, &|| false)?;
                self.install_peer(p, c);
            }
        }
        loop {
            self.adopt_arrivals();
            if let Some(e) = self.faults.failed.clone() {
                return Err(e);
            }
            let absent: Vec<usize> = peers
                .iter()
                .copied()
                .filter(|&p| p > r && self.net.peers[p].is_none())
                .collect();
            if absent.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DistError::network(format!(
                    "{}: timed out after {}ms waiting for rank(s) {} to connect",
                    self.ctx(),
                    self.links.timeout.as_millis(),
                    super::fault_texts::rank_list(&absent)
                )));
            }
            self.links.mailbox.wait(deadline);
        }
    }

    /// Every rank's identity (read from the store once: one wait, one read), or the ranks that
    /// had not published by `deadline`.
    ///
    /// # Errors
    /// As [`identity::read_all`].
    pub(super) fn identities(
        &mut self,
        deadline: Instant,
    ) -> Result<std::result::Result<&[Identity], Vec<usize>>> {
        if self.links.identities.is_none() {
            let ctx = self.ctx();
            let shared = self.shared.clone();
            let aborted = move || lock(&shared.queue).stop.is_some();
            let store = self.links.dialer.store.clone();
            match identity::read_all(store.as_ref(), self.id.size, deadline, &ctx, &aborted)? {
                Ok(all) => self.links.identities = Some(all),
                Err(missing) => return Ok(Err(missing)),
            }
        }
        Ok(Ok(self.links.identities.as_deref().unwrap_or_default()))
    }

    /// Whether every rank of the group runs on this host (a group of one does), or the ranks
    /// that had not published where they run by `deadline`.
    ///
    /// # Errors
    /// As [`Engine::identities`].
    pub(super) fn all_peers_local(
        &mut self,
        deadline: Instant,
    ) -> Result<std::result::Result<bool, Vec<usize>>> {
        if self.id.size == 1 {
            return Ok(Ok(true));
        }
        if self.links.dialer.mine.host.is_none() || self.id.size > MAX_MAP_RANKS {
            // No Unix sockets here: a host of our own, whatever the others published. A group
            // beyond the bound is treated as spanning hosts without asking (see the constant).
            return Ok(Ok(false));
        }
        let me = self.id.rank;
        Ok(self
            .identities(deadline)?
            .map(|ids| ids.iter().all(|i| ids[me].same_host(i))))
    }

    /// Marks the group initialized (its first op, or the eager set-up). The shared-memory
    /// segment is not set up here but by the first op that needs one (`algo::shm::probe`).
    pub(crate) fn ensure_initialized(&mut self) {
        if !self.shared.initialized.load(Ordering::Relaxed) {
            self.shared.initialized.store(true, Ordering::Release);
        }
    }
}
