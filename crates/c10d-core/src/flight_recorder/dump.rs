//! The dump: PyTorch's flight-recorder dictionary (version "2.10"), pickled.

use super::clock::{epoch_ns_of, Offset};
use super::entry::{thread_info, Entry, GroupInfo};
use super::shapes;
use crate::error::{DistError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `version` PyTorch 2.15 writes (and its analyzer expects all ranks to share).
pub const DUMP_VERSION: &str = "2.10";

/// A whole dump, PyTorch's dictionary: `version`, `comm_lib_version`, `pg_config`, `pg_status`,
/// `entries`. Reads PyTorch's own dumps too (unknown keys such as `frames` or
/// `nccl_comm_state` are ignored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dump {
    /// Format version, [`DUMP_VERSION`] in ours.
    pub version: String,
    /// The communication library's version (empty for gloo, as in PyTorch).
    #[serde(default)]
    pub comm_lib_version: String,
    /// Group name → its name, description and global ranks.
    #[serde(default)]
    pub pg_config: BTreeMap<String, PgConfig>,
    /// `pg_id` (as a string) → the group's last enqueued / started / completed collective.
    #[serde(default)]
    pub pg_status: BTreeMap<String, PgStatus>,
    /// The recorded ops, oldest first.
    #[serde(default)]
    pub entries: Vec<DumpEntry>,
}

/// One group of `pg_config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgConfig {
    /// Group name (`"0"` for the default group).
    pub name: String,
    /// Group description (`"default_pg"`, `"undefined"` ...).
    pub desc: String,
    /// The group's global ranks as PyTorch writes them: the text `"[0, 1, 2]"`.
    pub ranks: String,
}

impl PgConfig {
    /// The global ranks parsed from [`PgConfig::ranks`] (`None` when it is not a list of
    /// integers).
    pub fn rank_list(&self) -> Option<Vec<usize>> {
        let inner = self.ranks.trim().strip_prefix('[')?.strip_suffix(']')?;
        if inner.trim().is_empty() {
            return Some(Vec::new());
        }
        inner.split(',').map(|r| r.trim().parse().ok()).collect()
    }
}

/// One group of `pg_status` (PyTorch's `ProcessGroupStatus`; -1 = none yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgStatus {
    /// Collective sequence id of the last collective submitted.
    pub last_enqueued_collective: i64,
    /// … of the last one that started.
    pub last_started_collective: i64,
    /// … of the last one that completed.
    pub last_completed_collective: i64,
}

