//! The hub: one per process that made a unique id (`ncclGetUniqueId`), listening on
//! 127.0.0.1; every rank of a communicator made from that id (and of the communicators split
//! or shrunk from it) connects to it once per communicator. It matches collectives by sequence
//! number and computes them ([`crate::nccl::compute`]), matches sends with receives, splits
//! and shrinks, and turns a connection closed without `Bye` (a dead or aborted rank) into
//! errors for the waits that needed that rank, as NCCL's proxy reports a remote error.

use crate::nccl::compute::{self, Part};
use crate::nccl::wire::{Frame, Kind, OpHeader};
use std::collections::{HashMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use crate::nccl::codes::{INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR};

type Conn = Arc<Mutex<BufWriter<TcpStream>>>;
type Outbox = Vec<(Conn, Frame)>;

#[derive(Default)]
struct Comm {
    nranks: usize,
    conns: Vec<Option<Conn>>,
    places: Vec<Option<String>>,
    lost: Vec<u32>,
    left: HashSet<u32>,
    colls: HashMap<u64, Vec<Option<Part>>>,
    expected: HashMap<u64, Vec<bool>>,
    sends: HashMap<(u32, u32, u64), Vec<u8>>,
    recvs: HashSet<(u32, u32, u64)>,
}

#[derive(Default)]
struct Hub {
    comms: HashMap<u64, Comm>,
}

static HUB: LazyLock<Mutex<Hub>> = LazyLock::new(Default::default);
static KEYS: AtomicU64 = AtomicU64::new(0);

fn lock() -> std::sync::MutexGuard<'static, Hub> {
    HUB.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh communicator key (unique within this hub).
pub fn new_key() -> u64 {
    let n = KEYS.fetch_add(1, Ordering::Relaxed) + 1;
    (u64::from(std::process::id()) << 32) | n
}

/// The port of this process's hub, starting it on first use.
pub fn port() -> std::io::Result<u16> {
    static PORT: OnceLock<u16> = OnceLock::new();
    if let Some(p) = PORT.get() {
        return Ok(*p);
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::Builder::new()
        .name("gpusim-hub".into())
        .spawn(move || accept_loop(listener))?;
    Ok(*PORT.get_or_init(|| port))
}

fn accept_loop(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        let _ = stream.set_nodelay(true);
        let _ = std::thread::Builder::new()
            .name("gpusim-hub-conn".into())
            .spawn(move || serve(stream));
    }
}

fn send_all(out: Outbox) {
    for (conn, frame) in out {
        let mut w = conn.lock().unwrap_or_else(|e| e.into_inner());
        let _ = frame.write_to(&mut *w).and_then(|()| w.flush());
    }
}

fn serve(stream: TcpStream) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let conn: Conn = Arc::new(Mutex::new(BufWriter::new(stream)));
    let mut reader = BufReader::new(read_half);
    let mut me: Option<(u64, u32)> = None;
    while let Ok(f) = Frame::read_from(&mut reader) {
        if f.kind == Kind::Hello {
            me = Some((f.comm, f.rank));
        }
        let out = handle(&conn, f);
        send_all(out);
    }
    if let Some((comm, rank)) = me {
        send_all(lose(comm, rank));
    }
}

fn error(
    conn: &Conn,
    wait: Kind,
    comm: u64,
    seq: u64,
    aux: u32,
    code: i32,
    msg: &str,
) -> (Conn, Frame) {
    let mut payload = vec![wait as u8];
    payload.extend_from_slice(msg.as_bytes());
    (
        conn.clone(),
        Frame::new(Kind::Error, comm, seq, code as u32, aux).with(payload),
    )
}

fn handle(conn: &Conn, f: Frame) -> Outbox {
    let mut hub = lock();
    match f.kind {
        Kind::Hello => hello(&mut hub, conn, f),
        Kind::Contribute => contribute(&mut hub, conn, f),
        Kind::Send | Kind::RecvPost => p2p(&mut hub, conn, f),
        Kind::Bye => {
            if let Some(c) = hub.comms.get_mut(&f.comm) {
                c.left.insert(f.rank);
            }
            Vec::new()
        }
        _ => Vec::new(),
    }
}

