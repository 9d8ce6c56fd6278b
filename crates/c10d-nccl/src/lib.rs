//! c10d-nccl: the NCCL (CUDA) backend of c10d-rs, PyTorch's `ProcessGroupNCCL` in Rust.
//!
//! NCCL and the CUDA driver are both loaded at run time, so this crate builds, and its tests
//! pass, on a machine with no CUDA toolkit, no driver, no NCCL and no GPU.
//!
//! # What exists
//! Layers in cudarc's style, over our own loader (cudarc's NCCL loader never tries
//! `libnccl.so.2`, and its safe layer has no split, abort, config or async-error query):
//! - [`sys`]: the raw NCCL ABI (result, data type and reduction codes, `ncclUniqueId`,
//!   `ncclComm_t`, the 2.27 `ncclConfig_t` layout, function signatures);
//! - [`library`]: the function table of one opened `libnccl`: core functions resolved at load,
//!   newer ones (`ncclCommInitRankConfig` 2.14, `ncclCommFinalize` 2.14, `ncclCommSplit` 2.18,
//!   `ncclCommShrink` 2.27) looked up on first use with an error naming the function, the
//!   version it needs and the version loaded;
//! - [`result`]: checked calls turning `ncclResult_t` into errors with NCCL's own text;
//! - [`loader`]: where the library is found (`C10D_NCCL_LIBRARY`, the system's `libnccl.so.2`,
//!   the `nvidia-nccl-cu12/cu13` wheel of a PyTorch installation), once per process, with an
//!   error listing every place tried; [`python`] finds those installations' site-packages;
//! - [`version`]: NCCL version codes;
//! - [`mapping`]: c10d dtypes and reductions to NCCL's, with PyTorch's refusals (BAND/BOR/BXOR …);
//! - [`cuda`]: GPU count through cudarc's driver API, never panicking without a driver;
//! - [`env`](mod@env): PyTorch's `TORCH_NCCL_*` variables with PyTorch's parsing rules;
//! - [`options`]: `ProcessGroupNCCL.Options` and `NCCLConfig`;
//! - [`watchdog`]: the watchdog's bookkeeping (timeouts, async errors, what each
//!   `TORCH_NCCL_ASYNC_ERROR_HANDLING` mode does), as pure logic over an injected clock;
//! - [`availability`]: [`is_nccl_available`], [`nccl_version`], [`check_available`] and the
//!   error creating an NCCL group gives in this build.
//!
//! # What awaits a session with a GPU
//! The communicator type (init through the store-exchanged unique id, lazy or eager, split with
//! the no-colour split, shrink, abort, destroy), CUDA streams and events per device, device
//! tensors, every collective on device memory, the watchdog thread driving [`watchdog`], the
//! `Backend` implementation registered in c10d-world (today creating an `"nccl"` group fails
//! with a clear error, see [`backend_creation_error`]), and `cargo xtask test-multigpu`.
#![warn(missing_docs)]

pub mod availability;
mod collectives;
pub mod comm;
pub mod cuda;
pub mod device;
pub mod env;
mod events;
mod inflight;
pub mod library;
pub mod loader;
pub mod mapping;
pub mod memory;
pub mod options;
pub mod process_group;
pub mod python;
pub mod result;
pub mod stream;
pub mod sys;
pub mod version;
pub mod watchdog;
mod watchdog_thread;

pub use availability::{check_available, is_nccl_available, nccl_version, NcclAvailability};
pub use cuda::cuda_device_count;
pub use env::{ErrorHandlingMode, NcclEnv};
pub use library::NcclLibrary;
pub use loader::{library as nccl_library, LoadError};
pub use options::{NcclConfig, NcclOptions};
pub use process_group::ProcessGroupNccl;
pub use result::NcclError;
pub use version::Version;
pub use watchdog::{Watchdog, WorkProbe, WorkRecord};
