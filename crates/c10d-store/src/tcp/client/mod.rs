//! `TcpStore`: the client of PyTorch's TCPStore protocol (mirrors `torch.distributed.TCPStore`),
//! optionally owning the server (`is_master`).

use super::protocol::{cmd, put_bytes, put_i64, put_keys, put_u64, Limits};
use super::server::{self, ServerHandle, ServerOptions, TcpStoreServer};
use crate::auth::AuthSecret;
use crate::store::{check_multi_set_len, Store, DEFAULT_STORE_TIMEOUT};
use crate::tls::TlsConfig;
use c10d_core::{DistError, Result};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod connection;
use connection::{io_timeout_for, Client, Security};

/// Options of [`TcpStore::new`], mirroring the keyword arguments of Python's `TCPStore`.
#[derive(Debug, Clone)]
pub struct TcpStoreOptions {
    /// Number of workers (`world_size`); `None` = not counted. `Some(0)` is rejected. When set
    /// and `wait_for_workers`, each store object adds 1 to the internal key `init/`.
    pub world_size: Option<usize>,
    /// Start the server in this process (`is_master`).
    pub is_master: bool,
    /// Timeout of connecting, of waiting for workers, and default of blocking calls (300 s).
    /// Zero follows PyTorch's TCPStore quirk: every `get`/`wait` fails at once.
    pub timeout: Duration,
    /// Count this object in `init/`; the master waits until `world_size` objects joined.
    pub wait_for_workers: bool,
    /// Share one server per port among all master stores of this process (`multi_tenant`).
    pub multi_tenant: bool,
    /// Adopt this already bound listening socket instead of binding (`master_listen_fd`).
    pub master_listen_fd: Option<RawFd>,
    /// PyTorch's backend switch (`use_libuv`). Accepted for compatibility only: this server
    /// always implements the libuv backend's semantics.
    pub use_libuv: bool,
    /// The job's secret ([`crate::auth`]): the client proves it to the server (and the server
    /// to the client), and a master's server requires it of every client. `None` = the secret
    /// file named by `C10D_AUTH_SECRET_FILE`, if set; else no authentication (PyTorch's).
    pub auth: Option<AuthSecret>,
    /// TLS ([`crate::tls`]): the client encrypts its connection and a master's server
    /// requires TLS of every client. `None` = the files named by `C10D_TLS_CERT_FILE`,
    /// `C10D_TLS_KEY_FILE` and `C10D_TLS_CA_FILE`, if set; else plain TCP (PyTorch's).
    pub tls: Option<TlsConfig>,
}

impl Default for TcpStoreOptions {
    fn default() -> Self {
        TcpStoreOptions {
            world_size: None,
            is_master: false,
            timeout: DEFAULT_STORE_TIMEOUT,
            wait_for_workers: true,
            multi_tenant: false,
            master_listen_fd: None,
            use_libuv: true,
            auth: None,
            tls: None,
        }
    }
}

/// A TCPStore handle (mirrors `torch.distributed.TCPStore`): a client connection, plus the
/// server when `is_master`. Every user key goes on the wire as `"/" + key`.
///
/// Interoperates byte for byte with PyTorch 2.x (≥ 2.5: VALIDATE + PING handshake) servers and
/// clients. All methods take `&self`; one request is in flight per handle at a time (a mutex,
/// like PyTorch). Every read is bounded: WAIT/BARRIER by the wait timeout, other replies by the
/// store timeout, so a dead server surfaces as [`DistError::Network`].
pub struct TcpStore {
    host: String,
    port: u16,
    is_master: bool,
    server: Option<Arc<ServerHandle>>,
    client: Mutex<Client>,
    timeout: Mutex<Duration>,
    /// The job's secret and TLS, for connections made later (`clone_store`).
    security: Security,
}

impl std::fmt::Debug for TcpStore {
    /// Like PyTorch's repr: `TCPStore(client=TCPClient((host, port)), server=TCPServer(port=P))`,
    /// `server=<nullptr>` for clients. Never blocks on a request in flight.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let client = format!("({}, {})", self.host, self.port);
        match &self.server {
            Some(s) => write!(
                f,
                "TCPStore(client=TCPClient({client}), server=TCPServer(port={}))",
                s.port()
            ),
            None => write!(f, "TCPStore(client=TCPClient({client}), server=<nullptr>)"),
        }
    }
}

fn env_truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE" | "yes" | "on")
}

fn wire_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    k
}

/// Appends `wire_key(key)` as a length-prefixed string without building it first.
fn put_wire_key(out: &mut Vec<u8>, key: &str) {
    put_u64(out, key.len() as u64 + 1);
    out.push(b'/');
    out.extend_from_slice(key.as_bytes());
}