fn hello(hub: &mut Hub, conn: &Conn, f: Frame) -> Outbox {
    let n = f.aux as usize;
    let c = hub.comms.entry(f.comm).or_insert_with(|| Comm {
        nranks: n,
        conns: vec![None; n],
        places: vec![None; n],
        ..Default::default()
    });
    let r = f.rank as usize;
    if c.nranks != n || r >= n || c.conns[r].is_some() {
        let msg = format!(
            "c10d-gpusim: ncclCommInitRank: rank {r} of {n} does not fit communicator of {} ranks (or joined twice)",
            c.nranks
        );
        return vec![error(
            conn,
            Kind::Ready,
            f.comm,
            0,
            0,
            INVALID_ARGUMENT,
            &msg,
        )];
    }
    let place = String::from_utf8_lossy(&f.payload).into_owned();
    if let Some(other) = c.places.iter().position(|p| p.as_deref() == Some(&place)) {
        let msg = format!(
            "c10d-gpusim: Duplicate GPU detected : rank {r} and rank {other} both on host {:?} device cuda:{} (give ranks sharing a GPU distinct NCCL_HOSTIDs)",
            place.split('\t').next().unwrap_or(""),
            place.split('\t').nth(1).unwrap_or("")
        );
        return vec![error(conn, Kind::Ready, f.comm, 0, 0, INVALID_USAGE, &msg)];
    }
    c.conns[r] = Some(conn.clone());
    c.places[r] = Some(place);
    if c.conns.iter().all(Option::is_some) {
        // Every rank's place, in rank order: what a rank's transport report needs.
        let places: Vec<&str> = c.places.iter().flatten().map(String::as_str).collect();
        let ready = Frame::new(Kind::Ready, f.comm, 0, 0, 0).with(places.join("\n").into_bytes());
        return c
            .conns
            .iter()
            .flatten()
            .map(|k| (k.clone(), ready.clone()))
            .collect();
    }
    Vec::new()
}

fn lost_message(comm: u64, lost: &[u32]) -> String {
    format!(
        "c10d-gpusim: communicator {comm:#x}: rank(s) {lost:?} lost (connection closed without ncclCommDestroy: the process died or aborted) [remote process exited or there was a network error]"
    )
}

fn contribute(hub: &mut Hub, conn: &Conn, f: Frame) -> Outbox {
    let Some((header, data)) = OpHeader::decode(&f.payload) else {
        return Vec::new();
    };
    let Some(c) = hub.comms.get_mut(&f.comm) else {
        let msg = "c10d-gpusim: collective on an unknown communicator";
        return vec![error(
            conn,
            Kind::Result,
            f.comm,
            f.seq,
            0,
            INVALID_USAGE,
            msg,
        )];
    };
    let n = c.nranks;
    let expected = c.expected.entry(f.seq).or_insert_with(|| {
        let excluded = if header.op == 7 {
            ranks_of(data)
        } else {
            Vec::new()
        };
        (0..n as u32).map(|r| !excluded.contains(&r)).collect()
    });
    if c.lost
        .iter()
        .any(|&l| expected.get(l as usize) == Some(&true))
    {
        let msg = lost_message(f.comm, &c.lost);
        return vec![error(
            conn,
            Kind::Result,
            f.comm,
            f.seq,
            0,
            REMOTE_ERROR,
            &msg,
        )];
    }
    let parts = c
        .colls
        .entry(f.seq)
        .or_insert_with(|| (0..n).map(|_| None).collect());
    if let Some(slot) = parts.get_mut(f.rank as usize) {
        *slot = Some(Part {
            header,
            data: data.to_vec(),
        });
    }
    let expected = c.expected[&f.seq].clone();
    let done = parts.iter().zip(&expected).all(|(p, e)| p.is_some() || !e);
    if !done {
        return Vec::new();
    }
    let parts = c.colls.remove(&f.seq).unwrap_or_default();
    c.expected.remove(&f.seq);
    finish(hub, f.comm, f.seq, parts)
}

