//! The flight recorder (PyTorch's `FlightRecorder`, `torch/csrc/distributed/c10d/FlightRecorder.hpp`):
//! the last N collectives and point-to-point ops of every group and backend of the process, written to a file when an op times out or fails, when the program asks
//! ([`FlightRecorder::dump_to_file`]) or on a signal, so that a hang can be explained after
//! the fact (`c10d-fr-trace` in c10d-world, or PyTorch's own analyzer).
//!
//! # What is recorded
//!
//! For each op a backend submits ([`GroupRecorder::record`]): the group's name and
//! description, PyTorch's sequence numbers (`collective_seq_id`, `p2p_seq_id`, `op_id`, all
//! 1-based, per group), the profiling name (`"gloo:all_reduce"`, `"gloo:send 0->1"`,
//! `"gloo:recv 1<-0"`, `"gloo:recv 1<-?"` for any source; ranks within the group), the input
//! and output shapes and dtypes, the timeout, the submitting thread, and timestamps (ns since
//! the Unix epoch) as the op moves from *scheduled* to *started* to *completed*
//! ([`Trace::started`], [`Trace::finished`]). A failed op keeps its state (scheduled or
//! started), is *retired*, and carries its error.
//!
//! # How recording stays cheap
//!
//! Each thread that records owns a ring of N slots (`rings`, `ring`); an op fills the next
//! slot of its own thread's ring, 128 bytes (two cache lines) written under a sequence lock
//! with plain stores (`slot`): no lock, no atomic read-modify-write, no allocation unless an
//! op's shapes need more than seven words (one in-place tensor of up to five dimensions fits;
//! lists of outputs do not) or it fails. The start and end are one word each, written into
//! the slot by whichever thread runs or completes the op, tagged with the slot's lap so that
//! an op that outlives a lap of its ring cannot mark the entry that replaced it (at worst, when
//! it ends at the very instant its old slot is rewritten, it erases that entry's mark). Timestamps
//! are whole milliseconds of the coarse monotonic clock (the kernel's tick, 1–4 ms; `clock`):
//! a fine clock read costs more than the rest of the recording. A dump merges the rings by
//! creation time and keeps the newest N. The `flight_recorder` benchmark of c10d-gloo
//! measures it on a 1 KiB all-reduce: about 21–26 ns per op (record 13–16, start 3–5, finish
//! 4–7). c10d-gloo hides it on the fast path (the op's entry is written while it waits for a
//! peer's data, see below), so recording costs no measurable time on a 1.2 µs shared-memory
//! all-reduce between two processes, nor on the socket path.
//!
//! # Environment (read once, when the first group registers)
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `TORCH_FR_BUFFER_SIZE` (older: `TORCH_NCCL_TRACE_BUFFER_SIZE`) | entries kept; ≤ 0 disables recording | 2000 |
//! | `TORCH_FR_DUMP_TEMP_FILE` (older: `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`) | dump file prefix; the file is `<prefix><global rank>` | `$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`, else `$HOME/.cache/torch/comm_lib_trace_rank_` |
//! | `TORCH_FR_DUMP_ON_TIMEOUT` (older: `TORCH_NCCL_DUMP_ON_TIMEOUT`) | dump when an op times out or fails | true |
//! | `C10D_FR_DUMP_SIGNAL` (ours) | dump each time this signal arrives (`SIGUSR1`, `USR2`, a number) | unset: no handler |
//!
//! When both names of a pair are set the first wins, as in PyTorch. An invalid value fails
//! group creation with PyTorch's text "Invalid value for environment variable: NAME".
//!
//! # Dump format
//!
//! A pickle (protocol 2) of PyTorch's dictionary, version `"2.10"` as PyTorch 2.15 writes it
//! ([`Dump`]): `version`, `comm_lib_version` (empty), `pg_config` (group name → `name`, `desc`,
//! `ranks` as the text `"[0, 1]"` of global ranks), `pg_status` (`pg_id` → last enqueued,
//! started and completed collective), and `entries` with PyTorch's keys: `record_id`, `pg_id`,
//! `process_group` (a `(name, desc)` tuple), `thread_name`, `thread_id`, `collective_seq_id`,
//! `p2p_seq_id`, `op_id`, `profiling_name`, `time_created_ns`, `duration_ms` (completed ops),
//! `input_sizes`, `input_dtypes`, `output_sizes`, `output_dtypes` (PyTorch's dtype names,
//! `"Float"`), `state`, `time_discovered_started_ns`, `time_discovered_completed_ns`,
//! `retired`, `timeout_ms`, `is_p2p`. PyTorch's `python -m
//! torch.distributed.flight_recorder.fr_trace` reads these files.
//!
//! # Differences from PyTorch, on purpose
//!
//! - One recorder per process for every backend (PyTorch keeps one per event type and per
//!   hooked backend); entries of all groups share it and `pg_id` tells them apart.
//! - One ring per recording thread, merged when dumped (PyTorch keeps one ring under a mutex).
//!   The dump holds the newest N entries of the process as PyTorch's does, and `record_id` is
//!   still the entry's index among all ops the process recorded; entries that threads recorded
//!   within one clock tick are ordered by thread, not by the instant they were recorded.
//! - Times are whole milliseconds of the monotonic clock, shifted to the Unix epoch when the
//!   dump is written (a wall-clock step between an op and the dump shifts its times).
//! - A group is forgotten once it was shut down, aborted or dropped and the ring holds none of
//!   its entries (PyTorch keeps every group's `pg_config` for the life of the process).
//! - Entries carry an extra `error` key (the failure's message); PyTorch's analyzer ignores it.
//! - No `frames` (call stacks): capturing a Python or Rust backtrace per op would cost far more
//!   than the op itself on small messages. `TORCH_FR_CPP_STACK` and
//!   `TORCH_INCLUDE_STACK_TRACE` are not read.
//! - Timestamps are taken when the backend runs the op (no CUDA events), from the coarse clock
//!   (see above), and `duration_ms` is the host time from start to completion at that
//!   resolution (0 for most small ops). An op that outlives a whole lap of its thread's ring
//!   and then ends at the very instant its old slot is rewritten may leave the new entry
//!   without its start or end mark (it is never given the old op's); PyTorch's gloo records no start or completion at all
//!   (its entries stay "scheduled").
//! - c10d-gloo records a blocking collective that the caller's thread runs at once when the op
//!   first waits for a peer (or ends, if it never waits), after its local preparation (a
//!   list of tensors is packed first) and, over sockets, after its sends were posted: the
//!   entry is then written while a peer's data travels, at no cost to the op. It keeps its
//!   submission time ([`GroupRecorder::record_at`]); its start time is its first wait's. A
//!   failure of the group noticed on that thread in between (another op of the group
//!   failing in that moment) writes its dump once the op is recorded
//!   ([`hold_failure_dumps`]), so the failed op's waiters may see its error just before the
//!   file exists. A dump requested from outside in that moment (a signal, the program) may
//!   not show the op yet.
//! - Sends and receives are recorded with their peers (PyTorch's gloo does not record them);
//!   `monitored_barrier` is recorded as `"barrier"`, `all_to_all_single` as `"all_to_all"`.
//! - The dump is written at the first failure of a run of failures of a group (not for every
//!   op failed by the same fault), never for ops failed by an orderly shutdown or abort, and
//!   on the signal of `C10D_FR_DUMP_SIGNAL` (PyTorch has no signal trigger; it offers a named
//!   pipe, `TORCH_NCCL_DEBUG_INFO_PIPE_FILE`, which is not supported). Only the pickle format
//!   is written (no JSON dump), and the writer cannot be replaced, only its prefix
//!   ([`FlightRecorder::set_dump_prefix`]).

