//! Creating the default group: `init_process_group`, the store-based barrier and the
//! launcher's environment (`LOCAL_RANK`, `TORCHELASTIC_RUN_ID`).

use super::{process_group_name, GroupMember, InitOptions, NewPg, PgOptions, World};
use crate::config::{self, BackendConfig};
use c10d_core::{DistError, Result};
use c10d_store::{PrefixStore, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl World {
    /// `torch.distributed.init_process_group`: creates the default group ("0", desc
    /// "default_pg"). A store made from `init_method` is wrapped in `PrefixStore("default_pg", ..)`;
    /// a store passed in `store` is used as given (PyTorch's rule).
    ///
    /// Rules: `store` and `init_method` are exclusive; with a store, `world_size` and `rank` are
    /// required; neither → `env://`. The timeout defaults to 30 min (10 min for NCCL) and is also
    /// set on a store made by rendezvous. With `TORCH_DIST_INIT_BARRIER=1` a store-based barrier
    /// follows. Installs a panic hook that prefixes panic messages with `[rank{N}]:`.
    ///
    /// # Errors
    /// - [`DistError::InvalidArgument`] "trying to initialize the default process group twice!",
    ///   "Cannot specify both init_method and store.", "world_size must be positive if using
    ///   store", "rank must be non-negative if using store", backend-string errors;
    /// - rendezvous errors (bad URL, missing env vars, store timeouts);
    /// - backend creation errors (e.g. nccl unavailable);
    /// - [`DistError::Store`] "Timed out initializing process group in store based barrier ..."
    pub fn init_process_group(&self, opts: InitOptions) -> Result<()> {
        if self.lock().default_pg.is_some() {
            return Err(DistError::invalid(
                "trying to initialize the default process group twice!",
            ));
        }
        if opts.store.is_some() && opts.init_method.is_some() {
            return Err(DistError::invalid(
                "Cannot specify both init_method and store.",
            ));
        }
        let backend = match (&opts.backend, opts.device_id) {
            (Some(b), _) => config::normalize_backend_name(b),
            (None, Some(d)) => config::get_default_backend_for_device(d.device_type().as_str())?,
            (None, None) => "undefined".to_string(),
        };
        let backend_config = BackendConfig::parse(&backend)?;
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend));
        warn_ignored_pg_timeout(&opts.pg_options);
        let r = init_store(&opts, timeout)?;
        let (rank, world_size) = (r.rank, r.world_size);
        if rank >= world_size {
            return Err(DistError::invalid(format!(
                "Invalid rank {rank} for world_size {world_size}: rank must be in [0, world_size)"
            )));
        }
        let (group_name, count_before) = {
            let mut st = self.lock();
            st.hostname_hint = r.hostname_hint;
            let before = st.group_count;
            (process_group_name(&mut st, &[], false), before)
        };
        let member = self.new_process_group_helper(NewPg {
            group_size: world_size,
            group_rank: Some(rank),
            global_ranks: Vec::new(),
            backend,
            config: backend_config,
            store: r.store.clone(),
            group_name: group_name.clone(),
            pg_options: opts.pg_options.clone(),
            timeout,
            pg_tag: None,
            device_id: opts.device_id,
            group_desc: "default_pg".to_string(),
        });
        let member = match member {
            Ok(m) => m,
            Err(e) => {
                // Departure from PyTorch: a failed init does not consume a group name, so a retry
                // names WORLD "0" again.
                self.lock().group_count = count_before;
                return Err(e);
            }
        };
        self.set_default_group(member.0, world_size, r.init_method)?;
        crate::panic_hook::install(rank);
        if self.init_barrier() {
            store_based_barrier(rank, r.store.as_ref(), &group_name, world_size, timeout)?;
        }
        Ok(())
    }

    /// Records the created group as WORLD (ranks `0..world_size`).
    pub(crate) fn set_default_group(
        &self,
        member: GroupMember,
        world_size: usize,
        init_method: Option<String>,
    ) -> Result<()> {
        let pg = member.into_group().map_err(|_| {
            DistError::invalid("Default process group creation returned a nonmember")
        })?;
        let mut st = self.lock();
        st.default_pg = Some(pg.clone());
        st.init_method = init_method;
        if let Some(e) = st.entry_mut(&pg) {
            e.ranks = (0..world_size).collect();
        }
        Ok(())
    }
}

/// Where the default group's store, rank and size come from.
struct InitStore {
    store: Arc<dyn Store>,
    rank: usize,
    world_size: usize,
    /// The URL when the store came from rendezvous.
    init_method: Option<String>,
    hostname_hint: Option<String>,
}

