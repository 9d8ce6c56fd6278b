//! The elastic job (`--nnodes MIN:MAX`): round after round of rendezvous and workers, until the
//! workers succeed, fail for good, or c10drun is stopped. A membership change (a node joined
//! or was lost) starts the next round without counting against `--max-restarts`; a failure
//! counts, as in torchrun.

use crate::agent::{AgentKeys, AgentStore};
use crate::attempt::{run_attempt, Ctx, StopReason};
use crate::cli::Config;
use crate::elastic::{Elastic, RoundWatch, Seat};
use crate::finish::{exit_barrier, finish_failed};
use crate::log_dir::LogDir;
use crate::output::say;
use crate::summary::print_summary;
use crate::worker_store;
use c10d_store::tcp::TcpStoreServer;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Workers' stores of recent rounds kept up (a spare host must not pull the store from under
/// a round that still runs).
const KEPT_STORES: usize = 3;

/// Runs the elastic job; returns c10drun's exit status.
///
/// Errors: the rendezvous times out, the store fails, a worker cannot start.
pub(super) fn run_elastic(
    cfg: &Config,
    el: &Elastic,
    server: Option<TcpStoreServer>,
    agent_port: u16,
    mut store: Option<AgentStore>,
    logs: &LogDir,
) -> Result<i32, String> {
    let hosting = server.is_some();
    let keys = AgentKeys::new(&cfg.run_id);
    let mut fresh: VecDeque<(u32, TcpStoreServer)> = VecDeque::new();
    let (mut round, mut restarts) = (0u32, 0u32);
    let mut previous: Vec<i64> = Vec::new();
    loop {
        let s = store
            .as_mut()
            .ok_or("the elastic rendezvous needs the store")?;
        let asked = Instant::now();
        let mut prepare = |r: u32, s: &mut AgentStore| {
            if let Some(server) = worker_store::prepare(r, hosting, Some(s), &keys)? {
                fresh.push_back((r, server));
                if fresh.len() > KEPT_STORES {
                    fresh.pop_front();
                }
            }
            Ok(())
        };
        let Some(seat) = el.rendezvous(s, &keys, round, &mut prepare)? else {
            say("the job ended before this node got a place in it");
            return Ok(0);
        };
        round = seat.round;
        announce(&seat, &previous, cfg.nproc, asked);
        previous = seat.nodes.clone();
        let own = fresh.iter().find(|(r, _)| *r == round).map(|(_, f)| f);
        let ctx = Ctx {
            cfg,
            attempt: round,
            nnodes: seat.nodes.len(),
            restarts,
            watch: Some(RoundWatch {
                keys: keys.clone(),
                seat: seat.clone(),
                seq: el.seq,
                conf: el.conf,
                addr: s.addr.clone(),
            }),
            node_rank: seat.node_rank,
            master_addr: cfg.store_host.clone(),
            port: worker_store::port(round, own, agent_port, &mut store, &keys)?,
            keys: keys.clone(),
        };
        let (stop, workers, elapsed) = run_attempt(&ctx, round, &mut store, logs)?;
        let s = store
            .as_mut()
            .ok_or("the elastic rendezvous needs the store")?;
        let next = match stop {
            None => return Ok(finish_succeeded(&ctx, s, &seat, el)),
            Some(StopReason::Membership(ref why)) => Next::Changed(why.clone()),
            Some(ref r @ (StopReason::LocalFailure(_) | StopReason::RemoteFailure(_))) => {
                match classify_failure(s, &keys, el, &seat)? {
                    Some(why) => Next::Changed(why),
                    None if restarts < cfg.max_restarts => {
                        let why = format!(
                            "worker group failed (restart {} of {}); restarting it",
                            restarts + 1,
                            cfg.max_restarts
                        );
                        print_summary(&ctx, &workers, r, elapsed, &why, &[]);
                        // Not a membership change (the other agents classify the same failure
                        // and must count it too): only the next round's size is told.
                        let n = seat.nodes.len().to_string();
                        s.set_once(&keys.expected(round + 1), n.as_bytes())?;
                        restarts += 1;
                        Next::Restart
                    }
                    None => Next::Fail,
                }
            }
            Some(_) => Next::Fail,
        };
        match next {
            Next::Changed(why) => say(&format!(
                "round {round} is over ({why}); meeting the other nodes for round {}",
                round + 1
            )),
            Next::Restart => {}
            Next::Fail => {
                let reason = stop.expect("a failed round has a reason");
                let _ = s.set(&keys.job_closed(), b"failed");
                let code = finish_failed(&ctx, &mut store, hosting, &reason, &workers, elapsed);
                drop(fresh);
                drop(server);
                return Ok(code);
            }
        }
        round += 1;
    }
}

