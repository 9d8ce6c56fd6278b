//! # c10d-world
//!
//! `torch.distributed`'s Python API in Rust: [`init_process_group`], groups ([`new_group`],
//! [`split_group`], [`new_subgroups`], [`shrink_group`] after a failure ...), the collectives as free functions ([`all_reduce`],
//! [`broadcast`], [`barrier`] ...), object collectives over `serde`, the backend registry
//! ([`register_backend`]) and `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks.
//!
//! All state lives in a [`World`]. The free functions use the process-wide [`World::global`];
//! tests (and programs that run several ranks as threads) create one [`World`] per rank and call
//! the same operations as methods.
//!
//! ```no_run
//! use c10d_core::{ReduceOp, Tensor};
//! use c10d_world as dist;
//! # fn main() -> c10d_core::Result<()> {
//! dist::init_process_group(dist::InitOptions { backend: Some("gloo".into()), ..Default::default() })?;
//! let t = Tensor::from_vec(vec![dist::get_rank(None)? as f32; 4]);
//! dist::all_reduce(&t).op(ReduceOp::Sum).run()?;
//! dist::destroy_process_group(None)?;
//! # Ok(()) }
//! ```
//!
//! ## Call style
//!
//! Every collective is called the same way ([`call`]): PyTorch's required arguments are
//! positional, each of its keyword arguments is a builder method of [`Collective`] with
//! PyTorch's name, and the call ends in `.run()` (blocking, `async_op=False`) or `.start()`
//! (a [`Work`], `async_op=True`):
//!
//! ```no_run
//! # use c10d_world as dist;
//! # use dist::{Rank, ReduceOp, Tensor};
//! # fn main() -> c10d_core::Result<()> {
//! # let (t, sub) = (Tensor::from_vec(vec![1.0f32; 4]), dist::new_group(None, Default::default())?);
//! # let list: Vec<Tensor> = vec![];
//! dist::all_reduce(&t).op(ReduceOp::Avg).group(&sub).run()?;
//! let work = dist::all_reduce(&t).start()?;
//! dist::broadcast(&t, 1).group(&sub).run()?; // src = global rank 1
//! dist::broadcast(&t, Rank::Group(0)).group(&sub).run()?; // group_src = 0
//! dist::gather(&t).gather_list(&list).dst(0).run()?;
//! let sender: i64 = dist::recv(&t).tag(7).run()?; // any source
//! # Ok(()) }
//! ```
//!
//! The ops on single buffers (`all_reduce`, `broadcast`, `reduce`, `all_gather_into_tensor`,
//! `reduce_scatter_tensor`, `all_to_all_single`, `send`, `recv` and their aliases) also take memory the
//! caller owns, with no copy: `&mut [T]` / `&mut Vec<T>` in place, `&[T]` as an input, and
//! with the `ndarray` feature `ArrayViewMut` / `ArrayView`, blocking; [`c10d_core::TensorView`]s
//! of a [`c10d_core::borrowed::scope`] for asynchronous use ([`buffer`]).
//!
//! Why this shape: PyTorch's Python signatures put up to six arguments in a row, most of them
//! optional; as positional `Option`s (`broadcast(&x, Some(1), Some(&sub), false, None)`) a call
//! does not say which is which, and a mistake compiles or yields an error about argument
//! positions. Named methods make every keyword visible at the call site, let the defaults be
//! left out, make a compile error name the argument (`no method named dst found for
//! Collective<Broadcast>`), and give all ops one shape; a root is one [`Rank`] (global or
//! group rank), so PyTorch's run-time error for giving both cannot happen.
//!
//! ## Where things live, and how a collective flows
//!
//! [`world`] holds the state (one file per concept: `init`, `groups`, `split`, `create` (the
//! one backend-creation path of every group), `registry`, `queries`, `teardown`); [`call`] the
//! builder; [`ops`] one argument type per collective with PyTorch's Python-layer checks;
//! [`collectives`] what ops share (group resolution, roots, dtype checks, coalescing,
//! `batch_isend_irecv`), with `coalescing` what an open `coalescing_manager` block records;
//! [`buffer`] the memory a collective accepts; [`config`] backend strings and the backend
//! registry, `plugin` what the registry holds and hands a creator; `gloo` and `nccl` (features
//! of those names) the built-in creators; [`detail`] DETAIL mode; [`device_mesh`]
//! n-dimensional grids of groups (`init_device_mesh`); [`shrink`] (a group without its failed
//! ranks) and [`grow`] (WORLD taking replacements back: `grow_group`, `join_process_group`);
//! [`standalone`] groups outside the default world, formed from host, port, rank and size (as
//! vLLM and the RL stacks form a trainer-to-inference group); [`stateless`] vLLM's
//! `StatelessProcessGroup`, spoken from Rust; [`weight_sync`] the receiving side of
//! trainer-to-inference weight sync; [`objects`] the object collectives;
//! [`flight_recorder`] the flight recorder's record, from a program's side; [`panic_hook`]
//! `[rank{N}]: ` on panic messages. DDP's Reducer is the crate `c10d-ddp`, the launcher `c10d-run`, the
//! command-line tools `c10d-tools`.
//!
//! `dist::all_reduce(&t).run()`: the free function calls [`World::all_reduce`] on
//! [`World::global`], which returns a [`Collective`]; `.run()` checks the arguments, resolves
//! the group (`None` → WORLD; a non-member warns and does nothing) and calls
//! [`ProcessGroup`]'s [`all_reduce`](c10d_core::Collectives::all_reduce), which builds an
//! [`Op`](c10d_core::Op) and hands it to the backend of the tensors' device type
//! ([`Collectives::run`](c10d_core::Collectives::run); for `"gloo"`,
//! `c10d_gloo::ProcessGroupGloo` submits the op to its group's engine); the backend returns a [`Work`] that `.run()` waits on and `.start()`
//! returns. The whole picture, across crates: `docs/architecture.md` in the repository.
//!
//! ## Departures from PyTorch
//!
//! - Ranks are `usize`; functions that return −1 for non-members in PyTorch (`get_rank`,
//!   `get_world_size`, `recv`) return `i64`. Groups are passed as `Option<&GroupMember>`
//!   (`None` = WORLD), to collectives through `.group(..)`.
//! - Collectives are builders (see "Call style"); a root is one [`Rank`] instead of PyTorch's
//!   `src`/`group_src` pair. `.start()` on a non-member returns a completed [`Work`] where
//!   PyTorch returns `None`. Every collective takes a `.timeout(..)` (PyTorch's C++ options
//!   field; Python exposes it only on `monitored_barrier`). The object collectives return
//!   their result (`all_gather_object` → `Vec<T>`, `gather_object` → `Option<Vec<T>>` on the
//!   root, `scatter_object_list` → `Option<T>`) instead of filling an output list.
//! - An unknown single backend name fails at once with "Unknown backend ..." (PyTorch warns and
//!   fails later at creation).
//! - A failed `init_process_group` does not consume the WORLD name (PyTorch's counter stays at 1).
//! - `split_group` on a backend without [`c10d_core::Backend::split`] (gloo here) creates a
//!   fresh backend for the members instead of raising.
//! - DETAIL fingerprints print the real sequence number (PyTorch prints 0) and device types as
//!   "CPU"/"CUDA".
//! - `monitored_barrier` without a timeout uses the group's timeout (PyTorch: 30 min always).
//! - [`shrink_group`] works on every backend, gloo included, by creating a new backend for the
//!   survivors (PyTorch needs `ncclCommShrink`); see [`shrink`] for the other differences.
//! - Object collectives pickle, as PyTorch does, but read pickles without running code: a
//!   Python rank's object must be plain data (classes and functions are refused; see
//!   [`objects`]). The store layout (the `default_pg` prefix of
//!   rendezvous stores, `"<name>/"` group prefixes, `"<device>/"` backend prefixes, barrier keys,
//!   SHA-1 group names) is PyTorch's and is checked against torch in `tests/interop_world.rs`.
//! - "undefined"/no backend means `cpu:gloo` (PyTorch adds `cuda:nccl` when CUDA is built in);
//!   ask for `"cpu:gloo,cuda:nccl"` or `"nccl"` explicitly. `"nccl"` is available where
//!   c10d-nccl finds NCCL and a GPU.

