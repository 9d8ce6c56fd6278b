//! A candle tensor as a c10d-rs tensor (`with_tensor`, `empty_like`): the candle tensor's own
//! storage, shape and dtype, written in place through the lent tensor; non-contiguous tensors
//! and the closure's errors come back as clear errors.

use c10d_candle as cc;
use c10d_core::{DistError, ErrorKind};
use candle_core::{DType, Device, IndexOp, Tensor};

#[test]
fn a_lent_view_is_the_tensors_own_storage_with_its_shape() {
    let v: Vec<f32> = (0..35).map(|i| i as f32).collect();
    let t = Tensor::from_vec(v, (5, 7), &Device::Cpu).unwrap();
    let rows = t.i(1..3).unwrap();
    let src = c10d_core::Tensor::full(-1f32, &[2, 7]);
    cc::with_tensor(&rows, |ct| {
        assert_eq!(
            (ct.shape(), ct.dtype()),
            (&[2, 7][..], c10d_core::DType::F32)
        );
        assert_eq!(ct.to_vec::<f32>()?[0], 7.0, "starts at row 1");
        ct.copy_from(&src)
    })
    .unwrap();
    let all = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for (i, x) in all.iter().enumerate() {
        let want = if (7..21).contains(&i) { -1.0 } else { i as f32 };
        assert_eq!(*x, want, "element {i}");
    }
}

#[test]
fn u32_is_lent_as_its_i32_bits_and_empty_like_follows_the_tensor() {
    let t = Tensor::new(&[1u32, u32::MAX], &Device::Cpu).unwrap();
    let bits = cc::with_tensor(&t, |ct| ct.to_vec::<i32>()).unwrap();
    assert_eq!(bits, [1, -1]);
    let e = cc::empty_like(&Tensor::zeros((3, 4), DType::BF16, &Device::Cpu).unwrap()).unwrap();
    assert_eq!(
        (e.shape(), e.dtype(), e.device()),
        (&[3, 4][..], c10d_core::DType::BF16, c10d_core::Device::Cpu)
    );
    assert_eq!(cc::empty_like(&t).unwrap().dtype(), c10d_core::DType::I32);
}

#[test]
fn non_contiguous_tensors_and_the_closures_error_come_back() {
    let t = Tensor::zeros((3, 4), DType::F32, &Device::Cpu)
        .unwrap()
        .t()
        .unwrap();
    let e = cc::with_tensor(&t, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("contiguous"), "{e}");
    let t = Tensor::zeros(4, DType::F32, &Device::Cpu).unwrap();
    let e = cc::with_tensor(&t, |_| -> c10d_core::Result<()> {
        Err(DistError::network("from the closure"))
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Network);
    // A handle cloned out of the closure stops working when it returns.
    let kept = cc::with_tensor(&t, |ct| Ok(ct.clone())).unwrap();
    assert!(kept
        .to_vec::<f32>()
        .unwrap_err()
        .to_string()
        .contains("given back"));
}
