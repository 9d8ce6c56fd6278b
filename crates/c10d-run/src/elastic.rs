//! torchrun's elastic rendezvous (`--nnodes MIN:MAX`, `--rdzv-backend c10d`), in the agents'
//! store.
//!
//! - **Rounds.** Each worker group runs in a round. An agent joins round `r` by taking the next
//!   arrival index (`a{r}/joined`) and writing its node number under `a{r}/member/{i}`. The
//!   round closes (`a{r}/closed` = its node count, set once with compare-set) as soon as MAX
//!   nodes joined, or the nodes the round expects (`a{r}/expected`, written by whoever ended
//!   the round before), or `last_call_timeout` after MIN joined. Arrivals past the count are
//!   late.
//! - **Node ranks.** Every agent takes a node number once (`node_seq`, in order of first
//!   arrival); a round's node ranks follow those numbers, so nodes that stay keep their order
//!   and newcomers come last (torchrun sorts by node descriptor, to the same effect for nodes
//!   that stay).
//! - **Joining.** A late node below MAX counts itself in `a{r}/waiting`; the members' watchers
//!   see it and end the round (`a{r}/change`). At MAX it waits as a spare (torchrun's
//!   redundancy list). Either way it joins round `r + 1` once round `r` is over.
//! - **Leaving.** Each agent bumps `keep_alive/{n}` every `keep_alive_interval`; a member whose
//!   counter stood still for `keep_alive_interval × keep_alive_max_attempt` is lost: the
//!   watchers end the round. When workers fail first (their peer vanished), the agents check
//!   the keep-alives before counting the failure: a lost node makes it a membership change,
//!   which does not count against `--max-restarts` (a failure does, as in torchrun).
//! - **The end.** An agent whose job ended for good sets `job_closed`; spares then exit.

use crate::agent::{fail_text, AgentKeys, AgentStore, Remote};
use crate::cli::ElasticConf;
use crate::host::hostname;
use crate::output::say;
use c10d_store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a waiting agent looks at the store.
const POLL: Duration = Duration::from_millis(100);

/// This node's place in a closed round.
#[derive(Debug, Clone)]
pub struct Seat {
    pub round: u32,
    /// Position of this node among the round's members.
    pub node_rank: usize,
    /// The members' node numbers, in node-rank order.
    pub nodes: Vec<i64>,
}

/// How a join ended.
enum Joined {
    Seat(Seat),
    /// The round closed with this many nodes before this one arrived.
    Late(usize),
    /// The job ended for good.
    JobClosed,
}

/// The elastic agent's identity and settings.
pub struct Elastic {
    pub conf: ElasticConf,
    pub min: usize,
    pub max: usize,
    pub join_timeout: Duration,
    /// This node's number (order of first arrival, from 1).
    pub seq: i64,
}

impl Elastic {
    /// Takes a node number, publishes this node's description and starts its keep-alive.
    ///
    /// Errors: the store fails.
    pub fn start(
        s: &mut AgentStore,
        keys: &AgentKeys,
        conf: ElasticConf,
        (min, max): (usize, usize),
        join_timeout: Duration,
        local_addr: Option<&str>,
    ) -> Result<Elastic, String> {
        let seq = s.add(&keys.node_seq(), 1)?;
        s.set(&keys.node(seq), describe_self(local_addr).as_bytes())?;
        s.add(&keys.keep_alive(seq), 1)?;
        keep_alive(
            s.clone_conn()?,
            keys.keep_alive(seq),
            conf.keep_alive_interval,
        );
        say(&format!(
            "elastic rendezvous of {min} to {max} nodes: this node is {}",
            Elastic::describe(s, keys, seq)
        ));
        Ok(Elastic {
            conf,
            min,
            max,
            join_timeout,
            seq,
        })
    }

    /// Joins the earliest open round from `first` on and returns this node's seat, or `None`
    /// when the job ended before this node got one. `before_join(r)` runs before each join
    /// (the hosting agent prepares round `r`'s workers' store there).
    ///
    /// Errors: `join_timeout` passed; the store fails.
    pub fn rendezvous(
        &self,
        s: &mut AgentStore,
        keys: &AgentKeys,
        first: u32,
        before_join: &mut dyn FnMut(u32, &mut AgentStore) -> Result<(), String>,
    ) -> Result<Option<Seat>, String> {
        let deadline = Instant::now() + self.join_timeout;
        let mut r = latest_round(s, keys, first)?;
        loop {
            before_join(r, s)?;
            match self.join(s, keys, r, deadline)? {
                Joined::Seat(seat) => return Ok(Some(seat)),
                Joined::JobClosed => return Ok(None),
                Joined::Late(n) if n < self.max => {
                    say(&format!(
                        "round {r} already runs with {n} node(s); asking it to make room for this node"
                    ));
                    s.add(&keys.waiting(r), 1)?;
                }
                Joined::Late(n) => say(&format!(
                    "round {r} runs with the most nodes allowed ({n}); this node waits as a spare"
                )),
            }
            if !wait_round_over(s, keys, r, deadline)? {
                return Ok(None);
            }
            r += 1;
        }
    }

