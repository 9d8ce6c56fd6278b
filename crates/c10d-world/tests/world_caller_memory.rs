//! Collectives on memory the caller owns, over the real gloo backend with ranks as threads:
//! slices and `Vec`s of every element type (blocking), `TensorView`s in a borrow scope
//! (asynchronous), and `ndarray` views (the `ndarray` feature, enabled for tests through the
//! crate's dev-dependency on itself).

use c10d_testing::world as world_common;

use c10d_core::borrowed::scope;
use c10d_core::half::{bf16, f16};
use c10d_core::{c32, c64, Element, ReduceOp, Tensor};
use c10d_world::World;
use ndarray::{Array2, ArrayView2};
use std::fmt::Debug;
use world_common::run_gloo;

const N: usize = 3;

/// all_reduce (in place), all_gather_into_tensor (`&[T]` → `&mut [T]`) and broadcast (in
/// place) on rank `r`'s own memory, with `val` mapping small integers to `T`.
fn borrowed_round_trip<T: Element + PartialEq + Debug>(w: &World, r: usize, val: fn(u8) -> T) {
    let mut summed = vec![val(r as u8 + 1), val(1)];
    w.all_reduce(&mut summed).run().unwrap();
    assert_eq!(summed, [val(6), val(3)], "all_reduce of {:?}", T::DTYPE);

    let mine = [val(r as u8), val(10)];
    let mut all = vec![val(0); 2 * N];
    w.all_gather_into_tensor(&mut all, &mine[..]).run().unwrap();
    let expect: Vec<T> = (0..N as u8).flat_map(|k| [val(k), val(10)]).collect();
    assert_eq!(all, expect, "all_gather of {:?}", T::DTYPE);

    let mut b = vec![val(if r == 2 { 7 } else { 0 }); 3];
    w.broadcast(&mut b[..], 2).run().unwrap();
    assert_eq!(b, [val(7); 3], "broadcast of {:?}", T::DTYPE);
}

#[test]
fn every_element_type_through_borrowed_slices() {
    run_gloo(
        N,
        |_| {},
        |w, r| {
            borrowed_round_trip(w, r, |x| x as f32);
            borrowed_round_trip(w, r, |x| x as f64);
            borrowed_round_trip(w, r, |x| f16::from_f32(x as f32));
            borrowed_round_trip(w, r, |x| bf16::from_f32(x as f32));
            borrowed_round_trip(w, r, |x| x as i8);
            borrowed_round_trip(w, r, |x| x);
            borrowed_round_trip(w, r, |x| x as i16);
            borrowed_round_trip(w, r, |x| x as i32);
            borrowed_round_trip(w, r, |x| x as i64);
            // SUM over bool is a logical or, so the same expectations hold
            borrowed_round_trip(w, r, |x| x != 0);
            borrowed_round_trip(w, r, |x| c32 {
                re: x as f32,
                im: -(x as f32),
            });
            borrowed_round_trip(w, r, |x| c64 {
                re: x as f64,
                im: 2.0 * x as f64,
            });
        },
    );
}

#[test]
fn reduce_scatter_all_to_all_and_reduce_on_slices() {
    let out = run_gloo(
        N,
        |_| {},
        |w, r| {
            let input: Vec<i32> = (0..2 * N as i32).map(|i| i + r as i32).collect();
            let mut mine = [0i32; 2];
            let rs = w.reduce_scatter_tensor(&mut mine[..], &input[..]);
            rs.op(ReduceOp::Max).run().unwrap();
            let mut swapped = vec![0i32; 2 * N];
            w.all_to_all_single(&mut swapped, &input[..]).run().unwrap();
            let mut x = [r as f64 + 1.0];
            w.reduce(&mut x[..], 1).op(ReduceOp::Product).run().unwrap();
            (mine, swapped, x[0])
        },
    );
    // rank r's chunk of the max: rows 2r, 2r+1 plus the largest offset (2)
    assert_eq!(out[1].0, [4, 5]);
    assert_eq!(out[2].1, [4, 5, 5, 6, 6, 7]);
    assert_eq!(out[1].2, 6.0);
}

