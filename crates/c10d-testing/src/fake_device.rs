//! [`HostBackedDevice`]: "CUDA" memory kept in host memory, with every [`DeviceStorage`] hook
//! (host copies, on-device copies, zeroing, zeroed allocation), so that device paths of
//! device-agnostic code (DDP's Reducer with buckets beside its parameters) run and are checked
//! on machines without a GPU, through a backend that takes device tensors (gloo stages them
//! through host memory, as `"cuda:gloo"`).

use c10d_core::{DType, Device, DeviceStorage, DistError, Element, Result, Tensor};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Host bytes standing in for memory of `cuda:ordinal`. On-device copies between two of them
/// are counted (shared by every storage allocated from one another), so a test can tell that
/// the device path ran rather than a copy through the host.
pub struct HostBackedDevice {
    bytes: Mutex<Vec<u8>>,
    ordinal: u32,
    device_ops: Arc<AtomicUsize>,
}

impl HostBackedDevice {
    /// A tensor of `shape` holding `values` on `cuda:ordinal`.
    ///
    /// # Panics
    /// When `values` does not have `shape`'s element count (a test's own mistake).
    pub fn tensor<T: Element>(values: &[T], shape: &[usize], ordinal: u32) -> Tensor {
        let host = Tensor::from_vec_shaped(values.to_vec(), shape).expect("values fit the shape");
        let bytes = host
            .read_bytes(|b| b.to_vec())
            .expect("a fresh host tensor");
        let st = HostBackedDevice {
            bytes: Mutex::new(bytes),
            ordinal,
            device_ops: Arc::new(AtomicUsize::new(0)),
        };
        Tensor::from_device_storage(Arc::new(st), T::DTYPE, shape).expect("sized to fit")
    }

    /// Zeros of `dtype` and `shape` on `cuda:ordinal`.
    pub fn zeros(dtype: DType, shape: &[usize], ordinal: u32) -> Tensor {
        let nbytes = shape.iter().product::<usize>() * dtype.size();
        let st = HostBackedDevice {
            bytes: Mutex::new(vec![0; nbytes]),
            ordinal,
            device_ops: Arc::new(AtomicUsize::new(0)),
        };
        Tensor::from_device_storage(Arc::new(st), dtype, shape).expect("sized to fit")
    }

    /// How many on-device copies and zero fills `t`'s storage, and every storage allocated from
    /// it (or it from), have run; `None` for a tensor of another storage.
    pub fn device_ops(t: &Tensor) -> Option<usize> {
        let st = t
            .device_storage()?
            .as_any()
            .downcast_ref::<HostBackedDevice>()?;
        Some(st.device_ops.load(Ordering::Relaxed))
    }

    fn range(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
        let n = self.bytes.lock().unwrap_or_else(|e| e.into_inner()).len();
        match offset.checked_add(len) {
            Some(end) if end <= n => Ok(offset..end),
            _ => Err(DistError::invalid(format!(
                "{len} bytes at {offset} are outside a {n}-byte fake device storage"
            ))),
        }
    }
}

impl DeviceStorage for HostBackedDevice {
    fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }
    fn device_ptr(&self) -> u64 {
        self.bytes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ptr() as u64
    }
    fn nbytes(&self) -> usize {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
    fn last_stream(&self) -> Option<u64> {
        None
    }
    fn record_stream(&self, _: u64) {}
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let r = self.range(offset, dst.len())?;
        dst.copy_from_slice(&self.bytes.lock().unwrap_or_else(|e| e.into_inner())[r]);
        Ok(())
    }
    fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let r = self.range(offset, src.len())?;
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())[r].copy_from_slice(src);
        Ok(())
    }
    fn copy_from_device(
        &self,
        offset: usize,
        src: &dyn DeviceStorage,
        src_offset: usize,
        nbytes: usize,
    ) -> Result<()> {
        self.device_ops.fetch_add(1, Ordering::Relaxed);
        c10d_core::copy_through_host(self, offset, src, src_offset, nbytes)
    }
    fn fill_zero(&self, offset: usize, nbytes: usize) -> Result<()> {
        let r = self.range(offset, nbytes)?;
        self.device_ops.fetch_add(1, Ordering::Relaxed);
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())[r].fill(0);
        Ok(())
    }
    fn alloc_zeroed(&self, nbytes: usize) -> Result<Arc<dyn DeviceStorage>> {
        Ok(Arc::new(HostBackedDevice {
            bytes: Mutex::new(vec![0; nbytes]),
            ordinal: self.ordinal,
            device_ops: self.device_ops.clone(),
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
