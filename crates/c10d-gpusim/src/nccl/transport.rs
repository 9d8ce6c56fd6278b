//! The transport NCCL would pick between two ranks, reported as NCCL reports it with
//! `NCCL_DEBUG=INFO` (`... NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0`), so that
//! a suite can check which transport its settings lead to. The simulator moves data through its
//! hub whatever it reports; the choice is NCCL's, as its documentation describes it:
//! - ranks on one host (`NCCL_HOSTID`, else the machine) on different devices: `P2P/CUMEM/read`;
//! - ranks on different hosts: the network plugin, which is the socket transport only when
//!   `NCCL_NET=Socket` or `NCCL_IB_DISABLE=1`; else InfiniBand (`NET/IB/0`), as NCCL picks
//!   where an IB device (a loopback-capable RoCE NIC on a GPU machine) exists: the simulator
//!   assumes one does.

/// A rank's place, as it told the hub: host id and device ordinal.
pub fn place(host: &str, device: usize) -> String {
    format!("{host}\t{device}")
}

fn parse(place: &str) -> (&str, &str) {
    place.split_once('\t').unwrap_or((place, "0"))
}

/// The transport between two places.
fn between(a: &str, b: &str) -> &'static str {
    let ((ha, _), (hb, _)) = (parse(a), parse(b));
    if ha == hb {
        return "P2P/CUMEM/read";
    }
    let socket = std::env::var("NCCL_NET").is_ok_and(|v| v.eq_ignore_ascii_case("Socket"))
        || std::env::var("NCCL_IB_DISABLE").as_deref() == Ok("1");
    if socket {
        "NET/Socket/0"
    } else {
        "NET/IB/0"
    }
}

/// Prints this rank's ring connection (to the next rank) with `NCCL_DEBUG=INFO`, given every
/// rank's place (one per line, in rank order).
pub fn report(rank: u32, places: &[u8]) {
    if !std::env::var("NCCL_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("INFO")) {
        return;
    }
    let text = String::from_utf8_lossy(places);
    let all: Vec<&str> = text.lines().collect();
    if all.len() < 2 {
        return;
    }
    let (me, next) = (rank as usize, (rank as usize + 1) % all.len());
    let (_, dev) = parse(all[me]);
    let (_, next_dev) = parse(all[next]);
    eprintln!(
        "c10d-gpusim:{}:0 [{dev}] NCCL INFO Channel 00/0 : {me}[{dev}] -> {next}[{next_dev}] via {}",
        std::process::id(),
        between(all[me], all[next])
    );
}