#[test]
fn views_in_a_borrow_scope_run_asynchronously() {
    let out = run_gloo(
        N,
        |_| {},
        |w, r| {
            let mut grads = vec![r as f32; 4];
            let shard = [r as i64; 2];
            let mut gathered = vec![0i64; 2 * N];
            let escaped = scope(|s| {
                let g = s.view_mut(&mut grads);
                let sh = s.view(&shard);
                let all = s.view_mut(&mut gathered);
                let w1 = w.all_reduce(&g).op(ReduceOp::Sum).start().unwrap();
                let w2 = w.all_gather_into_tensor(&all, &sh).start().unwrap();
                w1.wait().unwrap();
                w2.wait().unwrap();
                // a read-only view cannot be written, on every rank alike
                let e = w.all_reduce(&sh).run().unwrap_err().to_string();
                assert!(e.contains("read-only"), "{e}");
                (*g).clone()
            });
            // the memory is the caller's again; a handle that escaped the scope is cut off
            let e = escaped.to_vec::<f32>().unwrap_err().to_string();
            assert!(e.contains("given back to its owner"), "{e}");
            (grads, gathered)
        },
    );
    assert_eq!(out[0].0, [3.0; 4]);
    assert_eq!(out[2].1, [0, 0, 1, 1, 2, 2]);
}

#[test]
fn borrowed_memory_is_refused_inside_a_coalescing_block() {
    run_gloo(
        2,
        |_| {},
        |w, _| {
            let t = Tensor::from_vec(vec![1.0f32]);
            let mut v = vec![1.0f32];
            let e = w
                .coalescing_manager(None, false, || {
                    w.all_reduce(&t).run()?;
                    w.all_reduce(&mut v).run()
                })
                .unwrap_err()
                .to_string();
            assert!(e.contains("coalescing_manager"), "{e}");
            w.all_reduce(&mut v).run().unwrap();
            assert_eq!(v, [2.0]);
        },
    );
}

#[test]
fn ndarray_views_keep_their_shape_and_must_be_standard_order() {
    let out = run_gloo(
        N,
        |_| {},
        |w, r| {
            let mut a = Array2::from_shape_fn((2, 3), |(i, j)| (i * 3 + j + r) as f64);
            w.all_reduce(a.view_mut()).run().unwrap();
            let mine = Array2::from_elem((1, 2), r as u8);
            let mut all = Array2::<u8>::zeros((N, 2));
            let input: ArrayView2<u8> = mine.view();
            w.all_gather_into_tensor(all.view_mut(), input)
                .run()
                .unwrap();
            let mut t = Array2::<f32>::zeros((2, 3));
            let e = w.all_reduce(t.view_mut().reversed_axes()).run();
            let e = e.unwrap_err().to_string();
            assert!(
                e.contains("not contiguous in standard (row-major) order"),
                "{e}"
            );
            (a, all)
        },
    );
    let sum: Vec<f64> = (0..6).map(|k| (3 * k + 3) as f64).collect();
    assert_eq!(out[0].0.as_slice().unwrap(), &sum[..]);
    assert_eq!(out[1].1, ndarray::array![[0u8, 0], [1, 1], [2, 2]]);
}

#[test]
fn send_and_recv_on_slices() {
    let out = run_gloo(
        2,
        |_| {},
        |w, r| {
            let mut got = [0i16; 3];
            if r == 0 {
                let data = [7i16, 8, 9];
                w.send(&data[..], 1).tag(4).run().unwrap();
            } else {
                let from = w.recv(&mut got[..]).tag(4).run().unwrap();
                assert_eq!(from, 0, "recv from any source names the sender");
            }
            got
        },
    );
    assert_eq!(out[1], [7, 8, 9]);
}