mod clock;
mod config;
mod dump;
mod entry;
mod group;
mod hold;
mod ring;
mod rings;
mod shapes;
mod signal;
mod slot;

pub use config::{
    default_dump_prefix, FrConfig, BUFFER_SIZE_ENV, DEFAULT_BUFFER_SIZE, DUMP_FILE_ENV,
    DUMP_ON_TIMEOUT_ENV, DUMP_SIGNAL_ENV,
};
pub use dump::{Dump, DumpEntry, PgConfig, PgStatus, DUMP_VERSION};
pub use group::{GroupRecorder, OpRecord, Stamp, Trace};
pub use hold::{hold_failure_dumps, DumpHold};

use crate::error::{DistError, Result};
use entry::{Entry, GroupInfo};
use group::{GroupCore, GroupStatus};
use rings::RingSet;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Groups known to the recorder (`pg_config`, `pg_status`).
#[derive(Debug, Default)]
struct Groups {
    next_pg_id: u64,
    config: BTreeMap<String, PgConfig>,
    status: BTreeMap<u64, &'static GroupStatus>,
    info: BTreeMap<u64, Arc<GroupInfo>>,
    /// Groups not shut down, aborted or dropped yet: `pg_id` → this process's global rank.
    live: BTreeMap<u64, usize>,
}