/// PyTorch's server limits ([`Limits::DEFAULT`], also the defaults of ours): a request over
/// them makes the server close the connection, so the client refuses it first with a clear error.
const MAX_WIRE_KEY: usize = Limits::DEFAULT.max_key_len;
const MAX_VALUE: usize = Limits::DEFAULT.max_payload;
const MAX_KEYS: usize = Limits::DEFAULT.max_keys;

fn check_key(key: &str) -> Result<()> {
    let n = key.len() + 1;
    if n > MAX_WIRE_KEY {
        return Err(DistError::invalid(format!(
            "TCPStore key of {n} bytes (with its '/' prefix) exceeds the server's limit of \
             {MAX_WIRE_KEY} bytes"
        )));
    }
    Ok(())
}

fn check_keys(keys: &[&str]) -> Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(DistError::invalid(format!(
            "TCPStore request of {} keys exceeds the server's limit of {MAX_KEYS} keys",
            keys.len()
        )));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE {
        return Err(DistError::invalid(format!(
            "TCPStore value of {} bytes exceeds the server's limit of {MAX_VALUE} bytes",
            value.len()
        )));
    }
    Ok(())
}

impl TcpStore {
    /// Creates a store like Python's `TCPStore(host, port, world_size, is_master, timeout,
    /// wait_for_workers, multi_tenant, master_listen_fd, use_libuv)`.
    ///
    /// With `is_master` a server is started on `port` (0 = any free port, see [`TcpStore::port`];
    /// `multi_tenant` reuses this process's server on that port; `master_listen_fd` adopts a
    /// bound socket). If binding fails while env `TORCHELASTIC_USE_AGENT_STORE` is truthy and
    /// `MASTER_PORT` equals `port`, the store becomes a plain client (torchrun agent store).
    /// Then a client connects to `host:port` (hostname, IPv4, IPv6 or `"[::1]"`) with exponential
    /// backoff until `timeout`.
    ///
    /// # Errors
    /// - [`DistError::InvalidArgument`] "TCPStore world size cannot be 0".
    /// - [`DistError::Network`] "The server socket has failed to listen on any local network
    ///   address. port: P, …" when the bind fails.
    /// - [`DistError::Network`] "The client socket has timed out after {ms}ms while trying to
    ///   connect to ({host}, {port})." or a handshake failure.
    /// - [`DistError::Store`] "Timed out after {s} seconds waiting for clients. {n}/{N} clients
    ///   joined." (master with `world_size` and `wait_for_workers`).
    pub fn new(host: &str, port: u16, opts: TcpStoreOptions) -> Result<TcpStore> {
        if opts.world_size == Some(0) {
            return Err(DistError::invalid("TCPStore world size cannot be 0"));
        }
        let security = Security {
            auth: AuthSecret::given_or_env(opts.auth.as_ref())?,
            tls: TlsConfig::given_or_env(opts.tls.as_ref())?,
        };
        let mut server = None;
        if opts.is_master {
            let sopts = ServerOptions {
                port,
                world_size: opts.world_size,
                auth: security.auth.clone(),
                tls: security.tls.clone(),
                ..ServerOptions::default()
            };
            let bind = || -> Result<Arc<ServerHandle>> {
                match opts.master_listen_fd {
                    Some(fd) => Ok(TcpStoreServer::from_listen_fd(fd, port, sopts.clone())?.handle),
                    None => {
                        let l = server::bind_listener(None, port)?;
                        server::start(l, &sopts)
                    }
                }
            };
            let res = if opts.multi_tenant {
                server::multi_tenant_server(port, bind)
            } else {
                bind()
            };
            match res {
                Ok(h) => server = Some(h),
                Err(e) => {
                    let agent =
                        std::env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| env_truthy(&v));
                    let mport = std::env::var("MASTER_PORT")
                        .ok()
                        .and_then(|p| p.trim().parse::<u16>().ok());
                    if agent && mport == Some(port) && port != 0 {
                        log::warn!("TCPStore: binding port {port} failed ({e}); TORCHELASTIC_USE_AGENT_STORE is set, continuing as a client of the agent's store");
                    } else {
                        return Err(e);
                    }
                }
            }
        }
        let port = server.as_ref().map_or(port, |s| s.port());
        let client = Client::connect(host, port, opts.timeout, &security)?;
        let store = TcpStore {
            host: host.to_string(),
            port,
            is_master: server.is_some(),
            server,
            client: Mutex::new(client),
            timeout: Mutex::new(opts.timeout),
            security,
        };
        if let (Some(ws), true) = (opts.world_size, opts.wait_for_workers) {
            store.raw_add(b"init/", 1)?;
            if store.server.is_some() {
                store.wait_for_workers(ws, opts.timeout)?;
            }
        }
        Ok(store)
    }

    fn wait_for_workers(&self, ws: usize, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            let n = {
                let v = self.request(
                    |b| {
                        b.push(cmd::GET);
                        put_bytes(b, b"init/");
                    },
                    Client::recv_bytes,
                )?;
                super::protocol::parse_stoll(&v).unwrap_or(0)
            };
            if n >= ws as i64 {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(DistError::store(format!(
                    "Timed out after {} seconds waiting for clients. {n}/{ws} clients joined.",
                    timeout.as_millis().div_ceil(1000)
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's port (the real one when 0 was requested).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host this client connects to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// True when this object runs the server (false for an agent-store fallback).
    pub fn is_master(&self) -> bool {
        self.is_master
    }

    /// True: the server implements libuv-backend semantics (`libuvBackend`).
    pub fn libuv_backend(&self) -> bool {
        true
    }

    fn lock(&self) -> MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn io_timeout(&self) -> Duration {
        io_timeout_for(self.timeout())
    }

    /// Runs one request: encode with `f`, send, then read the reply with `r` under the store timeout.
    fn request<T>(
        &self,
        f: impl FnOnce(&mut Vec<u8>),
        r: impl FnOnce(&mut Client) -> Result<T>,
    ) -> Result<T> {
        let io_t = self.io_timeout();
        let mut c = self.lock();
        c.send_with(f)?;
        c.set_rcvtimeo(io_t)?;
        r(&mut c)
    }

    fn raw_add(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.request(
            |b| {
                b.push(cmd::ADD);
                put_bytes(b, key);
                put_i64(b, delta);
            },
            |c| c.recv_i64(),
        )
    }

    fn wait_wire(
        c: &mut Client,
        keys: &[Vec<u8>],
        timeout: Duration,
        io_t: Duration,
    ) -> Result<()> {
        if c.wait_keys(keys, timeout, io_t)? {
            Ok(())
        } else {
            let names: Vec<String> = keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect();
            Err(DistError::store(format!(
                "wait timeout after {}ms, keys: {}",
                timeout.as_millis(),
                names.join(", ")
            )))
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.lock().send_with(|b| {
            b.push(cmd::SET);
            put_wire_key(b, key);
            put_bytes(b, value);
        })
    }

    /// WAIT (store timeout) then GET, like PyTorch.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        check_key(key)?;
        let k = wire_key(key);
        let (t, io_t) = (self.timeout(), self.io_timeout());
        let mut c = self.lock();
        Self::wait_wire(&mut c, std::slice::from_ref(&k), t, io_t)?;
        c.send_with(|b| {
            b.push(cmd::GET);
            put_bytes(b, &k);
        })?;
        c.set_rcvtimeo(io_t)?;
        c.recv_bytes()
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        check_key(key)?;
        self.raw_add(&wire_key(key), delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        check_key(key)?;
        check_value(expected)?;
        check_value(desired)?;
        self.request(
            |b| {
                b.push(cmd::COMPARE_SET);
                put_wire_key(b, key);
                put_bytes(b, expected);
                put_bytes(b, desired);
            },
            |c| c.recv_bytes(),
        )
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        check_keys(keys)?;
        self.request(
            |b| {
                b.push(cmd::CHECK);
                put_u64(b, keys.len() as u64);
                for k in keys {
                    put_wire_key(b, k);
                }
            },
            |c| match c.recv_u8()? {
                0 => Ok(true),
                1 => Ok(false),
                x => Err(c.fail(DistError::network(format!("invalid CHECK response {x}")))),
            },
        )
    }

    fn wait_timeout(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        check_keys(keys)?;
        let ks: Vec<Vec<u8>> = keys.iter().map(|k| wire_key(k)).collect();
        let io_t = self.io_timeout();
        let mut c = self.lock();
        Self::wait_wire(&mut c, &ks, timeout, io_t)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        self.request(
            |b| {
                b.push(cmd::DELETE_KEY);
                put_wire_key(b, key);
            },
            |c| Ok(c.recv_i64()? == 1),
        )
    }

    fn num_keys(&self) -> Result<i64> {
        self.request(|b| b.push(cmd::GETNUMKEYS), |c| c.recv_i64())
    }

    fn has_extended_api(&self) -> bool {
        true
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.lock().send_with(|b| {
            b.push(cmd::APPEND);
            put_wire_key(b, key);
            put_bytes(b, value);
        })
    }

    /// One WAIT on all keys (store timeout), then MULTI_GET.
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        check_keys(keys)?;
        let ks: Vec<Vec<u8>> = keys.iter().map(|k| wire_key(k)).collect();
        let (t, io_t) = (self.timeout(), self.io_timeout());
        let mut c = self.lock();
        Self::wait_wire(&mut c, &ks, t, io_t)?;
        c.send_with(|b| {
            b.push(cmd::MULTI_GET);
            put_keys(b, &ks);
        })?;
        c.set_rcvtimeo(io_t)?;
        (0..ks.len()).map(|_| c.recv_bytes()).collect()
    }

    fn multi_set(&self, keys: &[&str], values: &[&[u8]]) -> Result<()> {
        check_multi_set_len(keys, values)?;
        check_keys(keys)?;
        values.iter().try_for_each(|v| check_value(v))?;
        self.lock().send_with(|b| {
            b.push(cmd::MULTI_SET);
            put_u64(b, keys.len() as u64);
            for (k, v) in keys.iter().zip(values) {
                put_wire_key(b, k);
                put_bytes(b, v);
            }
        })
    }

    fn queue_push(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        check_value(value)?;
        self.lock().send_with(|b| {
            b.push(cmd::QUEUE_PUSH);
            put_wire_key(b, key);
            put_bytes(b, value);
        })
    }

    /// With `block`, WAIT (store timeout) then QUEUE_POP; an empty reply raises
    /// [`DistError::QueueEmpty`] "queue is empty".
    fn queue_pop(&self, key: &str, block: bool) -> Result<Vec<u8>> {
        check_key(key)?;
        let k = wire_key(key);
        let (t, io_t) = (self.timeout(), self.io_timeout());
        let mut c = self.lock();
        if block {
            Self::wait_wire(&mut c, std::slice::from_ref(&k), t, io_t)?;
        }
        c.send_with(|b| {
            b.push(cmd::QUEUE_POP);
            put_bytes(b, &k);
        })?;
        c.set_rcvtimeo(io_t)?;
        let len = c.recv_i64()?;
        if len <= 0 {
            return Err(DistError::queue_empty("queue is empty"));
        }
        c.recv_bytes()
    }

    fn queue_len(&self, key: &str) -> Result<i64> {
        check_key(key)?;
        self.request(
            |b| {
                b.push(cmd::QUEUE_LEN);
                put_wire_key(b, key);
            },
            |c| c.recv_i64(),
        )
    }

    /// LIST_KEYS; keys not starting with "/" (internal, e.g. `init/`) are dropped, the "/" stripped.
    fn list_keys(&self) -> Result<Vec<String>> {
        let raw = self.request(
            |b| b.push(cmd::LIST_KEYS),
            |c| {
                let n = c.recv_i64()?;
                let mut v = Vec::with_capacity((n.max(0) as usize).min(4096));
                for _ in 0..n.max(0) {
                    v.push(c.recv_bytes()?);
                }
                Ok(v)
            },
        )?;
        Ok(raw
            .into_iter()
            .filter_map(|k| {
                k.strip_prefix(b"/")
                    .map(|s| String::from_utf8_lossy(s).into_owned())
            })
            .collect())
    }

    /// Native BARRIER command (PyTorch ≥ 2.12 servers): the counter lives at `"/" + key`.
    ///
    /// # Errors
    /// [`DistError::Store`] "barrier timeout after {ms}ms, key: {key}".
    fn barrier(&self, key: &str, world_size: usize, timeout: Duration) -> Result<()> {
        check_key(key)?;
        let io_t = self.io_timeout();
        let mut c = self.lock();
        c.send_with(|b| {
            b.push(cmd::BARRIER);
            put_wire_key(b, key);
            put_i64(b, world_size as i64);
        })?;
        if c.finish_wait(timeout, io_t)? {
            Ok(())
        } else {
            Err(DistError::store(format!(
                "barrier timeout after {}ms, key: {key}",
                timeout.as_millis()
            )))
        }
    }

    fn timeout(&self) -> Duration {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_timeout(&self, timeout: Duration) {
        *self.timeout.lock().unwrap_or_else(|e| e.into_inner()) = timeout;
    }

    /// A new client connection to the same server (PyTorch's `clone()`); it keeps a master's
    /// server alive as long as it lives.
    fn clone_store(&self) -> Result<Arc<dyn Store>> {
        let t = self.timeout();
        let client = Client::connect(&self.host, self.port, io_timeout_for(t), &self.security)?;
        Ok(Arc::new(TcpStore {
            host: self.host.clone(),
            port: self.port,
            is_master: false,
            server: self.server.clone(),
            client: Mutex::new(client),
            timeout: Mutex::new(t),
            security: self.security.clone(),
        }))
    }
}
