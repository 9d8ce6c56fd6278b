//! Groups that grow back: [`World::grow_group`] (the members) and
//! [`World::join_process_group`] (the newcomers) make WORLD larger, the inverse of
//! [`World::shrink_group`]. A training job that shrank after a failure takes a replacement
//! process back in (torchft's reconfiguration; torchcomms calls it `reconfigure`).
//!
//! ## How the members and the newcomers agree
//!
//! Through the job's store (the store under WORLD's prefixes: the TCPStore of env:// and tcp://,
//! or the store given to `init_process_group`), under `c10d_grow/<g>/`, `g` being the grow's
//! generation (0 for the first grow of the store; members count their grows, newcomers read it
//! from `c10d_grow/next`):
//!
//! 1. each newcomer takes an arrival index `i` from the counter `c10d_grow/<g>/joined` and
//!    writes who it is under `c10d_grow/<g>/joiner/<i>`;
//! 2. rank 0 of WORLD waits (up to the timeout) until the `new_ranks` newcomers it was asked
//!    for have arrived, then publishes the plan under `c10d_grow/<g>/plan`: the old size `n`,
//!    the number admitted `k`, the new group's name and the group counter after it, and moves
//!    `c10d_grow/next` on; the other members and the newcomers wait for the plan;
//! 3. everyone creates the new WORLD of `n + k` ranks over the store prefix
//!    `"default_pg/<new name>/"` (a name no earlier group had):
//!    **members keep their ranks `0..n`, newcomer `i` becomes rank `n + i`** (arrival order).
//!    A newcomer that arrived past `k` joins the next generation instead.
//!
//! The new WORLD has the members' backend string, backend config, op timeout and bound device
//! (a newcomer's come from its own [`InitOptions`]); the old WORLD and every other group are
//! aborted and forgotten, as after shrinking WORLD. Every rank ends with the same group
//! counter, so later `new_group` calls agree on names.
//!
//! ## Departures from PyTorch
//!
//! PyTorch 2.14 grows NCCL communicators (`ncclCommGrow`) and Gloo contexts in its backends;
//! its Python surface for it is not part of the stable API that c10d-rs mirrors. Here growing
//! is a world-level operation on every backend: the new WORLD's backends are created afresh
//! over the store (so NCCL needs no `ncclCommGrow`), only WORLD grows, and the newcomers enter
//! through `join_process_group` instead of `init_process_group`.

use crate::config::{self, BackendConfig};
use crate::world::{
    process_group_name, stop_backends, BackendSource, GroupMember, InitOptions, NewPg, World,
};
use c10d_core::{DistError, ProcessGroup, Result};
use c10d_store::{PrefixStore, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The plan rank 0 publishes: old size, admitted newcomers, new group name, group counter.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    old_size: usize,
    admitted: usize,
    name: String,
    group_count: usize,
}

impl Plan {
    fn encode(&self) -> Vec<u8> {
        format!(
            "{} {} {} {}",
            self.old_size, self.admitted, self.group_count, self.name
        )
        .into_bytes()
    }

    fn decode(v: &[u8]) -> Result<Plan> {
        let text = String::from_utf8_lossy(v);
        let mut it = text.splitn(4, ' ');
        let mut num = || it.next().and_then(|x| x.parse::<usize>().ok());
        match (num(), num(), num()) {
            (Some(old_size), Some(admitted), Some(group_count)) => Ok(Plan {
                old_size,
                admitted,
                group_count,
                name: text.splitn(4, ' ').nth(3).unwrap_or_default().to_string(),
            }),
            _ => Err(DistError::invalid(format!(
                "grow: the store holds a bad plan {text:?}"
            ))),
        }
    }
}

fn key(g: u64, what: &str) -> String {
    format!("c10d_grow/{g}/{what}")
}

/// Where generation numbers continue.
const NEXT: &str = "c10d_grow/next";

/// The store under every `PrefixStore` of `s`: what members and newcomers share.
fn root_store(s: &Arc<dyn Store>) -> Arc<dyn Store> {
    let mut s = s.clone();
    while let Some(inner) = s.wrapped_store() {
        s = inner;
    }
    s
}

/// The new WORLD's store: the root under `default_pg`, as `init_process_group` has it.
fn world_store(root: &Arc<dyn Store>) -> Arc<dyn Store> {
    Arc::new(PrefixStore::new("default_pg", root.clone()))
}

/// `key` of `store` once it exists, waiting until `deadline`.
///
/// # Errors
/// [`DistError::Store`] naming the key, `what` is waited for, and the time waited.
fn wait_get(store: &dyn Store, k: &str, deadline: Instant, what: &str) -> Result<Vec<u8>> {
    let t0 = Instant::now();
    let left = deadline.saturating_duration_since(t0);
    store.wait_timeout(&[k], left).map_err(|e| {
        DistError::store(format!(
            "grow: {what} did not happen within {:.1} s (waiting for store key '{k}': {e})",
            t0.elapsed().as_secs_f64()
        ))
    })?;
    store.get(k)
}

