use super::*;

#[test]
fn extended_leases_take_disjoint_halves_of_one_buffer() {
    let buf = Tensor::from_vec(vec![0f32; 8]);
    let (lo, hi) = (buf.narrow(0, 4).unwrap(), buf.narrow(4, 4).unwrap());
    let mut l = TensorLeases::acquire(&[], std::slice::from_ref(&lo)).unwrap();
    l.extend(&[], std::slice::from_ref(&hi)).unwrap();
    assert_eq!(l.output_tensors().count(), 2);
    // Overlapping a leased output is refused, and the buffer stays leased to `l` only.
    let mid = buf.narrow(2, 4).unwrap();
    assert!(l.extend(&[], std::slice::from_ref(&mid)).is_err());
    assert!(TensorLeases::acquire(std::slice::from_ref(&buf), &[]).is_err());
    drop(l);
    assert!(TensorLeases::acquire(&[], &[buf]).is_ok());
}

#[test]
fn extended_leases_upgrade_a_sole_read_and_add_nothing_on_error() {
    let (a, b) = (
        Tensor::from_vec(vec![1u8; 4]),
        Tensor::from_vec(vec![2u8; 4]),
    );
    let mut l = TensorLeases::acquire(std::slice::from_ref(&a), &[]).unwrap();
    // `b` is busy elsewhere: extending with (a written, b read) fails and leaves `a` read.
    let other = TensorLeases::acquire(&[], std::slice::from_ref(&b)).unwrap();
    assert!(l
        .extend(std::slice::from_ref(&b), std::slice::from_ref(&a))
        .is_err());
    assert!(TensorLeases::acquire(std::slice::from_ref(&a), &[]).is_ok());
    drop(other);
    // Sole reader: the read lease becomes the write lease.
    l.extend(&[], std::slice::from_ref(&a)).unwrap();
    assert!(TensorLeases::acquire(std::slice::from_ref(&a), &[]).is_err());
    drop(l);
    // Another reader: no upgrade.
    let mut l = TensorLeases::acquire(std::slice::from_ref(&a), &[]).unwrap();
    let reader = TensorLeases::acquire(std::slice::from_ref(&a), &[]).unwrap();
    assert!(l.extend(&[], std::slice::from_ref(&a)).is_err());
    drop((l, reader));
    assert!(TensorLeases::acquire(&[], &[a]).is_ok());
}

#[test]
fn an_input_leased_earlier_is_copied_before_a_new_output_overlaps_it() {
    let buf = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0]);
    let mut l = TensorLeases::acquire(std::slice::from_ref(&buf), &[]).unwrap();
    l.extend(&[], std::slice::from_ref(&buf)).unwrap();
    {
        let (ins, mut outs) = l.host_slices().unwrap();
        outs[0].fill(0);
        assert_eq!(
            bytemuck::cast_slice::<u8, f32>(ins[0]),
            &[1.0, 2.0, 3.0, 4.0]
        );
    }
}

#[test]
fn zero_copy_round_trip() {
    let v = vec![1.0f32, 2.0, 3.0, 4.0];
    let p = v.as_ptr();
    let t = Tensor::from_vec_shaped(v, &[2, 2]).unwrap();
    assert_eq!(t.shape(), &[2, 2]);
    assert_eq!(t.nbytes(), 16);
    let back: Vec<f32> = t.into_vec().unwrap();
    assert_eq!(
        back.as_ptr(),
        p,
        "into_vec must hand back the same allocation"
    );
}

/// An owner that records when it is dropped.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);
impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn raw_host_memory_is_used_in_place_and_its_owner_outlives_every_handle() {
    let mut mem = vec![1i32, 2, 3, 4, 5, 6];
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // SAFETY: `mem` outlives the tensor (dropped at the end of the test) and is only
    // accessed through it while the tensor lives.
    let t = unsafe {
        Tensor::from_raw_host(
            mem.as_mut_ptr().cast(),
            DType::I32,
            &[2, 3],
            Box::new(DropFlag(dropped.clone())),
        )
    }
    .unwrap();
    t.narrow(1, 1)
        .unwrap()
        .write(|s: &mut [i32]| s.fill(9))
        .unwrap();
    let view = t.reshape(&[6]).unwrap();
    drop(t);
    assert!(
        !dropped.load(Ordering::SeqCst),
        "a view still holds the storage"
    );
    assert_eq!(view.clone().into_vec::<i32>().unwrap(), [1, 2, 3, 9, 9, 9]);
    drop(view);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the owner is released with the last handle"
    );
    assert_eq!(
        mem,
        [1, 2, 3, 9, 9, 9],
        "writes landed in the caller's memory"
    );
}