/// The user's store (with `world_size` and `rank`), or a rendezvous over `init_method`
/// (default `env://`) wrapped in `PrefixStore("default_pg", ..)`, with `timeout` set on it.
fn init_store(opts: &InitOptions, timeout: Duration) -> Result<InitStore> {
    if let Some(store) = opts.store.clone() {
        let ws = opts
            .world_size
            .filter(|w| *w > 0)
            .ok_or_else(|| DistError::invalid("world_size must be positive if using store"))?;
        let rank = opts
            .rank
            .ok_or_else(|| DistError::invalid("rank must be non-negative if using store"))?;
        return Ok(InitStore {
            store,
            rank,
            world_size: ws,
            init_method: None,
            hostname_hint: std::env::var("MASTER_ADDR").ok(),
        });
    }
    let url = opts
        .init_method
        .clone()
        .unwrap_or_else(|| "env://".to_string());
    let env = |k: &str| match &opts.env {
        Some(f) => f(k),
        None => std::env::var(k).ok(),
    };
    let rdv = c10d_store::rendezvous::rendezvous_with_env(
        &url,
        opts.rank,
        opts.world_size,
        timeout,
        &env,
    )?;
    rdv.store.set_timeout(timeout);
    let hint = hostname_hint(&url, &env);
    // Only a store made by rendezvous is wrapped, as in PyTorch: a user's store is used as given.
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new("default_pg", rdv.store));
    Ok(InitStore {
        store,
        rank: rdv.rank,
        world_size: rdv.world_size,
        init_method: Some(url),
        hostname_hint: hint,
    })
}

/// The store a process joining a running job uses (`join_process_group`): the user's store as
/// given, or a client of `init_method`'s (default `env://`) store wrapped in
/// `PrefixStore("default_pg", ..)`, as the members' default group has it. It never hosts the
/// store (the members already do) and needs no rank or world size. Returns the store and the
/// URL.
pub(crate) fn join_store(
    opts: &InitOptions,
    timeout: Duration,
) -> Result<(Arc<dyn Store>, Option<String>)> {
    if let Some(store) = opts.store.clone() {
        return Ok((store, None));
    }
    let url = opts
        .init_method
        .clone()
        .unwrap_or_else(|| "env://".to_string());
    // A client: the agent-store rule makes env:// and tcp:// connect, never host; the rank and
    // size it needs are placeholders (the members assign the real ones).
    let env = |k: &str| match (k, &opts.env) {
        ("TORCHELASTIC_USE_AGENT_STORE", _) => Some("True".to_string()),
        ("RANK" | "WORLD_SIZE", _) => None,
        (_, Some(f)) => f(k),
        (_, None) => std::env::var(k).ok(),
    };
    let rdv = c10d_store::rendezvous::rendezvous_with_env(&url, Some(1), Some(2), timeout, &env)?;
    rdv.store.set_timeout(timeout);
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new("default_pg", rdv.store));
    Ok((store, Some(url)))
}

pub(super) fn warn_ignored_pg_timeout(o: &Option<PgOptions>) {
    if o.as_ref().is_some_and(|o| o.timeout.is_some()) {
        log::warn!("pg_options._timeout was specified, but timeout kwarg has a default value that will always override it.");
    }
}

fn hostname_hint(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(rest) = url.strip_prefix("tcp://") {
        let host = rest.split(['/', '?']).next().unwrap_or("");
        let host = match host.rfind(':') {
            Some(i) => &host[..i],
            None => host,
        };
        return Some(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        );
    }
    env("MASTER_ADDR")
}

/// `_store_based_barrier`: each rank adds 1 to `store_based_barrier_key:<name>`; the last sets
/// `<key>:last_worker`; all wait for it, re-checking at least every 10 s.
///
/// # Errors
/// [`DistError::Store`] "Timed out initializing process group in store based barrier on rank
/// {rank}, for key: {key} (world_size={n}, num_workers_joined={k}, timeout={t:?} error={e})".
pub fn store_based_barrier(
    rank: usize,
    store: &dyn Store,
    group_name: &str,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let key = format!("store_based_barrier_key:{group_name}");
    store.add(&key, 1)?;
    let count = store.add(&key, 0)?;
    let last = format!("{key}:last_worker");
    if count as usize == world_size {
        store.set(&last, b"1")?;
    }
    let start = Instant::now();
    let interval = Duration::from_secs_f64(10.0 + world_size as f64 / 1000.0);
    loop {
        let remaining = timeout.saturating_sub(start.elapsed());
        let wait = interval.min(remaining).max(Duration::from_millis(1));
        match store.wait_timeout(&[last.as_str()], wait) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_store_error() => {
                let joined = store.add(&key, 0).unwrap_or(-1);
                if start.elapsed() >= timeout {
                    return Err(DistError::store(format!(
                        "Timed out initializing process group in store based barrier on rank {rank}, for key: {key} (world_size={world_size}, num_workers_joined={joined}, timeout={timeout:?} error={e})"
                    )));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `get_node_local_rank(fallback_rank)`: `LOCAL_RANK` from the environment, else the fallback.
///
/// # Errors
/// [`DistError::InvalidArgument`] when `LOCAL_RANK` is missing (and no fallback) or not an integer.
pub fn get_node_local_rank(fallback_rank: Option<usize>) -> Result<usize> {
    match std::env::var("LOCAL_RANK") {
        Ok(v) => v.trim().parse().map_err(|_| DistError::invalid(format!("LOCAL_RANK must be an integer, got {v:?}"))),
        Err(_) => fallback_rank.ok_or_else(|| {
            DistError::invalid(
                "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` to work, assuming you are not running in a multi-device context and want the code to run locally instead.",
            )
        }),
    }
}

/// `is_torchelastic_launched()`: true when `TORCHELASTIC_RUN_ID` is set (torchrun / c10drun).
pub fn is_torchelastic_launched() -> bool {
    std::env::var_os("TORCHELASTIC_RUN_ID").is_some()
}