/// One recorded op, with PyTorch's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DumpEntry {
    /// Index of the entry in this process's recording (0-based, increasing).
    pub record_id: u64,
    /// The group's id in this process.
    pub pg_id: u64,
    /// `(group name, group description)`, a tuple in the pickle.
    pub process_group: (String, String),
    /// Name of the thread that submitted the op.
    #[serde(default)]
    pub thread_name: String,
    /// Id of that thread.
    #[serde(default)]
    pub thread_id: String,
    /// Collective sequence id (1-based; for send/recv: collectives so far).
    pub collective_seq_id: u64,
    /// Point-to-point sequence id (1-based; for collectives: sends/receives so far).
    pub p2p_seq_id: u64,
    /// Op index in the group (1-based).
    pub op_id: u64,
    /// `"gloo:all_reduce"`, `"gloo:send 0->1"`, `"gloo:recv 1<-?"` ...
    pub profiling_name: String,
    /// When the op was submitted, ns since the Unix epoch.
    pub time_created_ns: u64,
    /// Milliseconds from start to completion (completed ops only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Shape of each input tensor.
    pub input_sizes: Vec<Vec<i64>>,
    /// PyTorch dtype name of each input tensor (`"Float"` ...).
    pub input_dtypes: Vec<String>,
    /// Shape of each output tensor.
    pub output_sizes: Vec<Vec<i64>>,
    /// PyTorch dtype name of each output tensor.
    pub output_dtypes: Vec<String>,
    /// `"scheduled"`, `"started"` or `"completed"`.
    pub state: String,
    /// When the op started, ns since the epoch (`None` before).
    pub time_discovered_started_ns: Option<u64>,
    /// When the op completed, ns since the epoch (`None` before, and for failed ops).
    pub time_discovered_completed_ns: Option<u64>,
    /// The op ended (completed or failed). Retired but not completed = it failed/timed out.
    pub retired: bool,
    /// The op's timeout in milliseconds.
    pub timeout_ms: u64,
    /// A send or receive.
    pub is_p2p: bool,
    /// c10d-rs extension: the error the op failed with (absent in PyTorch's dumps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl DumpEntry {
    pub(crate) fn from_entry(e: &Entry, g: &GroupInfo, offset: Offset) -> DumpEntry {
        let ns = |ms: u64| epoch_ns_of(ms, offset);
        let (started, completed) = (e.started_ms.map(ns), e.completed_ms.map(ns));
        let state = match (started, completed) {
            (_, Some(_)) => "completed",
            (Some(_), None) => "started",
            (None, None) => "scheduled",
        };
        let ((input_sizes, input_dtypes), (output_sizes, output_dtypes)) =
            shapes::decode(&e.shapes);
        let h = &e.head;
        let (thread_name, thread_id) = thread_info(h.thread);
        DumpEntry {
            record_id: e.record_id,
            pg_id: h.pg_id as u64,
            process_group: (g.name.clone(), g.desc.clone()),
            thread_name,
            thread_id,
            collective_seq_id: h.collective_seq_id,
            p2p_seq_id: h.p2p_seq_id as u64,
            op_id: h.op_id,
            profiling_name: h.profiling_name(g),
            time_created_ns: ns(h.created_ms),
            duration_ms: started
                .zip(completed)
                .map(|(s, c)| c.saturating_sub(s) as f64 / 1e6),
            input_sizes,
            input_dtypes,
            output_sizes,
            output_dtypes,
            state: state.to_string(),
            time_discovered_started_ns: started,
            time_discovered_completed_ns: completed,
            retired: e.retired,
            timeout_ms: h.timeout_ms as u64,
            is_p2p: h.is_p2p(),
            error: e.error.clone(),
        }
    }

    /// The op part of the profiling name (`"all_reduce"`, `"send"` ...).
    pub fn op_name(&self) -> &str {
        let name = self.profiling_name.rsplit(':').next().unwrap_or("");
        name.split(' ').next().unwrap_or("")
    }
}

impl Dump {
    /// The pickle PyTorch writes (protocol 2, readable with Python's `pickle.load`).
    ///
    /// # Errors
    /// [`DistError::Dist`] if serialization fails (it does not for dumps the recorder made).
    pub fn to_pickle(&self) -> Result<Vec<u8>> {
        serde_pickle::to_vec(self, serde_pickle::SerOptions::new().proto_v2())
            .map_err(|e| DistError::dist(format!("flight recorder: cannot pickle the dump: {e}")))
    }

    /// Parses a pickled dump, ours or PyTorch's.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming what is wrong when `bytes` is not a pickled
    /// flight-recorder dictionary.
    pub fn from_pickle(bytes: &[u8]) -> Result<Dump> {
        serde_pickle::from_slice(
            bytes,
            serde_pickle::DeOptions::new().replace_unresolved_globals(),
        )
        .map_err(|e| DistError::invalid(format!("not a flight-recorder dump: {e}")))
    }

    /// Reads and parses the dump file at `path`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] naming the file when it cannot be read or parsed.
    pub fn read(path: &Path) -> Result<Dump> {
        let bytes = std::fs::read(path)
            .map_err(|e| DistError::invalid(format!("cannot read dump {}: {e}", path.display())))?;
        Self::from_pickle(&bytes).map_err(|e| e.with_prefix(&format!("{}: ", path.display())))
    }

    /// Writes the pickle to `path` (through a temporary file and a rename, so a reader never
    /// sees half a dump), creating the parent directory.
    ///
    /// # Errors
    /// [`DistError::Dist`] naming the path when the directory or file cannot be written.
    pub fn write(&self, path: &Path) -> Result<()> {
        let bytes = self.to_pickle()?;
        let fail = |e: std::io::Error| {
            DistError::dist(format!(
                "flight recorder: cannot write {}: {e}",
                path.display()
            ))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        // One temporary file per write: two threads of this process dumping at once (a failure
        // and the signal handler) must not write into the same one.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let mut tmp = path.as_os_str().to_owned();
        let n = WRITES.fetch_add(1, Ordering::Relaxed);
        tmp.push(format!(".tmp{}.{n}", std::process::id()));
        let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp); // best effort: the error below is what matters
        }
        written.map_err(fail)
    }
}
