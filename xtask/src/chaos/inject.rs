//! Injecting a fault into a running job: signals, destroying one TCP connection with `ss -K`,
//! taking the veth link between the two host namespaces down.

use super::hosts::HostPair;
use super::job::Rank;
use super::plan::{FaultKind, Plan};
use std::process::Command;
use std::time::Instant;

/// What was done, and when: the ranks to blame as seen from each rank.
pub struct Injected {
    pub at: Instant,
    /// `culprits[r]`: the ranks whose naming in rank `r`'s error is correct.
    pub culprits: Vec<Vec<usize>>,
    /// Ranks expected to fail and be checked (the killed or stopped one is not).
    pub survivors: Vec<usize>,
}

/// Injects `plan`'s fault.
///
/// # Errors
/// The fault could not be injected (e.g. no peer connection found yet).
pub fn inject(
    plan: &Plan,
    ranks: &[Rank],
    hosts: Option<&HostPair>,
    master_port: u16,
) -> Result<Injected, String> {
    let n = plan.world;
    let v = plan.victim;
    let others: Vec<usize> = (0..n).filter(|&r| r != v).collect();
    let mut at = Instant::now();
    let (culprits, survivors) = match plan.kind {
        FaultKind::Kill | FaultKind::Stop => {
            let sig = if plan.kind == FaultKind::Kill {
                libc::SIGKILL
            } else {
                libc::SIGSTOP
            };
            ranks[v].signal(sig);
            (vec![vec![v]; n], others)
        }
        FaultKind::Slow => {
            ranks[v].signal(libc::SIGSTOP);
            std::thread::sleep(std::time::Duration::from_millis(plan.stall_ms));
            ranks[v].signal(libc::SIGCONT);
            (vec![Vec::new(); n], (0..n).collect())
        }
        FaultKind::CloseSocket => {
            let ns: Vec<Option<String>> = match (plan.host_of(v), hosts) {
                (Some(h), Some(p)) => vec![Some(p.names[h].clone()), Some(p.names[1 - h].clone())],
                _ => vec![None],
            };
            let (peer, kill) = find_socket(ranks, v, &ns, master_port, plan.delay_ms)?;
            at = Instant::now();
            ss(
                ns[0].as_deref(),
                &kill.iter().map(String::as_str).collect::<Vec<_>>(),
            )?;
            let mut c = vec![vec![v, peer]; n];
            c[v] = vec![peer];
            c[peer] = vec![v];
            (c, (0..n).collect())
        }
        FaultKind::LinkDown => {
            hosts
                .ok_or("link down needs two host namespaces")?
                .set_link(false)?;
            let side = |h: usize| -> Vec<usize> {
                (0..n).filter(|&r| plan.host_of(r) == Some(h)).collect()
            };
            let c = (0..n)
                .map(|r| side(1 - plan.host_of(r).unwrap_or(0)))
                .collect();
            (c, (0..n).collect())
        }
    };
    Ok(Injected {
        at,
        culprits,
        survivors,
    })
}

/// An established TCP connection: local and peer `addr:port`, owning pid.
struct Conn {
    local: String,
    peer: String,
    pid: i32,
}

/// Runs `ss args` (inside namespace `ns` when given) and returns its stdout.
fn ss(ns: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "ss"]);
            c
        }
        None => Command::new("ss"),
    };
    let out = cmd
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ss: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ss {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses `ss -tnpH state established` lines.
fn connections(text: &str) -> Vec<Conn> {
    let mut out = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 5 {
            continue;
        }
        for part in f[4].split("pid=").skip(1) {
            if let Ok(pid) = part.split(',').next().unwrap_or("").parse() {
                out.push(Conn {
                    local: f[2].into(),
                    peer: f[3].into(),
                    pid,
                });
            }
        }
    }
    out
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap_or("")
}

/// One of rank `v`'s connections to another rank (not to the store; chosen by `pick`): that
/// rank and the `ss` arguments that destroy the connection. `ns`: every namespace the job runs
/// in (`None`: this one); the first is `v`'s, where `ss -K` must run.
fn find_socket(
    ranks: &[Rank],
    v: usize,
    ns: &[Option<String>],
    master_port: u16,
    pick: u64,
) -> Result<(usize, Vec<String>), String> {
    let mut conns = Vec::new();
    for n in ns {
        conns.extend(connections(&ss(
            n.as_deref(),
            &["-tnpH", "state", "established"],
        )?));
    }
    let rank_of = |pid: i32| ranks.iter().position(|r| r.pid == pid);
    let mp = master_port.to_string();
    let candidates: Vec<(&Conn, usize)> = conns
        .iter()
        .filter(|c| c.pid == ranks[v].pid && port(&c.local) != mp && port(&c.peer) != mp)
        .filter_map(|c| {
            // The other end: the same addresses swapped, owned by another rank.
            let other = conns
                .iter()
                .find(|o| o.local == c.peer && o.peer == c.local)?;
            Some((c, rank_of(other.pid)?))
        })
        .filter(|(_, p)| *p != v)
        .collect();
    if candidates.is_empty() {
        return Err(format!("rank {v} has no TCP connection to another rank"));
    }
    let (c, peer) = candidates[pick as usize % candidates.len()];
    let args = ["-K", "-tn", "src", &c.local, "dst", &c.peer];
    Ok((peer, args.iter().map(|a| a.to_string()).collect()))
}
