//! [`GlooOptions`]: construction options of [`crate::ProcessGroupGloo`] and the choice of the
//! local listen address.

use c10d_core::{BackendOptions, DistError, Result, DEFAULT_TIMEOUT};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// All-reduce algorithm choice (overridable for tests and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllreduceAlgorithm {
    /// Chosen by message size and group size: [`AllreduceAlgorithm::Direct`] up to
    /// [`GlooOptions::small_allreduce_bytes`], above it [`AllreduceAlgorithm::AllPairs`] for
    /// groups of up to 8 ranks and [`AllreduceAlgorithm::Ring`] for larger ones.
    #[default]
    Auto,
    /// Every rank sends its whole buffer to every other rank and reduces locally in rank order:
    /// one network hop, latency-optimal for small messages.
    Direct,
    /// Pipelined ring reduce-scatter + all-gather: bandwidth-optimal for large messages.
    Ring,
    /// Direct (all-pairs) reduce-scatter + all-gather, chunked: the ring's byte count in two
    /// dependent phases instead of 2(n−1) steps.
    AllPairs,
}

/// Broadcast algorithm choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BroadcastAlgorithm {
    /// Binomial tree up to [`GlooOptions::small_broadcast_bytes`], pipelined chain above.
    #[default]
    Auto,
    /// Binomial tree rooted at the source: ⌈log2 n⌉ hops.
    Tree,
    /// Pipelined chain root → root+1 → …, chunks of [`GlooOptions::pipeline_chunk_bytes`].
    Chain,
}

