//! The agents' meeting point: a client of the store (hosted by one agent) with every operation
//! bounded by a deadline, the per-attempt rendezvous, and the watcher for other nodes' failures.

use c10d_store::tcp::TcpStore;
use c10d_store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keys in the store used by the agents (never clash with PyTorch's keys).
#[derive(Clone)]
pub struct AgentKeys {
    prefix: String,
}

impl AgentKeys {
    pub fn new(run_id: &str) -> Self {
        AgentKeys {
            prefix: format!("c10drun/{run_id}"),
        }
    }
    pub fn joined(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/joined", self.prefix)
    }
    pub fn started(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/started", self.prefix)
    }
    pub fn failed(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/failed", self.prefix)
    }
    /// The port of the workers' store of restart `attempt` (`worker_store`).
    pub fn worker_port(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/worker_port", self.prefix)
    }
    /// The exit barrier of `attempt`: nodes done, and the mark the last one sets.
    pub fn done(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/done", self.prefix)
    }
    pub fn finished(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/finished", self.prefix)
    }
    /// Elastic: who joined round `attempt` `i`-th (the node's sequence number).
    pub fn member(&self, attempt: u32, i: usize) -> String {
        format!("{}/a{attempt}/member/{i}", self.prefix)
    }
    /// Elastic: the number of nodes round `attempt` closed with.
    pub fn closed(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/closed", self.prefix)
    }
    /// Elastic: nodes that arrived after round `attempt` closed and want in.
    pub fn waiting(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/waiting", self.prefix)
    }
    /// Elastic: the number of nodes round `attempt` is expected to gather.
    pub fn expected(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/expected", self.prefix)
    }
    /// Elastic: why round `attempt` ended with a membership change.
    pub fn change(&self, attempt: u32) -> String {
        format!("{}/a{attempt}/change", self.prefix)
    }
    /// Elastic: the counter that numbers nodes in order of their first arrival.
    pub fn node_seq(&self) -> String {
        format!("{}/node_seq", self.prefix)
    }
    /// Elastic: node `seq`'s description (host and pid), for messages.
    pub fn node(&self, seq: i64) -> String {
        format!("{}/node/{seq}", self.prefix)
    }
    /// Elastic: node `seq`'s keep-alive counter.
    pub fn keep_alive(&self, seq: i64) -> String {
        format!("{}/keep_alive/{seq}", self.prefix)
    }
    /// Elastic: set once the job ended for good (why).
    pub fn job_closed(&self) -> String {
        format!("{}/job_closed", self.prefix)
    }
}

/// Why a store operation failed.
#[derive(Debug)]
pub enum StoreFail {
    /// The store did not answer in time or the connection broke: it is unreachable.
    Lost(String),
    /// The store answered with an error (e.g. a wait timed out).
    Op(String),
}

/// The agent's store client. Every operation runs under `deadline` (a helper thread), so a
/// partitioned or frozen store cannot hold the launcher; once it failed to answer, every later
/// operation fails at once.
pub struct AgentStore {
    store: Arc<TcpStore>,
    /// `host:port`, for messages.
    pub addr: String,
    pub deadline: Duration,
    pub lost: Option<String>,
}

impl AgentStore {
    pub fn connect(
        host: &str,
        port: u16,
        connect_timeout: Duration,
        deadline: Duration,
    ) -> Result<AgentStore, String> {
        let s = TcpStore::new(
            host,
            port,
            c10d_store::tcp::TcpStoreOptions {
                world_size: None,
                is_master: false,
                timeout: connect_timeout,
                wait_for_workers: false,
                ..Default::default()
            },
        )
        .map_err(|e| format!("cannot reach the store at {host}:{port}: {e}"))?;
        // Replies (and the cancel of a timed-out wait) are bounded by the deadline from now on.
        s.set_timeout(deadline);
        Ok(AgentStore {
            store: Arc::new(s),
            addr: format!("{host}:{port}"),
            deadline,
            lost: None,
        })
    }

    /// Runs `f` on the store, giving up after `extra + deadline`.
    pub fn bounded<T: Send + 'static>(
        &mut self,
        what: &str,
        extra: Duration,
        f: impl FnOnce(&TcpStore) -> c10d_store::Result<T> + Send + 'static,
    ) -> Result<T, StoreFail> {
        if let Some(why) = &self.lost {
            return Err(StoreFail::Lost(why.clone()));
        }
        let (tx, rx) = mpsc::channel();
        let s = self.store.clone();
        std::thread::spawn(move || {
            let _ = tx.send(f(&s));
        });
        let limit = extra + self.deadline;
        let res = match rx.recv_timeout(limit) {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if e.is_store_error() => return Err(StoreFail::Op(e.to_string())),
            Ok(Err(e)) => format!("the store at {} is unreachable ({what}: {e})", self.addr),
            Err(_) => format!(
                "the store at {} is unreachable (no answer to {what} within {:.0} s)",
                self.addr,
                limit.as_secs_f64()
            ),
        };
        self.lost = Some(res.clone());
        Err(StoreFail::Lost(res))
    }

    /// `add`, bounded; errors as text.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, String> {
        let k = key.to_string();
        self.bounded("add", Duration::ZERO, move |st| st.add(&k, delta))
            .map_err(|e| fail_text(&e))
    }

    /// `set`, bounded; errors as text.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<(), String> {
        let (k, v) = (key.to_string(), value.to_vec());
        self.bounded("set", Duration::ZERO, move |st| st.set(&k, &v))
            .map_err(|e| fail_text(&e))
    }

    /// The value of `key`, `None` when it does not exist; bounded, errors as text.
    pub fn try_get(&mut self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let k = key.to_string();
        self.bounded("get", Duration::ZERO, move |st| {
            if st.check(&[k.as_str()])? {
                st.get(&k).map(Some)
            } else {
                Ok(None)
            }
        })
        .map_err(|e| fail_text(&e))
    }

    /// `compare_set(key, "", value)`: the value that won; bounded, errors as text.
    pub fn set_once(&mut self, key: &str, value: &[u8]) -> Result<Vec<u8>, String> {
        let (k, v) = (key.to_string(), value.to_vec());
        self.bounded("compare_set", Duration::ZERO, move |st| {
            st.compare_set(&k, b"", &v)
        })
        .map_err(|e| fail_text(&e))
    }

    /// The values of `keys` (each waited for up to the deadline); bounded, errors as text.
    pub fn get_all(&mut self, keys: Vec<String>) -> Result<Vec<Vec<u8>>, String> {
        self.bounded("multi_get", Duration::ZERO, move |st| {
            let k: Vec<&str> = keys.iter().map(String::as_str).collect();
            st.multi_get(&k)
        })
        .map_err(|e| fail_text(&e))
    }

    /// A second connection for the failure watcher.
    pub fn clone_conn(&self) -> Result<Arc<dyn Store>, String> {
        let s = self
            .store
            .clone_store()
            .map_err(|e| format!("cannot open a second store connection: {e}"))?;
        s.set_timeout(self.deadline);
        Ok(s)
    }
}

