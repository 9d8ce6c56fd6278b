//! The receiving side of trainer-to-inference weight sync: a trainer (rank `src` of a group,
//! typically a PyTorch process) broadcasts a sequence of named tensors; an inference worker
//! (this process) receives them, checks them against what it expects, and reports throughput.
//!
//! The protocol, all over one group's collectives:
//! 1. the trainer broadcasts the manifest with `broadcast_object_list([manifest], src)`, a list
//!    of `(name, shape, dtype)` tuples in send order (`dtype` as PyTorch prints it,
//!    `"torch.float32"`, or bare, `"float32"`); objects are pickled, so a Python trainer sends
//!    a plain list;
//! 2. then either one `broadcast(tensor, src)` per tensor, in manifest order (unpacked), or,
//!    with [`ReceiveOptions::packed_buffer_bytes`], the tensors' bytes concatenated into
//!    uint8 buffers, a buffer closed once its running total reaches the size (vLLM's packed
//!    mode), each buffer one broadcast, with up to [`ReceiveOptions::in_flight`] buffers in
//!    flight.
//!
//! [`pack_plan`] is the packing rule, which the trainer must follow too (a PyTorch trainer
//! sends with `c10d_rs.weight_sync.send_weights`, the Python side of the same rule). Every step is bounded
//! by the group's timeout (or [`ReceiveOptions::timeout`]). A manifest that differs from the
//! expected one fails before any tensor is received, naming the first difference; the protocol
//! has no reply, so the trainer then waits in its first data broadcast until its own timeout.
//! Once data flows, a receiver that fails to store a tensor still takes part in every
//! remaining broadcast (so the group stays in step) and returns the first error at the end.

use crate::call::Rank;
use crate::world::{GroupMember, World};
use c10d_core::{DType, DistError, Result, Tensor, Work};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One manifest entry as it crosses languages: name, shape, dtype name.
pub type ManifestEntry = (String, Vec<i64>, String);

/// A tensor the receiver expects (or received): name, shape, dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The parameter's name (`state_dict` key).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
}

impl TensorSpec {
    /// Bytes of the tensor.
    pub fn nbytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }

    fn from_entry((name, shape, dtype): &ManifestEntry) -> Result<TensorSpec> {
        let bad = |what: String| {
            DistError::invalid(format!("weight sync: manifest entry {name:?}: {what}"))
        };
        let shape = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}"))))
            .collect::<Result<Vec<usize>>>()?;
        let dtype = DType::parse(dtype.trim_start_matches("torch."))
            .map_err(|e| bad(e.message().to_string()))?;
        let elems = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if elems.and_then(|n| n.checked_mul(dtype.size())).is_none() {
            return Err(bad(format!("shape {shape:?} overflows the address space")));
        }
        Ok(TensorSpec {
            name: name.clone(),
            shape,
            dtype,
        })
    }
}

/// How to receive.
#[derive(Debug, Clone, Default)]
pub struct ReceiveOptions {
    /// The trainer's rank (global, or [`Rank::Group`]); default global 0.
    pub src: Option<Rank>,
    /// The group; `None` = WORLD.
    pub group: Option<GroupMember>,
    /// Packed mode: the buffer size in bytes (vLLM's `packed_buffer_size_bytes`, 1 GiB by
    /// default there); `None` = one broadcast per tensor.
    pub packed_buffer_bytes: Option<usize>,
    /// Packed buffers in flight at once (vLLM's `packed_num_buffers`; `None` = 2).
    pub in_flight: Option<usize>,
    /// What the receiver expects; `None` = whatever the manifest says.
    pub expected: Option<Vec<TensorSpec>>,
    /// Bound of each step; `None` = the group's timeout.
    pub timeout: Option<Duration>,
}

/// What was received.
#[derive(Debug)]
pub struct Received {
    /// The tensors, in manifest order, each with its spec.
    pub tensors: Vec<(TensorSpec, Tensor)>,
    /// Bytes of tensor data received.
    pub bytes: usize,
    /// Seconds from the manifest's arrival to the last tensor's.
    pub seconds: f64,
}

impl Received {
    /// Throughput of the tensor data, in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9) / 1e9
    }
}

/// Packed mode's buffers: for each, the manifest indices it carries and its size in bytes.
/// A buffer takes tensors in order and closes once its running total exceeds `buffer_bytes`
/// (strictly, as vLLM's `packed_broadcast_producer` does: a total equal to it stays open); the
/// last buffer holds what is left. The trainer must pack the same way.
pub fn pack_plan(specs: &[TensorSpec], buffer_bytes: usize) -> Vec<(Vec<usize>, usize)> {
    let mut plan: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: Option<(Vec<usize>, usize)> = None;
    for (i, s) in specs.iter().enumerate() {
        let (idx, bytes) = open.get_or_insert_with(|| (Vec::new(), 0));
        idx.push(i);
        *bytes += s.nbytes();
        if *bytes > buffer_bytes {
            plan.extend(open.take());
        }
    }
    plan.extend(open);
    plan
}