/// Options of [`crate::ProcessGroupGloo`] (mirrors `ProcessGroupGloo.Options` plus the
/// environment variables PyTorch's Gloo reads).
#[derive(Debug, Clone, PartialEq)]
pub struct GlooOptions {
    /// Default per-op timeout (PyTorch default 30 min). Ops whose options carry a timeout use that.
    pub timeout: Duration,
    /// Group name: checked in the connection handshake and printed in errors.
    pub group_name: String,
    /// Group description (logs and errors).
    pub group_desc: String,
    /// Global ranks of the members in group-rank order (empty = identity); used in error texts.
    pub global_ranks: Vec<usize>,
    /// Connect at the first op instead of in [`crate::ProcessGroupGloo::new`]
    /// (PyTorch's `TORCH_GLOO_LAZY_INIT=1`). All ranks must then issue at least one op.
    pub lazy_init: bool,
    /// Address to listen on. `None`: the IPv4 address of interface `C10D_SOCKET_IFNAME`, else of
    /// `GLOO_SOCKET_IFNAME`, else the local address that reaches [`GlooOptions::hostname_hint`],
    /// else 127.0.0.1.
    pub listen_addr: Option<IpAddr>,
    /// A host (e.g. `MASTER_ADDR`) whose route picks the local address when no interface is named.
    pub hostname_hint: Option<String>,
    /// All-reduce algorithm.
    pub allreduce_algorithm: AllreduceAlgorithm,
    /// Broadcast algorithm.
    pub broadcast_algorithm: BroadcastAlgorithm,
    /// With [`AllreduceAlgorithm::Auto`]: the direct exchange is used up to this many bytes
    /// per rank's buffer, the ring above.
    pub small_allreduce_bytes: usize,
    /// With [`BroadcastAlgorithm::Auto`]: the tree is used up to this many bytes.
    pub small_broadcast_bytes: usize,
    /// `reduce` sends every contribution straight to the root while n × the buffer stays within
    /// this many bytes (the root's scratch), and reduce-scatters then gathers above.
    pub small_reduce_scratch_bytes: usize,
    /// Chunk size of pipelined algorithms (ring, chain), in bytes.
    pub pipeline_chunk_bytes: usize,
    /// Kernel socket buffer size (SO_SNDBUF/SO_RCVBUF) in bytes; 0 keeps the kernel's autotuning.
    /// Default 4 MiB (measured up to ~1.5x the busbw of autotuned loopback buffers at 16 MiB).
    /// TCP sockets keep autotuning when `net.core.rmem_max`/`wmem_max` are below this size.
    pub socket_buffer_bytes: usize,
    /// Connect peers on the same host (same kernel boot id) through abstract Unix-domain
    /// sockets instead of loopback TCP (Linux; falls back to TCP when unreachable). Same frames
    /// and fault handling, about twice the throughput. Default on; `C10D_GLOO_TCP_ONLY=1` in
    /// the environment or `false` here forces TCP.
    pub local_unix_sockets: bool,
    /// With every rank on this host (Unix-domain sockets): all-reduces (with
    /// [`AllreduceAlgorithm::Auto`]) of at least this many bytes per rank, and all-gathers /
    /// reduce-scatters of at least this many bytes of outputs / inputs per rank, copy straight
    /// between the ranks' memory (Linux cross-memory attach, `process_vm_readv`: one copy per
    /// byte instead of two through socket buffers). Default 2 MiB (below it, a group with shared
    /// memory uses that instead, see [`GlooOptions::shared_memory`]); `usize::MAX` turns it off.
    /// Must be equal on every rank.
    pub cma_min_bytes: usize,
    /// Whether this rank agrees to cross-memory attach. On the group's first eligible
    /// all-reduce every rank probes reading each peer's memory (seccomp, ptrace rules or
    /// different users can forbid it) and votes; one rank that cannot, or that set this to
    /// `false` (`C10D_GLOO_CMA=0` in its environment), makes the whole group use sockets.
    /// Default `true`. See [`crate::ProcessGroupGloo::cross_memory_attach`].
    pub cross_memory_attach: bool,
    /// Whether this rank agrees to a shared-memory segment for the group. With every rank on
    /// this host, all-reduces (with [`AllreduceAlgorithm::Auto`]), all-gathers and
    /// reduce-scatters below [`GlooOptions::cma_min_bytes`], and broadcasts (with
    /// [`BroadcastAlgorithm::Auto`]) of at most 2 MiB per rank (64 KiB in groups of more than 8),
    /// then go through memory shared by the ranks, without sockets (same fold order
    /// and bits as the socket algorithms they replace). The segment is reserved by the first op
    /// that needs it, with slots sized to that op (from 64 KiB, grown when a later op needs
    /// more), and only where `/dev/shm` has room for it, leaving an eighth free (else the group
    /// uses sockets, with one warning). One rank that cannot map the segment, or
    /// that set this to `false` (`C10D_GLOO_SHM=0` in its environment), makes the whole group use
    /// sockets. Default `true`.
    pub shared_memory: bool,
    /// Whether this rank agrees to two-level all-reduces in groups that span hosts (reduce
    /// inside each host, exchange between hosts, spread; see `algo::hierarchical`), used with
    /// [`AllreduceAlgorithm::Auto`] above [`GlooOptions::small_allreduce_bytes`] when the
    /// ranks sit on two or more hosts with the same number (≥ 2) each. One rank that sets this
    /// to `false` (`C10D_GLOO_TWO_LEVEL=0` in its environment) makes the whole group use the
    /// flat algorithms. Default `true`.
    pub two_level: bool,
    /// TLS for the TCP connections of the mesh (`c10d_store::tls`): each one is encrypted and
    /// both ends prove a certificate of the job's CA. Same-host Unix sockets, shared memory
    /// and cross-memory attach are not affected. `None` = the files named by
    /// `C10D_TLS_CERT_FILE`, `C10D_TLS_KEY_FILE` and `C10D_TLS_CA_FILE`, if set; else plain TCP.
    pub tls: Option<c10d_store::TlsConfig>,
}