fn ranks_of(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

/// Completes collective `seq` of `comm`: the results (or a split's new communicators) to every
/// contributor.
fn finish(hub: &mut Hub, comm: u64, seq: u64, parts: Vec<Option<Part>>) -> Outbox {
    let ranks: Vec<usize> = (0..parts.len()).filter(|&r| parts[r].is_some()).collect();
    let present: Vec<Part> = parts.into_iter().flatten().collect();
    let conns: Vec<Conn> = {
        let c = &hub.comms[&comm];
        ranks.iter().filter_map(|&r| c.conns[r].clone()).collect()
    };
    let results = match present[0].header.op {
        6 => Ok(split(hub, &present)),
        7 => Ok(shrink(hub, present.len())),
        _ => compute::check_matching(&present)
            .and_then(|()| compute::results(&present).map_err(|m| (INVALID_ARGUMENT, m))),
    };
    match results {
        Ok(res) => conns
            .into_iter()
            .zip(res)
            .map(|(k, data)| (k, Frame::new(Kind::Result, comm, seq, 0, 0).with(data)))
            .collect(),
        Err((code, msg)) => conns
            .iter()
            .map(|k| error(k, Kind::Result, comm, seq, 0, code, &msg))
            .collect(),
    }
}

fn new_comm(hub: &mut Hub, n: usize) -> u64 {
    let key = new_key();
    hub.comms.insert(
        key,
        Comm {
            nranks: n,
            conns: vec![None; n],
            places: vec![None; n],
            ..Default::default()
        },
    );
    key
}

fn placement(key: u64, rank: usize, n: usize) -> Vec<u8> {
    let mut v = key.to_le_bytes().to_vec();
    v.extend_from_slice(&(rank as u32).to_le_bytes());
    v.extend_from_slice(&(n as u32).to_le_bytes());
    v
}

/// `ncclCommSplit`: ranks of one color form a communicator, ordered by (key, old rank); color
/// `NCCL_SPLIT_NOCOLOR` (-1) gets key 0 (no communicator).
fn split(hub: &mut Hub, parts: &[Part]) -> Vec<Vec<u8>> {
    let key_of = |p: &Part| i32::from_le_bytes(p.data[..4].try_into().expect("4 bytes"));
    let mut out = vec![placement(0, 0, 0); parts.len()];
    let mut colors: Vec<i32> = parts
        .iter()
        .map(|p| p.header.root)
        .filter(|&c| c >= 0)
        .collect();
    colors.sort_unstable();
    colors.dedup();
    for color in colors {
        let mut members: Vec<usize> = (0..parts.len())
            .filter(|&r| parts[r].header.root == color)
            .collect();
        members.sort_by_key(|&r| (key_of(&parts[r]), r));
        let key = new_comm(hub, members.len());
        for (new_rank, &r) in members.iter().enumerate() {
            out[r] = placement(key, new_rank, members.len());
        }
    }
    out
}

/// `ncclCommShrink`: the ranks left, in their old order.
fn shrink(hub: &mut Hub, n: usize) -> Vec<Vec<u8>> {
    let key = new_comm(hub, n);
    (0..n).map(|r| placement(key, r, n)).collect()
}

fn p2p(hub: &mut Hub, conn: &Conn, f: Frame) -> Outbox {
    let Some(c) = hub.comms.get_mut(&f.comm) else {
        return Vec::new();
    };
    let (src, dst) = if f.kind == Kind::Send {
        (f.rank, f.aux)
    } else {
        (f.aux, f.rank)
    };
    let key = (src, dst, f.seq);
    if f.kind == Kind::Send {
        c.sends.insert(key, f.payload);
    } else if c.lost.contains(&src) && !c.sends.contains_key(&key) {
        let msg = lost_message(f.comm, &c.lost);
        return vec![error(
            conn,
            Kind::Deliver,
            f.comm,
            f.seq,
            src,
            REMOTE_ERROR,
            &msg,
        )];
    } else {
        c.recvs.insert(key);
    }
    if !c.recvs.contains(&key) || !c.sends.contains_key(&key) {
        return Vec::new();
    }
    c.recvs.remove(&key);
    let data = c.sends.remove(&key).unwrap_or_default();
    let Some(Some(to)) = c.conns.get(dst as usize).cloned() else {
        return Vec::new();
    };
    vec![(
        to,
        Frame::new(Kind::Deliver, f.comm, f.seq, 0, src).with(data),
    )]
}

/// Rank `rank` of `comm` closed its connection: unless it said `Bye`, every wait that needs
/// it fails with `ncclRemoteError`.
fn lose(comm: u64, rank: u32) -> Outbox {
    let mut hub = lock();
    let Some(c) = hub.comms.get_mut(&comm) else {
        return Vec::new();
    };
    if c.left.contains(&rank) {
        return Vec::new();
    }
    c.lost.push(rank);
    let msg = lost_message(comm, &c.lost);
    let mut out = Vec::new();
    let stuck: Vec<u64> = c
        .colls
        .iter()
        .filter(|(seq, parts)| parts[rank as usize].is_none() && c.expected[seq][rank as usize])
        .map(|(seq, _)| *seq)
        .collect();
    for seq in stuck {
        let parts = c.colls.remove(&seq).unwrap_or_default();
        for (r, _) in parts.iter().enumerate().filter(|(_, p)| p.is_some()) {
            if let Some(k) = &c.conns[r] {
                out.push(error(k, Kind::Result, comm, seq, 0, REMOTE_ERROR, &msg));
            }
        }
    }
    let waiting: Vec<(u32, u32, u64)> = c.recvs.iter().filter(|k| k.0 == rank).copied().collect();
    for (src, dst, seq) in waiting {
        c.recvs.remove(&(src, dst, seq));
        if let Some(Some(k)) = c.conns.get(dst as usize) {
            out.push(error(k, Kind::Deliver, comm, seq, src, REMOTE_ERROR, &msg));
        }
    }
    if c.conns.iter().any(Option::is_none) {
        for k in c.conns.iter().flatten() {
            out.push(error(k, Kind::Ready, comm, 0, 0, REMOTE_ERROR, &msg));
        }
    }
    out
}