/// Rendezvous of `attempt`: all `nnodes` agents joined before any worker starts. Returns this
/// agent's arrival index (0-based).
pub fn rendezvous(
    s: &mut AgentStore,
    keys: &AgentKeys,
    attempt: u32,
    nnodes: usize,
    run_id: &str,
    timeout: Duration,
) -> Result<usize, String> {
    let joined = keys.joined(attempt);
    let n = s
        .bounded("join", Duration::ZERO, move |st| st.add(&joined, 1))
        .map_err(|e| fail_text(&e))?;
    if n as usize > nnodes {
        return Err(format!(
            "run id '{run_id}' already has {} agents but --nnodes is {nnodes}; use a fresh --run-id",
            n - 1
        ));
    }
    if n as usize == nnodes {
        let started = keys.started(attempt);
        s.bounded("start", Duration::ZERO, move |st| st.set(&started, b"1"))
            .map_err(|e| fail_text(&e))?;
    }
    // Waits in short slices, so a store that goes silent is noticed within the deadline.
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "timed out waiting for {nnodes} nodes to join (rendezvous timeout {:.0} s)",
                timeout.as_secs_f64()
            ));
        }
        let slice = left.min(Duration::from_secs(1));
        let started = keys.started(attempt);
        match s.bounded("rendezvous", slice, move |st| {
            st.wait_timeout(&[started.as_str()], slice)
        }) {
            Ok(()) => return Ok(n as usize - 1),
            Err(StoreFail::Op(_)) => continue,
            Err(e) => return Err(fail_text(&e)),
        }
    }
}

pub fn fail_text(e: &StoreFail) -> String {
    match e {
        StoreFail::Lost(m) | StoreFail::Op(m) => m.clone(),
    }
}

/// What the watcher saw.
pub enum Remote {
    /// Another node published a failure (its message).
    Failure(String),
    /// Elastic: the round ended with a membership change (why).
    Membership(String),
    /// The store stopped answering.
    Lost(String),
}

/// Watches `failed` on its own connection; checks the store every `period`, so a store that
/// stops answering is reported within `period + deadline`. Ends when `stop` is set.
pub fn watch(
    conn: Arc<dyn Store>,
    key: String,
    addr: String,
    period: Duration,
    deadline: Duration,
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<Remote>,
) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match conn.wait_timeout(&[key.as_str()], period) {
                Ok(()) => {
                    let msg = conn
                        .get(&key)
                        .map(|v| String::from_utf8_lossy(&v).into_owned())
                        .unwrap_or_else(|e| e.to_string());
                    let _ = tx.send(Remote::Failure(msg));
                    return;
                }
                Err(e) if e.is_store_error() => continue,
                Err(e) => {
                    if !stop.load(Ordering::SeqCst) {
                        let _ = tx.send(Remote::Lost(format!(
                            "the store at {addr} is unreachable ({e}; deadline {:.0} s)",
                            deadline.as_secs_f64()
                        )));
                    }
                    return;
                }
            }
        }
    });
}

/// Tells the other nodes' agents why this node is stopping (bounded; single-node runs have no
/// store client). Returns a note when the store could not be told.
pub(crate) fn publish_failure(
    store: &mut Option<AgentStore>,
    keys: &AgentKeys,
    attempt: u32,
    msg: &str,
) -> Option<String> {
    let s = store.as_mut()?;
    let (key, msg) = (keys.failed(attempt), msg.to_string());
    match s.bounded("publishing the failure", Duration::ZERO, move |st| {
        st.set(&key, msg.as_bytes())
    }) {
        Ok(()) => None,
        Err(e) => Some(fail_text(&e)),
    }
}