impl World {
    /// The members' side of growing WORLD by `new_ranks` processes, which call
    /// [`World::join_process_group`] on the same store (before or after; the first
    /// `new_ranks` to arrive are taken). Every member of WORLD calls it.
    ///
    /// Members keep their ranks; newcomers get ranks `n..n + new_ranks` in arrival order (`n`
    /// the old size). The result is the new WORLD (also what `get_rank`/`get_world_size`
    /// answer for from now on); the old WORLD and every other group are aborted and removed.
    /// `timeout` bounds the wait for the newcomers and the new group's creation (`None`: WORLD's
    /// op timeout). See the [module docs](crate::grow) for the protocol.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] before `init_process_group` or for `new_ranks == 0`;
    /// [`DistError::Store`] when the newcomers (or rank 0's plan) do not come in time, naming
    /// the store key; the backend's error if the new group cannot be created. WORLD is left as
    /// it was when any of these fail.
    pub fn grow_group(&self, new_ranks: usize, timeout: Option<Duration>) -> Result<GroupMember> {
        if new_ranks == 0 {
            return Err(DistError::invalid(
                "grow_group: new_ranks must be at least 1",
            ));
        }
        let (world, entry) = {
            let st = self.lock();
            let pg = st
                .default_pg
                .clone()
                .ok_or_else(|| DistError::invalid(crate::world::NOT_INITIALIZED))?;
            let entry = st.default_entry()?.clone();
            (pg, entry)
        };
        let backend = world.default_backend()?;
        let timeout = timeout.unwrap_or_else(|| backend.timeout());
        let deadline = Instant::now() + timeout;
        let store = root_store(&entry.store);
        let g = self.lock().grow_generation;
        let (n, rank) = (world.size(), world.rank());
        let plan = if rank == 0 {
            let k = key(g, &format!("joiner/{}", new_ranks - 1));
            wait_get(
                store.as_ref(),
                &k,
                deadline,
                &format!("{new_ranks} newcomer(s) joining"),
            )?;
            let plan = {
                let mut st = self.lock();
                let name = process_group_name(&mut st, &entry.ranks, true);
                Plan {
                    old_size: n,
                    admitted: new_ranks,
                    name,
                    group_count: st.group_count,
                }
            };
            store.set(&key(g, "plan"), &plan.encode())?;
            store.set(NEXT, (g + 1).to_string().as_bytes())?;
            plan
        } else {
            let v = wait_get(
                store.as_ref(),
                &key(g, "plan"),
                deadline,
                "rank 0's grow plan",
            )?;
            Plan::decode(&v)?
        };
        let size = plan.old_size + plan.admitted;
        let a = NewPg {
            group_size: size,
            group_rank: Some(rank),
            global_ranks: (0..size).collect(),
            backend: entry.backend_name.clone(),
            config: entry.config.clone(),
            store: world_store(&store),
            group_name: plan.name.clone(),
            pg_options: None,
            timeout: backend.timeout(),
            pg_tag: None,
            device_id: world.bound_device_id(),
            group_desc: "default:grown".to_string(),
        };
        let (member, _) = self.create_group(a, BackendSource::Create)?;
        let new_pg = member
            .group()
            .cloned()
            .ok_or_else(|| DistError::invalid("grow_group: the backend created no group"))?;
        self.adopt_grown(&new_pg, &world, &plan, g);
        Ok(GroupMember::Group(new_pg))
    }

