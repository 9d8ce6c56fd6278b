//! Where a rank runs, as its peers read it from the store: the kernel it booted and its network
//! namespace (two ranks with equal identities reach each other over abstract Unix sockets and
//! share `/dev/shm`), its Unix socket's name, and whether it lets the group run two-level
//! algorithms. Published once per group under `gloo/local/<rank>` as one line:
//! `"<host> <two-level 0|1> <unix socket>"`, `-` for a field that is absent.

use c10d_core::Result;
use c10d_store::Store;

/// One rank's published identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// `"<boot id>/<network namespace>"`; `None` when unknown or when the rank does not use
    /// Unix sockets (it is then on a host of its own, as far as the group is concerned).
    pub host: Option<String>,
    /// The rank lets the group run two-level algorithms.
    pub two_level: bool,
    /// The name of its abstract Unix listener.
    pub unix: Option<String>,
}

impl Identity {
    /// This process's identity, with its Unix listener's name (`None`: no Unix sockets).
    pub(crate) fn mine(unix: Option<&str>, two_level: bool) -> Identity {
        Identity {
            host: unix.and_then(|_| host_id()),
            two_level,
            unix: unix.map(str::to_string),
        }
    }

    /// Whether two ranks with these identities share a host.
    pub(crate) fn same_host(&self, other: &Identity) -> bool {
        self.host.is_some() && self.host == other.host
    }

    /// The published line.
    pub(crate) fn encode(&self) -> String {
        let f = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".to_string());
        format!(
            "{} {} {}",
            f(&self.host),
            u8::from(self.two_level),
            f(&self.unix)
        )
    }

    /// Reads a published line (anything malformed: a host of its own).
    pub(crate) fn decode(b: &[u8]) -> Identity {
        let s = String::from_utf8_lossy(b);
        let mut it = s.split(' ');
        let mut field = || {
            it.next()
                .filter(|f| !f.is_empty() && *f != "-")
                .map(str::to_string)
        };
        let (host, two, unix) = (field(), field(), field());
        Identity {
            host,
            two_level: two.as_deref() == Some("1"),
            unix,
        }
    }
}

/// The running kernel and network namespace: equal on every process of one host that can reach
/// each other's abstract Unix sockets.
fn host_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    let ns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().replace(' ', "_"))
        .unwrap_or_default();
    (!boot.is_empty()).then(|| format!("{boot}/{ns}"))
}

pub(crate) fn addr_key(rank: usize) -> String {
    format!("gloo/addr/{rank}")
}

pub(crate) fn local_key(rank: usize) -> String {
    format!("gloo/local/{rank}")
}

/// Every rank's identity, in rank order: one read of the store once all have published (waited
/// for in slices of 100 ms until `deadline`, polling `aborted`), however many ranks (what the
/// host map and the same-host checks need, once per group). `Ok(Err(ranks))`: these ranks had
/// not published by `deadline` (they never joined the group).
///
/// # Errors
/// A store failure; [`c10d_core::DistError::Backend`] when the group was aborted meanwhile.
pub(crate) fn read_all(
    store: &dyn Store,
    n: usize,
    deadline: std::time::Instant,
    ctx: &str,
    aborted: &dyn Fn() -> bool,
) -> Result<std::result::Result<Vec<Identity>, Vec<usize>>> {
    let keys: Vec<String> = (0..n).map(local_key).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let what = (ctx, "waiting for its ranks");
    if !super::wait_keys(store, &refs, deadline, aborted, what)? {
        let mut missing = Vec::new();
        for (r, k) in refs.iter().enumerate() {
            if !store.check(&[k])? {
                missing.push(r);
            }
        }
        return Ok(Err(missing));
    }
    Ok(Ok(store
        .multi_get(&refs)?
        .iter()
        .map(|v| Identity::decode(v))
        .collect()))
}

#[cfg(test)]
mod tests {
    use super::Identity;

    #[test]
    fn identities_round_trip_and_compare_hosts() {
        let a = Identity {
            host: Some("b/net:[1]".into()),
            two_level: true,
            unix: Some("c10d-gloo.1".into()),
        };
        assert_eq!(Identity::decode(a.encode().as_bytes()), a);
        let none = Identity::mine(None, false);
        assert_eq!(Identity::decode(none.encode().as_bytes()), none);
        assert!(!none.same_host(&none), "no host: a host of its own");
        let b = Identity {
            unix: None,
            ..a.clone()
        };
        assert!(a.same_host(&b));
        let c = Identity {
            host: Some("b/net:[2]".into()),
            ..a.clone()
        };
        assert!(!a.same_host(&c), "another network namespace");
        assert_eq!(
            Identity::decode(b"garbage").host.as_deref(),
            Some("garbage")
        );
        assert_eq!(Identity::decode(b""), Identity::mine(None, false));
    }
}
