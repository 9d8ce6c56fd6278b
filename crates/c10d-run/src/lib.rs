//! # c10d-run
//!
//! The `c10drun` launcher (`torch.distributed.run` / torchrun's counterpart): it starts the
//! workers of a job on each node with the environment torchrun gives them (`RANK`,
//! `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_*` …), hosts or joins
//! the rendezvous store (a PyTorch-compatible TCPStore from `c10d-store`), restarts failed
//! attempts and reports how each worker ended. Install it with `cargo install c10d-run`; see
//! `c10drun --help`.
//!
//! The library holds the whole launcher ([`launch`](fn@launch) runs it from a parsed command
//! line, [`Args`]; the `c10drun` binary is only that call) and what other process launchers of
//! the workspace share ([`die_with_parent`](fn@die_with_parent)).
//!
//! Inside, the arrows go one way, from the job down to the pieces it uses:
//!
//! - `launch`: the static job (hosting the store, attempts, restarts);
//!   `elastic_job` runs the elastic one (`--nnodes MIN:MAX`, rounds of `elastic`'s rendezvous).
//! - `finish`: the exit barrier and the end of a failed job; `summary`: the failure summary.
//! - `attempt`: one attempt of the local workers (start, supervise, stop), with its context
//!   (`Ctx`) and why it stopped (`StopReason`); `worker`: one worker process; `log_dir`: where
//!   their logs go; `output`: their lines on the console (and c10drun's own messages);
//!   `report`: how a worker ended.
//! - `agent`: the agents' store client, rendezvous and failure watch; `worker_store`: the
//!   workers' store of each restart; `cli`: the command line and its checked `Config`;
//!   `signals`, `host`: the process's signals and the machine's names.

mod agent;
mod attempt;
mod cli;
pub mod die_with_parent;
mod elastic;
mod elastic_job;
mod finish;
mod host;
mod launch;
mod log_dir;
mod output;
mod report;
mod signals;
mod summary;
mod worker;
mod worker_store;

pub use cli::Args;
pub use die_with_parent::die_with_parent;
pub use launch::launch;