    /// Joins round `r` and waits until it closes.
    fn join(
        &self,
        s: &mut AgentStore,
        keys: &AgentKeys,
        r: u32,
        deadline: Instant,
    ) -> Result<Joined, String> {
        let i = (s.add(&keys.joined(r), 1)? - 1) as usize;
        s.set(&keys.member(r, i), self.seq.to_string().as_bytes())?;
        let mut min_since: Option<Instant> = None;
        loop {
            if let Some(n) = s.try_get(&keys.closed(r))? {
                let n = parse_count(&n, "closed")?;
                return Ok(if i < n {
                    Joined::Seat(self.seat(s, keys, r, n)?)
                } else {
                    Joined::Late(n)
                });
            }
            if s.try_get(&keys.job_closed())?.is_some() {
                return Ok(Joined::JobClosed);
            }
            let count = s.add(&keys.joined(r), 0)? as usize;
            let expected = match s.try_get(&keys.expected(r))? {
                Some(v) => parse_count(&v, "expected")?.clamp(self.min, self.max),
                None => self.max,
            };
            if count >= self.min {
                min_since.get_or_insert_with(Instant::now);
            }
            let last_call_over = min_since.is_some_and(|t| t.elapsed() >= self.conf.last_call);
            if count >= expected || last_call_over {
                s.set_once(&keys.closed(r), count.min(self.max).to_string().as_bytes())?;
                continue;
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out waiting for {} node(s) to join round {r} ({count} joined; join_timeout {:.0} s)",
                    self.min,
                    self.join_timeout.as_secs_f64()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The seat of this node in round `r`, closed with `n` nodes.
    fn seat(&self, s: &mut AgentStore, keys: &AgentKeys, r: u32, n: usize) -> Result<Seat, String> {
        let raw = s.get_all((0..n).map(|i| keys.member(r, i)).collect())?;
        let mut nodes = raw
            .iter()
            .map(|v| parse_count(v, "member").map(|x| x as i64))
            .collect::<Result<Vec<_>, _>>()?;
        nodes.sort_unstable();
        let node_rank = nodes
            .iter()
            .position(|&x| x == self.seq)
            .ok_or_else(|| format!("round {r} closed without this node (node {})", self.seq))?;
        Ok(Seat {
            round: r,
            node_rank,
            nodes,
        })
    }

    /// After the workers of `seat` failed: the members (other than this node) whose
    /// keep-alive stood still for the loss limit, checked until every other member proved
    /// alive or the limit passed.
    ///
    /// Errors: the store fails.
    pub fn lost_members(
        &self,
        s: &mut AgentStore,
        keys: &AgentKeys,
        seat: &Seat,
    ) -> Result<Vec<i64>, String> {
        let others: Vec<i64> = seat
            .nodes
            .iter()
            .copied()
            .filter(|&x| x != self.seq)
            .collect();
        let first = keep_alive_values(s, keys, &others)?;
        let mut alive = vec![false; others.len()];
        let until = Instant::now() + self.conf.lost_after();
        while Instant::now() < until && alive.contains(&false) {
            std::thread::sleep(POLL);
            let now = keep_alive_values(s, keys, &others)?;
            for (k, (a, b)) in first.iter().zip(&now).enumerate() {
                alive[k] |= a != b;
            }
        }
        Ok(others
            .into_iter()
            .zip(alive)
            .filter(|(_, a)| !a)
            .map(|(x, _)| x)
            .collect())
    }

    /// Ends round `round` for everyone with a membership change: the next round expects
    /// `next` nodes. Returns the reason that won (another agent may have ended it first).
    ///
    /// Errors: the store fails.
    pub fn end_round(
        s: &mut AgentStore,
        keys: &AgentKeys,
        round: u32,
        next: usize,
        why: &str,
    ) -> Result<String, String> {
        let (keys, why) = (keys.clone(), why.to_string());
        s.bounded("ending the round", Duration::ZERO, move |st| {
            end_round_in(st, &keys, round, next, &why)
        })
        .map_err(|e| fail_text(&e))
    }

    /// The description of node `seq` ("node N (host, pid P)").
    pub fn describe(s: &mut AgentStore, keys: &AgentKeys, seq: i64) -> String {
        match s.try_get(&keys.node(seq)) {
            Ok(Some(d)) => format!("node {seq} ({})", String::from_utf8_lossy(&d)),
            _ => format!("node {seq}"),
        }
    }
}

/// The latest round from `first` on that has begun.
fn latest_round(s: &mut AgentStore, keys: &AgentKeys, first: u32) -> Result<u32, String> {
    let mut r = first;
    while s.try_get(&keys.joined(r + 1))?.is_some() {
        r += 1;
    }
    Ok(r)
}

/// Waits until round `r` is over (changed, failed, or the next round began): `true`; `false`
/// when the job ended for good.
///
/// Errors: `deadline` passed; the store fails.
fn wait_round_over(
    s: &mut AgentStore,
    keys: &AgentKeys,
    r: u32,
    deadline: Instant,
) -> Result<bool, String> {
    loop {
        if s.try_get(&keys.job_closed())?.is_some() {
            return Ok(false);
        }
        for k in [keys.change(r), keys.failed(r), keys.joined(r + 1)] {
            if s.try_get(&k)?.is_some() {
                return Ok(true);
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out waiting for round {r} to make room for this node (join_timeout)"
            ));
        }
        std::thread::sleep(POLL * 2);
    }
}

fn keep_alive_values(
    s: &mut AgentStore,
    keys: &AgentKeys,
    nodes: &[i64],
) -> Result<Vec<i64>, String> {
    nodes
        .iter()
        .map(|&n| s.add(&keys.keep_alive(n), 0))
        .collect()
}

fn parse_count(v: &[u8], what: &str) -> Result<usize, String> {
    String::from_utf8_lossy(v)
        .parse()
        .map_err(|_| format!("the store holds a bad {what} value: {v:?}"))
}

/// "host, pid P" (`--local-addr` as the host when given).
fn describe_self(local_addr: Option<&str>) -> String {
    let host = match local_addr {
        Some(a) => a.to_string(),
        None => hostname().unwrap_or_else(|| "?".into()),
    };
    format!("{host}, pid {}", std::process::id())
}

/// Bumps `key` every `interval` on its own connection, for the life of the agent.
fn keep_alive(conn: Arc<dyn Store>, key: String, interval: Duration) {
    std::thread::spawn(move || {
        while conn.add(&key, 1).is_ok() {
            std::thread::sleep(interval);
        }
    });
}

/// What the round watcher watches.
#[derive(Clone)]
pub struct RoundWatch {
    pub keys: AgentKeys,
    pub seat: Seat,
    pub seq: i64,
    pub conf: ElasticConf,
    pub addr: String,
}

/// Watches round `w.seat.round` on its own connection until `stop`: another node's failure,
/// the round ended by another agent, nodes waiting to join, a member's keep-alive standing
/// still. Ends the round itself for the last two.
pub fn watch_round(
    conn: Arc<dyn Store>,
    w: RoundWatch,
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<Remote>,
) {
    std::thread::spawn(move || {
        let mut seen: Vec<(i64, Instant)> = vec![(-1, Instant::now()); w.seat.nodes.len()];
        while !stop.load(Ordering::SeqCst) {
            match look(conn.as_ref(), &w, &mut seen) {
                Ok(None) => std::thread::sleep(POLL * 2),
                Ok(Some(c)) => {
                    let _ = tx.send(c);
                    return;
                }
                Err(e) => {
                    if !stop.load(Ordering::SeqCst) {
                        let _ = tx.send(Remote::Lost(format!(
                            "the store at {} is unreachable ({e})",
                            w.addr
                        )));
                    }
                    return;
                }
            }
        }
    });
}

/// One look at the round; `seen` holds each member's last keep-alive value and when it moved.
fn look(
    st: &dyn Store,
    w: &RoundWatch,
    seen: &mut [(i64, Instant)],
) -> c10d_store::Result<Option<Remote>> {
    let (k, r) = (&w.keys, w.seat.round);
    let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    if st.check(&[k.failed(r).as_str()])? {
        return Ok(Some(Remote::Failure(text(st.get(&k.failed(r))?))));
    }
    if st.check(&[k.change(r).as_str()])? {
        return Ok(Some(Remote::Membership(text(st.get(&k.change(r))?))));
    }
    let n = w.seat.nodes.len();
    let waiting = st.add(&k.waiting(r), 0)?.max(0) as usize;
    if waiting > 0 {
        let why = format!("{waiting} node(s) asked to join");
        let won = end_round_in(st, k, r, n + waiting, &why)?;
        return Ok(Some(Remote::Membership(won)));
    }
    for (i, &node) in w.seat.nodes.iter().enumerate() {
        let v = st.add(&k.keep_alive(node), 0)?;
        if v != seen[i].0 {
            seen[i] = (v, Instant::now());
        } else if node != w.seq && seen[i].1.elapsed() >= w.conf.lost_after() {
            let why = format!(
                "node {node} lost: no keep-alive for {:.1} s",
                seen[i].1.elapsed().as_secs_f64()
            );
            let won = end_round_in(st, k, r, n - 1, &why)?;
            return Ok(Some(Remote::Membership(won)));
        }
    }
    Ok(None)
}

/// [`Elastic::end_round`] on any connection.
fn end_round_in(
    st: &dyn Store,
    keys: &AgentKeys,
    round: u32,
    next: usize,
    why: &str,
) -> c10d_store::Result<String> {
    st.compare_set(&keys.expected(round + 1), b"", next.to_string().as_bytes())?;
    let won = st.compare_set(&keys.change(round), b"", why.as_bytes())?;
    Ok(String::from_utf8_lossy(&won).into_owned())
}
