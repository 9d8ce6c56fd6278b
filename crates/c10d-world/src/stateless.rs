//! vLLM's `StatelessProcessGroup`, spoken from Rust: a metadata group that lives only in a
//! TCPStore (rank 0 hosts it), with vLLM's store protocol, so that a Rust process is a member
//! of the group a vLLM worker or an RL trainer (TRL, OpenRLHF, verl, which all use vLLM's
//! class) forms for weight sync, and can then join its NCCL communicator
//! (`c10d_nccl::unique_id::UniqueIdExchange::Vllm`).
//!
//! The protocol, as vLLM's class has it (keys at the store's root, values pickled):
//!
//! | call | key | notes |
//! |---|---|---|
//! | `send_obj(obj, dst)` / `recv_obj(src)` | `send_to/{dst}/{n}` | `n` counts per (sender, receiver) pair; the key does not name the sender, so two ranks sending to one rank overwrite each other (as in vLLM) |
//! | `broadcast_obj(obj, src)` | `broadcast_from/{src}/{n}` | `n` counts the source's broadcasts |
//! | `all_gather_obj(obj)` | one `broadcast_obj` per rank, in rank order | |
//! | `barrier()` | `arrival_{id}_{rank}`, `departure_{id}_{rank}` | `id` = `barrier_<uuid4>`, broadcast by rank 0; rank 0 waits for every departure and deletes the keys |
//!
//! A sender deletes what it stored once it is older than `data_expiration` (vLLM's
//! `expire_data`, checked at its next send). Objects are pickled as Python pickles them and
//! read without running code (see [`crate::objects`]): plain data only.
//!
//! This module is the one home of vLLM's protocol in c10d-rs: the key formats above are written
//! only here (`send_key`, `broadcast_key`, `barrier_key`). The others adapt it:
//! [`crate::standalone`] borrows vLLM's method names for groups of its own (no vLLM keys), and
//! c10d-nccl's `UniqueIdExchange::Vllm` reads the one broadcast that carries the
//! `ncclUniqueId` (it cannot depend on this crate; a test here checks that its key is
//! `broadcast_key`'s), with its pickle read by `c10d_nccl::pickled_id`.
//!
//! ## Departures from vLLM
//!
//! - Every blocking step is bounded by the group's `store_timeout` and its error names the
//!   group's rank, the step, the store key and the time waited; vLLM's `get` blocks for the
//!   store's timeout and raises the store's error.
//! - The tensor calls (`broadcast`, `send`, `recv`, `all_reduce` through pickled tensors) are
//!   not offered: their values are pickled `torch.Tensor`s, which are code, not data. Use a real
//!   group for tensors.

use c10d_core::{DistError, Result};
use c10d_store::{Store, TcpStore, TcpStoreOptions};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a barrier looks at the store.
const POLL: Duration = Duration::from_millis(2);

/// vLLM's key of the `n`-th object sent to `dst` (by any rank: the key does not name the sender).
fn send_key(dst: usize, n: u64) -> String {
    format!("send_to/{dst}/{n}")
}

/// vLLM's key of the `n`-th object broadcast by `src`.
fn broadcast_key(src: usize, n: u64) -> String {
    format!("broadcast_from/{src}/{n}")
}

/// vLLM's key of `rank`'s mark in the `phase` (`"arrival"`, `"departure"`) of barrier `id`.
fn barrier_key(phase: &str, id: &str, rank: usize) -> String {
    format!("{phase}_{id}_{rank}")
}

/// Settings of [`StatelessProcessGroup::create`] (vLLM's keyword arguments).
#[derive(Debug, Clone, Copy)]
pub struct StatelessOptions {
    /// How long a sender keeps what it stored (vLLM's `data_expiration_seconds`, 1 hour).
    pub data_expiration: Duration,
    /// Bound of connecting and of every wait (vLLM's `store_timeout`, 300 s).
    pub store_timeout: Duration,
}

impl Default for StatelessOptions {
    fn default() -> Self {
        StatelessOptions {
            data_expiration: Duration::from_secs(3600),
            store_timeout: Duration::from_secs(300),
        }
    }
}

