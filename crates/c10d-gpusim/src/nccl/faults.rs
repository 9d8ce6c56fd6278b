//! Faults injected on purpose: `C10D_SIM_FAULTS=KIND@RANK:N[,KIND@RANK:N…]`, where RANK is
//! the process's `RANK` (or `C10D_GPU_RANK`) and N counts this process's NCCL operations
//! (collectives, sends and receives, from 1) or, for `init_hang`, its communicator inits.
//!
//! | kind | what happens at that op |
//! |---|---|
//! | `hang` | the op never completes (a stuck peer: the others wait for it) until abort |
//! | `die` | the process is killed (SIGKILL) when its stream reaches the op |
//! | `remote_error` | `ncclCommGetAsyncError` turns `ncclRemoteError`; the op hangs until abort |
//! | `system_error` | the same with `ncclSystemError` |
//! | `init_hang` | the Nth communicator init never finishes (until abort) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A fault kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Never completes.
    Hang,
    /// The process dies.
    Die,
    /// An asynchronous `ncclRemoteError`.
    RemoteError,
    /// An asynchronous `ncclSystemError`.
    SystemError,
    /// Communicator init never finishes.
    InitHang,
}

struct Planned {
    fault: Fault,
    rank: u64,
    at: u64,
}

fn parse(spec: &str) -> Option<Planned> {
    let (kind, rest) = spec.trim().split_once('@')?;
    let (rank, at) = rest.split_once(':').unwrap_or((rest, "1"));
    let fault = match kind {
        "hang" => Fault::Hang,
        "die" => Fault::Die,
        "remote_error" => Fault::RemoteError,
        "system_error" => Fault::SystemError,
        "init_hang" => Fault::InitHang,
        _ => return None,
    };
    Some(Planned {
        fault,
        rank: rank.parse().ok()?,
        at: at.parse().ok()?,
    })
}

fn plan() -> &'static Vec<Planned> {
    static PLAN: OnceLock<Vec<Planned>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let spec = std::env::var("C10D_SIM_FAULTS").unwrap_or_default();
        spec.split(',')
            .filter(|s| !s.trim().is_empty())
            .filter_map(|s| {
                let p = parse(s);
                if p.is_none() {
                    eprintln!("c10d-gpusim: ignoring malformed fault {s:?} (KIND@RANK:N)");
                }
                p
            })
            .collect()
    })
}

fn my_rank() -> u64 {
    ["RANK", "C10D_GPU_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(0)
}

static OPS: AtomicU64 = AtomicU64::new(0);
static INITS: AtomicU64 = AtomicU64::new(0);

fn find(count: &AtomicU64, want: impl Fn(Fault) -> bool) -> Option<Fault> {
    if plan().is_empty() {
        return None;
    }
    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
    let rank = my_rank();
    plan()
        .iter()
        .find(|p| want(p.fault) && p.rank == rank && p.at == n)
        .map(|p| p.fault)
}

/// The fault planned for this process's next NCCL operation.
pub fn next_op() -> Option<Fault> {
    find(&OPS, |f| f != Fault::InitHang)
}

/// Whether this process's next communicator init hangs.
pub fn next_init_hangs() -> bool {
    find(&INITS, |f| f == Fault::InitHang).is_some()
}
