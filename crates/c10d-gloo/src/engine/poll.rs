//! The event loop: one `epoll` wait and the handling of its batch of events (the waker drains
//! submissions, readable peers are read, writable ones flushed), then the read backlog, the
//! faults noticed meanwhile (see `faults.rs`), liveness answers and point-to-point deadlines;
//! reading a peer frame by frame, within a budget (`on_readable`) or to the end (`read_all`).

use super::conn::{read_step, ReadStep, Rx};
use super::{Engine, WAKER};
use c10d_core::DistError;
use mio::Token;
use std::time::{Duration, Instant};

impl Engine {
    /// Waits for events (at most `timeout`, or until the nearest p2p deadline or liveness probe)
    /// and handles them.
    pub(super) fn poll_once(&mut self, timeout: Option<Duration>) {
        let now = Instant::now();
        let t = match (timeout, self.next_p2p_wake()) {
            _ if self.has_backlog() || self.faults.recorded() => Some(Duration::ZERO),
            (Some(t), Some(d)) => Some(t.min(d.saturating_duration_since(now))),
            (None, Some(d)) => Some(d.saturating_duration_since(now)),
            (t, None) => t,
        };
        if let Err(e) = self.net.poll.poll(&mut self.net.events, t) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                let err = DistError::network(format!("{}: epoll failed: {e}", self.ctx()))
                    .with_io_source(e);
                self.fail_group(err, false);
            }
            return;
        }
        let mut evs: smallvec::SmallVec<[(Token, bool, bool, bool); 16]> =
            smallvec::SmallVec::new();
        for ev in self.net.events.iter() {
            evs.push((
                ev.token(),
                ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                ev.is_writable() || ev.is_error(),
                ev.is_read_closed() || ev.is_error(),
            ));
        }
        for (tok, r, w, closed) in evs {
            if tok == WAKER {
                self.adopt_arrivals();
                self.drain();
                continue;
            }
            if closed {
                self.peer_closing(tok.0);
            }
            if r {
                self.on_readable(tok.0);
            }
            if w {
                self.flush(tok.0);
            }
        }
        self.read_backlog();
        self.handle_faults();
        self.after_poll();
        self.handle_faults();
        if !self.p2p.ops.is_empty() {
            self.expire_p2p();
        }
    }

    /// Reads what `p` sent, within the read budget of one event (see `flow.rs`).
    pub(super) fn on_readable(&mut self, p: usize) {
        self.read_peer(p, true);
    }

    /// Reads everything `p` already sent, budget and pause aside (fault handling).
    pub(super) fn read_all(&mut self, p: usize) {
        self.read_peer(p, false);
    }

    /// Reads from `p` until its socket would block (or, when `bounded`, until the read budget of
    /// one event is spent or reading from `p` is paused), handling each frame as it completes.
    fn read_peer(&mut self, p: usize, bounded: bool) {
        let mut steps = 0;
        loop {
            if bounded && !self.may_read(p, steps) {
                return;
            }
            steps += 1;
            let step = match self.net.peers[p].as_mut() {
                Some(peer) if peer.open => read_step(peer),
                _ => return,
            };
            match step {
                ReadStep::Block => return,
                ReadStep::More => {}
                ReadStep::Lost(why) => return self.peer_lost(p, why),
                ReadStep::Header(h) => {
                    let dest = self.classify(p, &h);
                    if h.nbytes == 0 {
                        self.finish_frame(p, h, dest);
                    } else if let Some(peer) = self.net.peers[p].as_mut() {
                        peer.rx = Rx::Payload {
                            hdr: h,
                            dest,
                            got: 0,
                        };
                    }
                }
                ReadStep::Done(h, dest) => self.finish_frame(p, h, dest),
            }
        }
    }
}