impl Groups {
    /// Forgets the groups that are no longer live and have no entry left among `in_ring`
    /// (the `pg_id`s of the ring's entries); a name's `pg_config` goes with its last group.
    fn prune(&mut self, in_ring: &BTreeSet<u64>) {
        let gone: Vec<u64> = (self.info.keys())
            .filter(|id| !self.live.contains_key(id) && !in_ring.contains(id))
            .copied()
            .collect();
        for id in gone {
            self.status.remove(&id);
            if let Some(info) = self.info.remove(&id) {
                if !self.info.values().any(|i| i.name == info.name) {
                    self.config.remove(&info.name);
                }
            }
        }
    }
}

/// The recorded ops of this process (mirrors `c10d::FlightRecorder`). Backends
/// register each group ([`FlightRecorder::register_group`]) and record through the returned
/// [`GroupRecorder`]; [`FlightRecorder::global`] is the one every backend uses.
#[derive(Debug)]
pub struct FlightRecorder {
    config: FrConfig,
    enabled: AtomicBool,
    /// One ring per recording thread.
    rings: Arc<RingSet>,
    groups: Mutex<Groups>,
    /// This process's global rank (names the dump file): that of the oldest live group (the
    /// WORLD group, registered first); kept when the last group goes; -1 until one registered.
    rank: AtomicI64,
    dump_prefix: Mutex<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static GLOBAL: OnceLock<std::result::Result<Arc<FlightRecorder>, DistError>> = OnceLock::new();

impl FlightRecorder {
    /// A recorder with the given settings (recording is on when `buffer_size > 0`). Does not
    /// install the signal handler of `config.dump_signal` (see [`FlightRecorder::global`]).
    pub fn new(config: FrConfig) -> Arc<FlightRecorder> {
        Arc::new(FlightRecorder {
            enabled: AtomicBool::new(config.buffer_size > 0),
            rings: RingSet::new(config.buffer_size),
            groups: Mutex::default(),
            rank: AtomicI64::new(-1),
            dump_prefix: Mutex::new(config.dump_prefix.clone()),
            config,
        })
    }