/// Rank 0's bound socket, before the group exists (see [`StatelessProcessGroup::listen`]).
#[derive(Debug)]
pub struct StatelessListener {
    listener: std::net::TcpListener,
    host: String,
}

impl StatelessListener {
    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Rank 0 of `world_size`: hosts the store on this socket and waits (up to
    /// `opts.store_timeout`) until every other rank connected.
    ///
    /// # Errors
    /// As [`StatelessProcessGroup::create`].
    pub fn create(
        self,
        world_size: usize,
        opts: StatelessOptions,
    ) -> Result<StatelessProcessGroup> {
        use std::os::fd::AsRawFd;
        let port = self.port();
        // The server duplicates the descriptor; ours closes when `self` drops.
        let fd = self.listener.as_raw_fd();
        StatelessProcessGroup::connect(&self.host, port, 0, world_size, Some(fd), opts)
    }
}

/// A member of a vLLM-style stateless group (see the [module docs](self)).
pub struct StatelessProcessGroup {
    rank: usize,
    world_size: usize,
    store: Arc<TcpStore>,
    opts: StatelessOptions,
    send_dst_counter: Vec<u64>,
    recv_src_counter: Vec<u64>,
    broadcast_send_counter: u64,
    broadcast_recv_src_counter: Vec<u64>,
    /// What this rank stored, with when (for `expire_data`).
    entries: VecDeque<(String, Instant)>,
}

impl std::fmt::Debug for StatelessProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StatelessProcessGroup(rank {} of {}, store port {})",
            self.rank,
            self.world_size,
            self.store.port()
        )
    }
}