/// The first difference between what arrived and what is expected.
fn check_expected(got: &[TensorSpec], want: &[TensorSpec]) -> Result<()> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            return Err(DistError::invalid(format!(
                "weight sync: tensor {i} of the manifest is {} {:?} {}, expected {} {:?} {}",
                g.name, g.shape, g.dtype, w.name, w.shape, w.dtype
            )));
        }
    }
    if got.len() != want.len() {
        return Err(DistError::invalid(format!(
            "weight sync: the manifest has {} tensors, expected {}",
            got.len(),
            want.len()
        )));
    }
    Ok(())
}

impl World {
    /// Sends one weight update from this rank (the trainer's side, as a Python trainer would
    /// send it): the manifest of `tensors`, then their data, unpacked or packed as `opts` says
    /// (`expected` is not used).
    ///
    /// # Errors
    /// A tensor that is not a CPU tensor; the collectives' errors.
    pub fn send_weights(&self, tensors: &[(String, Tensor)], opts: &ReceiveOptions) -> Result<()> {
        let src = opts.src.unwrap_or(Rank::Global(0));
        let specs: Vec<TensorSpec> = tensors.iter().map(|(n, t)| spec_of(n, t)).collect();
        let entries: Vec<ManifestEntry> = specs
            .iter()
            .map(|s| {
                let shape = s.shape.iter().map(|&d| d as i64).collect();
                (s.name.clone(), shape, s.dtype.to_string())
            })
            .collect();
        let mut manifest = [entries];
        self.broadcast_object_list(&mut manifest)
            .src(src)
            .group(opts.group.as_ref())
            .within(opts.timeout)
            .run()?;
        let Some(size) = opts.packed_buffer_bytes else {
            for (_, t) in tensors {
                self.bcast(t, src, opts)?;
            }
            return Ok(());
        };
        for (idx, bytes) in pack_plan(&specs, size) {
            let mut buf = Vec::with_capacity(bytes);
            for i in idx {
                tensors[i].1.read_bytes(|b| buf.extend_from_slice(b))?;
            }
            self.bcast(&Tensor::from_vec(buf), src, opts)?;
        }
        Ok(())
    }

    /// Receives one weight update (see the module docs): the manifest, then every tensor,
    /// into new tensors.
    ///
    /// # Errors
    /// A manifest that does not decode or differs from [`ReceiveOptions::expected`]; the
    /// collectives' errors (a timeout names the step).
    pub fn receive_weights(&self, opts: &ReceiveOptions) -> Result<Received> {
        self.receive(opts, None)
    }

    /// Receives one weight update into tensors the receiver already holds (an inference
    /// server's own parameters, or the previous update's tensors): the manifest must match
    /// them (names, shapes, dtypes, in order), and the data lands in them (directly, or from
    /// the packed buffers, which are allocated per update).
    ///
    /// # Errors
    /// A target that is not a writable CPU tensor free to be written (checked before the
    /// manifest is received); as [`World::receive_weights`]; a manifest that differs from
    /// `targets`.
    pub fn receive_weights_into(
        &self,
        targets: &[(String, Tensor)],
        opts: &ReceiveOptions,
    ) -> Result<Received> {
        for (name, t) in targets {
            t.write_bytes(|_| ()).map_err(|e| {
                e.map_message(|m| format!("weight sync: target {name:?} cannot be written: {m}"))
            })?;
        }
        let opts = ReceiveOptions {
            expected: Some(targets.iter().map(|(n, t)| spec_of(n, t)).collect()),
            ..opts.clone()
        };
        let into: Vec<Tensor> = targets.iter().map(|(_, t)| t.clone()).collect();
        self.receive(&opts, Some(&into))
    }

