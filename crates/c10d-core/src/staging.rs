//! Device tensors through a CPU backend, as PyTorch's Gloo takes CUDA tensors: [`Staged`]
//! wraps any CPU [`Backend`]; an op given device tensors runs on host copies of them (made on
//! the caller's current stream before the op is handed over), and its `Work` completes once the
//! results have been copied back into the device tensors. CPU tensors pass straight through.
//!
//! The copies go through [`crate::DeviceStorage`], so this needs no CUDA of its own. It lets
//! several ranks share one GPU (a CPU transport between them), and a `"cpu:gloo,cuda:gloo"`
//! group take both kinds of tensors.
//!
//! Departures from PyTorch's Gloo: the copies are synchronous on the host (PyTorch queues them
//! on streams); the copy back runs on a helper thread once the op finished; and the device
//! tensors are not leased while the op runs (their host copies are): do not touch them before
//! `Work::wait` returns.

use crate::backend::Backend;
use crate::collectives::Collectives;
use crate::error::Result;
use crate::op::{Op, Side};
use crate::options::*;
use crate::tensor::Tensor;
use crate::work::Work;
use std::sync::Arc;

/// A CPU backend that also takes device tensors, staged through host memory.
pub struct Staged {
    inner: Arc<dyn Backend>,
}

/// (device tensor, its host stand-in) pairs to copy back.
type Back = Vec<(Tensor, Tensor)>;

/// `op` with every device tensor replaced by a host copy; the written ones are listed in
/// the returned pairs, to copy back.
fn stage(op: Op) -> Result<(Op, Back)> {
    let mut back = Back::new();
    let staged = op.try_map_tensors(|side, t| {
        if t.is_cpu() {
            return Ok(t);
        }
        let host = t.to_cpu()?;
        if side == Side::Output {
            back.push((t, host.clone()));
        }
        Ok(host)
    })?;
    Ok((staged, back))
}

/// The work that completes once `inner` did and `back` was copied into the device tensors.
fn copy_back(inner: Work, back: Back) -> Work {
    if back.is_empty() {
        return inner;
    }
    let (work, completer) = Work::new(inner.op_type(), inner.sequence_number());
    let spawned = std::thread::Builder::new()
        .name("c10d-staging".into())
        .spawn(move || {
            let r = inner
                .wait()
                .and_then(|()| back.iter().try_for_each(|(dev, host)| dev.copy_from(host)));
            if let Some(src) = inner.source_rank() {
                completer.set_source_rank(src);
            }
            completer.set_outputs(back.into_iter().map(|(d, _)| d).collect());
            completer.complete(r);
        });
    // A failed spawn drops the completer, which fails the work with a clear message.
    drop(spawned);
    work
}

impl Staged {
    /// Wraps a CPU backend.
    pub fn new(inner: Arc<dyn Backend>) -> Staged {
        Staged { inner }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }
}

impl Collectives for Staged {
    fn run(&self, op: Op) -> Result<Work> {
        if op.tensors().all(Tensor::is_cpu) {
            return self.inner.run(op);
        }
        let (host_op, back) = stage(op)?;
        Ok(copy_back(self.inner.run(host_op)?, back))
    }
}

