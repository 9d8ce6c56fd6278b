//! The few tensor operations that run on the device itself, through [`DeviceStorage`]: a copy
//! between two tensors of one device, zeroing, and allocating zeros beside a tensor. They let
//! device-agnostic code (DDP's Reducer keeping its buckets where the gradients live) work on
//! CUDA tensors without linking CUDA.

use super::{checked_numel, DeviceStorage, StorageGuard, StorageKind, Tensor};
use crate::dtype::DType;
use crate::error::{DistError, Result};
use std::sync::Arc;

impl Tensor {
    /// A tensor of zeros of `dtype` and `shape` on this tensor's device
    /// (`Tensor.new_zeros(shape, dtype=dtype)`). Device memory comes from
    /// [`DeviceStorage::alloc_zeroed`] of this tensor's storage.
    ///
    /// # Errors
    /// A shape whose byte size overflows; for a device tensor, what `alloc_zeroed` returns
    /// ([`DistError::Unsupported`] for storages that cannot allocate, out of memory).
    pub fn new_zeros(&self, dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let StorageKind::Device(d) = &self.storage.kind else {
            return Ok(Tensor::zeros(dtype, shape));
        };
        let nbytes = checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| {
                DistError::invalid(format!("new_zeros: shape {shape:?} is too large"))
            })?;
        Tensor::from_device_storage(d.alloc_zeroed(nbytes)?, dtype, shape)
    }

    /// Sets every element to zero (`Tensor.zero_()`); on a device, as
    /// [`DeviceStorage::fill_zero`] orders it.
    ///
    /// # Errors
    /// A storage in use by a collective or read-only; a failed device call.
    pub fn zero_(&self) -> Result<()> {
        let StorageKind::Device(d) = &self.storage.kind else {
            return self.write_bytes(|b| b.fill(0));
        };
        let _g = StorageGuard::acquire(&self.storage, true)?;
        d.fill_zero(self.offset, self.nbytes())
    }

    /// `self.copy_(src)` on the device when both are views of two different storages of one
    /// device; `None` for every other pair (copied through the host).
    pub(super) fn copy_on_device(&self, src: &Tensor) -> Option<Result<()>> {
        let (StorageKind::Device(d), StorageKind::Device(s)) =
            (&self.storage.kind, &src.storage.kind)
        else {
            return None;
        };
        if d.device() != s.device() || Arc::ptr_eq(&self.storage, &src.storage) {
            return None;
        }
        Some(self.copy_between(d.as_ref(), s.as_ref(), src))
    }

    fn copy_between(
        &self,
        dst: &dyn DeviceStorage,
        storage: &dyn DeviceStorage,
        src: &Tensor,
    ) -> Result<()> {
        let _r = StorageGuard::acquire(&src.storage, false)?;
        let _w = StorageGuard::acquire(&self.storage, true)?;
        dst.copy_from_device(self.offset, storage, src.offset, self.nbytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::staging::tests::{fake_cuda, FakeDevice};
    use std::sync::atomic::Ordering;

    fn fake(ordinal: u32, v: &[f32]) -> Tensor {
        crate::staging::tests::fake_on(ordinal, v, true)
    }

    fn copies(t: &Tensor) -> usize {
        let s = t
            .device_storage()
            .unwrap()
            .as_any()
            .downcast_ref::<FakeDevice>();
        s.unwrap().device_copies.load(Ordering::Relaxed)
    }

    #[test]
    fn a_copy_between_views_of_one_device_runs_on_the_device() {
        let src = fake(0, &[1.0, 2.0, 3.0, 4.0]);
        let dst = fake(0, &[0.0; 6]);
        dst.narrow(1, 3)
            .unwrap()
            .copy_from(&src.narrow(1, 3).unwrap())
            .unwrap();
        assert_eq!(dst.to_vec::<f32>().unwrap(), [0.0, 2.0, 3.0, 4.0, 0.0, 0.0]);
        assert_eq!(copies(&dst), 1);
    }

    #[test]
    fn copies_across_devices_or_within_one_storage_go_through_the_host() {
        let a = fake(0, &[1.0, 2.0]);
        let b = fake(1, &[0.0, 0.0]);
        b.copy_from(&a).unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), [1.0, 2.0]);
        let c = fake(0, &[1.0, 2.0, 3.0, 4.0]);
        c.narrow(0, 2)
            .unwrap()
            .copy_from(&c.narrow(2, 2).unwrap())
            .unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), [3.0, 4.0, 3.0, 4.0]);
        assert_eq!(copies(&b) + copies(&c), 0);
    }

    #[test]
    fn new_zeros_lands_on_the_same_device_and_zero_clears_only_the_view() {
        let t = fake(3, &[5.0; 4]);
        let z = t.new_zeros(DType::F32, &[2, 3]).unwrap();
        assert_eq!(
            (z.device(), z.dtype(), z.shape()),
            (Device::Cuda(3), DType::F32, &[2, 3][..])
        );
        assert_eq!(z.to_vec::<f32>().unwrap(), [0.0; 6]);
        t.narrow(1, 2).unwrap().zero_().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [5.0, 0.0, 0.0, 5.0]);
        let host = Tensor::from_vec(vec![1i64, 2]);
        assert_eq!(
            host.new_zeros(DType::I64, &[3])
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            [0, 0, 0]
        );
        host.zero_().unwrap();
        assert_eq!(host.to_vec::<i64>().unwrap(), [0, 0]);
    }

    #[test]
    fn a_storage_that_cannot_allocate_says_so_and_a_busy_one_is_refused() {
        let t = fake_cuda(&[1.0]);
        let e = t.new_zeros(DType::F32, &[4]).unwrap_err();
        assert!(
            e.to_string().contains("cannot allocate memory on cuda:0"),
            "{e}"
        );
        let leases = crate::TensorLeases::acquire(&[], std::slice::from_ref(&t)).unwrap();
        assert!(t.zero_().unwrap_err().to_string().contains("in-flight"));
        drop(leases);
        t.zero_().unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [0.0]);
    }
}