    /// The newcomers' side of growing WORLD: instead of `init_process_group`, joins the running
    /// job whose members call [`World::grow_group`], and initialises this world with the grown
    /// WORLD. The rank comes from the members (`n + arrival index`); `opts.rank` and
    /// `opts.world_size` must be `None` (`RANK`/`WORLD_SIZE` in the environment are ignored).
    /// The store is `opts.store` as given, or a client of `opts.init_method`'s (default
    /// `env://`), never a new server. `opts.timeout` (default as for `init_process_group`)
    /// bounds the whole join.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when this world is initialised already, or for a rank or
    /// world size given; the store's error when it cannot be reached; [`DistError::Store`]
    /// when no grow admits this process in time, naming the store key; the backend's error if
    /// the new group cannot be created.
    pub fn join_process_group(&self, opts: InitOptions) -> Result<()> {
        if self.lock().default_pg.is_some() {
            return Err(DistError::invalid(
                "join_process_group: the default process group is initialized already",
            ));
        }
        if opts.rank.is_some() || opts.world_size.is_some() {
            return Err(DistError::invalid(
                "join_process_group: rank and world_size come from the members; pass None",
            ));
        }
        let backend = config::normalize_backend_name(opts.backend.as_deref().unwrap_or("gloo"));
        let backend_config = BackendConfig::parse(&backend)?;
        let timeout = opts
            .timeout
            .unwrap_or_else(|| config::default_timeout_for(&backend));
        let deadline = Instant::now() + timeout;
        let (store, init_method) = crate::world::join_store(&opts, timeout)?;
        let store = root_store(&store);
        let (g, plan, rank) = admitted(store.as_ref(), deadline)?;
        let size = plan.old_size + plan.admitted;
        self.lock().group_count = plan.group_count;
        let (member, _) = self.create_group(
            NewPg {
                group_size: size,
                group_rank: Some(rank),
                global_ranks: Vec::new(),
                backend,
                config: backend_config,
                store: world_store(&store),
                group_name: plan.name.clone(),
                pg_options: opts.pg_options.clone(),
                timeout,
                pg_tag: None,
                device_id: opts.device_id,
                group_desc: "default:grown".to_string(),
            },
            BackendSource::Create,
        )?;
        self.set_default_group(member, size, init_method)?;
        self.lock().grow_generation = g + 1;
        crate::panic_hook::install(rank);
        Ok(())
    }

    /// Makes `new_pg` WORLD after a grow of generation `g`: forgets (and aborts) every other
    /// group, takes the plan's group counter.
    fn adopt_grown(&self, new_pg: &ProcessGroup, old_world: &ProcessGroup, plan: &Plan, g: u64) {
        // As after shrinking WORLD: the new group is WORLD, every other group goes.
        let old = self.forget_shrunk(new_pg, old_world, true);
        {
            let mut st = self.lock();
            st.group_count = plan.group_count;
            st.grow_generation = g + 1;
        }
        for pg in &old {
            stop_backends(pg, true);
        }
    }
}

/// A newcomer's admission: joins the current generation (the next one when it arrived past
/// the admitted count) until a plan admits it. Returns the generation, the plan and its rank.
fn admitted(store: &dyn Store, deadline: Instant) -> Result<(u64, Plan, usize)> {
    let mut g: u64 = if store.check(&[NEXT])? {
        String::from_utf8_lossy(&store.get(NEXT)?)
            .parse()
            .map_err(|_| DistError::invalid(format!("grow: the store holds a bad '{NEXT}'")))?
    } else {
        0
    };
    loop {
        let i = (store.add(&key(g, "joined"), 1)? - 1) as usize;
        let me = format!("pid {}", std::process::id());
        store.set(&key(g, &format!("joiner/{i}")), me.as_bytes())?;
        let v = wait_get(store, &key(g, "plan"), deadline, "the members' grow_group")?;
        let plan = Plan::decode(&v)?;
        if i < plan.admitted {
            return Ok((g, plan.clone(), plan.old_size + i));
        }
        g += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip() {
        let p = Plan {
            old_size: 3,
            admitted: 1,
            name: "abc def".into(),
            group_count: 7,
        };
        assert_eq!(Plan::decode(&p.encode()).unwrap(), p);
        assert!(Plan::decode(b"x y").is_err());
    }

    #[test]
    fn a_newcomer_past_the_admitted_count_waits_for_the_next_grow() {
        let store: Arc<dyn Store> = Arc::new(c10d_store::HashStore::new());
        let plan = Plan {
            old_size: 2,
            admitted: 1,
            name: "g0".into(),
            group_count: 1,
        };
        store.add(&key(0, "joined"), 1).unwrap();
        store.set(&key(0, "plan"), &plan.encode()).unwrap();
        let s2 = store.clone();
        let late = std::thread::spawn(move || {
            admitted(s2.as_ref(), Instant::now() + Duration::from_secs(10))
        });
        // The late one moves to generation 1 and waits there.
        let k = key(1, "joiner/0");
        store
            .wait_timeout(&[k.as_str()], Duration::from_secs(10))
            .unwrap();
        let next = Plan {
            old_size: 3,
            admitted: 1,
            name: "g1".into(),
            group_count: 2,
        };
        store.set(&key(1, "plan"), &next.encode()).unwrap();
        let (g, p, rank) = late.join().unwrap().unwrap();
        assert_eq!((g, p.name.as_str(), rank), (1, "g1", 3));
    }

    #[test]
    fn no_grow_in_time_is_a_timeout_naming_the_key() {
        let store = c10d_store::HashStore::new();
        let e = admitted(&store, Instant::now() + Duration::from_millis(100)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("c10d_grow/0/plan"), "{text}");
        assert!(text.contains("grow_group"), "{text}");
    }
}