impl Default for GlooOptions {
    fn default() -> Self {
        GlooOptions {
            timeout: DEFAULT_TIMEOUT,
            group_name: "0".into(),
            group_desc: "default_pg".into(),
            global_ranks: Vec::new(),
            lazy_init: false,
            listen_addr: None,
            hostname_hint: None,
            allreduce_algorithm: AllreduceAlgorithm::Auto,
            broadcast_algorithm: BroadcastAlgorithm::Auto,
            small_allreduce_bytes: 64 * 1024,
            small_broadcast_bytes: 256 * 1024,
            small_reduce_scratch_bytes: 4 * 1024 * 1024,
            pipeline_chunk_bytes: 1024 * 1024,
            socket_buffer_bytes: 4 * 1024 * 1024,
            local_unix_sockets: std::env::var("C10D_GLOO_TCP_ONLY")
                .map(|v| v.trim() != "1")
                .unwrap_or(true),
            cma_min_bytes: 2 * 1024 * 1024,
            cross_memory_attach: std::env::var("C10D_GLOO_CMA").map_or(true, |v| v.trim() != "0"),
            shared_memory: std::env::var("C10D_GLOO_SHM").map_or(true, |v| v.trim() != "0"),
            two_level: std::env::var("C10D_GLOO_TWO_LEVEL").map_or(true, |v| v.trim() != "0"),
            tls: None,
        }
    }
}

impl GlooOptions {
    /// Options from the generic backend options; `lazy_init` from `TORCH_GLOO_LAZY_INIT=1`.
    pub fn from_backend_options(o: &BackendOptions) -> Self {
        GlooOptions {
            timeout: o.timeout,
            group_name: o.group_name.clone(),
            group_desc: o.group_desc.clone(),
            global_ranks: o.global_ranks.clone(),
            lazy_init: std::env::var("TORCH_GLOO_LAZY_INIT")
                .map(|v| v.trim() == "1")
                .unwrap_or(false),
            ..Default::default()
        }
    }

    /// The address to listen on, resolved as described on [`GlooOptions::listen_addr`].
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when a named interface does not exist or has no IPv4 address.
    pub fn resolve_listen_addr(&self) -> Result<IpAddr> {
        if let Some(a) = self.listen_addr {
            return Ok(a);
        }
        for var in ["C10D_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"] {
            if let Ok(name) = std::env::var(var) {
                let name = name.split(',').next().unwrap_or("").trim().to_string();
                if !name.is_empty() {
                    return interface_ipv4(&name).map(IpAddr::V4).ok_or_else(|| {
                        DistError::invalid(format!(
                            "{var}={name}: no such interface with an IPv4 address"
                        ))
                    });
                }
            }
        }
        if let Some(h) = &self.hostname_hint {
            if let Some(a) = route_to(h) {
                return Ok(a);
            }
        }
        Ok(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

/// The local address the kernel would use to reach `host` (connect a UDP socket; nothing is sent).
fn route_to(host: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let target = (host, 9u16).to_socket_addrs().ok()?.find(|a| a.is_ipv4())?;
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect(target).ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The first IPv4 address of interface `name` (via `getifaddrs`).
fn interface_ipv4(name: &str) -> Option<Ipv4Addr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
        let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: ifa_addr is non-null and points to a sockaddr of the family it declares.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if n.to_bytes() == name.as_bytes() && fam == libc::AF_INET {
            // SAFETY: family is AF_INET, so the sockaddr is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            break;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_interface_and_defaults() {
        assert_eq!(interface_ipv4("lo"), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(interface_ipv4("no-such-if0"), None);
        let o = GlooOptions::default();
        assert_eq!(o.timeout, DEFAULT_TIMEOUT);
        let o = GlooOptions {
            hostname_hint: Some("127.0.0.1".into()),
            ..Default::default()
        };
        // Env vars may be set by the environment; only check the hint path when they are not.
        if std::env::var("C10D_SOCKET_IFNAME").is_err()
            && std::env::var("GLOO_SOCKET_IFNAME").is_err()
        {
            assert_eq!(
                o.resolve_listen_addr().unwrap(),
                IpAddr::V4(Ipv4Addr::LOCALHOST)
            );
        }
    }
}
