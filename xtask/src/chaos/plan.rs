//! What one trial does: the job (collective, size, world size, layout over hosts, transport)
//! and the fault (kind, victim, when), drawn at random.

use super::rng::Rng;

/// The fault injected into one rank of a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// `SIGKILL` of the victim: its peers must fail at once (EOF/reset), naming it.
    Kill,
    /// `SIGSTOP` of the victim for good: its peers must time out, naming it.
    Stop,
    /// One of the victim's peer connections destroyed (`ss -K`): both ends fail at once, naming
    /// each other, and the others name one of the two.
    CloseSocket,
    /// The victim stopped for less than the op timeout, then continued: the job must finish,
    /// with correct results, on every rank.
    Slow,
    /// The veth link between the two host namespaces taken down: every rank must time out,
    /// naming a rank on the other side.
    LinkDown,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Kill,
        FaultKind::Stop,
        FaultKind::CloseSocket,
        FaultKind::Slow,
        FaultKind::LinkDown,
    ];

    /// The kind named `name` ([`FaultKind::name`]).
    pub fn named(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The name printed in the report.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill -9",
            FaultKind::Stop => "SIGSTOP",
            FaultKind::CloseSocket => "close socket",
            FaultKind::Slow => "slow rank",
            FaultKind::LinkDown => "link down",
        }
    }
}

/// The collectives a trial may run (`c10d-bench` names).
pub const OPS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "sendrecv",
];

/// One randomized trial.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: FaultKind,
    pub op: &'static str,
    /// Bytes per collective (c10d-bench's `size`).
    pub size: usize,
    pub world: usize,
    pub victim: usize,
    /// Delay between the job being set up (rank 0's header line) and the fault.
    pub delay_ms: u64,
    /// How long a slow rank stays stopped (`Slow` only).
    pub stall_ms: u64,
    /// Ranks `0..split` run in host namespace A, the others in B; `None`: all on this host.
    pub split: Option<usize>,
    /// Peers talk TCP only (`C10D_GLOO_TCP_ONLY=1`) instead of local Unix sockets.
    pub tcp_only: bool,
}

impl Plan {
    /// Draws a trial of `kind`; `two_hosts` says whether jobs may be spread over two
    /// namespaces.
    pub fn draw(rng: &mut Rng, kind: FaultKind, two_hosts: bool, timeout_ms: u64) -> Plan {
        let world = rng.range(2, 4) as usize;
        // 64 B .. 4 MiB, powers of 4.
        let size = 64usize << (2 * rng.range(0, 8));
        let split = if kind == FaultKind::LinkDown || (two_hosts && rng.range(0, 2) == 0) {
            Some(rng.range(1, world as u64 - 1) as usize)
        } else {
            None
        };
        Plan {
            kind,
            op: OPS[rng.range(0, OPS.len() as u64 - 1) as usize],
            size,
            world,
            victim: rng.range(0, world as u64 - 1) as usize,
            // A slow rank is slowed early: its job has to outlast the stall.
            delay_ms: rng.range(0, if kind == FaultKind::Slow { 50 } else { 300 }),
            stall_ms: rng.range(timeout_ms / 5, timeout_ms / 2),
            split,
            // `ss -K` destroys TCP sockets only.
            tcp_only: kind == FaultKind::CloseSocket || rng.range(0, 1) == 0,
        }
    }

    /// Which host namespace (0 = A, 1 = B) runs `rank`; `None` on a single host.
    pub fn host_of(&self, rank: usize) -> Option<usize> {
        self.split.map(|s| usize::from(rank >= s))
    }

    /// One line describing the trial.
    pub fn describe(&self) -> String {
        let layout = match self.split {
            Some(s) => format!("ranks 0..{s} | {s}..{}", self.world),
            None => "one host".into(),
        };
        let what = match self.kind {
            FaultKind::Slow => format!("rank {} slowed for {} ms", self.victim, self.stall_ms),
            FaultKind::LinkDown => "link down".into(),
            k => format!("{} rank {}", k.name(), self.victim),
        };
        format!(
            "{what} after {} ms, {} {} B x{} ({layout}, {})",
            self.delay_ms,
            self.op,
            self.size,
            self.world,
            if self.tcp_only { "tcp" } else { "local" }
        )
    }
}
