//! Runs the algorithm the table (`algo::select`) picks for an op: reads what the group can do
//! from its `Comm`, runs the probes the table asks for (cross-memory attach, the host map, the
//! shared-memory set-up), then calls the chosen algorithm.

use super::select::{
    self, AllReduce, Broadcast, Caps, Choice, CmaVerdict, Exchange, HostsVerdict, Probe, Settings,
};
use crate::engine::Comm;
use crate::options::GlooOptions;
use c10d_core::{DType, ReduceOp, Result};

/// The algorithm settings, copied into each op.
#[derive(Clone, Copy)]
pub(crate) struct Algo {
    table: Settings,
    /// Reduce with segmented trees above this many bytes (`GlooOptions`).
    pub small_reduce_scratch: usize,
    /// Pipeline chunk of the ring and the chain, bytes.
    chunk: usize,
    /// This rank lets the group use cross-memory attach (its vote in the probe).
    cma_allowed: bool,
    /// This rank lets the group use a shared-memory segment (its vote in the set-up).
    shm_allowed: bool,
}

impl Algo {
    pub fn from_options(opts: &GlooOptions) -> Algo {
        Algo {
            table: Settings {
                allreduce: opts.allreduce_algorithm,
                broadcast: opts.broadcast_algorithm,
                small_allreduce: opts.small_allreduce_bytes,
                small_broadcast: opts.small_broadcast_bytes,
                cma_min: opts.cma_min_bytes,
            },
            small_reduce_scratch: opts.small_reduce_scratch_bytes,
            cma_allowed: opts.cross_memory_attach,
            shm_allowed: opts.shared_memory,
            chunk: opts.pipeline_chunk_bytes.max(64),
        }
    }

    /// The table's answer for this op, after running the probes it asks for (each records its
    /// verdict, which the table reads next time: cross-memory attach and the host map once per
    /// group, the shared-memory set-up once per slot size at most).
    fn choose<A>(&self, comm: &mut Comm<'_>, table: impl Fn(&Caps) -> Choice<A>) -> Result<A> {
        for _ in 0..4 {
            match table(&caps(comm)?) {
                Choice::Run(a) => return Ok(a),
                Choice::Probe(Probe::Cma) => {
                    super::cma::probe(comm, self.cma_allowed)?;
                }
                Choice::Probe(Probe::Hosts) => {
                    let hosts = super::hierarchical::probe(comm, self.cma_allowed)?;
                    comm.set_hosts(hosts);
                }
                Choice::Probe(Probe::Shm(bytes)) => {
                    super::shm::probe(comm, bytes, self.shm_allowed)?;
                }
            }
        }
        Err(c10d_core::DistError::backend(format!(
            "{}: the algorithm table kept asking for probes",
            comm.ctx()
        )))
    }

    /// All-reduce of `buf` in place (`op` a combining op: AVG and PREMUL_SUM were mapped).
    pub fn all_reduce(
        &self,
        comm: &mut Comm<'_>,
        buf: &mut [u8],
        op: ReduceOp,
        dtype: DType,
    ) -> Result<()> {
        let len = buf.len();
        let chunk = self.chunk;
        match self.choose(comm, |c| select::all_reduce(&self.table, c, len))? {
            AllReduce::Shm(fold) => super::shm::all_reduce(comm, buf, op, dtype, fold),
            AllReduce::Cma => super::cma::all_reduce(comm, buf, op, dtype),
            AllReduce::TwoLevel => match comm.hosts() {
                Some(hosts) => super::hierarchical::all_reduce(comm, buf, op, dtype, &hosts),
                None => super::allreduce::all_pairs(comm, buf, op, dtype, chunk),
            },
            AllReduce::Direct => super::allreduce::direct(comm, buf, op, dtype),
            AllReduce::Doubling => super::doubling::all_reduce(comm, buf, op, dtype),
            AllReduce::AllPairs => super::allreduce::all_pairs(comm, buf, op, dtype, chunk),
            AllReduce::Ring => super::allreduce::ring(comm, buf, op, dtype, chunk),
        }
    }

    /// All-gather (`outputs[i * n + p]` = rank p's `inputs[i]`).
    pub fn all_gather(
        &self,
        comm: &mut Comm<'_>,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        let mine: usize = inputs.iter().map(|i| i.len()).sum();
        let total: usize = outputs.iter().map(|o| o.len()).sum();
        match self.choose(comm, |c| select::exchange(&self.table, c, mine, total))? {
            Exchange::Shm => super::shm::all_gather(comm, inputs, outputs),
            Exchange::Cma => super::cma::all_gather(comm, inputs, outputs),
            Exchange::Direct => super::exchange::all_gather(comm, inputs, outputs),
        }
    }

    /// Reduce-scatter (see `algo::reduce::reduce_scatter`).
    pub fn reduce_scatter(
        &self,
        comm: &mut Comm<'_>,
        blocks: &[&[u8]],
        out: &mut [u8],
        op: ReduceOp,
        dtype: DType,
    ) -> Result<()> {
        let total: usize = blocks.iter().map(|b| b.len()).sum();
        match self.choose(comm, |c| select::exchange(&self.table, c, total, total))? {
            Exchange::Shm => super::shm::reduce_scatter(comm, blocks, out, op, dtype),
            Exchange::Cma => super::cma::reduce_scatter(comm, blocks, out, op, dtype),
            Exchange::Direct => super::reduce::reduce_scatter(comm, blocks, out, op, dtype),
        }
    }

    /// Broadcast of `buf` from `root`.
    pub fn broadcast(&self, comm: &mut Comm<'_>, buf: &mut [u8], root: usize) -> Result<()> {
        let len = buf.len();
        match self.choose(comm, |c| select::broadcast(&self.table, c, len))? {
            Broadcast::Shm => super::shm::broadcast(comm, buf, root),
            Broadcast::Tree => super::broadcast::tree(comm, buf, root),
            Broadcast::Chain => super::broadcast::chain(comm, buf, root, self.chunk),
        }
    }
}

/// What the group can do, from its engine.
///
/// # Errors
/// As [`Comm::all_peers_local`].
fn caps(comm: &mut Comm<'_>) -> Result<Caps> {
    let local = comm.all_peers_local()?;
    Ok(Caps {
        size: comm.size(),
        local,
        shm_slot: super::shm::slot_capacity(comm.shm()),
        shm_limit: super::shm::limit(comm, local),
        cma: match comm.cma() {
            None => CmaVerdict::Unprobed,
            Some(true) => CmaVerdict::Permitted,
            Some(false) => CmaVerdict::Refused,
        },
        hosts: match comm.hosts_probed() {
            false => HostsVerdict::Unprobed,
            true if comm.hosts().is_some() => HostsVerdict::Hierarchical,
            true => HostsVerdict::Flat,
        },
    })
}
