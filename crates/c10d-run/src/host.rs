//! This machine: its host name and whether an address names it.

/// This machine's (short) host name, as Python's `socket.gethostname()`.
pub(crate) fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
}

/// True when `host` names an address of this machine.
pub(crate) fn is_local(host: &str) -> bool {
    use std::net::ToSocketAddrs;
    (host, 0)
        .to_socket_addrs()
        .map(|mut addrs| addrs.any(|a| std::net::TcpListener::bind((a.ip(), 0)).is_ok()))
        .unwrap_or(false)
}