/// What follows a round that ended without success.
enum Next {
    /// The membership changed (why): the next round, not counted.
    Changed(String),
    /// A failure, restarted (counted).
    Restart,
    /// A failure past `--max-restarts`, a signal or the store lost: the job is over.
    Fail,
}

/// After a failure: `Some(why)` when the round had ended with a membership change (another
/// node stopped its workers for it, and so broke ours) or a member was lost (the round ends as
/// a membership change); `None` for a failure of live nodes.
fn classify_failure(
    s: &mut AgentStore,
    keys: &AgentKeys,
    el: &Elastic,
    seat: &Seat,
) -> Result<Option<String>, String> {
    if let Some(why) = s.try_get(&keys.change(seat.round))? {
        return Ok(Some(String::from_utf8_lossy(&why).into_owned()));
    }
    let lost = el.lost_members(s, keys, seat)?;
    if lost.is_empty() {
        return Ok(None);
    }
    let names: Vec<String> = lost
        .iter()
        .map(|&n| Elastic::describe(s, keys, n))
        .collect();
    let why = format!(
        "{} lost: no keep-alive for {:.1} s",
        names.join(", "),
        el.conf.lost_after().as_secs_f64()
    );
    let next = seat.nodes.len() - lost.len();
    Elastic::end_round(s, keys, seat.round, next, &why).map(Some)
}

/// Prints the round: its nodes, who joined and left since this node's previous round, the new
/// world size, and how long the rendezvous took.
fn announce(seat: &Seat, previous: &[i64], nproc: usize, asked: Instant) {
    let list = |v: Vec<i64>| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut line = format!(
        "round {}: {} node(s) [{}], WORLD_SIZE {}, this node is node rank {}",
        seat.round,
        seat.nodes.len(),
        list(seat.nodes.clone()),
        seat.nodes.len() * nproc,
        seat.node_rank
    );
    if !previous.is_empty() {
        let joined: Vec<i64> = seat
            .nodes
            .iter()
            .copied()
            .filter(|n| !previous.contains(n))
            .collect();
        let left: Vec<i64> = previous
            .iter()
            .copied()
            .filter(|n| !seat.nodes.contains(n))
            .collect();
        line += &format!("; joined [{}], left [{}]", list(joined), list(left));
    }
    line += &format!(" (rendezvous took {:.2} s)", asked.elapsed().as_secs_f64());
    say(&line);
}

/// Every worker succeeded: the exit barrier of the round, then the job is closed (spares exit).
fn finish_succeeded(ctx: &Ctx, s: &mut AgentStore, seat: &Seat, el: &Elastic) -> i32 {
    if let Err(msg) = exit_barrier(
        s,
        &ctx.keys,
        seat.round,
        seat.nodes.len(),
        ctx.cfg.rdzv_timeout,
    ) {
        say(&format!("exit barrier: {msg}"));
    }
    let _ = s.set(&ctx.keys.job_closed(), b"finished");
    // Give nodes outside the round (spares, latecomers) a moment to see the end before a
    // hosted store goes away.
    let r = seat.round;
    let outside = s.add(&ctx.keys.joined(r), 0).unwrap_or(0) as usize > seat.nodes.len()
        || s.try_get(&ctx.keys.joined(r + 1)).ok().flatten().is_some();
    if outside {
        std::thread::sleep(el.conf.close.min(Duration::from_secs(1)));
    }
    0
}