#[test]
fn raw_host_memory_rejects_null_and_misaligned_pointers() {
    let mut mem = [0u64; 2];
    let base: *mut u8 = mem.as_mut_ptr().cast();
    // SAFETY: both calls fail their checks before the pointers are used.
    let null =
        unsafe { Tensor::from_raw_host(std::ptr::null_mut(), DType::F32, &[2], Box::new(())) };
    assert!(null
        .unwrap_err()
        .to_string()
        .contains("null or not aligned"));
    // SAFETY: as above.
    let odd =
        unsafe { Tensor::from_raw_host(base.wrapping_add(1), DType::F32, &[2], Box::new(())) };
    assert!(odd.is_err());
    // SAFETY: an empty tensor never dereferences its pointer.
    let empty =
        unsafe { Tensor::from_raw_host(std::ptr::null_mut(), DType::F32, &[0], Box::new(())) };
    assert_eq!(empty.unwrap().numel(), 0);
}

#[test]
fn views_share_storage() {
    let t = Tensor::from_vec((0..6i64).collect());
    let v = t.narrow(2, 3).unwrap();
    v.write(|s: &mut [i64]| s[0] = 100).unwrap();
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![0, 1, 100, 3, 4, 5]);
    assert!(t.narrow(4, 3).is_err());
    let c = t.chunk(3).unwrap();
    assert_eq!(c[2].to_vec::<i64>().unwrap(), vec![4, 5]);
    assert!(t.chunk(4).is_err());
    assert!(t.to_vec::<f32>().is_err(), "wrong dtype must be refused");
}

#[test]
fn leases_block_user_access_and_second_writer() {
    let t = Tensor::from_vec(vec![1u8; 8]);
    let l = TensorLeases::acquire(&[], std::slice::from_ref(&t)).unwrap();
    assert!(t.is_busy());
    assert!(t.to_vec::<u8>().is_err());
    let e = TensorLeases::acquire(&[], std::slice::from_ref(&t))
        .err()
        .unwrap();
    assert!(e.to_string().contains("in-flight collective"));
    assert!(TensorLeases::acquire(std::slice::from_ref(&t), &[]).is_err());
    drop(l);
    assert!(!t.is_busy());
    assert_eq!(t.to_vec::<u8>().unwrap(), vec![1; 8]);
}

#[test]
fn overlapping_input_is_snapshotted() {
    let out = Tensor::from_vec(vec![0i32, 0, 7, 0]);
    let inp = out.narrow(2, 1).unwrap();
    let mut l =
        TensorLeases::acquire(std::slice::from_ref(&inp), std::slice::from_ref(&out)).unwrap();
    let (ins, mut outs) = l.host_slices().unwrap();
    outs[0].fill(0);
    assert_eq!(ins[0], 7i32.to_ne_bytes());
}

#[test]
fn overflowing_shapes_are_refused() {
    // A wrapping element count would make a view larger than its storage (out of bounds).
    let big = [1usize << 63, 2];
    assert!(Tensor::from_vec_shaped(Vec::<f32>::new(), &big).is_err());
    let t = Tensor::from_vec(Vec::<f32>::new());
    assert!(t.reshape(&big).is_err());
    assert!(
        t.reshape(&[0, usize::MAX, 2]).is_ok(),
        "a zero dimension makes it empty"
    );
}

#[test]
fn bool_bytes_other_than_0_or_1_never_become_bools() {
    // `write_bytes` (or a peer's bytes received into a bool tensor) can store any byte; a
    // `bool` other than 0/1 is undefined behaviour, so typed access must not expose it.
    let t = Tensor::from_vec(vec![false, true, false]);
    t.write_bytes(|b| b[2] = 2).unwrap();
    assert!(t.read(|s: &[bool]| s.to_vec()).is_err());
    assert!(t.to_vec::<bool>().is_err());
    assert!(t.clone().into_vec::<bool>().is_err());
    // Writing normalises (any non-zero byte is true, as in PyTorch).
    t.write(|s: &mut [bool]| assert_eq!(s, &[false, true, true]))
        .unwrap();
    assert_eq!(t.read_bytes(|b| b.to_vec()).unwrap(), vec![0, 1, 1]);
    assert_eq!(t.into_vec::<bool>().unwrap(), vec![false, true, true]);
    let u = Tensor::from_vec(vec![true]);
    u.write_bytes(|b| b[0] = 7).unwrap();
    assert!(u.into_vec::<bool>().is_err(), "zero-copy path checks too");
}

#[test]
fn overlapping_outputs_are_refused() {
    let t = Tensor::from_vec(vec![0i32; 4]);
    let a = t.narrow(0, 3).unwrap();
    let b = t.narrow(2, 2).unwrap();
    assert!(TensorLeases::acquire(&[], &[a.clone(), b]).is_err());
    let c = t.narrow(3, 1).unwrap();
    assert!(TensorLeases::acquire(&[], &[a.clone(), c]).is_ok());
    // An empty view overlaps nothing, whichever order the outputs come in.
    let e = t.narrow(1, 0).unwrap();
    assert!(TensorLeases::acquire(&[], &[a.clone(), e.clone()]).is_ok());
    assert!(TensorLeases::acquire(&[], &[e, a]).is_ok());
}
