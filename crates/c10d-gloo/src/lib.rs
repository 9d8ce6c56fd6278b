//! # c10d-gloo
//!
//! The CPU collective backend of c10d-rs (PyTorch's `ProcessGroupGloo`): every collective of
//! `torch.distributed` on CPU tensors, between processes and hosts, over TCP on `mio` +
//! `socket2`.
//!
//! * [`ProcessGroupGloo::new`] publishes where the rank listens (two store keys) and connects
//!   its ring neighbours; every other connection is made when an algorithm first needs that
//!   peer (see the `transport` module), so sockets, memory and store operations per rank grow
//!   with what the algorithms use (a 1 KiB all-reduce of 512 ranks: recursive doubling, 10
//!   peers), not with the group. With [`GlooOptions::lazy_init`] even the neighbours wait for
//!   the first op.
//! * Ops of a group run in issue order on one engine per group: a blocking call runs on the
//!   caller's thread when the engine is free, everything else on the group's worker thread;
//!   see the `engine` module for why the event loop is per group rather than per process.
//! * Peers on the same host talk over abstract Unix sockets, others over TCP (see `transport`;
//!   [`GlooOptions::local_unix_sockets`] turns this off).
//! * When every rank of a group is on one host, all-reduces, all-gathers and reduce-scatters
//!   below the cross-memory-attach threshold (2 MiB) and broadcasts up to 2 MiB (in groups of up
//!   to 8 ranks; up to 64 KiB per rank in larger ones) go through a shared-memory segment the
//!   group's first such op sets up, sized to it, where `/dev/shm` has room (else sockets, with
//!   one warning; see `algo::shm`): no socket and no system call on the fast
//!   path, a futex when a rank must wait, the fold order of the socket algorithm each replaces
//!   (same bits), every fault check of the socket path. `C10D_GLOO_SHM=0` /
//!   [`GlooOptions::shared_memory`] turns it off.
//! * When every rank of a group is on one host, all-reduces, all-gathers and reduce-scatters of
//!   at least [`GlooOptions::cma_min_bytes`] (2 MiB) copy straight out of the peers' buffers with
//!   Linux cross-memory attach (`process_vm_readv`, see `algo::cma`): one copy per byte instead
//!   of two through socket buffers, the sockets carrying only three rounds of control frames.
//!   Whether it is permitted is probed once per group and agreed by every rank; otherwise (or
//!   with `C10D_GLOO_CMA=0` on any rank) the socket algorithms run. Reads only: a peer can
//!   never write our memory; it can read it, as any process of the same user already may.
//! * When a group spans hosts with 2 to 16 ranks on each (as many on every host, at most 16
//!   hosts), large all-reduces run in two levels (see `algo::hierarchical`): reduce inside each host
//!   (cross-memory attach where allowed), exchange between hosts one segment per local rank,
//!   spread inside the host; the bytes crossing the network halve against the flat all-pairs.
//!   The host map comes from the identities the ranks publish in the store (kernel and network
//!   namespace) at the first such op; `C10D_GLOO_TWO_LEVEL=0` / [`GlooOptions::two_level`] turns it off.
//! * Algorithms live in `algo::*`, one small module each: direct-exchange (up to 16 ranks),
//!   recursive-doubling (beyond), all-pairs (reduce-scatter + all-gather) and pipelined-ring
//!   all-reduce, binomial-tree and
//!   pipelined-chain broadcast, direct all-gather / gather / scatter / all-to-all /
//!   reduce-scatter, direct and segmented reduce, dissemination barrier, monitored barrier.
//! * Every frame carries a header (see `wire`); a rank that runs a different collective, dtype
//!   or size than its peer fails with an error naming both ranks and both ops.
//!
//! Performance: the README's measured table ("Figures", `bash crates/c10d-world/benches/compare.sh`,
//! which drives `c10d-bench`; 2-core machine, loopback, best of N alternating runs against
//! PyTorch 2.15's Gloo in the same run). A 1 KiB all-reduce takes 1.57 µs with 2 ranks over
//! shared memory (9.2–14 µs over sockets; PyTorch 0.40 ms) and 4.21 µs with 4 (37–45 µs over
//! sockets; PyTorch 4.8 ms); 16 MiB busbw is 5.7× PyTorch's with 2 ranks (earlier runs
//! 3.3–3.9×) and 2.70× with 4 (earlier 2.1–2.35×), with cross-memory attach. With
//! `C10D_GLOO_TCP_ONLY=1` (loopback TCP like PyTorch) 16 MiB is 1.74× (2 ranks) and 1.18–1.25×
//! (4 ranks), the rest being the kernel's TCP cost. With 4 ranks, broadcast from 512 KiB to
//! 64 MiB is 1.5–5.6× faster and all_to_all from 512 KiB up 1.3–10×. Update these with the
//! README's table.
//!
//! # Which file owns what
//!
//! (The workspace-wide picture, and how an op reaches this crate from `c10d_world`, is in
//! `docs/architecture.md` at the repository root.)
//!
//! | file | owns |
//! |------|------|
//! | `process_group.rs` | [`ProcessGroupGloo`]: creation, worker thread, `submit` of one `Launch` (tensor leases, sequence numbers, flight-recorder entry, queue; a blocking call driven on the caller's thread), abort and shutdown |
//! | `ops.rs` | the `Backend` methods: argument checks, the op's body, its `Launch` |
//! | `bodies.rs` | bodies shared by several ops (all-reduce with AVG/PREMUL_SUM around the chosen algorithm, reduce at / towards the root, reduce-scatter) |
//! | `checks.rs` | argument checks with PyTorch's texts (the shared ones of `c10d_core::checks`, plus CPU-only checks) |
//! | `slices.rs` | cutting a leased buffer into per-rank / per-tensor parts |
//! | `options.rs` | [`GlooOptions`] and the listen-address choice |
//! | `transport.rs` | connection set-up: listen, publish in the store, connect/accept the mesh, hello handshake; deadlines |
//! | `engine/mod.rs` | the per-group engine, one concept per file (its table is in `engine/mod.rs`): |
//! | `engine/submit.rs` | queue, worker thread, drive loops, running a collective |
//! | `engine/setup.rs` | connecting the mesh (also under lazy init), the shared-memory verdict |
//! | `engine/poll.rs`, `engine/conn.rs` | the `mio` poll loop; connection I/O (write queue, receive state machine) |
//! | `engine/matching.rs`, `engine/p2p.rs` | frame matching for collectives; point-to-point ops |
//! | `engine/faults.rs` | lost or departed peers, failing the group, detaching buffers, error texts |
//! | `engine/comm.rs` | `Comm`, the algorithms' view of the engine (posts, waits, time-outs) |
//! | `engine/flow.rs`, `engine/liveness.rs` | read budget and back-pressure; ping/pong probes that name a silent rank |
//! | `wire.rs` | the 64-byte frame header |
//! | `algo/*.rs` | the socket algorithms, written against `Posts` / `Comm` (post parts of registered buffers, wait, fold) with no `unsafe` and no pointers |
//! | `shm/` | the group's shared-memory segment as the platform gives it (below the engine, which keeps it): `segment.rs` (mapping, slots, futex: all of its `unsafe`), `setup.rs` (made through the store by the first op that needs it), `fit.rs` (slot sizes, whether `/dev/shm` has room, the warning) |
//! | `hosts.rs` | the host map (which ranks share a host), kept by the engine between ops |
//! | `algo/shm/` | the shared-memory path: `sync.rs` (one op's protocol: arrivals, waits and their checks), `ops.rs` (all-reduce, broadcast, all-gather, reduce-scatter), `probe.rs` (the set-up every rank runs at the op that first needs a segment, or a bigger one) |
//! | `algo/cma/` | cross-memory attach: `remote.rs` (`process_vm_readv`, published buffers: its only `unsafe`), `mod.rs` (probe, vote, all-reduce, all-gather, reduce-scatter) |
//! | `algo/step.rs` | the step tag of frames (phase, round, piece) |
//! | `algo/select.rs` | which algorithm runs an op: one pure table of (size, group size, options, what the group can do: shared memory, cross-memory attach, how ranks sit on hosts) |
//! | `algo/dispatch.rs` | runs the table's choice (and the probes it asks for: cross-memory attach, the host map) |
//! | `algo/hierarchical.rs` | learning the host map, and the two-level all-reduce of groups that span hosts |
//! | `bin/c10d-gloo-worker.rs` | rank process for benchmarks and process tests |
//!
//! # How a collective flows
//!
//! 1. `ProcessGroupGloo::all_reduce` (`ops.rs`) checks the arguments and builds the op's body,
//!    a closure that asks the table for an algorithm and runs it (e.g. `algo::allreduce::ring`)
//!    on a `Comm` (`algo::dispatch`).
//! 2. `submit` (`process_group.rs`) leases the tensors, numbers the op, records it in the
//!    flight recorder and queues it; a blocking call that finds the engine free drives it on
//!    the caller's thread, otherwise the group's worker thread does (`engine/mod.rs`, "who
//!    drives it"). A blocking call that also finds nothing queued runs the op at once, without
//!    the queue, and records it at its first wait for a peer (`Comm::record_pending`).
//! 3. The engine runs queued collectives in issue order (`Engine::run_coll` in
//!    `engine/submit.rs`): connects first under lazy init, gives the body a `Comm` with the
//!    op's deadline, and completes the op's `Work` with the body's result.
//! 4. Inside the body the algorithm posts non-blocking sends and receives (each frame = header
//!    from `wire.rs` + payload, tagged by collective index and step) and waits on them; the
//!    waiting thread polls the sockets (`engine/poll.rs`), writes queued frames (`flush`,
//!    `engine/conn.rs`) and reads arriving frames straight into the posted buffers
//!    (`on_readable`, matched in `engine/matching.rs`).
//!
//! Differences from PyTorch's Gloo, on purpose: `ReduceOp::Avg` and `ReduceOp::PremulSum` are
//! supported (PyTorch's Gloo refuses them); AVG divides by the group size (also when a rank
//! passes several tensors). Argument errors use PyTorch's texts, prefixed
//! `"ProcessGroupGloo::<op>: "`.

mod algo;
mod bodies;
mod checks;
mod engine;
#[doc(hidden)]
pub mod fuzzing;
mod hosts;
mod ops;
mod options;
mod process_group;
mod shm;
mod slices;
mod transport;
mod wire;

pub use options::{AllreduceAlgorithm, BroadcastAlgorithm, GlooOptions};
pub use process_group::ProcessGroupGloo;