    fn receive(&self, opts: &ReceiveOptions, into: Option<&[Tensor]>) -> Result<Received> {
        let src = opts.src.unwrap_or(Rank::Global(0));
        let mut manifest: [Vec<ManifestEntry>; 1] = [Vec::new()];
        self.broadcast_object_list(&mut manifest)
            .src(src)
            .group(opts.group.as_ref())
            .within(opts.timeout)
            .run()?;
        let specs = manifest[0]
            .iter()
            .map(TensorSpec::from_entry)
            .collect::<Result<Vec<_>>>()?;
        if let Some(want) = &opts.expected {
            check_expected(&specs, want)?;
        }
        let start = Instant::now();
        let tensors = match opts.packed_buffer_bytes {
            None => (0..specs.len())
                .map(|i| {
                    let t = target(&specs, into, i);
                    self.bcast(&t, src, opts).map(|()| t)
                })
                .collect::<Result<Vec<_>>>()?,
            Some(size) => self.receive_packed(&specs, into, size, src, opts)?,
        };
        let bytes = specs.iter().map(TensorSpec::nbytes).sum();
        Ok(Received {
            tensors: specs.into_iter().zip(tensors).collect(),
            bytes,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// One blocking broadcast of the update's group and bound.
    fn bcast(&self, t: &Tensor, src: Rank, o: &ReceiveOptions) -> Result<()> {
        self.broadcast(t, src)
            .group(o.group.as_ref())
            .within(o.timeout)
            .run()
    }

    fn receive_packed(
        &self,
        specs: &[TensorSpec],
        into: Option<&[Tensor]>,
        size: usize,
        src: Rank,
        o: &ReceiveOptions,
    ) -> Result<Vec<Tensor>> {
        let depth = o.in_flight.unwrap_or(2).max(1);
        let mut out: Vec<Option<Tensor>> = vec![None; specs.len()];
        let mut flight: VecDeque<(Work, Tensor, Vec<usize>)> = VecDeque::new();
        // The first failure; every buffer is still posted and waited for, so the receiver
        // leaves the protocol where the trainer does.
        let mut first: Option<DistError> = None;
        let settle = |done, out: &mut [Option<Tensor>], first: &mut Option<DistError>| {
            if let Err(e) = unpack(done, specs, into, out) {
                first.get_or_insert(e);
            }
        };
        for (idx, bytes) in pack_plan(specs, size) {
            if flight.len() == depth {
                settle(flight.pop_front(), &mut out, &mut first);
            }
            let buf = Tensor::zeros(DType::U8, &[bytes]);
            let started = self
                .broadcast(&buf, src)
                .group(o.group.as_ref())
                .within(o.timeout)
                .start();
            match started {
                Ok(w) => flight.push_back((w, buf, idx)),
                Err(e) => {
                    first.get_or_insert(e);
                    break;
                }
            }
        }
        while !flight.is_empty() {
            settle(flight.pop_front(), &mut out, &mut first);
        }
        match first {
            Some(e) => Err(e),
            None => Ok(out.into_iter().flatten().collect()),
        }
    }
}

/// The spec of a tensor the caller holds.
fn spec_of(name: &str, t: &Tensor) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        shape: t.shape().to_vec(),
        dtype: t.dtype(),
    }
}

/// Where manifest entry `i` lands: the receiver's own tensor, or a new one.
fn target(specs: &[TensorSpec], into: Option<&[Tensor]>, i: usize) -> Tensor {
    match into {
        Some(ts) => ts[i].clone(),
        None => Tensor::zeros(specs[i].dtype, &specs[i].shape),
    }
}

/// Waits for one packed buffer and cuts it into its tensors.
fn unpack(
    done: Option<(Work, Tensor, Vec<usize>)>,
    specs: &[TensorSpec],
    into: Option<&[Tensor]>,
    out: &mut [Option<Tensor>],
) -> Result<()> {
    let Some((work, buf, idx)) = done else {
        return Ok(());
    };
    work.wait()?;
    buf.read_bytes(|bytes| -> Result<()> {
        let mut at = 0;
        for i in idx {
            let n = specs[i].nbytes();
            let t = target(specs, into, i);
            t.write_bytes(|b| b.copy_from_slice(&bytes[at..at + n]))?;
            at += n;
            out[i] = Some(t);
        }
        Ok(())
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, n: usize) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: vec![n],
            dtype: DType::F32,
        }
    }

    #[test]
    fn the_packing_rule() {
        let specs = [spec("a", 10), spec("b", 10), spec("c", 100), spec("d", 1)];
        // 40-byte tensors into 64-byte buffers: a+b (80), c alone (400), d (4).
        let plan = pack_plan(&specs, 64);
        assert_eq!(plan, vec![(vec![0, 1], 80), (vec![2], 400), (vec![3], 4)]);
        // A running total equal to the size keeps the buffer open (vLLM closes on `>`).
        assert_eq!(
            pack_plan(&specs, 80),
            vec![(vec![0, 1, 2], 480), (vec![3], 4)]
        );
        assert_eq!(pack_plan(&specs, 1 << 30), vec![(vec![0, 1, 2, 3], 484)]);
        assert!(pack_plan(&[], 64).is_empty());
    }

    #[test]
    fn manifest_entries_and_expectations() {
        let e: ManifestEntry = ("w".into(), vec![2, 3], "torch.bfloat16".into());
        let s = TensorSpec::from_entry(&e).unwrap();
        assert_eq!(
            (s.shape.clone(), s.dtype, s.nbytes()),
            (vec![2, 3], DType::BF16, 12)
        );
        let bad: ManifestEntry = ("w".into(), vec![-1], "float32".into());
        assert!(TensorSpec::from_entry(&bad)
            .unwrap_err()
            .message()
            .contains("negative"));
        let odd: ManifestEntry = ("w".into(), vec![1], "torch.quint8".into());
        assert!(TensorSpec::from_entry(&odd).is_err());
        let e = check_expected(&[spec("a", 2)], &[spec("a", 3)]).unwrap_err();
        assert!(
            e.message().contains("tensor 0 of the manifest is a [2]"),
            "{e}"
        );
        assert!(check_expected(&[spec("a", 2)], &[]).is_err());
    }
}
