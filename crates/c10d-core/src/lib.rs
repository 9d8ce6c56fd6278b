//! # c10d-core
//!
//! The vocabulary every c10d-rs crate speaks, mirroring PyTorch's `c10d` core:
//!
//! - [`DType`], [`Device`], [`Tensor`] (zero-copy from `Vec<T>`, leased while a collective owns it),
//!   [`DeviceStorage`] for accelerator memory without linking CUDA; [`borrowed`] tensors over
//!   slices the caller owns, checked by the borrow checker;
//! - [`ReduceOp`] with PyTorch's ids and the reduction kernels ([`reduce`]);
//! - the options structs ([`options`]), [`Work`], [`Op`] (one call as a value), [`Collectives`]
//!   (the one entry point that runs an op, and PyTorch's call forms on it), the [`Backend`]
//!   trait and [`ProcessGroup`];
//! - the argument checks every backend shares, with PyTorch's texts ([`checks`]), and
//!   [`staging::Staged`], which lets a CPU backend take device tensors through host copies;
//! - [`DistError`] with PyTorch's exception kinds, and [`DebugLevel`];
//! - the [`flight_recorder`] every backend records its ops into (PyTorch's `FlightRecorder`).
//!
//! This crate knows nothing of sockets or CUDA; the only files it touches are the flight
//! recorder's dumps.
//!
//! Where it sits in a collective: c10d-world checks a call's arguments and hands the tensors
//! to [`ProcessGroup`] (`process_group.rs`), which picks the [`Backend`] (`backend.rs`) of their
//! device type; the backend leases the tensors ([`TensorLeases`], `tensor/leases.rs`), runs the op and
//! completes a [`Work`] (`work.rs`) with the result or a [`DistError`] (`error.rs`); the
//! [`flight_recorder`] records it. See `docs/architecture.md` in the repository.

pub mod backend;
pub mod borrowed;
pub mod checks;
mod collectives;
pub mod debug;
pub mod device;
pub mod dtype;
pub mod error;
pub mod flight_recorder;
pub mod op;
mod op_type;
pub mod options;
pub mod process_group;
pub mod reduce;
pub mod staging;
pub mod tensor;
pub mod work;

pub use backend::Backend;
pub use borrowed::{BorrowScope, TensorView};
pub use collectives::Collectives;
pub use debug::DebugLevel;
pub use device::{Device, DeviceType};
pub use dtype::{c32, c64, DType, Element};
pub use error::{DistError, ErrorContext, ErrorKind, Result};
pub use flight_recorder::FlightRecorder;
pub use op::{Op, Side, TensorList};
pub use options::*;
pub use process_group::ProcessGroup;
pub use reduce::ReduceOp;
pub use tensor::{copy_through_host, DeviceStorage, Tensor, TensorLeases};
pub use work::{OpType, Work, WorkCompleter};

/// Re-export so `dispatch_dtype!` works in dependent crates.
pub use half;
