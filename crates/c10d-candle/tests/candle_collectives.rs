//! Collectives on candle tensors, ranks as threads (each its own `World`, "gloo" over one
//! `HashStore`): values differ per rank and element, so an offset or order bug shows; views
//! that share storage see in-place results; bad input is a clear error.

use c10d_testing::world as common;

use c10d_candle as cc;
use c10d_core::ReduceOp;
use candle_core::{DType, Device, IndexOp, Tensor};

/// Bound of every wait.
const T: std::time::Duration = std::time::Duration::from_secs(20);

fn value(r: usize, i: usize) -> f32 {
    (r * 7 + i % 251) as f32
}

fn rank_tensor(r: usize, shape: (usize, usize)) -> Tensor {
    let v: Vec<f32> = (0..shape.0 * shape.1).map(|i| value(r, i)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

#[test]
fn all_reduce_in_place_on_the_tensors_own_storage() {
    let out = common::ranks(3, T, |w, r| {
        let t = rank_tensor(r, (5, 7));
        let view = t.i(1..3).unwrap(); // a contiguous view: rows 1 and 2 only
        cc::all_reduce(&view)
            .op(ReduceOp::Sum)
            .world(w)
            .run()
            .unwrap();
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    });
    for (r, v) in out.iter().enumerate() {
        for (i, x) in v.iter().enumerate() {
            let want = if (7..21).contains(&i) {
                (0..3).map(|q| value(q, i)).sum()
            } else {
                value(r, i)
            };
            assert_eq!(*x, want, "rank {r} element {i}");
        }
    }
}

#[test]
fn broadcast_all_gather_reduce_scatter_send_recv() {
    common::ranks(2, T, |w, r| {
        let t = rank_tensor(r, (4, 3));
        cc::broadcast(&t, 1).world(w).run().unwrap();
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            rank_tensor(1, (4, 3)).to_vec2::<f32>().unwrap()
        );

        let mine = Tensor::new(&[r as i64 * 10, r as i64 * 10 + 1], &Device::Cpu).unwrap();
        let all = cc::all_gather_into_tensor(&mine).world(w).run().unwrap();
        assert_eq!(all.to_vec1::<i64>().unwrap(), [0, 1, 10, 11]);

        let big = rank_tensor(r, (4, 3));
        let part = cc::reduce_scatter_tensor(&big)
            .op(ReduceOp::Max)
            .world(w)
            .run()
            .unwrap();
        assert_eq!(part.dims(), [2, 3]);
        let want: Vec<f32> = (0..6).map(|i| value(1, r * 6 + i)).collect();
        assert_eq!(part.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);

        let u = Tensor::new(&[u32::MAX - 1, 5], &Device::Cpu).unwrap();
        cc::all_reduce(&u).op(ReduceOp::Sum).world(w).run().unwrap();
        assert_eq!(u.to_vec1::<u32>().unwrap(), [u32::MAX - 3, 10]);

        let m = Tensor::zeros((2, 2), DType::BF16, &Device::Cpu).unwrap();
        if r == 0 {
            let src = Tensor::ones((2, 2), DType::BF16, &Device::Cpu).unwrap();
            cc::send(&src, 1).world(w).run().unwrap();
        } else {
            cc::recv(&m, 0).world(w).run().unwrap();
            assert_eq!(
                m.to_dtype(DType::F32)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap(),
                4.0
            );
        }
    });
}

#[test]
fn bad_input_is_a_clear_error() {
    common::ranks(2, T, |w, _r| {
        let t = Tensor::zeros((3, 4), DType::F32, &Device::Cpu).unwrap();
        let e = cc::all_reduce(&t.t().unwrap())
            .op(ReduceOp::Sum)
            .world(w)
            .run()
            .unwrap_err();
        assert!(e.to_string().contains("contiguous"), "{e}");
        let e = cc::reduce_scatter_tensor(&t)
            .op(ReduceOp::Sum)
            .world(w)
            .run()
            .unwrap_err();
        assert!(e.to_string().contains("multiple of 2"), "{e}");
        let u = Tensor::new(&[1u32], &Device::Cpu).unwrap();
        let e = cc::all_reduce(&u)
            .op(ReduceOp::Max)
            .world(w)
            .run()
            .unwrap_err();
        assert!(e.to_string().contains("U32"), "{e}");
    });
}
