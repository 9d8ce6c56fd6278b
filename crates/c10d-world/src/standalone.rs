//! Standalone groups: a group outside the default world, formed from (host, port, rank, world
//! size, group name, timeout), the way the RL stacks that copy PyTorch's
//! `_new_process_group_helper` form a trainer-to-inference group: rank 0 hosts the TCP store (it
//! listens first: [`StandaloneGroup::listen`]), every rank joins it ([`StoreHost::join`],
//! [`StandaloneGroup::join`]). Several such groups live side by side with the default world and
//! with each other (each is a [`World`] of its own, on its own store prefix `"<group name>/"`,
//! as PyTorch's `_new_process_group_helper` prefixes a group, so groups may share one store).
//! The members are c10d-rs processes: a Python peer would have to build the same store prefix
//! chain (the RL stacks' copies use `PrefixStore(group_name)` without the slash).
//!
//! This is not vLLM's `StatelessProcessGroup`: that protocol (its store keys and pickled
//! values, for a group with vLLM workers) has one home, [`crate::stateless`]. A standalone group
//! only borrows vLLM's method names (`broadcast_obj`, `all_gather_obj`) and runs them as
//! collectives of its own [`World`]; it writes no vLLM key.
//!
//! Teardown is ordered: every rank says it left (a counter in the store), and rank 0 keeps the
//! store up until all have (bounded by the timeout), since a backend may still reach the store
//! while it connects.
//!
//! Every blocking step is bounded by the group's timeout, and its error names the group, the
//! rank, the step (connecting to the store, initialising the group, a collective), the address,
//! and how long it waited.

use crate::config::default_timeout_for;
use crate::world::{InitOptions, World};
use c10d_core::{DistError, Result};
use c10d_store::{PrefixStore, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a member needs to join a standalone group.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    /// The store's host (rank 0's address).
    pub host: String,
    /// The store's port.
    pub port: u16,
    /// This process's rank in the group.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// The group's name: its store prefix, so that groups may share one store.
    pub group_name: String,
    /// Bound of every blocking step; `None` = the backend's default (30 min, NCCL 10 min).
    pub timeout: Option<Duration>,
    /// Backend string (`"gloo"` by default; `"cpu:gloo,cuda:nccl"` ...).
    pub backend: String,
}

impl StandaloneOptions {
    /// A member of `world_size` ranks joining `host:port` as `rank`, on `"gloo"`.
    pub fn new(host: &str, port: u16, rank: usize, world_size: usize, group_name: &str) -> Self {
        StandaloneOptions {
            host: host.to_string(),
            port,
            rank,
            world_size,
            group_name: group_name.to_string(),
            timeout: None,
            backend: "gloo".into(),
        }
    }

    fn timeout(&self) -> Duration {
        self.timeout
            .unwrap_or_else(|| default_timeout_for(&self.backend))
    }
}

/// Rank 0's listening store, before the group is joined (its port is known at once, also when
/// it was asked for port 0).
pub struct StoreHost {
    server: TcpStoreServer,
}

impl StoreHost {
    /// The port the store listens on.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// Joins the group as rank 0 (`opts.port` is replaced by this store's).
    ///
    /// # Errors
    /// As [`StandaloneGroup::join`].
    pub fn join(self, opts: StandaloneOptions) -> Result<StandaloneGroup> {
        let opts = StandaloneOptions {
            port: self.port(),
            ..opts
        };
        let mut g = StandaloneGroup::join(opts)?;
        g.server = Some(self.server);
        Ok(g)
    }
}

/// A standalone group (see the module docs); torn down when dropped.
pub struct StandaloneGroup {
    world: World,
    opts: StandaloneOptions,
    /// The group's (prefixed) store.
    store: Arc<dyn Store>,
    /// Set once torn down.
    left: bool,
    /// Rank 0's store server, kept as long as the group.
    server: Option<TcpStoreServer>,
}

impl StandaloneGroup {
    /// Rank 0's first step: listen on `host:port` (port 0: the system picks one).
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn listen(host: &str, port: u16) -> Result<StoreHost> {
        let server = TcpStoreServer::bind(ServerOptions {
            host: Some(host.to_string()),
            port,
            ..ServerOptions::default()
        })
        .map_err(|e| {
            e.map_message(|m| format!("standalone group: listening on {host}:{port}: {m}"))
        })?;
        Ok(StoreHost { server })
    }

    /// Rank 0 listens and joins; the others join. `opts.port` must not be 0.
    ///
    /// # Errors
    /// As [`StandaloneGroup::listen`] and [`StandaloneGroup::join`].
    pub fn create(opts: StandaloneOptions) -> Result<StandaloneGroup> {
        if opts.rank == 0 {
            return StandaloneGroup::listen(&opts.host, opts.port)?.join(opts);
        }
        StandaloneGroup::join(opts)
    }