impl StatelessProcessGroup {
    /// Rank 0's first step: listen on `host:port` (port 0: the system picks one; vLLM's
    /// `listen_socket`), so that the port is known before [`StatelessListener::create`], which
    /// waits for the other ranks.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn listen(host: &str, port: u16) -> Result<StatelessListener> {
        let listener = std::net::TcpListener::bind((host, port)).map_err(|e| {
            DistError::network(format!(
                "StatelessProcessGroup: cannot listen on {host}:{port}: {e}"
            ))
        })?;
        Ok(StatelessListener {
            listener,
            host: host.to_string(),
        })
    }

    /// `StatelessProcessGroup.create(host, port, rank, world_size)`: rank 0 listens on
    /// `host:port` (a fixed port here; see [`StatelessProcessGroup::listen`] for port 0) and
    /// waits until every other rank connected, as vLLM's does; the others connect.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for `rank >= world_size`; the store's error (bind,
    /// connect, or the wait for the other ranks) after `opts.store_timeout`, naming the rank
    /// and the address.
    pub fn create(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        opts: StatelessOptions,
    ) -> Result<StatelessProcessGroup> {
        if rank == 0 {
            return StatelessProcessGroup::listen(host, port)?.create(world_size, opts);
        }
        StatelessProcessGroup::connect(host, port, rank, world_size, None, opts)
    }

    /// The member `rank`: its store client (rank 0: also the server, on `listen_fd`), counted
    /// in the store's `init/` as PyTorch's `wait_for_workers` counts.
    fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        listen_fd: Option<std::os::fd::RawFd>,
        opts: StatelessOptions,
    ) -> Result<StatelessProcessGroup> {
        if rank >= world_size {
            return Err(DistError::invalid(format!(
                "StatelessProcessGroup: rank {rank} is not below world_size {world_size}"
            )));
        }
        let start = Instant::now();
        let store = TcpStore::new(
            host,
            port,
            TcpStoreOptions {
                world_size: Some(world_size),
                is_master: listen_fd.is_some(),
                master_listen_fd: listen_fd,
                timeout: opts.store_timeout,
                wait_for_workers: true,
                ..Default::default()
            },
        )
        .map_err(|e| {
            e.with_prefix(&format!(
                "StatelessProcessGroup rank {rank} of {world_size}: the store at {host}:{port} (after {:.1} s): ",
                start.elapsed().as_secs_f64()
            ))
        })?;
        Ok(StatelessProcessGroup {
            rank,
            world_size,
            store: Arc::new(store),
            opts,
            send_dst_counter: vec![0; world_size],
            recv_src_counter: vec![0; world_size],
            broadcast_send_counter: 0,
            broadcast_recv_src_counter: vec![0; world_size],
            entries: VecDeque::new(),
        })
    }

    /// This member's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of members.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The store's port (what rank 0 bound when given port 0).
    pub fn port(&self) -> u16 {
        self.store.port()
    }

    /// The group's store (for a communicator made through it).
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// `send_obj(obj, dst)`: `obj` pickled under `send_to/{dst}/{n}`.
    ///
    /// # Errors
    /// `dst` outside the group; an object that cannot be pickled; the store's error.
    pub fn send_obj<T: Serialize>(&mut self, obj: &T, dst: usize) -> Result<()> {
        self.check_rank(dst, "send_obj dst")?;
        self.expire_data()?;
        let key = send_key(dst, self.send_dst_counter[dst]);
        self.store.set(&key, &crate::objects::encode(obj)?)?;
        self.send_dst_counter[dst] += 1;
        self.entries.push_back((key, Instant::now()));
        Ok(())
    }

    /// `recv_obj(src)`: the next object `src` sent to this rank.
    ///
    /// # Errors
    /// `src` outside the group; nothing sent within the store timeout (naming the key); a
    /// pickle that is not plain data of type `T`.
    pub fn recv_obj<T: DeserializeOwned>(&mut self, src: usize) -> Result<T> {
        self.check_rank(src, "recv_obj src")?;
        let key = send_key(self.rank, self.recv_src_counter[src]);
        let obj = crate::objects::decode(&self.wait_get(&key, "recv_obj")?)?;
        self.recv_src_counter[src] += 1;
        Ok(obj)
    }

    /// `broadcast_obj(obj, src)`: rank `src` passes `Some(obj)` and gets it back; the others
    /// pass `None` and get `src`'s object, from `broadcast_from/{src}/{n}`. As in vLLM, nothing
    /// is cleaned up after all ranks read it (it expires on the sender's side).
    ///
    /// # Errors
    /// `src` outside the group; `obj` missing on `src`; nothing broadcast within the store
    /// timeout (naming the key); a pickle that is not plain data of type `T`.
    pub fn broadcast_obj<T: Serialize + DeserializeOwned + Clone>(
        &mut self,
        obj: Option<&T>,
        src: usize,
    ) -> Result<T> {
        self.check_rank(src, "broadcast_obj src")?;
        if self.rank == src {
            let obj = obj.ok_or_else(|| {
                DistError::invalid(format!(
                    "StatelessProcessGroup: broadcast_obj on its source rank {src} needs the object"
                ))
            })?;
            self.expire_data()?;
            let key = broadcast_key(src, self.broadcast_send_counter);
            self.store.set(&key, &crate::objects::encode(obj)?)?;
            self.broadcast_send_counter += 1;
            self.entries.push_back((key, Instant::now()));
            return Ok(obj.clone());
        }
        let key = broadcast_key(src, self.broadcast_recv_src_counter[src]);
        let got = crate::objects::decode(&self.wait_get(&key, "broadcast_obj")?)?;
        self.broadcast_recv_src_counter[src] += 1;
        Ok(got)
    }

    /// `all_gather_obj(obj)`: every rank's object in rank order (one broadcast per rank).
    ///
    /// # Errors
    /// As [`StatelessProcessGroup::broadcast_obj`].
    pub fn all_gather_obj<T: Serialize + DeserializeOwned + Clone>(
        &mut self,
        obj: &T,
    ) -> Result<Vec<T>> {
        (0..self.world_size)
            .map(|i| self.broadcast_obj((i == self.rank).then_some(obj), i))
            .collect()
    }

    /// The index of the next broadcast from `src` (vLLM's counters), and moves past it: for a
    /// broadcast another layer reads itself, such as the `ncclUniqueId` that vLLM's
    /// `PyNcclCommunicator` broadcasts through the group (pass the index as
    /// `UniqueIdExchange::Vllm { first }` to c10d-nccl).
    ///
    /// # Errors
    /// `src` outside the group.
    pub fn take_broadcast_index(&mut self, src: usize) -> Result<u64> {
        self.check_rank(src, "take_broadcast_index src")?;
        let c = if self.rank == src {
            &mut self.broadcast_send_counter
        } else {
            &mut self.broadcast_recv_src_counter[src]
        };
        *c += 1;
        Ok(*c - 1)
    }

    /// `barrier(timeout)`: vLLM's three phases (rank 0 broadcasts a fresh barrier id; every
    /// rank marks its arrival and waits for all; every rank marks its departure, and rank 0
    /// waits for all departures, then deletes the keys), each phase bounded by `timeout`.
    ///
    /// # Errors
    /// A phase not done within `timeout`, naming the ranks missing; the store's error.
    pub fn barrier(&mut self, timeout: Duration) -> Result<()> {
        let id = if self.rank == 0 {
            let id = format!("barrier_{}", uuid4());
            self.broadcast_obj(Some(&id), 0)?
        } else {
            self.broadcast_obj::<String>(None, 0)?
        };
        self.store
            .set(&barrier_key("arrival", &id, self.rank), b"1")?;
        self.wait_all(&id, "arrival", timeout)?;
        self.store
            .set(&barrier_key("departure", &id, self.rank), b"1")?;
        if self.rank != 0 {
            return Ok(());
        }
        self.wait_all(&id, "departure", timeout)?;
        for i in 0..self.world_size {
            for phase in ["arrival", "departure"] {
                self.store.delete_key(&barrier_key(phase, &id, i))?;
            }
        }
        Ok(())
    }

    /// Waits until every rank's `{phase}_{id}_{rank}` key exists.
    fn wait_all(&self, id: &str, phase: &str, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut missing: Vec<usize> = (0..self.world_size).collect();
        loop {
            let mut still = Vec::new();
            for &i in &missing {
                if !self.store.check(&[barrier_key(phase, id, i).as_str()])? {
                    still.push(i);
                }
            }
            missing = still;
            if missing.is_empty() {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(DistError::store(format!(
                    "StatelessProcessGroup rank {}: barrier {phase} timed out after {:.2} s; ranks {missing:?} did not arrive",
                    self.rank,
                    start.elapsed().as_secs_f64()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// vLLM's `expire_data`: deletes what this rank stored longer ago than `data_expiration`.
    fn expire_data(&mut self) -> Result<()> {
        while let Some((key, at)) = self.entries.front() {
            if at.elapsed() <= self.opts.data_expiration {
                break;
            }
            self.store.delete_key(key)?;
            self.entries.pop_front();
        }
        Ok(())
    }

    /// `key`'s value once it exists, within the store timeout.
    fn wait_get(&self, key: &str, step: &str) -> Result<Vec<u8>> {
        let start = Instant::now();
        self.store
            .wait_timeout(&[key], self.opts.store_timeout)
            .map_err(|e| {
                DistError::store(format!(
                    "StatelessProcessGroup rank {}: {step} waited {:.1} s for store key {key:?}: {e}",
                    self.rank,
                    start.elapsed().as_secs_f64()
                ))
            })?;
        self.store.get(key)
    }

    fn check_rank(&self, r: usize, what: &str) -> Result<()> {
        if r < self.world_size {
            return Ok(());
        }
        Err(DistError::invalid(format!(
            "StatelessProcessGroup: {what} {r} is not a rank of a group of {}",
            self.world_size
        )))
    }
}

/// A random UUID (version 4) in its text form, as Python's `uuid.uuid4()` prints it.
fn uuid4() -> String {
    let mut b = [0u8; 16];
    rand::fill(&mut b[..]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Three ranks as threads: vLLM's keys and counters, all_gather order, send/recv pairs,
    /// the id broadcast another layer reads, the barrier's cleanup, and expiry.
    #[test]
    fn three_ranks_exchange_with_vllms_keys() {
        let opts = StatelessOptions {
            store_timeout: Duration::from_secs(20),
            data_expiration: Duration::from_millis(300),
        };
        let l = StatelessProcessGroup::listen("127.0.0.1", 0).unwrap();
        let port = l.port();
        let member = move |r: usize| -> Result<Vec<String>> {
            let mut g = StatelessProcessGroup::create("127.0.0.1", port, r, 3, opts)?;
            let cfg: BTreeMap<String, i64> = [("tp".to_string(), 2)].into();
            let got = g.broadcast_obj((r == 0).then_some(&cfg), 0)?;
            assert_eq!(got, cfg);
            let all = g.all_gather_obj(&format!("rank{r}"))?;
            let idx = g.take_broadcast_index(0)?;
            assert_eq!(idx, 2, "rank {r}: broadcasts of rank 0 so far");
            g.send_obj(&(r as i64 * 10), (r + 1) % 3)?;
            let from: i64 = g.recv_obj((r + 2) % 3)?;
            assert_eq!(from, ((r + 2) % 3) as i64 * 10);
            g.barrier(Duration::from_secs(20))?;
            Ok(all)
        };
        let others: Vec<_> = (1..3)
            .map(|r| std::thread::spawn(move || member(r)))
            .collect();
        let mut g0 = l.create(3, opts).unwrap();
        // Rank 0 of the threads above is this one: run its part here.
        let cfg: BTreeMap<String, i64> = [("tp".to_string(), 2)].into();
        g0.broadcast_obj(Some(&cfg), 0).unwrap();
        let all = g0.all_gather_obj(&"rank0".to_string()).unwrap();
        assert_eq!(g0.take_broadcast_index(0).unwrap(), 2);
        g0.send_obj(&0i64, 1).unwrap();
        assert_eq!(g0.recv_obj::<i64>(2).unwrap(), 20);
        g0.barrier(Duration::from_secs(20)).unwrap();
        for h in others {
            assert_eq!(h.join().unwrap().unwrap(), all);
        }
        assert_eq!(all, ["rank0", "rank1", "rank2"]);
        let st = g0.store();
        for k in [
            "broadcast_from/0/0",
            "broadcast_from/0/1",
            "broadcast_from/2/0",
            "send_to/1/0",
        ] {
            assert!(st.check(&[k]).unwrap(), "{k}");
        }
        assert_eq!(
            st.list_keys()
                .unwrap()
                .iter()
                .filter(|k| k.starts_with("arrival_"))
                .count(),
            0
        );
        // What rank 0 stored expires at its next send.
        std::thread::sleep(Duration::from_millis(400));
        g0.send_obj(&1i64, 1).unwrap();
        assert!(!st.check(&["broadcast_from/0/0"]).unwrap());
        assert!(st.check(&["send_to/1/1"]).unwrap());
    }

    #[test]
    fn a_missing_object_is_a_bounded_error_naming_the_key() {
        let opts = StatelessOptions {
            store_timeout: Duration::from_millis(300),
            ..Default::default()
        };
        let mut g = StatelessProcessGroup::listen("127.0.0.1", 0)
            .unwrap()
            .create(1, opts)
            .unwrap();
        let e = g.recv_obj::<i64>(0).unwrap_err().to_string();
        assert!(e.contains("send_to/0/0") && e.contains("recv_obj"), "{e}");
        assert!(g
            .send_obj(&1i64, 3)
            .unwrap_err()
            .to_string()
            .contains("not a rank"));
    }

    /// c10d-nccl reads the id vLLM's `PyNcclCommunicator` broadcasts under this module's key.
    #[cfg(feature = "nccl")]
    #[test]
    fn nccls_vllm_id_key_is_this_protocols_broadcast_key() {
        use c10d_nccl::unique_id::UniqueIdExchange;
        for (first, n) in [(0, 0), (2, 0), (2, 3)] {
            let keys = UniqueIdExchange::Vllm { first }.keys(n, "ignored", 4);
            assert_eq!(keys, [broadcast_key(0, first + n)]);
        }
        assert_eq!(send_key(1, 2), "send_to/1/2");
        assert_eq!(
            barrier_key("arrival", "barrier_x", 3),
            "arrival_barrier_x_3"
        );
    }

    #[test]
    fn uuids_look_like_pythons() {
        let u = uuid4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
    }
}
