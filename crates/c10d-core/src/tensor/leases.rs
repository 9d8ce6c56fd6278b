//! [`TensorLeases`]: the leases a collective holds on its input and output tensors while it
//! runs (readers share, a writer is alone, overlapping views conflict).

use super::*;

enum InputSrc {
    /// Points into a read-leased storage that no output overlaps.
    Borrowed(*const u8, usize),
    /// Snapshot of an input that overlapped an output of the same operation.
    Snapshot(Vec<u8>),
    /// Device memory (pointer given by the tensor).
    Device,
}

/// The leases one operation holds on its tensors, from launch until it finishes.
///
/// Inputs that overlap an output of the same operation (for example
/// `all_gather_into_tensor` with the input being a chunk of the output) are copied once at
/// acquire time, so the algorithm never sees aliased input and output buffers.
/// Dropping the value releases every lease.
pub struct TensorLeases {
    inputs: Vec<(Tensor, InputSrc)>,
    outputs: Vec<(Tensor, Option<(*mut u8, usize)>)>,
    _guards: Vec<StorageGuard>,
}

// SAFETY: the raw pointers point into storages kept alive by the guards (and tensors) held in the
// same value; the guards give this value exclusive write access to every output storage and shared
// read access to every input storage, so moving it to another thread cannot create a data race.
unsafe impl Send for TensorLeases {}

impl TensorLeases {
    /// Leases `outputs` for writing and `inputs` for reading.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when a storage is already leased by another in-flight
    /// collective, when two outputs overlap, or when tensors mix host and device memory in a way
    /// the caller did not expect (device tensors are leased but expose no host slices).
    pub fn acquire(inputs: &[Tensor], outputs: &[Tensor]) -> Result<TensorLeases> {
        let mut leases = TensorLeases {
            inputs: Vec::new(),
            outputs: Vec::new(),
            _guards: Vec::new(),
        };
        leases.extend(inputs, outputs)?;
        Ok(leases)
    }

    /// Adds one more operation's tensors to these leases, for a block of operations that run
    /// as one (a coalesced block: `batch_isend_irecv` may receive into two disjoint `narrow()`
    /// halves of one buffer). A storage leased here already is not leased again; one leased
    /// here for reading only and now written is upgraded when nobody else reads it. On an
    /// error nothing is added.
    ///
    /// # Errors
    /// As [`TensorLeases::acquire`], the outputs checked against every output leased so far.
    pub fn extend(&mut self, inputs: &[Tensor], outputs: &[Tensor]) -> Result<()> {
        self.check_outputs_disjoint(outputs)?;
        let (fresh, upgrades) = self.new_guards(inputs, outputs)?;
        for (n, &k) in upgrades.iter().enumerate() {
            if let Err(e) = self._guards[k].upgrade() {
                upgrades[..n]
                    .iter()
                    .for_each(|&j| self._guards[j].downgrade());
                return Err(e);
            }
        }
        self._guards.extend(fresh);
        self.snapshot_inputs_under(outputs);
        let all_outputs: Vec<Tensor> = self
            .outputs
            .iter()
            .map(|(t, _)| t.clone())
            .chain(outputs.iter().cloned())
            .collect();
        for t in inputs {
            self.inputs.push((t.clone(), input_src(t, &all_outputs)));
        }
        for t in outputs {
            // SAFETY: offset within the allocation (tensor invariant).
            let p = t
                .storage
                .host_ptr()
                .map(|b| (unsafe { b.add(t.offset) }, t.nbytes()));
            self.outputs.push((t.clone(), p));
        }
        Ok(())
    }

    /// Outputs must not overlap each other or an output leased so far.
    fn check_outputs_disjoint(&self, outputs: &[Tensor]) -> Result<()> {
        for (i, t) in outputs.iter().enumerate() {
            let mut earlier = self.outputs.iter().map(|(u, _)| u).chain(&outputs[..i]);
            let overlaps = earlier.any(|u| {
                u.shares_storage_with(t) && ranges_overlap(&u.byte_range(), &t.byte_range())
            });
            if overlaps && t.nbytes() > 0 {
                return Err(DistError::invalid(format!(
                    "output tensors {i} and another output overlap in memory; each output must be a distinct buffer"
                )));
            }
        }
        Ok(())
    }