pub mod buffer;
pub mod call;
mod coalescing;
pub mod collectives;
pub mod config;
pub mod detail;
pub mod device_mesh;
pub mod flight_recorder;
#[cfg(feature = "gloo")]
mod gloo;
pub mod grow;
#[cfg(feature = "nccl")]
mod nccl;
pub mod objects;
pub mod ops;
pub mod panic_hook;
mod pickle_scan;
mod plugin;
pub mod shrink;
pub mod standalone;
pub mod stateless;
pub mod weight_sync;
pub mod world;

pub use buffer::{Buffer, BufferMut, SharedBuffer};
pub use call::{Collective, Rank};
pub use collectives::{CoalescingManager, P2PKind, P2POp};
pub use config::{
    default_timeout_for, get_default_backend_for_device, is_backend_available, is_gloo_available,
    is_nccl_available, register_backend, BackendConfig, BackendCreateArgs, BackendCreator,
};
pub use detail::{CollectiveFingerPrint, DetailWrapper};
pub use device_mesh::{
    init_device_mesh, BackendOverride, DeviceMesh, MeshArray, MeshDim, MeshOptions,
};
use objects::*;
use ops::*;
pub use world::{
    get_node_local_rank, hash_ranks_to_str, is_torchelastic_launched, store_based_barrier,
    EnvLookup, GroupMember, GroupOptions, InitOptions, PgOptions, SplitOptions, World,
    NON_GROUP_MEMBER_VALUE,
};

