//! Reduction-kernel throughput against `memcpy` of the same bytes.
//!
//! Run: `cargo bench -p c10d-core --bench reduce_kernels`. Prints GB/s for SUM on f32, bf16, f16
//! and i64 and the ratio to a `copy_from_slice` of the same byte count measured in the same run.
//! Bytes counted per element: the destination size (as memcpy's count).

use c10d_core::reduce::reduce_into;
use c10d_core::{DType, ReduceOp};
use std::hint::black_box;
use std::time::Instant;

fn time_it(bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let iters = 20;
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    bytes as f64 / best / 1e9
}

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for &bytes in &[256 << 10, 4 << 20, 64 << 20] {
        let src = vec![1u8; bytes];
        let mut dst = vec![0u8; bytes];
        // Make the byte patterns valid small numbers for every dtype (0x0101...).
        let memcpy = time_it(bytes, || {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        });
        println!("# {} KiB buffers: memcpy {:.2} GB/s", bytes >> 10, memcpy);
        println!("{:<10} {:>10} {:>12}", "dtype", "GB/s", "vs memcpy");
        for dt in [DType::F32, DType::BF16, DType::F16, DType::I64, DType::F64] {
            if let Some(f) = &filter {
                if !dt.short_name().contains(f.as_str()) {
                    continue;
                }
            }
            let mut acc = vec![0u8; bytes];
            let gbs = time_it(bytes, || {
                reduce_into(ReduceOp::Sum, dt, black_box(&mut acc), black_box(&src)).unwrap();
            });
            println!(
                "{:<10} {:>10.2} {:>11.0}%",
                dt.short_name(),
                gbs,
                100.0 * gbs / memcpy
            );
        }
    }
}