    /// The guards an operation needs beyond those held: one write guard per output storage and
    /// one read guard per other input storage (taken now), and the indices of held read
    /// guards that must become write guards.
    fn new_guards(
        &self,
        inputs: &[Tensor],
        outputs: &[Tensor],
    ) -> Result<(Vec<StorageGuard>, Vec<usize>)> {
        let mut fresh: Vec<StorageGuard> = Vec::new();
        let mut upgrades = Vec::new();
        let wanted = outputs.iter().map(|t| (t, true));
        for (t, write) in wanted.chain(inputs.iter().map(|t| (t, false))) {
            let same = |g: &StorageGuard| Arc::ptr_eq(&g.storage, &t.storage);
            match self._guards.iter().position(same) {
                Some(k) if write && !self._guards[k].write && !upgrades.contains(&k) => {
                    upgrades.push(k)
                }
                Some(_) => {}
                None if fresh.iter().any(same) => {}
                None => fresh.push(StorageGuard::acquire(&t.storage, write)?),
            }
        }
        Ok((fresh, upgrades))
    }

    /// Host inputs leased earlier that new `outputs` overlap are copied now, before anything
    /// writes the outputs.
    fn snapshot_inputs_under(&mut self, outputs: &[Tensor]) {
        for (t, src) in &mut self.inputs {
            let InputSrc::Borrowed(p, n) = *src else {
                continue;
            };
            let hit = outputs.iter().any(|o| {
                o.shares_storage_with(t) && ranges_overlap(&o.byte_range(), &t.byte_range())
            });
            if hit {
                // SAFETY: the read (or own write) lease held here keeps the bytes valid, and
                // nothing writes them before this call returns.
                let snap = unsafe { std::slice::from_raw_parts(p, n) }.to_vec();
                *src = InputSrc::Snapshot(snap);
            }
        }
    }

    /// The leased input tensors.
    pub fn input_tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.inputs.iter().map(|(t, _)| t)
    }

    /// The leased output tensors.
    pub fn output_tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.outputs.iter().map(|(t, _)| t)
    }

    /// Host views of all inputs (read-only) and all outputs (writable) at once.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when any tensor lives on a device.
    pub fn host_slices(&mut self) -> Result<HostSlices<'_>> {
        let mut ins = Vec::with_capacity(self.inputs.len());
        for (t, src) in &self.inputs {
            ins.push(match src {
                // SAFETY: read lease (or our own write lease on a storage no output overlaps in this
                // range) keeps the bytes valid and unwritten while `self` is borrowed.
                InputSrc::Borrowed(p, n) => unsafe { std::slice::from_raw_parts(*p, *n) },
                InputSrc::Snapshot(v) => v.as_slice(),
                InputSrc::Device => {
                    return Err(DistError::invalid(format!(
                        "expected a CPU tensor, got {t:?}"
                    )))
                }
            });
        }
        let mut outs = Vec::with_capacity(self.outputs.len());
        for (t, p) in &self.outputs {
            let (p, n) =
                p.ok_or_else(|| DistError::invalid(format!("expected a CPU tensor, got {t:?}")))?;
            // SAFETY: outputs are pairwise disjoint (checked in `acquire`), no borrowed input overlaps
            // them, and we hold the write lease; `&mut self` prevents a second call while these live.
            outs.push(unsafe { std::slice::from_raw_parts_mut(p, n) });
        }
        Ok((ins, outs))
    }
}

/// True when the byte ranges share a byte (an empty range overlaps nothing).
/// Read-only input views and writable output views, as returned by [`TensorLeases::host_slices`].
pub type HostSlices<'a> = (Vec<&'a [u8]>, Vec<&'a mut [u8]>);

/// Where an operation reads input `t` from: host memory that an output of the same lease set
/// overlaps is copied now (the lease set holds the write lease on it); other host memory is
/// read in place; device memory through the tensor's pointer.
fn input_src(t: &Tensor, outputs: &[Tensor]) -> InputSrc {
    let Some(base) = t.storage.host_ptr() else {
        return InputSrc::Device;
    };
    // SAFETY: offset is within the allocation (tensor invariant).
    let ptr = unsafe { base.add(t.offset) };
    let overlaps = outputs
        .iter()
        .any(|o| o.shares_storage_with(t) && ranges_overlap(&o.byte_range(), &t.byte_range()));
    if overlaps {
        // SAFETY: the write lease on this storage is held by the caller's lease set, so no one
        // else writes it; the range lies within the allocation.
        let snap = unsafe { std::slice::from_raw_parts(ptr, t.nbytes()) }.to_vec();
        InputSrc::Snapshot(snap)
    } else {
        InputSrc::Borrowed(ptr, t.nbytes())
    }
}

fn ranges_overlap(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}