    /// The process's recorder, made from the environment at the first call (see the module
    /// documentation), with the signal handler of `C10D_FR_DUMP_SIGNAL` installed. Every
    /// backend records into it. Mirrors `FlightRecorder::get()`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] "Invalid value for environment variable: NAME" when a
    /// variable has an invalid value, or when the signal handler cannot be installed; the same
    /// error at every call.
    pub fn global() -> Result<&'static Arc<FlightRecorder>> {
        GLOBAL
            .get_or_init(|| {
                let config = FrConfig::from_env()?;
                let signal = config.dump_signal;
                let fr = FlightRecorder::new(config);
                if let Some(s) = signal {
                    signal::install(fr.clone(), s)?;
                }
                Ok(fr)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Installs a handler that writes this recorder's dump each time `signal` arrives (on a
    /// thread of its own; the program's other signal handling is untouched). No PyTorch
    /// counterpart.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for a signal that cannot be handled (`SIGKILL`,
    /// `SIGSEGV` ...).
    pub fn install_dump_signal(self: &Arc<Self>, signal: i32) -> Result<()> {
        signal::install(self.clone(), signal)
    }

    /// The settings the recorder was made with.
    pub fn config(&self) -> &FrConfig {
        &self.config
    }

    /// Whether ops are being recorded.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Pauses (`false`) or resumes recording; a no-op on a recorder of size 0. No PyTorch
    /// counterpart (PyTorch reads the size once); used by the benchmark to compare both in
    /// one run.
    pub fn set_enabled(&self, on: bool) {
        self.enabled
            .store(on && self.config.buffer_size > 0, Ordering::Relaxed);
    }

    /// Whether a failing op writes the dump (`TORCH_FR_DUMP_ON_TIMEOUT`).
    pub fn dump_on_failure(&self) -> bool {
        self.config.dump_on_failure
    }

    /// Registers a group (mirrors `record_pg_ranks`) and returns its recording handle.
    /// `backend` names the backend in profiling names (`"gloo"`), `global_ranks` are the
    /// group's members (empty: `0..size`), `group_rank` this process's rank in the group.
    ///
    /// The dump file is named after this process's global rank, as in PyTorch: the one the
    /// oldest live group maps its `group_rank` to (the WORLD group's, since it is created
    /// first), not the latest group's. A group stays registered until its handle is shut down
    /// ([`GroupRecorder::set_shutting_down`], called by a backend's shutdown and abort) or
    /// dropped; its `pg_config`/`pg_status` and its entries stay in dumps until the ring has
    /// overwritten its last entry (or [`FlightRecorder::reset`]). PyTorch never forgets a
    /// group.
    pub fn register_group(
        self: &Arc<Self>,
        backend: &'static str,
        name: &str,
        desc: &str,
        global_ranks: &[usize],
        group_rank: usize,
        size: usize,
    ) -> Arc<GroupRecorder> {
        let ranks: Vec<usize> = if global_ranks.is_empty() {
            (0..size).collect()
        } else {
            global_ranks.to_vec()
        };
        let global = ranks.get(group_rank).copied().unwrap_or(group_rank);
        let core = GroupCore::leak(self);
        let in_ring = self.pg_ids_in_ring();
        let mut g = lock(&self.groups);
        g.prune(&in_ring);
        let pg_id = g.next_pg_id;
        g.next_pg_id += 1;
        g.live.insert(pg_id, global);
        self.store_rank(&g);
        let ranks_text: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
        g.config.insert(
            name.to_string(),
            PgConfig {
                name: name.to_string(),
                desc: desc.to_string(),
                ranks: format!("[{}]", ranks_text.join(", ")),
            },
        );
        g.status.insert(pg_id, &core.status);
        let info = Arc::new(GroupInfo {
            pg_id,
            name: name.to_string(),
            desc: desc.to_string(),
            backend,
            group_rank,
        });
        g.info.insert(pg_id, info.clone());
        drop(g);
        Arc::new(GroupRecorder::new(self.clone(), info, core))
    }

    /// Ends the registration of group `pg_id` (shut down, aborted or dropped): it no longer
    /// names the dump file, and it is forgotten once the ring holds none of its entries.
    pub(crate) fn unregister_group(&self, pg_id: u64) {
        let in_ring = self.pg_ids_in_ring();
        let mut g = lock(&self.groups);
        if g.live.remove(&pg_id).is_some() {
            self.store_rank(&g);
        }
        g.prune(&in_ring);
    }

    /// Sets the dump file's rank from the oldest live group, if any.
    fn store_rank(&self, g: &Groups) {
        if let Some((_, &rank)) = g.live.first_key_value() {
            self.rank.store(rank as i64, Ordering::Relaxed);
        }
    }

    /// The `pg_id`s of the entries the rings hold.
    fn pg_ids_in_ring(&self) -> BTreeSet<u64> {
        self.rings.rings().iter().flat_map(|r| r.pg_ids()).collect()
    }

    /// The last `buffer_size` entries of all rings (see [`merge`]).
    fn entries(&self) -> Vec<Entry> {
        let snaps = self.rings.rings().iter().map(|r| r.snapshot()).collect();
        merge(snaps, self.config.buffer_size)
    }

    /// This process's global rank as the registered groups tell it (the oldest live group's;
    /// `None` before any registered).
    pub fn rank(&self) -> Option<usize> {
        usize::try_from(self.rank.load(Ordering::Relaxed)).ok()
    }

    /// Everything recorded so far (mirrors `_dump_fr_trace`'s dictionary).
    pub fn dump(&self) -> Dump {
        let entries = self.entries();
        let offset = clock::Offset::now();
        let g = lock(&self.groups);
        let pg_status = g
            .status
            .iter()
            .map(|(id, s)| {
                let v = PgStatus {
                    last_enqueued_collective: s.last_enqueued.load(Ordering::Relaxed),
                    last_started_collective: s.last_started.load(Ordering::Relaxed),
                    last_completed_collective: s.last_completed.load(Ordering::Relaxed),
                };
                (id.to_string(), v)
            })
            .collect();
        Dump {
            version: DUMP_VERSION.to_string(),
            comm_lib_version: String::new(),
            pg_config: g.config.clone(),
            pg_status,
            entries: entries
                .iter()
                .filter_map(|e| {
                    let info = g.info.get(&(e.head.pg_id as u64))?;
                    Some(DumpEntry::from_entry(e, info, offset))
                })
                .collect(),
        }
    }

    /// Forgets every recorded op, and the groups no longer registered (live groups stay).
    /// Mirrors `_reset_fr_trace`.
    pub fn reset(&self) {
        self.rings.rings().iter().for_each(|r| r.forget());
        lock(&self.groups).prune(&BTreeSet::new());
    }

    /// The prefix of dump files (`TORCH_FR_DUMP_TEMP_FILE`).
    pub fn dump_prefix(&self) -> String {
        lock(&self.dump_prefix).clone()
    }

    /// Changes the prefix of dump files (PyTorch lets a program register its own
    /// `DebugInfoWriter` instead).
    pub fn set_dump_prefix(&self, prefix: impl Into<String>) {
        *lock(&self.dump_prefix) = prefix.into();
    }

    /// Writes the dump to `<prefix><global rank>` and returns that path. Mirrors
    /// `_dump_fr_trace_file` / `ProcessGroupNCCL::dumpDebuggingInfo`.
    ///
    /// # Errors
    /// [`DistError::Dist`] when no group registered yet (the rank, hence the file name, is
    /// unknown) or the file cannot be written (naming the path).
    pub fn dump_to_file(&self) -> Result<PathBuf> {
        let rank = self.rank().ok_or_else(|| {
            DistError::dist(
                "flight recorder: no process group was created yet, so this process's rank \
                 (which names the dump file) is unknown",
            )
        })?;
        let path = PathBuf::from(format!("{}{rank}", self.dump_prefix()));
        self.dump().write(&path)?;
        Ok(path)
    }
}

/// The last `n` entries of the rings' snapshots, oldest first, numbered by `record_id`: the
/// entry's index among all ops the process recorded (as PyTorch numbers them). Entries of
/// different threads are ordered by creation time, then by ring. Entries older than a
/// truncated ring's first are left out: that ring's own entries of that time are gone, so what
/// is kept is every op since the cut, and numbered exactly.
fn merge(snaps: Vec<ring::Snapshot>, n: usize) -> Vec<Entry> {
    let total: u64 = snaps.iter().map(|s| s.count).sum();
    let key = |i: usize, e: &Entry| (e.head.created_ms, i, e.local_id);
    let cut = (snaps.iter().enumerate())
        .filter(|(_, s)| s.truncated)
        .filter_map(|(i, s)| s.entries.first().map(|e| key(i, e)))
        .max();
    let mut all: Vec<(usize, Entry)> = (snaps.into_iter().enumerate())
        .flat_map(|(i, s)| s.entries.into_iter().map(move |e| (i, e)))
        .filter(|(i, e)| cut.is_none_or(|c| key(*i, e) >= c))
        .collect();
    all.sort_by_key(|(i, e)| key(*i, e));
    let kept = all.split_off(all.len().saturating_sub(n));
    let first = total - kept.len() as u64;
    (kept.into_iter().zip(first..))
        .map(|((_, e), record_id)| Entry { record_id, ..e })
        .collect()
}

#[cfg(test)]
mod tests;