/// What a program needs from c10d-core, so that it depends on c10d-world alone.
pub use c10d_core::{
    DType, DebugLevel, Device, DeviceType, DistError, ErrorKind, ProcessGroup, ReduceOp, Result,
    Tensor, Work,
};

use std::time::Duration;

fn w() -> &'static World {
    World::global()
}

/// [`World::init_process_group`] on the global world.
///
/// # Errors
/// See [`World::init_process_group`].
pub fn init_process_group(opts: InitOptions) -> Result<()> {
    w().init_process_group(opts)
}
/// [`World::is_initialized`] on the global world.
pub fn is_initialized() -> bool {
    w().is_initialized()
}
/// [`World::destroy_process_group`] on the global world.
///
/// # Errors
/// See [`World::destroy_process_group`].
pub fn destroy_process_group(group: Option<&GroupMember>) -> Result<()> {
    w().destroy_process_group(group)
}
/// [`World::abort_process_group`] on the global world.
///
/// # Errors
/// See [`World::abort_process_group`].
pub fn abort_process_group(group: Option<&GroupMember>) -> Result<()> {
    w().abort_process_group(group)
}
/// [`World::new_group`] on the global world.
///
/// # Errors
/// See [`World::new_group`].
pub fn new_group(ranks: Option<&[usize]>, opts: GroupOptions) -> Result<GroupMember> {
    w().new_group(ranks, opts)
}
/// [`World::new_group_with_tag`] on the global world (`_new_group_with_tag`).
///
/// # Errors
/// See [`World::new_group_with_tag`].
pub fn new_group_with_tag(
    ranks: Option<&[i64]>,
    opts: GroupOptions,
    pg_tag: Option<&str>,
) -> Result<GroupMember> {
    w().new_group_with_tag(ranks, opts, pg_tag)
}
/// [`World::new_subgroups`] on the global world.
///
/// # Errors
/// See [`World::new_subgroups`].
pub fn new_subgroups(
    group_size: Option<usize>,
    group: Option<&ProcessGroup>,
    opts: GroupOptions,
) -> Result<(ProcessGroup, Vec<GroupMember>)> {
    w().new_subgroups(group_size, group, opts)
}
/// [`World::new_subgroups_by_enumeration`] on the global world.
///
/// # Errors
/// See [`World::new_subgroups_by_enumeration`].
pub fn new_subgroups_by_enumeration(
    lists: &[Vec<i64>],
    opts: GroupOptions,
) -> Result<(Option<GroupMember>, Vec<GroupMember>)> {
    w().new_subgroups_by_enumeration(lists, opts)
}
/// [`World::split_group`] on the global world.
///
/// # Errors
/// See [`World::split_group`].
pub fn split_group(
    parent: Option<&ProcessGroup>,
    split_ranks: &[Vec<usize>],
    opts: SplitOptions,
) -> Result<GroupMember> {
    w().split_group(parent, split_ranks, opts)
}
/// [`World::shrink_group`] on the global world (`torch.distributed.shrink_group`, PyTorch
/// 2.9+): the ranks of `group` (default: WORLD) minus `ranks_to_exclude` (group ranks) as a new
/// group; shrinking WORLD makes the result the new WORLD.
///
/// # Errors
/// See [`World::shrink_group`].
pub fn shrink_group(
    ranks_to_exclude: &[usize],
    group: Option<&GroupMember>,
) -> Result<GroupMember> {
    w().shrink_group(ranks_to_exclude, group)
}
/// [`World::grow_group`] on the global world: the members of WORLD take `new_ranks`
/// newcomers (which call [`join_process_group`]) into a new, larger WORLD; members keep their
/// ranks, newcomers come after them in arrival order.
///
/// # Errors
/// See [`World::grow_group`].
pub fn grow_group(new_ranks: usize, timeout: Option<std::time::Duration>) -> Result<GroupMember> {
    w().grow_group(new_ranks, timeout)
}
/// [`World::join_process_group`] on the global world: a newcomer's `init_process_group`,
/// joining a running job's WORLD when its members call [`grow_group`].
///
/// # Errors
/// See [`World::join_process_group`].
pub fn join_process_group(opts: InitOptions) -> Result<()> {
    w().join_process_group(opts)
}
/// [`World::get_rank`] on the global world (−1 on a non-member).
///
/// # Errors
/// See [`World::get_rank`].
pub fn get_rank(group: Option<&GroupMember>) -> Result<i64> {
    w().get_rank(group)
}
/// [`World::get_world_size`] on the global world (−1 on a non-member).
///
/// # Errors
/// See [`World::get_world_size`].
pub fn get_world_size(group: Option<&GroupMember>) -> Result<i64> {
    w().get_world_size(group)
}
/// [`World::get_group_rank`] on the global world.
///
/// # Errors
/// See [`World::get_group_rank`].
pub fn get_group_rank(group: &ProcessGroup, global_rank: usize) -> Result<usize> {
    w().get_group_rank(group, global_rank)
}
/// [`World::get_global_rank`] on the global world.
///
/// # Errors
/// See [`World::get_global_rank`].
pub fn get_global_rank(group: &ProcessGroup, group_rank: usize) -> Result<usize> {
    w().get_global_rank(group, group_rank)
}
/// [`World::get_process_group_ranks`] on the global world.
///
/// # Errors
/// See [`World::get_process_group_ranks`].
pub fn get_process_group_ranks(group: Option<&ProcessGroup>) -> Result<Vec<usize>> {
    w().get_process_group_ranks(group)
}
/// [`World::get_pg_count`] on the global world.
pub fn get_pg_count() -> usize {
    w().get_pg_count()
}
/// [`World::get_backend`] on the global world.
///
/// # Errors
/// See [`World::get_backend`].
pub fn get_backend(group: Option<&GroupMember>) -> Result<String> {
    w().get_backend(group)
}
/// [`World::get_backend_config`] on the global world.
///
/// # Errors
/// See [`World::get_backend_config`].
pub fn get_backend_config(group: Option<&GroupMember>) -> Result<String> {
    w().get_backend_config(group)
}
/// [`World::get_debug_level`] on the global world.
///
/// # Errors
/// See [`World::get_debug_level`].
pub fn get_debug_level() -> Result<DebugLevel> {
    w().get_debug_level()
}
/// [`World::register_process_group`] on the global world.
pub fn register_process_group(name: &str, group: &ProcessGroup) {
    w().register_process_group(name, group)
}
/// [`World::resolve_process_group`] on the global world.
///
/// # Errors
/// See [`World::resolve_process_group`].
pub fn resolve_process_group(name: &str) -> Result<ProcessGroup> {
    w().resolve_process_group(name)
}
/// [`World::unregister_process_group`] on the global world.
pub fn unregister_process_group(name: &str) {
    w().unregister_process_group(name)
}
/// [`World::set_timeout`] on the global world.
///
/// # Errors
/// See [`World::set_timeout`].
pub fn set_timeout(timeout: Duration, group: Option<&ProcessGroup>) -> Result<()> {
    w().set_timeout(timeout, group)
}

