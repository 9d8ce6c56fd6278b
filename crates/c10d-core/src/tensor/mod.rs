//! Tensors: cheap handles to shared storage, safe to hand to asynchronous collectives.
//!
//! A [`Tensor`] is (dtype, shape, byte offset, shared storage). Collectives take
//! *leases* on the storages they touch ([`TensorLeases::acquire`]): a write lease for
//! every output, a read lease for every input. While a lease is held, user access through
//! [`Tensor::read`], [`Tensor::write`], [`Tensor::to_vec`] … returns an error instead of
//! observing a torn write, and a second collective that wants to write the same storage
//! fails with a clear error rather than racing. Leases are dropped when the backend
//! finishes the operation, before its [`crate::Work`] completes.
//!
//! Tensors are always contiguous (row-major). Views made by [`Tensor::narrow`],
//! [`Tensor::reshape`] and [`Tensor::chunk`] share storage with their base.
//!
//! Mirrors `torch.Tensor` as far as collectives need it; there is no autograd and no strides.

use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::{DistError, Result};
use smallvec::SmallVec;
use std::any::Any;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Arc, Mutex};

/// Storage living on an accelerator, implemented by device backends (c10d-nccl over cudarc)
/// so that core never links CUDA.
pub trait DeviceStorage: Send + Sync + 'static {
    /// The device holding the memory (never [`Device::Cpu`]).
    fn device(&self) -> Device;
    /// Raw device pointer of the first byte.
    fn device_ptr(&self) -> u64;
    /// Size in bytes.
    fn nbytes(&self) -> usize;
    /// The stream (as a raw handle) this memory was last used on, if any.
    fn last_stream(&self) -> Option<u64>;
    /// Records the stream a backend used this memory on.
    fn record_stream(&self, stream: u64);
    /// Copies `dst.len()` bytes starting `offset` bytes into the storage to host memory. Ordered
    /// after the work already queued on the caller's stream of this device; returns once the
    /// bytes are in `dst`.
    ///
    /// # Errors
    /// A failed device call (the device's error text).
    fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` into the storage starting `offset` bytes in; ordered as
    /// [`DeviceStorage::copy_to_host`] and finished when it returns.
    ///
    /// # Errors
    /// A failed device call (the device's error text).
    fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()>;
    /// Copies `nbytes` bytes from `src` (starting `src_offset` bytes in) to this storage
    /// (starting `offset` bytes in), both on one device (`Tensor.copy_` between two CUDA
    /// tensors). The copy is ordered after the work queued on the caller's stream of the device
    /// and by its return is either complete or queued on that stream, as the implementation
    /// documents (c10d-nccl: queued, ahead of later work on the stream the thread declared;
    /// complete where it declared none). The default copies through host memory with
    /// [`DeviceStorage::copy_to_host`] and [`DeviceStorage::copy_from_host`].
    ///
    /// # Errors
    /// A range outside either storage; a failed device call (the device's error text).
    fn copy_from_device(
        &self,
        offset: usize,
        src: &dyn DeviceStorage,
        src_offset: usize,
        nbytes: usize,
    ) -> Result<()> {
        copy_through_host(self, offset, src, src_offset, nbytes)
    }
    /// Sets `nbytes` bytes starting `offset` bytes in to zero (`Tensor.zero_`), ordered as
    /// [`DeviceStorage::copy_from_device`]. The default copies zeros from the host.
    ///
    /// # Errors
    /// A range outside the storage; a failed device call.
    fn fill_zero(&self, offset: usize, nbytes: usize) -> Result<()> {
        self.copy_from_host(offset, &vec![0u8; nbytes])
    }
    /// New zeroed memory of `nbytes` bytes on the same device, usable from the caller's stream
    /// of that device when this returns (what `Tensor.new_zeros` allocates). The default
    /// refuses: storages lent by a caller that cannot allocate need not implement it.
    ///
    /// # Errors
    /// [`DistError::Unsupported`] by default; out of memory and other device errors.
    fn alloc_zeroed(&self, nbytes: usize) -> Result<Arc<dyn DeviceStorage>> {
        Err(cannot_allocate(self.device(), nbytes))
    }
    /// Downcasting hook for the backend that created it.
    fn as_any(&self) -> &dyn Any;
}

/// [`DeviceStorage::alloc_zeroed`]'s refusal by a storage that cannot allocate.
pub(crate) fn cannot_allocate(device: Device, nbytes: usize) -> DistError {
    DistError::unsupported(format!(
        "this device storage cannot allocate memory on {device} ({nbytes} bytes asked for)"
    ))
}

/// [`DeviceStorage::copy_from_device`] through a host buffer of `nbytes` bytes.
///
/// # Errors
/// As [`DeviceStorage::copy_to_host`] and [`DeviceStorage::copy_from_host`].
pub fn copy_through_host<D: DeviceStorage + ?Sized>(
    dst: &D,
    offset: usize,
    src: &dyn DeviceStorage,
    src_offset: usize,
    nbytes: usize,
) -> Result<()> {
    let mut bytes = vec![0u8; nbytes];
    src.copy_to_host(src_offset, &mut bytes)?;
    dst.copy_from_host(offset, &bytes)
}

/// Host memory: owned by a type-erased `Vec<T>` (or what `from_raw_host` was given), or, for
/// [`crate::borrowed`] views, a slice the caller lends until [`Tensor::revoke`].
struct HostBuffer {
    ptr: *mut u8,
    nbytes: usize,
    /// What keeps the bytes alive (a `Vec<T>`, taken back out by [`Tensor::into_vec`]); `()`
    /// for a borrowed slice, whose memory the borrow scope keeps alive.
    owner: Mutex<Option<Box<dyn Any + Send>>>,
}

enum StorageKind {
    Host(HostBuffer),
    Device(Arc<dyn DeviceStorage>),
}

/// Shared storage plus its borrow state: 0 free, n > 0 readers, -1 one writer, [`REVOKED`]
/// once borrowed memory has been given back to its owner (no access ever again).
pub(crate) struct Storage {
    kind: StorageKind,
    borrow: AtomicIsize,
    /// False for memory from a shared borrow (`&[T]`): write leases are refused.
    writable: bool,
}

/// Borrow state of a storage whose borrowed memory was given back ([`Tensor::revoke`]).
const REVOKED: isize = isize::MIN;

// SAFETY: the raw pointer in `HostBuffer` points either into memory kept alive by `owner` (a
// `Vec`'s heap allocation, never moved or freed while the storage lives; or what the caller of
// `from_raw_host` vouched for), or into a slice borrowed by a `borrowed::scope`, which stays valid
// until `Tensor::revoke` has set the flag to REVOKED, after which no access is granted. All access
// to the bytes goes through the `borrow` flag (readers/writer exclusion), so sharing the storage
// between threads cannot create a data race in safe code.
unsafe impl Send for Storage {}
// SAFETY: see `Send` above; `&Storage` only exposes bytes through the borrow flag.
unsafe impl Sync for Storage {}

impl Storage {
    fn try_read(&self) -> bool {
        let mut cur = self.borrow.load(Ordering::Acquire);
        loop {
            if cur < 0 {
                return false;
            }
            match self.borrow.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }
    fn try_write(&self) -> bool {
        self.borrow
            .compare_exchange(0, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
    fn release(&self, write: bool) {
        if write {
            self.borrow.store(0, Ordering::Release);
        } else {
            self.borrow.fetch_sub(1, Ordering::AcqRel);
        }
    }
    fn nbytes(&self) -> usize {
        match &self.kind {
            StorageKind::Host(h) => h.nbytes,
            StorageKind::Device(d) => d.nbytes(),
        }
    }
    fn device(&self) -> Device {
        match &self.kind {
            StorageKind::Host(_) => Device::Cpu,
            StorageKind::Device(d) => d.device(),
        }
    }
    fn host_ptr(&self) -> Option<*mut u8> {
        match &self.kind {
            StorageKind::Host(h) => Some(h.ptr),
            StorageKind::Device(_) => None,
        }
    }
}

/// RAII borrow of a storage (read or write).
struct StorageGuard {
    storage: Arc<Storage>,
    write: bool,
}

impl StorageGuard {
    fn acquire(storage: &Arc<Storage>, write: bool) -> Result<Self> {
        if write && !storage.writable {
            return Err(read_only_error());
        }
        let ok = if write {
            storage.try_write()
        } else {
            storage.try_read()
        };
        if ok {
            Ok(StorageGuard {
                storage: storage.clone(),
                write,
            })
        } else if storage.borrow.load(Ordering::Acquire) == REVOKED {
            Err(DistError::invalid(
                "tensor viewed borrowed memory that has been given back to its owner (its borrow scope ended)",
            ))
        } else {
            Err(busy_error(write))
        }
    }
}

impl StorageGuard {
    /// A read guard becomes a write guard when its holder is the storage's only reader.
    fn upgrade(&mut self) -> Result<()> {
        if !self.storage.writable {
            return Err(read_only_error());
        }
        let sole_reader = self
            .storage
            .borrow
            .compare_exchange(1, -1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if !sole_reader {
            return Err(busy_error(true));
        }
        self.write = true;
        Ok(())
    }

    /// Undoes [`StorageGuard::upgrade`].
    fn downgrade(&mut self) {
        self.storage.borrow.store(1, Ordering::Release);
        self.write = false;
    }
}

impl Drop for StorageGuard {
    fn drop(&mut self) {
        self.storage.release(self.write);
    }
}

fn read_only_error() -> DistError {
    DistError::invalid(
        "tensor views memory borrowed as `&[T]` (read-only); it cannot be written or be a collective's output",
    )
}

fn busy_error(write: bool) -> DistError {
    DistError::invalid(format!(
        "tensor is in use by an in-flight collective (wanted {} access); wait() on its Work before using it again",
        if write { "write" } else { "read" }
    ))
}

/// A tensor handle: dtype, shape and a view into shared storage. Cloning is cheap and
/// shares the storage (like assigning a `torch.Tensor` in Python).
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: SmallVec<[usize; 4]>,
    /// Byte offset of the first element in the storage.
    offset: usize,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor(dtype={}, shape={:?}, device={})",
            self.dtype,
            &self.shape[..],
            self.device()
        )
    }
}

/// Element count of a shape, `None` when it overflows `usize` (a zero dimension makes it 0).
fn checked_numel(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d))
}

/// Element count of a shape that is known to fit (every tensor's shape is checked at
/// construction); panics with a clear message for an overflowing one (`zeros`/`full`).
fn numel_of(shape: &[usize]) -> usize {
    checked_numel(shape)
        .unwrap_or_else(|| panic!("shape {shape:?} has more elements than fit in usize"))
}

/// True when every byte is a valid `bool` (0 or 1).
fn valid_bools(b: &[u8]) -> bool {
    b.iter().all(|x| *x <= 1)
}

fn bool_error() -> DistError {
    DistError::invalid(
        "bool tensor holds a byte other than 0 or 1 (written through write_bytes or received from a peer); \
         it cannot be viewed as bool",
    )
}

impl Tensor {
    /// A 1-D tensor that takes ownership of `data` without copying. Shape `[data.len()]`.
    pub fn from_vec<T: Element>(data: Vec<T>) -> Tensor {
        let n = data.len();
        Self::from_vec_shaped(data, &[n]).expect("1-D shape always matches")
    }

    /// A tensor of the given shape that takes ownership of `data` without copying.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the shape's element count differs from `data.len()`.
    pub fn from_vec_shaped<T: Element>(mut data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        if checked_numel(shape) != Some(data.len()) {
            return Err(DistError::invalid(format!(
                "shape {shape:?} has {} elements but the vector holds {}",
                checked_numel(shape).map_or("too many".to_string(), |n| n.to_string()),
                data.len()
            )));
        }
        let nbytes = std::mem::size_of_val(data.as_slice());
        let ptr = data.as_mut_ptr().cast::<u8>();
        Ok(Self::over_host(
            ptr,
            nbytes,
            Box::new(data),
            T::DTYPE,
            shape,
            true,
        ))
    }

    /// A tensor over `nbytes` of host memory at `ptr` that `owner` keeps alive.
    fn over_host(
        ptr: *mut u8,
        nbytes: usize,
        owner: Box<dyn Any + Send>,
        dtype: DType,
        shape: &[usize],
        writable: bool,
    ) -> Tensor {
        let storage = Storage {
            kind: StorageKind::Host(HostBuffer {
                ptr,
                nbytes,
                owner: Mutex::new(Some(owner)),
            }),
            borrow: AtomicIsize::new(0),
            writable,
        };
        Tensor {
            storage: Arc::new(storage),
            dtype,
            shape: shape.into(),
            offset: 0,
        }
    }

    /// A CPU tensor over host memory that something else owns (a `torch.Tensor`, a memory
    /// map, …), without copying. `owner` is kept alive until the last handle to the storage
    /// (including a collective's lease) is dropped; [`Tensor::into_vec`] always copies.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `ptr` is null while the shape is not empty, or is
    /// not aligned for `dtype`.
    ///
    /// # Safety
    /// `ptr` must point to `numel(shape) × dtype.size()` bytes that stay valid for reads and
    /// writes for as long as `owner` lives, and nobody may access them other than through the
    /// returned tensor's handles while a handle is in use (in particular while a collective
    /// owns it) — the rule a `torch.Tensor` passed to a PyTorch collective follows.
    pub unsafe fn from_raw_host(
        ptr: *mut u8,
        dtype: DType,
        shape: &[usize],
        owner: Box<dyn Any + Send>,
    ) -> Result<Tensor> {
        let nbytes = checked_numel(shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| DistError::invalid(format!("shape {shape:?} is too large")))?;
        if nbytes > 0 && (ptr.is_null() || !(ptr as usize).is_multiple_of(dtype.size().min(8))) {
            return Err(DistError::invalid(format!(
                "host pointer {ptr:p} is null or not aligned for {dtype}"
            )));
        }
        // An empty tensor may carry a null pointer; give it a dangling, aligned one instead.
        let ptr = if nbytes == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            ptr
        };
        Ok(Self::over_host(ptr, nbytes, owner, dtype, shape, true))
    }

    /// A CPU tensor over `data` (a slice the caller keeps), without copying. `writable` false
    /// makes every write lease fail (memory from a shared borrow). Used by
    /// [`crate::borrowed`], which ends the tensor's access with [`Tensor::revoke`] before the
    /// borrow ends.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `shape` does not hold `data.len()` elements.
    ///
    /// # Safety
    /// The memory must stay valid for reads (and writes when `writable`) until
    /// [`Tensor::revoke`] has returned on this tensor or one of its views, and nobody may
    /// access it other than through the tensor's handles until then.
    pub(crate) unsafe fn over_slice<T: Element>(
        data: *mut T,
        len: usize,
        shape: &[usize],
        writable: bool,
    ) -> Result<Tensor> {
        if checked_numel(shape) != Some(len) {
            return Err(DistError::invalid(format!(
                "shape {shape:?} does not hold the borrowed slice's {len} elements"
            )));
        }
        let nbytes = len * T::DTYPE.size();
        let ptr = if nbytes == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            data.cast::<u8>()
        };
        let owner = Box::new(());
        Ok(Self::over_host(
            ptr,
            nbytes,
            owner,
            T::DTYPE,
            shape,
            writable,
        ))
    }

    /// Ends every access to this tensor's storage for good: waits until no collective holds a
    /// lease on it (an in-flight op finishes, or fails at its timeout), turns any `bool` byte
    /// other than 0 into 1 (a peer may send any byte; the owner's `bool`s must stay valid),
    /// and then refuses every later read or write through any handle with an error.
    /// Idempotent. The end of a [`crate::borrowed::scope`] does this for every view; a scope
    /// that lends memory this crate cannot see (device memory) does it itself.
    pub fn revoke(&self) {
        let mut pause = std::time::Duration::from_micros(20);
        loop {
            match self
                .storage
                .borrow
                .compare_exchange(0, -1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(REVOKED) => return,
                Err(_) => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(1));
                }
            }
        }
        if self.dtype == DType::Bool && self.storage.writable {
            if let Some(p) = self.storage.host_ptr() {
                // SAFETY: we hold the exclusive write state (-1) set above; the storage's
                // bytes are valid for writes until revocation completes (constructor contract).
                let b = unsafe { std::slice::from_raw_parts_mut(p, self.storage.nbytes()) };
                b.iter_mut().for_each(|x| *x = (*x != 0) as u8);
            }
        }
        self.storage.borrow.store(REVOKED, Ordering::Release);
    }

    /// A CPU tensor of zeros (`torch.zeros(shape, dtype=dtype)`).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n = numel_of(shape);
        macro_rules! z {
            ($t:ty) => {
                Tensor::from_vec_shaped(vec![<$t as Default>::default(); n], shape)
            };
        }
        crate::dispatch_dtype!(dtype, z).expect("shape matches by construction")
    }

    /// A CPU tensor filled with `value`.
    pub fn full<T: Element>(value: T, shape: &[usize]) -> Tensor {
        Tensor::from_vec_shaped(vec![value; numel_of(shape)], shape)
            .expect("shape matches by construction")
    }

    /// Wraps device memory owned by a device backend.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when `shape`×`dtype` needs more bytes than the storage has.
    pub fn from_device_storage(
        storage: Arc<dyn DeviceStorage>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        Self::over_device(storage, dtype, shape, true)
    }

    /// As [`Tensor::from_device_storage`], for device memory lent by a shared borrow: every
    /// write (a collective's output, an in-place op, a host write) is refused with "tensor
    /// views memory borrowed as `&[T]` (read-only) ...".
    ///
    /// # Errors
    /// As [`Tensor::from_device_storage`].
    pub fn from_read_only_device_storage(
        storage: Arc<dyn DeviceStorage>,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor> {
        Self::over_device(storage, dtype, shape, false)
    }

    fn over_device(
        storage: Arc<dyn DeviceStorage>,
        dtype: DType,
        shape: &[usize],
        writable: bool,
    ) -> Result<Tensor> {
        let need = checked_numel(shape).and_then(|n| n.checked_mul(dtype.size()));
        if need.is_none_or(|need| need > storage.nbytes()) {
            return Err(DistError::invalid(format!(
                "device storage of {} bytes is too small for shape {shape:?} of {dtype}",
                storage.nbytes()
            )));
        }
        let st = Storage {
            kind: StorageKind::Device(storage),
            borrow: AtomicIsize::new(0),
            writable,
        };
        Ok(Tensor {
            storage: Arc::new(st),
            dtype,
            shape: shape.into(),
            offset: 0,
        })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape (row-major, contiguous).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// Number of dimensions.
    pub fn dim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel_of(&self.shape)
    }
    /// Size in bytes (`numel * dtype.size()`).
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    /// Byte offset of this view in its storage.
    pub fn storage_offset_bytes(&self) -> usize {
        self.offset
    }
    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.storage.device()
    }
    /// True for host tensors.
    pub fn is_cpu(&self) -> bool {
        matches!(self.device(), Device::Cpu)
    }
    /// True when both handles share one storage (views of the same base).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
    /// True while an in-flight collective holds a write lease on the storage.
    pub fn is_busy(&self) -> bool {
        self.storage.borrow.load(Ordering::Acquire) == -1
    }
    /// The device storage for device tensors (`None` on CPU).
    pub fn device_storage(&self) -> Option<&Arc<dyn DeviceStorage>> {
        match &self.storage.kind {
            StorageKind::Device(d) => Some(d),
            StorageKind::Host(_) => None,
        }
    }
    /// Device pointer of this view's first byte (`None` on CPU).
    pub fn device_ptr(&self) -> Option<u64> {
        self.device_storage()
            .map(|d| d.device_ptr() + self.offset as u64)
    }

    /// A view with another shape and the same element count (`Tensor.view`).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the element counts differ.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if checked_numel(shape) != Some(self.numel()) {
            return Err(DistError::invalid(format!(
                "shape '{shape:?}' is invalid for input of size {}",
                self.numel()
            )));
        }
        Ok(Tensor {
            shape: shape.into(),
            ..self.clone()
        })
    }

    /// A view of rows `start..start+len` along dimension 0 (`Tensor.narrow(0, start, len)`).
    /// A 0-d tensor is treated as shape `[1]`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the range exceeds dimension 0.
    pub fn narrow(&self, start: usize, len: usize) -> Result<Tensor> {
        let rows = self.shape.first().copied().unwrap_or(1);
        if start.checked_add(len).is_none_or(|end| end > rows) {
            return Err(DistError::invalid(format!(
                "narrow: start ({start}) + length ({len}) exceeds dimension size ({rows})"
            )));
        }
        let row_bytes = self.nbytes().checked_div(rows).unwrap_or(0);
        let mut shape = self.shape.clone();
        if shape.is_empty() {
            shape.push(len);
        } else {
            shape[0] = len;
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            dtype: self.dtype,
            shape,
            offset: self.offset + start * row_bytes,
        })
    }

    /// A flat 1-D view of the elements `start..start+len`.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the range exceeds the element count.
    pub fn flat_slice(&self, start: usize, len: usize) -> Result<Tensor> {
        self.reshape(&[self.numel()])?.narrow(start, len)
    }

    /// Splits dimension 0 into `n` equal views (`Tensor.chunk` when divisible).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when dimension 0 is not divisible by `n` or `n == 0`.
    pub fn chunk(&self, n: usize) -> Result<Vec<Tensor>> {
        let rows = self.shape.first().copied().unwrap_or(1);
        if n == 0 || rows % n != 0 {
            return Err(DistError::invalid(format!(
                "cannot split dimension 0 of size {rows} into {n} equal chunks"
            )));
        }
        (0..n)
            .map(|i| self.narrow(i * rows / n, rows / n))
            .collect()
    }

    fn check_dtype<T: Element>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(DistError::invalid(format!(
                "tensor has dtype {} but was accessed as {}",
                self.dtype,
                T::DTYPE
            )));
        }
        Ok(())
    }

    fn host_range(&self) -> Result<*mut u8> {
        let base = self.storage.host_ptr().ok_or_else(|| {
            DistError::invalid(format!(
                "tensor on {} cannot be accessed from the host",
                self.device()
            ))
        })?;
        // SAFETY: offset + nbytes <= storage size is an invariant of every constructor and view.
        Ok(unsafe { base.add(self.offset) })
    }

    /// Runs `f` over the elements as a slice. Mirrors reading a CPU tensor in PyTorch.
    ///
    /// # Errors
    /// Wrong element type, a device tensor, a storage currently written by a collective, or a
    /// bool tensor holding a byte other than 0 or 1.
    pub fn read<T: Element, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.check_dtype::<T>()?;
        self.read_bytes(|b| {
            if T::DTYPE == DType::Bool && !valid_bools(b) {
                return Err(bool_error());
            }
            // SAFETY: `b` is this view's bytes under a read guard; the pointer is aligned for T
            // because the storage was made over a `Vec` or slice of an element type of the same
            // dtype, or checked for alignment by `from_raw_host` (views move by whole
            // elements); `b.len()` is `numel * size_of::<T>()`; bool bytes were checked above.
            Ok(f(unsafe {
                std::slice::from_raw_parts(b.as_ptr().cast::<T>(), self.numel())
            }))
        })?
    }

    /// Runs `f` over the elements as a mutable slice.
    ///
    /// # Errors
    /// Wrong element type, a device tensor, or a storage currently used by a collective.
    pub fn write<T: Element, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.check_dtype::<T>()?;
        self.write_bytes(|b| {
            if T::DTYPE == DType::Bool {
                b.iter_mut().for_each(|x| *x = (*x != 0) as u8);
            }
            // SAFETY: `b` is this view's bytes under the exclusive write guard; alignment and
            // length as in `read`; bool bytes were just normalised to 0 or 1.
            f(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<T>(), self.numel()) })
        })
    }

    /// Runs `f` over the raw bytes of this view.
    ///
    /// # Errors
    /// A device tensor, or a storage currently written by a collective.
    pub fn read_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let ptr = self.host_range()?;
        let _g = StorageGuard::acquire(&self.storage, false)?;
        // SAFETY: as in `read`, bytes need no alignment.
        Ok(f(unsafe { std::slice::from_raw_parts(ptr, self.nbytes()) }))
    }

    /// Runs `f` over the raw bytes of this view, mutably. The caller must keep `bool` elements 0 or 1.
    ///
    /// # Errors
    /// A device tensor, or a storage currently used by a collective.
    pub fn write_bytes<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let ptr = self.host_range()?;
        let _g = StorageGuard::acquire(&self.storage, true)?;
        // SAFETY: as in `write`.
        Ok(f(unsafe {
            std::slice::from_raw_parts_mut(ptr, self.nbytes())
        }))
    }

    /// Copies the elements out (from a device tensor through [`Tensor::to_cpu`]).
    ///
    /// # Errors
    /// As [`Tensor::read`]; for a device tensor, as [`Tensor::to_cpu`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if !self.is_cpu() {
            self.check_dtype::<T>()?;
            return self.to_cpu()?.into_vec();
        }
        self.read(|s: &[T]| s.to_vec())
    }

    /// A CPU copy of this tensor (`Tensor.cpu()`); a CPU tensor is returned as is (shared, as
    /// PyTorch's `.cpu()` of a CPU tensor). A device tensor is copied after the work queued on the
    /// caller's stream, so wait on a collective's `Work` before reading its output.
    ///
    /// # Errors
    /// A storage currently written by a collective; the device's copy error.
    pub fn to_cpu(&self) -> Result<Tensor> {
        let StorageKind::Device(d) = &self.storage.kind else {
            return Ok(self.clone());
        };
        let _g = StorageGuard::acquire(&self.storage, false)?;
        let out = Tensor::zeros(self.dtype, &self.shape);
        out.write_bytes(|b| d.copy_to_host(self.offset, b))??;
        Ok(out)
    }

    /// Takes the elements out, without copying when this handle is the only one and views the
    /// whole storage; otherwise copies.
    ///
    /// # Errors
    /// As [`Tensor::read`].
    pub fn into_vec<T: Element>(self) -> Result<Vec<T>> {
        self.check_dtype::<T>()?;
        if T::DTYPE == DType::Bool && !self.read_bytes(valid_bools)? {
            return Err(bool_error());
        }
        if self.offset == 0
            && self.nbytes() == self.storage.nbytes()
            && Arc::strong_count(&self.storage) == 1
        {
            if let StorageKind::Host(h) = &self.storage.kind {
                let owner = h.owner.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(owner) = owner {
                    match owner.downcast::<Vec<T>>() {
                        Ok(v) => return Ok(*v),
                        Err(o) => *h.owner.lock().unwrap_or_else(|e| e.into_inner()) = Some(o),
                    }
                }
            }
        }
        self.to_vec()
    }

    /// Copies `src`'s bytes into this tensor (`Tensor.copy_`): on the device when both are on
    /// one device ([`DeviceStorage::copy_from_device`]), else through the host.
    ///
    /// # Errors
    /// Dtype or element-count mismatch, busy storages, a device copy error.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        if src.dtype != self.dtype || src.numel() != self.numel() {
            return Err(DistError::invalid(format!(
                "copy_: source {src:?} does not match destination {self:?}"
            )));
        }
        if let Some(done) = self.copy_on_device(src) {
            return done;
        }
        if !src.is_cpu() {
            return self.copy_from(&src.to_cpu()?);
        }
        if let StorageKind::Device(d) = &self.storage.kind {
            let _g = StorageGuard::acquire(&self.storage, true)?;
            return src.read_bytes(|s| d.copy_from_host(self.offset, s))?;
        }
        if src.shares_storage_with(self) {
            let tmp = src.read_bytes(|b| b.to_vec())?;
            return self.write_bytes(|d| d.copy_from_slice(&tmp));
        }
        src.read_bytes(|s| self.write_bytes(|d| d.copy_from_slice(s)))?
    }

    /// A new CPU tensor with a copy of the data (`Tensor.clone`).
    ///
    /// # Errors
    /// As [`Tensor::read_bytes`].
    pub fn deep_clone(&self) -> Result<Tensor> {
        let out = Tensor::zeros(self.dtype, &self.shape);
        out.copy_from(self)?;
        Ok(out)
    }

    fn byte_range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.nbytes()
    }
}

/// Dispatches on a [`DType`] to a macro taking the Rust element type.
///
/// `dispatch_dtype!(dtype, m)` expands to `match dtype { DType::F32 => m!(f32), ... }`.
#[macro_export]
macro_rules! dispatch_dtype {
    ($dtype:expr, $m:ident) => {
        match $dtype {
            $crate::DType::F32 => $m!(f32),
            $crate::DType::F64 => $m!(f64),
            $crate::DType::F16 => $m!($crate::half::f16),
            $crate::DType::BF16 => $m!($crate::half::bf16),
            $crate::DType::I8 => $m!(i8),
            $crate::DType::U8 => $m!(u8),
            $crate::DType::I16 => $m!(i16),
            $crate::DType::I32 => $m!(i32),
            $crate::DType::I64 => $m!(i64),
            $crate::DType::Bool => $m!(bool),
            $crate::DType::Complex64 => $m!($crate::c32),
            $crate::DType::Complex128 => $m!($crate::c64),
        }
    };
}

mod device_ops;
mod leases;
pub use leases::TensorLeases;

#[cfg(test)]
mod tests;
