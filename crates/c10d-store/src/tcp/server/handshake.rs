//! The set-up of one connection: its TLS handshake ([`crate::tls`], driven by the session as
//! bytes arrive) and its authentication (see [`crate::auth`]): the challenge is queued when the
//! connection is accepted (inside TLS, sent once the TLS handshake is done), the answer is the
//! first [`ANSWER_LEN`] bytes the client sends, and nothing it sends is read as a request
//! before a right answer. A wrong answer or a failed TLS handshake closes the connection; so
//! does a set-up not done within the server's handshake timeout (the event loop's deadline
//! queue).

use crate::auth::{AuthSecret, ServerHandshake, ANSWER_LEN};
use std::time::Instant;

/// A connection that has not yet answered the challenge.
pub(super) struct Pending {
    hs: ServerHandshake,
    got: Vec<u8>,
}

/// What a connection's bytes did to its handshake.
pub(super) enum Step {
    /// The answer is not complete yet (all of the input was taken).
    More,
    /// A right answer: send this proof; the rest of the input is requests.
    Done(Vec<u8>),
    /// A wrong answer.
    Refused,
}

impl Pending {
    /// A handshake, and the challenge to send.
    pub(super) fn start() -> (Pending, Vec<u8>) {
        let hs = ServerHandshake::new();
        let challenge = hs.challenge();
        let p = Pending {
            hs,
            got: Vec::with_capacity(ANSWER_LEN),
        };
        (p, challenge)
    }

    /// Takes the answer's bytes from the front of `input`.
    pub(super) fn absorb(&mut self, secret: &AuthSecret, input: &mut &[u8]) -> Step {
        let take = (ANSWER_LEN - self.got.len()).min(input.len());
        self.got.extend_from_slice(&input[..take]);
        *input = &input[take..];
        if self.got.len() < ANSWER_LEN {
            return Step::More;
        }
        match self.hs.answer(secret, &self.got) {
            Some(proof) => Step::Done(proof),
            None => Step::Refused,
        }
    }
}

impl super::EventLoop {
    /// Starts the set-up of a new connection `id`: its deadline when it must do a TLS
    /// handshake or authenticate, and the challenge when the server has a secret.
    pub(super) fn start_setup(&mut self, id: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if self.secret.is_some() {
            let (pending, challenge) = Pending::start();
            c.out.tail.extend_from_slice(&challenge);
            c.auth = Some(pending);
        }
        if c.in_setup() {
            let deadline = Instant::now() + self.handshake_timeout;
            c.setup_until = Some(deadline);
            self.handshakes.push_back((deadline, id));
            self.flush_conn(id);
        }
    }

    /// How long the loop may sleep: until the oldest handshake's deadline, and no longer than
    /// the accept retry interval while accepting is retried.
    pub(super) fn poll_timeout(&self) -> Option<std::time::Duration> {
        let handshake = self
            .handshakes
            .front()
            .map(|(d, _)| d.saturating_duration_since(Instant::now()));
        let retry = self.accept_retry.then_some(super::ACCEPT_RETRY);
        match (handshake, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Closes the connections whose set-up ran out of time.
    pub(super) fn expire_handshakes(&mut self) {
        let now = Instant::now();
        while let Some(&(deadline, id)) = self.handshakes.front() {
            if deadline > now {
                return;
            }
            self.handshakes.pop_front();
            let Some(c) = self.conns.get(&id) else {
                continue;
            };
            if c.setup_until != Some(deadline) || !c.in_setup() {
                continue;
            }
            let secs = self.handshake_timeout.as_secs_f64();
            let why = if c.tls.as_ref().is_some_and(|t| t.is_handshaking()) {
                format!(
                    "TLS handshake not done within {secs:.1} s (a client without TLS, such as \
                     PyTorch's TCPStore?)"
                )
            } else {
                format!(
                    "authentication failed: no answer within {secs:.1} s (a client without the \
                     job's secret, such as PyTorch's TCPStore?)"
                )
            };
            self.close(id, &why);
        }
    }
}