/// [`World::all_reduce`] on the global world.
pub fn all_reduce<D: BufferMut>(tensor: D) -> Collective<'static, AllReduce<D>> {
    w().all_reduce(tensor)
}
/// [`World::all_reduce_coalesced`] on the global world.
pub fn all_reduce_coalesced<'a>(tensors: &'a [Tensor]) -> Collective<'a, AllReduceCoalesced<'a>> {
    w().all_reduce_coalesced(tensors)
}
/// [`World::broadcast`] on the global world.
pub fn broadcast<D: BufferMut>(
    tensor: D,
    src: impl Into<Rank>,
) -> Collective<'static, Broadcast<D>> {
    w().broadcast(tensor, src)
}
/// [`World::reduce`] on the global world.
pub fn reduce<D: BufferMut>(tensor: D, dst: impl Into<Rank>) -> Collective<'static, Reduce<D>> {
    w().reduce(tensor, dst)
}
/// [`World::all_gather`] on the global world.
pub fn all_gather<'a>(
    tensor_list: &'a [Tensor],
    tensor: &'a Tensor,
) -> Collective<'a, AllGather<'a>> {
    w().all_gather(tensor_list, tensor)
}
/// [`World::all_gather_into_tensor`] on the global world.
pub fn all_gather_into_tensor<O: BufferMut, I: Buffer>(
    output: O,
    input: I,
) -> Collective<'static, AllGatherIntoTensor<O, I>> {
    w().all_gather_into_tensor(output, input)
}
/// [`World::all_gather_single`] on the global world.
pub fn all_gather_single<O: BufferMut, I: Buffer>(
    output: O,
    input: I,
) -> Collective<'static, AllGatherIntoTensor<O, I>> {
    w().all_gather_single(output, input)
}
/// [`World::all_gather_coalesced`] on the global world.
pub fn all_gather_coalesced<'a>(
    output_tensor_lists: &'a [Vec<Tensor>],
    input_tensor_list: &'a [Tensor],
) -> Collective<'a, AllGatherCoalesced<'a>> {
    w().all_gather_coalesced(output_tensor_lists, input_tensor_list)
}
/// [`World::gather`] on the global world.
pub fn gather<'a>(tensor: &'a Tensor) -> Collective<'a, Gather<'a>> {
    w().gather(tensor)
}
/// [`World::gather_single`] on the global world.
pub fn gather_single<'a>(tensor: &'a Tensor) -> Collective<'a, GatherSingle<'a>> {
    w().gather_single(tensor)
}
/// [`World::gather_into_tensor`] on the global world.
pub fn gather_into_tensor<'a>(tensor: &'a Tensor) -> Collective<'a, GatherSingle<'a>> {
    w().gather_into_tensor(tensor)
}
/// [`World::scatter`] on the global world.
pub fn scatter<'a>(tensor: &'a Tensor) -> Collective<'a, Scatter<'a>> {
    w().scatter(tensor)
}
/// [`World::reduce_scatter`] on the global world.
pub fn reduce_scatter<'a>(
    output: &'a Tensor,
    input_list: &'a [Tensor],
) -> Collective<'a, ReduceScatter<'a>> {
    w().reduce_scatter(output, input_list)
}
/// [`World::reduce_scatter_tensor`] on the global world.
pub fn reduce_scatter_tensor<O: BufferMut, I: Buffer>(
    output: O,
    input: I,
) -> Collective<'static, ReduceScatterTensor<O, I>> {
    w().reduce_scatter_tensor(output, input)
}
/// [`World::reduce_scatter_single`] on the global world.
pub fn reduce_scatter_single<O: BufferMut, I: Buffer>(
    output: O,
    input: I,
) -> Collective<'static, ReduceScatterTensor<O, I>> {
    w().reduce_scatter_single(output, input)
}
/// [`World::all_to_all`] on the global world.
pub fn all_to_all<'a>(
    output_tensor_list: &'a [Tensor],
    input_tensor_list: &'a [Tensor],
) -> Collective<'a, AllToAll<'a>> {
    w().all_to_all(output_tensor_list, input_tensor_list)
}
/// [`World::all_to_all_single`] on the global world.
pub fn all_to_all_single<O: BufferMut, I: Buffer>(
    output: O,
    input: I,
) -> Collective<'static, AllToAllSingle<'static, O, I>> {
    w().all_to_all_single(output, input)
}
/// [`World::barrier`] on the global world.
pub fn barrier<'a>() -> Collective<'a, Barrier<'a>> {
    w().barrier()
}
/// [`World::send`] on the global world.
pub fn send<D: Buffer>(tensor: D, dst: impl Into<Rank>) -> Collective<'static, SendTensor<D>> {
    w().send(tensor, dst)
}
/// [`World::isend`] on the global world.
pub fn isend<D: Buffer>(tensor: D, dst: impl Into<Rank>) -> Collective<'static, SendTensor<D>> {
    w().isend(tensor, dst)
}
/// [`World::recv`] on the global world.
pub fn recv<D: BufferMut>(tensor: D) -> Collective<'static, RecvTensor<D>> {
    w().recv(tensor)
}
/// [`World::irecv`] on the global world.
pub fn irecv<D: BufferMut>(tensor: D) -> Collective<'static, RecvTensor<D>> {
    w().irecv(tensor)
}
/// [`World::monitored_barrier`] on the global world.
pub fn monitored_barrier() -> Collective<'static, MonitoredBarrier> {
    w().monitored_barrier()
}
/// [`World::batch_isend_irecv`] on the global world.
///
/// # Errors
/// See [`World::batch_isend_irecv`].
pub fn batch_isend_irecv(ops: &[P2POp]) -> Result<Vec<Work>> {
    w().batch_isend_irecv(ops)
}
/// [`World::coalescing_manager`] on the global world.
///
/// # Errors
/// See [`World::coalescing_manager`].
pub fn coalescing_manager<R>(
    group: Option<&GroupMember>,
    async_ops: bool,
    f: impl FnOnce() -> Result<R>,
) -> Result<(R, CoalescingManager)> {
    w().coalescing_manager(group, async_ops, f)
}

