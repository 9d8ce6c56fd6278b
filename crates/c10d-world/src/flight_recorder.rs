//! The flight recorder from a program's side: every group's ops are recorded by the backend
//! into the process's [`FlightRecorder`] (see `c10d_core::flight_recorder` for what is kept,
//! the environment variables and the dump format); these functions get the record out.
//!
//! Dumps are also written without asking: when an op times out or fails
//! (`TORCH_FR_DUMP_ON_TIMEOUT`, on by default) and, with `C10D_FR_DUMP_SIGNAL=SIGUSR1`, each
//! time the process receives that signal (`kill -USR1 <pid>` on a hung rank). Read them with
//! `c10d-fr-trace <prefix>` (this crate's binary) or PyTorch's
//! `python -m torch.distributed.flight_recorder.fr_trace <dir>`.

use c10d_core::Result;
use std::path::PathBuf;

pub use c10d_core::flight_recorder::{
    Dump, DumpEntry, FlightRecorder, FrConfig, PgConfig, PgStatus, DUMP_VERSION,
};

/// Writes this process's dump to `<TORCH_FR_DUMP_TEMP_FILE><global rank>` and returns the path.
/// Mirrors `torch._C._distributed_c10d._dump_fr_trace_file`.
///
/// # Errors
/// `DistError::InvalidArgument` when a `TORCH_FR_*` variable is invalid; `DistError::Dist`
/// when no group was created yet (the rank naming the file is unknown) or the file cannot be
/// written (naming the path).
pub fn dump() -> Result<PathBuf> {
    FlightRecorder::global()?.dump_to_file()
}

/// The recorded ops and groups of this process (PyTorch's dump dictionary). Mirrors
/// `torch._C._distributed_c10d._dump_fr_trace` (which returns it pickled; see
/// [`Dump::to_pickle`]).
///
/// # Errors
/// `DistError::InvalidArgument` when a `TORCH_FR_*` variable is invalid.
pub fn trace() -> Result<Dump> {
    Ok(FlightRecorder::global()?.dump())
}

/// Makes every later delivery of `signal` (e.g. `libc::SIGUSR1`) write the dump, as
/// `C10D_FR_DUMP_SIGNAL` does. No PyTorch counterpart.
///
/// # Errors
/// `DistError::InvalidArgument` for a signal that cannot be handled (`SIGKILL` ...) or an
/// invalid `TORCH_FR_*` variable.
pub fn install_dump_signal(signal: i32) -> Result<()> {
    FlightRecorder::global()?.install_dump_signal(signal)
}
