//! Init-method URLs (`env://`, `tcp://`, `file://`), mirroring `torch/distributed/rendezvous.py`.
//!
//! [`rendezvous`] turns an init-method URL into a shared store plus this process's rank and the
//! world size, with PyTorch's rules and error texts:
//!
//! - `tcp://HOST:PORT?rank=R&world_size=W[&use_libuv=0|1]`: rank 0 starts the `TcpStore`
//!   server (`is_master`, `multi_tenant`), the others connect to it.
//! - `env://[?rank=R&world_size=W]`: rank and world size from the query, else from the `RANK`
//!   and `WORLD_SIZE` variables; the server address from `MASTER_ADDR` and `MASTER_PORT`.
//! - `file:///PATH?rank=R&world_size=W`: a [`FileStore`] on `PATH` with `world_size` cleanup.
//!
//! For `tcp://` and `env://`, when `TORCHELASTIC_USE_AGENT_STORE` is exactly `"True"` and the
//! store address equals `MASTER_ADDR`/`MASTER_PORT`, every rank is a client: torchrun's agent
//! already serves the store there.

use crate::file::FileStore;
use crate::store::Store;
use crate::tcp::{TcpStore, TcpStoreOptions};
use c10d_core::{DistError, Result};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// PyTorch's `default_pg_timeout` for rendezvous: 30 minutes.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The outcome of a rendezvous: the shared store, this process's rank, the number of processes
/// (PyTorch's `(store, rank, world_size)` triple).
pub struct Rendezvous {
    /// The store every rank of the job shares (`TcpStore` or `FileStore`).
    pub store: Arc<dyn Store>,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes. Always known: an `env://` rendezvous without a world size fails
    /// with "environment variable WORLD_SIZE expected, but not set", as PyTorch's
    /// `rendezvous()` does (PyTorch's dynamic `-1` only exists inside its backend-options path).
    pub world_size: usize,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

/// Runs the rendezvous named by `url` (`torch.distributed.rendezvous(url, rank, world_size)`),
/// reading environment variables from the process environment.
///
/// `rank` / `world_size` (`None` = PyTorch's -1) are appended to the URL's query; `timeout`
/// bounds connecting and waiting for workers (`tcp://`, `env://`) and becomes the store's
/// default timeout (all schemes; PyTorch applies it later in `init_process_group`).
///
/// # Errors
/// - [`DistError::Dist`] "No rendezvous handler for {scheme}://" for an unknown scheme.
/// - [`DistError::InvalidArgument`] (PyTorch's `AssertionError`) "The url: {url} has
///   node-specific arguments(rank, world_size) already." when `rank`/`world_size` are given and
///   the URL has either; "hostname cannot be None" for `tcp://:PORT`.
/// - [`DistError::InvalidArgument`] (PyTorch's `ValueError`) "Error initializing
///   torch.distributed using {scheme}:// rendezvous: {what}" with `what` one of "port number
///   missing", "rank parameter missing", "world size parameter missing", "path missing",
///   "environment variable {VAR} expected, but not set" (unset or empty); also for a rank, world
///   size or port that is not a valid number, "rank {r} is out of range for world_size {w}"
///   (a check PyTorch leaves to the backend), and "port must have value from 0 to 65535 but
///   was {port}.".
/// - Whatever [`TcpStore::new`] or [`FileStore::new`] return: connect timeouts
///   ([`DistError::Network`]), "Timed out after … waiting for clients" ([`DistError::Store`]), …
pub fn rendezvous(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Duration,
) -> Result<Rendezvous> {
    rendezvous_with_env(url, rank, world_size, timeout, &|k| std::env::var(k).ok())
}

/// As [`rendezvous`], with environment variables read through `env` (returns `None` for an
/// unset variable). Lets callers and tests supply an environment without touching the
/// process's own, which other threads may read concurrently.
///
/// Note that [`TcpStore::new`] itself still consults the process environment
/// (`TORCHELASTIC_USE_AGENT_STORE`, `MASTER_PORT`) when a master fails to bind.
///
/// # Errors
/// As [`rendezvous`].
pub fn rendezvous_with_env(
    url: &str,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Rendezvous> {
    let mut parsed = Url::parse(url);
    if rank.is_some() || world_size.is_some() {
        let mut q = parse_query(&parsed.query, &parsed.scheme)?;
        if q.contains_key("rank") || q.contains_key("world_size") {
            return Err(DistError::invalid(format!(
                "The url: {url} has node-specific arguments(rank, world_size) already."
            )));
        }
        if let Some(r) = rank {
            q.insert("rank".into(), r.to_string());
        }
        if let Some(w) = world_size {
            q.insert("world_size".into(), w.to_string());
        }
        parsed.query = q
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
    }
    match parsed.scheme.as_str() {
        "tcp" => tcp_handler(&parsed, timeout, env),
        "env" => env_handler(&parsed, timeout, env),
        "file" => file_handler(&parsed, timeout),
        s => Err(DistError::dist(format!("No rendezvous handler for {s}://"))),
    }
}

/// `ValueError("Error initializing torch.distributed using {scheme}:// rendezvous: {msg}")`.
fn rdzv_error(scheme: &str, msg: &str) -> DistError {
    DistError::invalid(format!(
        "Error initializing torch.distributed using {scheme}:// rendezvous: {msg}"
    ))
}

/// The parts of a URL that `urllib.parse.urlparse` gives the handlers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Url {
    /// Lower-cased scheme; empty when the URL has none.
    scheme: String,
    /// Everything between `//` and the path (`user@host:port`).
    netloc: String,
    path: String,
    query: String,
}

impl Url {
    /// Splits like `urlparse`: `scheme:` (letters first, then letters, digits, `+-.`),
    /// `//netloc` up to `/?#`, path up to `?#`, query up to `#`.
    fn parse(url: &str) -> Url {
        let mut rest = url;
        let mut scheme = String::new();
        if let Some(i) = url.find(':') {
            let s = &url[..i];
            let valid = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
            if valid {
                scheme = s.to_ascii_lowercase();
                rest = &url[i + 1..];
            }
        }
        if let Some(i) = rest.find('#') {
            rest = &rest[..i];
        }
        let mut netloc = String::new();
        if let Some(r) = rest.strip_prefix("//") {
            let end = r.find(['/', '?']).unwrap_or(r.len());
            netloc = r[..end].to_owned();
            rest = &r[end..];
        }
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, q),
            None => (rest, ""),
        };
        Url {
            scheme,
            netloc,
            path: path.to_owned(),
            query: query.to_owned(),
        }
    }

    /// `(hostname, port)` of the netloc as `urlparse` reports them: user info dropped, IPv6
    /// brackets removed, host lower-cased; `Ok(None)` port when absent or empty.
    fn host_port(&self) -> Result<(Option<String>, Option<u16>)> {
        let hostport = self
            .netloc
            .rsplit_once('@')
            .map_or(self.netloc.as_str(), |(_, h)| h);
        let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
            match r.split_once(']') {
                Some((h, after)) => (h, after.strip_prefix(':')),
                None => {
                    return Err(DistError::invalid(format!(
                        "Invalid IPv6 URL: {}",
                        self.netloc
                    )))
                }
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let host = (!host.is_empty()).then(|| host.to_ascii_lowercase());
        let port = match port {
            None | Some("") => None,
            Some(p) => {
                let n: u64 = p.parse().map_err(|_| {
                    DistError::invalid(format!("Port could not be cast to integer value as '{p}'"))
                })?;
                Some(
                    u16::try_from(n)
                        .map_err(|_| DistError::invalid("Port out of range 0-65535"))?,
                )
            }
        };
        Ok((host, port))
    }
}