/// [`World::all_gather_object`] on the global world.
pub fn all_gather_object<T: serde::Serialize + serde::de::DeserializeOwned>(
    obj: &T,
) -> Collective<'_, AllGatherObject<'_, T>> {
    w().all_gather_object(obj)
}
/// [`World::gather_object`] on the global world.
pub fn gather_object<T: serde::Serialize + serde::de::DeserializeOwned>(
    obj: &T,
) -> Collective<'_, GatherObject<'_, T>> {
    w().gather_object(obj)
}
/// [`World::broadcast_object_list`] on the global world.
pub fn broadcast_object_list<T: serde::Serialize + serde::de::DeserializeOwned>(
    object_list: &mut [T],
) -> Collective<'_, BroadcastObjectList<'_, T>> {
    w().broadcast_object_list(object_list)
}
/// [`World::scatter_object_list`] on the global world.
pub fn scatter_object_list<T: serde::Serialize + serde::de::DeserializeOwned>(
) -> Collective<'static, ScatterObjectList<'static, T>> {
    w().scatter_object_list()
}
/// [`World::send_object_list`] on the global world.
pub fn send_object_list<T: serde::Serialize>(
    object_list: &[T],
    dst: impl Into<Rank>,
) -> Collective<'_, SendObjectList<'_, T>> {
    w().send_object_list(object_list, dst)
}
/// [`World::recv_object_list`] on the global world.
pub fn recv_object_list<T: serde::de::DeserializeOwned>(
    object_list: &mut [T],
) -> Collective<'_, RecvObjectList<'_, T>> {
    w().recv_object_list(object_list)
}

/// The README's Rust examples, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