impl Backend for Staged {
    crate::delegate_backend!(
        inner: name,
        rank,
        size,
        device_type,
        timeout,
        set_timeout,
        sequence_number,
        set_sequence_number,
        is_initialized,
        monitored_barrier,
        supports_coalescing,
        start_coalescing,
        end_coalescing,
        supports_splitting,
        abort,
        shutdown,
    );
    fn split(&self, ranks: &[usize], opts: &BackendOptions) -> Result<Option<Arc<dyn Backend>>> {
        Ok(self
            .inner
            .split(ranks, opts)?
            .map(|child| Arc::new(Staged::new(child)) as Arc<dyn Backend>))
    }
    fn shrink(
        &self,
        ranks_to_exclude: &[usize],
        opts: &BackendOptions,
    ) -> Result<Option<Arc<dyn Backend>>> {
        Ok(self
            .inner
            .shrink(ranks_to_exclude, opts)?
            .map(|child| Arc::new(Staged::new(child)) as Arc<dyn Backend>))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::Device;
    use crate::device::DeviceType;
    use crate::tensor::DeviceStorage;
    use std::any::Any;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    /// "Device" memory kept in a host buffer on `cuda:ordinal`: exercises every device path
    /// without a GPU. Counts its on-device copies; allocates (`alloc_zeroed`) only when made
    /// with `can_alloc`.
    pub(crate) struct FakeDevice {
        pub bytes: Mutex<Vec<u8>>,
        pub ordinal: u32,
        pub device_copies: AtomicUsize,
        pub can_alloc: bool,
    }

    impl FakeDevice {
        fn new(bytes: Vec<u8>, ordinal: u32, can_alloc: bool) -> FakeDevice {
            FakeDevice {
                bytes: Mutex::new(bytes),
                ordinal,
                device_copies: AtomicUsize::new(0),
                can_alloc,
            }
        }
    }

    impl DeviceStorage for FakeDevice {
        fn device(&self) -> Device {
            Device::Cuda(self.ordinal)
        }
        fn device_ptr(&self) -> u64 {
            0x1000
        }
        fn nbytes(&self) -> usize {
            self.bytes.lock().unwrap().len()
        }
        fn last_stream(&self) -> Option<u64> {
            None
        }
        fn record_stream(&self, _: u64) {}
        fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            dst.copy_from_slice(&self.bytes.lock().unwrap()[offset..offset + dst.len()]);
            Ok(())
        }
        fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
            self.bytes.lock().unwrap()[offset..offset + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn copy_from_device(
            &self,
            offset: usize,
            src: &dyn DeviceStorage,
            src_offset: usize,
            nbytes: usize,
        ) -> Result<()> {
            self.device_copies.fetch_add(1, Ordering::Relaxed);
            crate::copy_through_host(self, offset, src, src_offset, nbytes)
        }
        fn alloc_zeroed(&self, nbytes: usize) -> Result<Arc<dyn DeviceStorage>> {
            if !self.can_alloc {
                return Err(crate::tensor::cannot_allocate(self.device(), nbytes));
            }
            Ok(Arc::new(FakeDevice::new(
                vec![0; nbytes],
                self.ordinal,
                true,
            )))
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    /// `v` on the fake `cuda:0`, which cannot allocate.
    pub(crate) fn fake_cuda(v: &[f32]) -> Tensor {
        fake_on(0, v, false)
    }

    /// `v` on the fake `cuda:ordinal`.
    pub(crate) fn fake_on(ordinal: u32, v: &[f32], can_alloc: bool) -> Tensor {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let st = FakeDevice::new(bytes, ordinal, can_alloc);
        Tensor::from_device_storage(Arc::new(st), crate::DType::F32, &[v.len()]).unwrap()
    }

    /// A one-rank CPU "backend" whose all_reduce doubles every element, on a thread, and
    /// refuses device tensors as a CPU backend does.
    struct Doubler;

    impl Backend for Doubler {
        fn name(&self) -> &str {
            "doubler"
        }
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn device_type(&self) -> DeviceType {
            DeviceType::Cpu
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(5)
        }
        fn set_timeout(&self, _: Duration) {}
    }

    impl Collectives for Doubler {
        fn run(&self, op: Op) -> Result<Work> {
            let Op::AllReduce { tensors, .. } = op else {
                return Err(op.unsupported_by("doubler"));
            };
            assert!(
                tensors.iter().all(Tensor::is_cpu),
                "a device tensor reached the CPU backend"
            );
            let (w, c) = Work::new(crate::OpType::Allreduce, 1);
            let t = tensors[0].clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let r = t.write(|s: &mut [f32]| s.iter_mut().for_each(|x| *x *= 2.0));
                c.complete(r);
            });
            Ok(w)
        }
    }

    #[test]
    fn device_tensors_round_trip_through_the_host() {
        let t = fake_cuda(&[1.0, 2.0, 3.0]);
        assert_eq!(t.device(), Device::Cuda(0));
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
        assert_eq!(
            t.narrow(1, 2).unwrap().to_vec::<f32>().unwrap(),
            vec![2.0, 3.0]
        );
        t.copy_from(&Tensor::from_vec(vec![7.0f32, 8.0, 9.0]))
            .unwrap();
        assert_eq!(
            t.to_cpu().unwrap().to_vec::<f32>().unwrap(),
            vec![7.0, 8.0, 9.0]
        );
        assert!(t.to_vec::<f64>().is_err());
    }

    #[test]
    fn staged_op_completes_after_the_copy_back() {
        let b = Staged::new(Arc::new(Doubler));
        let dev = fake_cuda(&[1.0, 2.0]);
        let w = b
            .all_reduce(std::slice::from_ref(&dev), &AllreduceOptions::default())
            .unwrap();
        w.wait().unwrap();
        assert_eq!(dev.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        assert_eq!(w.result().len(), 1);
        // CPU tensors pass straight through (the inner work itself).
        let cpu = Tensor::from_vec(vec![5.0f32]);
        b.all_reduce(std::slice::from_ref(&cpu), &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(cpu.to_vec::<f32>().unwrap(), vec![10.0]);
        // What the inner backend lacks stays unsupported, with its name.
        let e = b.barrier(&BarrierOptions::default()).unwrap_err();
        assert!(
            e.message()
                .contains("Backend doubler does not support barrier"),
            "{e}"
        );
    }
}