/// `_query_to_dict`: split on `&`, drop empty pieces, each `k=v` split on `=` (later keys win).
fn parse_query(query: &str, scheme: &str) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let mut it = pair.split('=');
        let k = it.next().unwrap_or_default();
        let v = it.next().ok_or_else(|| {
            rdzv_error(
                scheme,
                &format!("malformed query parameter '{pair}' (expected key=value)"),
            )
        })?;
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// Parses a rank / world size given as text (`int(...)` in PyTorch).
fn parse_count(scheme: &str, what: &str, v: &str) -> Result<usize> {
    v.trim().parse::<usize>().map_err(|_| {
        rdzv_error(
            scheme,
            &format!("{what} must be a non-negative integer, got '{v}'"),
        )
    })
}

/// `_get_use_libuv_from_query_dict`: query `use_libuv`, else env `USE_LIBUV`, else "1";
/// only the exact string "1" enables it.
fn use_libuv(q: &HashMap<String, String>, env: &dyn Fn(&str) -> Option<String>) -> bool {
    q.get("use_libuv")
        .cloned()
        .or_else(|| env("USE_LIBUV"))
        .unwrap_or_else(|| "1".into())
        == "1"
}

/// `_create_c10d_store`: the agent's store when it serves `host:port`, else rank 0 is the
/// multi-tenant master and the others connect.
#[allow(clippy::too_many_arguments)]
fn create_c10d_store(
    host: &str,
    port: u16,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    use_libuv: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Store>> {
    let agent_serves = env("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True")
        && env("MASTER_ADDR").as_deref() == Some(host)
        && env("MASTER_PORT") == Some(port.to_string());
    let opts = if agent_serves {
        TcpStoreOptions {
            world_size: Some(world_size),
            is_master: false,
            timeout,
            ..TcpStoreOptions::default()
        }
    } else {
        TcpStoreOptions {
            world_size: Some(world_size),
            is_master: rank == 0,
            timeout,
            multi_tenant: true,
            use_libuv,
            ..TcpStoreOptions::default()
        }
    };
    Ok(Arc::new(TcpStore::new(host, port, opts)?))
}

/// Rank and world size from the query, each required.
fn rank_and_size(scheme: &str, q: &HashMap<String, String>) -> Result<(usize, usize)> {
    let rank = q
        .get("rank")
        .ok_or_else(|| rdzv_error(scheme, "rank parameter missing"))?;
    let ws = q
        .get("world_size")
        .ok_or_else(|| rdzv_error(scheme, "world size parameter missing"))?;
    Ok((
        parse_count(scheme, "rank", rank)?,
        parse_count(scheme, "world_size", ws)?,
    ))
}

fn check_rank(scheme: &str, rank: usize, world_size: usize) -> Result<()> {
    if rank >= world_size {
        return Err(rdzv_error(
            scheme,
            &format!("rank {rank} is out of range for world_size {world_size}"),
        ));
    }
    Ok(())
}

fn tcp_handler(
    url: &Url,
    timeout: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Rendezvous> {
    const S: &str = "tcp";
    let (host, port) = url.host_port()?;
    let port = port.ok_or_else(|| rdzv_error(S, "port number missing"))?;
    let q = parse_query(&url.query, S)?;
    let (rank, world_size) = rank_and_size(S, &q)?;
    check_rank(S, rank, world_size)?;
    let host = host.ok_or_else(|| DistError::invalid("hostname cannot be None"))?;
    let store = create_c10d_store(
        &host,
        port,
        rank,
        world_size,
        timeout,
        use_libuv(&q, env),
        env,
    )?;
    Ok(Rendezvous {
        store,
        rank,
        world_size,
    })
}

fn env_handler(
    url: &Url,
    timeout: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Rendezvous> {
    const S: &str = "env";
    let get = |var: &str| -> Result<String> {
        env(var).filter(|v| !v.is_empty()).ok_or_else(|| {
            rdzv_error(
                S,
                &format!("environment variable {var} expected, but not set"),
            )
        })
    };
    let q = parse_query(&url.query, S)?;
    let rank = match q.get("rank") {
        Some(r) => parse_count(S, "rank", r)?,
        None => parse_count(S, "RANK", &get("RANK")?)?,
    };
    let world_size = match q.get("world_size") {
        Some(w) => parse_count(S, "world_size", w)?,
        None => parse_count(S, "WORLD_SIZE", &get("WORLD_SIZE")?)?,
    };
    let addr = get("MASTER_ADDR")?;
    let port_s = get("MASTER_PORT")?;
    let port: i64 = port_s.trim().parse().map_err(|_| {
        rdzv_error(
            S,
            &format!("MASTER_PORT must be an integer, got '{port_s}'"),
        )
    })?;
    let port = u16::try_from(port).map_err(|_| {
        DistError::invalid(format!(
            "port must have value from 0 to 65535 but was {port}."
        ))
    })?;
    check_rank(S, rank, world_size)?;
    let store = create_c10d_store(
        &addr,
        port,
        rank,
        world_size,
        timeout,
        use_libuv(&q, env),
        env,
    )?;
    Ok(Rendezvous {
        store,
        rank,
        world_size,
    })
}

fn file_handler(url: &Url, timeout: Duration) -> Result<Rendezvous> {
    const S: &str = "file";
    if url.path.is_empty() {
        return Err(rdzv_error(S, "path missing"));
    }
    let q = parse_query(&url.query, S)?;
    let (rank, world_size) = rank_and_size(S, &q)?;
    check_rank(S, rank, world_size)?;
    let store = FileStore::with_timeout(&url.path, Some(world_size), timeout)?;
    Ok(Rendezvous {
        store: Arc::new(store),
        rank,
        world_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parsing_like_urlparse() {
        let u = Url::parse("tcp://Host.Example:29500?rank=0&world_size=2");
        assert_eq!(
            (u.scheme.as_str(), u.netloc.as_str(), u.path.as_str()),
            ("tcp", "Host.Example:29500", "")
        );
        assert_eq!(
            u.host_port().unwrap(),
            (Some("host.example".into()), Some(29500))
        );
        let u = Url::parse("tcp://[::1]:5?x=1#frag");
        assert_eq!(u.host_port().unwrap(), (Some("::1".into()), Some(5)));
        assert_eq!(u.query, "x=1");
        let u = Url::parse("FILE:///tmp/a/b?rank=0");
        assert_eq!(
            (u.scheme.as_str(), u.path.as_str(), u.query.as_str()),
            ("file", "/tmp/a/b", "rank=0")
        );
        assert_eq!(
            Url::parse("tcp://host:?a=1").host_port().unwrap(),
            (Some("host".into()), None)
        );
        assert_eq!(
            Url::parse("tcp://u@:7").host_port().unwrap(),
            (None, Some(7))
        );
        assert!(Url::parse("tcp://h:99999").host_port().is_err());
        assert_eq!(Url::parse("/just/a/path").scheme, "");
        let q = parse_query("a=1&&b=2&a=3", "tcp").unwrap();
        assert_eq!((q["a"].as_str(), q["b"].as_str()), ("3", "2"));
        assert!(parse_query("novalue", "tcp").is_err());
    }
}
