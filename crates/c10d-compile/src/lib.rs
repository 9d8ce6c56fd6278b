//! # c10d-compile
//!
//! What PyTorch's compiler stack gets from `torch/_dynamo/distributed.py` and
//! `torch.distributed._functional_collectives`, for Rust frameworks that compile or autotune
//! kernels per rank (a JIT whose ranks must take the same decisions, or they deadlock on
//! mismatched collectives):
//!
//! - **Compile-side groups** ([`CompileGroups`], [`get_compile_pg`], [`get_guard_pg`],
//!   [`get_compile_sync_pg`]): all-rank groups tagged `"pt2_compile_pg"`, `"pt2_guard_pg"` and
//!   `"pt2_compile_sync_pg"` (the last always on gloo, with the default group's timeout),
//!   created lazily with c10d-world's tagged groups, cached, and only while enabled
//!   (`TORCH_COMPILER_COLLECTIVES=1` or [`config::set_enable_compiler_collectives`]; guard
//!   collectives with [`config::set_enable_guard_collectives`]).
//! - **Exchanges** on them ([`exchange`]): the compiler collective (merged automatic-dynamic
//!   [`FrameState`]s), the guard collective (any miss → all miss), and compile sync (SHA-256
//!   digests of artifacts; MIN of cache hits; object all-gather for other agreements).
//! - **Functional collectives** ([`Funcol`]): the `_c10d_functional` op set addressed by group
//!   name, handle, [`c10d_world::GroupMember`] or ranks + tag ([`GroupRef`]), returning
//!   [`AsyncCollectiveTensor`]s that wait on first access (and are `Future`s), with the
//!   process-wide work registry behind [`wait_tensor`] / [`wait_tensors`] ([`registry`]).
//!
//! ```no_run
//! use c10d_compile::{CompileGroups, FrameState, Funcol};
//! use c10d_core::Tensor;
//! use c10d_world::{self as dist, World};
//! # fn main() -> c10d_core::Result<()> {
//! dist::init_process_group(dist::InitOptions { backend: Some("gloo".into()), ..Default::default() })?;
//! let rank = dist::get_rank(None)?;
//!
//! // Functional collectives by group name ("0" is WORLD).
//! let f = Funcol::global();
//! let t = Tensor::from_vec(vec![rank as f32; 4]);
//! let avg = f.all_reduce(&t, "avg", "0")?; // new tensor; `t` untouched
//! println!("{:?}", avg.to_vec::<f32>()?); // waits here, on first access
//!
//! // Compile-side agreement.
//! let cg = CompileGroups::global();
//! cg.set_enable_compiler_collectives(Some(true));
//! let local = FrameState::new("forward").with_tensor("L['x']", &[5 + rank as usize, 4]);
//! let merged = cg.compiler_collective(&local)?; // same on every rank; dim 0 dynamic
//! assert_eq!(merged.dynamic_inputs(), vec!["L['x']"]);
//! let all_hit = cg.cache_hit_collective(true)?;
//! # let _ = all_hit;
//! dist::destroy_process_group(None)?;
//! # Ok(()) }
//! ```
//!
//! Ranks run as threads use one [`World`](c10d_world::World) per rank and
//! `CompileGroups::new(&world)` / `Funcol::new(&world)` instead of the global forms.
//!
//! ## Departures from PyTorch
//!
//! - State is per [`World`](c10d_world::World) like the rest of c10d-rs: group names resolve in
//!   the world's registry, and the compile-group cache lives in a [`CompileGroups`] handle (one
//!   per world). Switches have a process-wide value ([`config`]) and a per-handle override.
//! - The compile-sync group is gated by the compiler-collectives switch (PyTorch creates it on
//!   demand for the partitioner/cache).
//! - Compiler-collective states are exchanged with c10d-world's `all_gather_object`, which
//!   pickles plain data; Dynamo pickles its own classes, which a Rust rank refuses to load, so
//!   these exchanges do not interoperate with Python ranks.
//!   [`FrameState`] is a plain Rust model of Dynamo's `FrameStateSizeEntry` (ints, tensor sizes,
//!   dynamic dims, dynamic rank; an int on one rank and a tensor on another → fully dynamic), and
//!   ranks that compile different frames or frames with different inputs get an error naming
//!   them instead of a silent merge.
//! - The work registry finds entries by storage sharing and keeps the storage alive until it is
//!   waited (PyTorch: weak storage keys); `register_work` cannot deduplicate a [`c10d_core::Work`]
//!   registered by two separate calls (works have no identity); the in-flight scope is per
//!   thread (PyTorch: per rank). Plain c10d-world collectives enter the registry through
//!   [`registry::track_async_work`] (c10d-world does not know this crate).
//! - No autograd: the `_c10d_functional_autograd` and legacy `c10d_functional` namespaces, fake
//!   and meta tensors are not provided. A [`c10d_world::DeviceMesh`] is a group argument as in
//!   PyTorch (`GroupRef::Mesh`: a 1-D mesh, or a mesh and a dimension). Tensors are always
//!   contiguous, so "output is contiguous for a transposed input" holds trivially.
//! - `batch_p2p_ops([])` returns one empty f32 tensor (PyTorch: an undefined tensor); each p2p op
//!   of a batch gets its own work (PyTorch coalesces them into one).
//! - The reduce-op string `"unused"` is refused like any unknown string.

pub mod async_tensor;
pub mod config;
pub mod exchange;
pub mod frame_state;
pub mod functional;
pub mod group_ref;
pub mod groups;
pub mod registry;

pub use async_tensor::AsyncCollectiveTensor;
pub use exchange::{DigestReport, GuardVerdict, Sha256Digest};
pub use frame_state::{Dim, FrameState, InputState, Sizes};
pub use functional::Funcol;
pub use group_ref::GroupRef;
pub use groups::{
    get_compile_pg, get_compile_sync_pg, get_guard_pg, CompileGroupKind, CompileGroups,
    COMPILE_PG_TAG, COMPILE_SYNC_PG_TAG, GUARD_PG_TAG,
};
pub use registry::{
    allow_inflight_collective_as_graph_input_ctx, wait_tensor, wait_tensors, work_registry_size,
};