    /// Joins the group whose store is at `opts.host:opts.port`.
    ///
    /// # Errors
    /// A step that fails or runs past the timeout, named with the address and the time it
    /// took: connecting to the store, initialising the group (a rank that never joins).
    pub fn join(opts: StandaloneOptions) -> Result<StandaloneGroup> {
        let timeout = opts.timeout();
        let start = Instant::now();
        let store_opts = TcpStoreOptions {
            timeout,
            ..TcpStoreOptions::default()
        };
        let client = TcpStore::new(&opts.host, opts.port, store_opts)
            .map_err(|e| step_error(&opts, "connecting to the store", start, e))?;
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            &format!("{}/", opts.group_name),
            Arc::new(client),
        ));
        let world = World::new();
        world
            .init_process_group(InitOptions {
                backend: Some(opts.backend.clone()),
                store: Some(store.clone()),
                rank: Some(opts.rank),
                world_size: Some(opts.world_size),
                timeout: Some(timeout),
                ..InitOptions::default()
            })
            .map_err(|e| step_error(&opts, "initialising the group", start, e))?;
        Ok(StandaloneGroup {
            world,
            opts,
            store,
            left: false,
            server: None,
        })
    }

    /// The group as a [`World`]: every collective, with the call style of the default world
    /// (`g.world().all_reduce(&t).run()`).
    pub fn world(&self) -> &World {
        &self.world
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.opts.rank
    }

    /// `broadcast_obj(obj, src)` (vLLM's name): rank `src`'s `obj` on every rank (`obj` is
    /// ignored elsewhere; pass `None` there).
    ///
    /// # Errors
    /// `obj` missing on `src`; the collective's error, naming the group and step.
    pub fn broadcast_obj<T: Serialize + DeserializeOwned + Default>(
        &self,
        obj: Option<T>,
        src: usize,
    ) -> Result<T> {
        let start = Instant::now();
        let mut list = [match (obj, self.opts.rank == src) {
            (Some(o), true) => o,
            (None, true) => {
                return Err(DistError::invalid(format!(
                    "standalone group {:?}: broadcast_obj on the source rank {src} needs an object",
                    self.opts.group_name
                )))
            }
            (_, false) => T::default(),
        }];
        self.world
            .broadcast_object_list(&mut list)
            .src(src)
            .run()
            .map_err(|e| step_error(&self.opts, "broadcast_obj", start, e))?;
        let [obj] = list;
        Ok(obj)
    }

    /// `all_gather_obj(obj)` (vLLM's name): every rank's object, in rank order.
    ///
    /// # Errors
    /// The collective's error, naming the group and step.
    pub fn all_gather_obj<T: Serialize + DeserializeOwned>(&self, obj: &T) -> Result<Vec<T>> {
        let start = Instant::now();
        self.world
            .all_gather_object(obj)
            .run()
            .map_err(|e| step_error(&self.opts, "all_gather_obj", start, e))
    }

    /// A barrier of the group.
    ///
    /// # Errors
    /// The barrier's error, naming the group and step.
    pub fn barrier(&self) -> Result<()> {
        let start = Instant::now();
        self.world
            .barrier()
            .run()
            .map_err(|e| step_error(&self.opts, "barrier", start, e))
    }

    /// Tears the group down (`destroy_process_group`); rank 0's store goes with it.
    ///
    /// # Errors
    /// The backend's teardown error.
    pub fn destroy(mut self) -> Result<()> {
        self.leave()
    }

    /// Tears the group down, says so in the store, and (rank 0) waits until every rank has,
    /// up to the timeout, before the store may go.
    fn leave(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.left, true) {
            return Ok(());
        }
        let torn = self.world.destroy_process_group(None);
        const LEFT: &str = "standalone_left";
        let start = Instant::now();
        let mut count = self.store.add(LEFT, 1);
        if self.opts.rank == 0 {
            let deadline = start + self.opts.timeout();
            while matches!(count, Ok(n) if (n as usize) < self.opts.world_size)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
                count = self.store.add(LEFT, 0);
            }
        }
        torn.and(count.map(|_| ()))
            .map_err(|e| step_error(&self.opts, "leaving the group", start, e))
    }
}

impl Drop for StandaloneGroup {
    fn drop(&mut self) {
        // Nothing if `destroy` ran; the server (rank 0) goes after, with the fields.
        let _ = self.leave();
    }
}

/// `e`, prefixed with the group, the rank, the step, the store's address and the time waited.
fn step_error(o: &StandaloneOptions, step: &str, start: Instant, e: DistError) -> DistError {
    e.map_message(|m| {
        format!(
            "standalone group {:?} (rank {} of {}, store {}:{}): {step} failed after {:.1} s: {m}",
            o.group_name,
            o.rank,
            o.world_size,
            o.host,
            o.port,
            start.elapsed().as_secs_f64()
        )
    })
}
