//! Liveness probes: naming the rank that is really silent when an op times out.
//!
//! A time-out alone only tells a rank which peers *it* got no data from; in a ring or a tree that
//! peer is often itself waiting for the rank that stopped (SIGSTOP, a hung host, a cut link), so
//! every survivor would blame a different, healthy neighbour. Shortly before an op's deadline
//! (a quarter of its timeout before, at most 1 s) the engine therefore sends a ping frame to
//! every open peer; a peer whose engine is being driven (it waits in an op of this group)
//! answers with a pong at once. When the deadline passes, the peers that did not answer are
//! named in the error: they are stopped, hung, unreachable, or not inside any op of this group.
//! (A peer whose reading is paused because it ran ahead, see `flow.rs`, is not named: its pong
//! waits behind the frames it sent.)
//! No frame is sent while ops complete in time, so this costs nothing on the fast path.
//!
//! A rank whose op timed out also sends its error text to every peer as a note. The note fails
//! nothing; a peer keeps it and, if it later loses that rank's connection (the rank exited
//! because of its time-out), says what the rank had reported, so its error still names the
//! silent rank instead of only the one that left.

use super::conn::{control_header, Owner, TxData};
use super::fault_texts::rank_list;
use super::Engine;
use crate::wire::Kind;
use std::time::{Duration, Instant};

/// Probe state of one engine.
pub(super) struct Liveness {
    /// When the last round of pings went out.
    pinged: Option<Instant>,
    /// Per peer: when its last pong arrived.
    pong: Vec<Option<Instant>>,
    /// Per peer: a ping arrived and the pong is still to be sent.
    owe: Vec<bool>,
    /// Per peer: the time-out it last reported (see the module docs).
    notes: Vec<Option<String>>,
}

impl Liveness {
    /// State for a group of `n` ranks.
    pub(super) fn new(n: usize) -> Liveness {
        Liveness {
            pinged: None,
            pong: vec![None; n],
            owe: vec![false; n],
            notes: vec![None; n],
        }
    }
}

/// How long before the deadline of an op with `timeout` its probe goes out.
pub(super) fn window(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_secs(1))
}

impl Engine {
    /// Sends the probe for an op ending at `deadline` (with probe `window`) once it is due and
    /// no probe went out within that window yet.
    pub(super) fn probe_if_due(&mut self, deadline: Instant, window: Duration) {
        let due = deadline.checked_sub(window).unwrap_or(deadline);
        let now = Instant::now();
        if window.is_zero() || now < due || self.live.pinged.is_some_and(|t| t >= due) {
            return;
        }
        self.live.pinged = Some(now);
        for p in self.open_peers() {
            let h = control_header(Kind::Ping, 0);
            self.push_tx(p, h, TxData::Owned(Vec::new()), Owner::Nobody);
        }
    }

    /// When the probe of an op ending at `deadline` is due (`None`: sent already or disabled).
    pub(super) fn probe_due_at(&self, deadline: Instant, window: Duration) -> Option<Instant> {
        let due = deadline.checked_sub(window)?;
        let sent = self.live.pinged.is_some_and(|t| t >= due);
        (!window.is_zero() && !sent).then_some(due)
    }

    /// Handles a ping or pong frame from `p`.
    pub(super) fn on_probe_frame(&mut self, p: usize, kind: Kind) {
        match kind {
            Kind::Ping => self.live.owe[p] = true,
            _ => self.live.pong[p] = Some(Instant::now()),
        }
    }

    /// Answers the pings read by the last poll (after its batch of events, not from inside the
    /// read handler), and sends the probes of point-to-point ops that are due.
    pub(super) fn after_poll(&mut self) {
        for p in 0..self.live.owe.len() {
            if std::mem::take(&mut self.live.owe[p]) {
                let h = control_header(Kind::Pong, 0);
                self.push_tx(p, h, TxData::Owned(Vec::new()), Owner::Nobody);
            }
        }
        let p2p: Vec<(Instant, Duration)> = self
            .p2p
            .ops
            .values()
            .map(|o| (o.deadline, window(o.timeout)))
            .collect();
        for (d, w) in p2p {
            self.probe_if_due(d, w);
        }
    }

    /// The nearest instant a poll must wake up for: a point-to-point deadline or probe.
    pub(super) fn next_p2p_wake(&self) -> Option<Instant> {
        self.p2p
            .ops
            .values()
            .map(|o| {
                self.probe_due_at(o.deadline, window(o.timeout))
                    .map_or(o.deadline, |d| d.min(o.deadline))
            })
            .min()
    }

    /// Tells every open peer the time-out `text` of an op of this rank (see the module docs).
    pub(super) fn send_note(&mut self, text: &str) {
        for p in self.open_peers() {
            let h = control_header(Kind::Note, text.len());
            let data = TxData::Owned(text.as_bytes().to_vec());
            self.push_tx(p, h, data, Owner::Nobody);
        }
    }

    /// Keeps the note `text` that peer `p` sent.
    pub(super) fn note_received(&mut self, p: usize, text: &[u8]) {
        self.live.notes[p] = Some(String::from_utf8_lossy(text).into_owned());
    }

    /// What the peers `lost` had reported before leaving, as a suffix of an error text.
    pub(super) fn notes_of(&self, lost: impl Iterator<Item = usize>) -> String {
        lost.filter_map(|q| {
            let n = self.live.notes[q].as_ref()?;
            Some(format!(
                "; before that, {} had reported: {n}",
                self.id.peer_name(q)
            ))
        })
        .collect()
    }

    /// Open peers (not this rank, not ones that left).
    fn open_peers(&self) -> Vec<usize> {
        (0..self.net.peers.len())
            .filter(|&p| !self.faults.left[p] && self.net.peers[p].as_ref().is_some_and(|x| x.open))
            .collect()
    }

    /// The text naming the peers that did not answer the probe of an op ending at `deadline`
    /// (empty when none was sent in time or every peer answered).
    pub(super) fn silent_text(
        &self,
        deadline: Instant,
        window: Duration,
        missing: &[usize],
    ) -> String {
        self.probed_text(deadline, window) + &self.absent_text(missing)
    }

    /// Names the `missing` peers that never connected (connections are made on demand: a peer
    /// that never reached the op never connected, so no probe could reach it either).
    fn absent_text(&self, missing: &[usize]) -> String {
        let absent: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|&p| p != self.id.rank && self.net.peers.get(p).is_some_and(Option::is_none))
            .collect();
        if absent.is_empty() {
            return String::new();
        }
        format!(
            "; rank(s) {} never connected to rank {} (not started, hung before this op, or gone)",
            rank_list(&absent),
            self.id.rank
        )
    }

    /// Names the connected peers that did not answer the probe.
    fn probed_text(&self, deadline: Instant, window: Duration) -> String {
        let Some(due) = deadline.checked_sub(window) else {
            return String::new();
        };
        if window.is_zero() || self.live.pinged.is_none_or(|t| t < due) {
            return String::new();
        }
        let silent: Vec<usize> = self
            .open_peers()
            .into_iter()
            .filter(|&p| self.live.pong[p].is_none_or(|t| t < due) && !self.is_paused(p))
            .collect();
        if silent.is_empty() {
            return String::new();
        }
        format!(
            "; rank(s) {} did not answer a liveness probe within {}ms (stopped, hung, unreachable, or in no op of this group)",
            rank_list(&silent),
            window.as_millis()
        )
    }
}
