//! Host-side values for the GPU cases: typed tensors from `f64`s and back, and the expected
//! result of a reduction computed on the host.

use c10d_core::half::{bf16, f16};
use c10d_core::{DType, ReduceOp, Tensor};

/// The dtypes NCCL has that c10d-rs has (complex goes through as pairs of reals).
pub const DTYPES: [DType; 9] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::U8,
    DType::I32,
    DType::I64,
    DType::Bool,
];

/// A CPU tensor of `dtype` holding `v`.
pub fn host(dtype: DType, v: &[f64]) -> Tensor {
    match dtype {
        DType::F32 => Tensor::from_vec(v.iter().map(|&x| x as f32).collect()),
        DType::F64 => Tensor::from_vec(v.to_vec()),
        DType::F16 => Tensor::from_vec(v.iter().map(|&x| f16::from_f64(x)).collect()),
        DType::BF16 => Tensor::from_vec(v.iter().map(|&x| bf16::from_f64(x)).collect()),
        DType::I8 => Tensor::from_vec(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => Tensor::from_vec(v.iter().map(|&x| x as u8).collect()),
        DType::I16 => Tensor::from_vec(v.iter().map(|&x| x as i16).collect()),
        DType::I32 => Tensor::from_vec(v.iter().map(|&x| x as i32).collect()),
        DType::I64 => Tensor::from_vec(v.iter().map(|&x| x as i64).collect()),
        DType::Bool => Tensor::from_vec(v.iter().map(|&x| x != 0.0).collect()),
        other => panic!("no host values for {other}"),
    }
}

/// The values of a tensor that a failed op may still hold (its lease goes when the op's end
/// event has fired, shortly after an abort): retried for up to 10 s.
pub fn read_when_released(t: &Tensor) -> Result<Vec<f64>, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match t.to_cpu() {
            Ok(_) => return Ok(read(t)),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!(
                    "the tensor of a failed op was never given back: {e}"
                ))
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

/// The values of a (CPU or CUDA) tensor as `f64`s.
pub fn read(t: &Tensor) -> Vec<f64> {
    let t = t.to_cpu().expect("to_cpu");
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::F64 => t.to_vec::<f64>().unwrap(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I8 => t
            .to_vec::<i8>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::U8 => t
            .to_vec::<u8>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I16 => t
            .to_vec::<i16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I32 => t
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|x| x as f64)
            .collect(),
        DType::Bool => t
            .to_vec::<bool>()
            .unwrap()
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
        other => panic!("no host values for {other}"),
    }
}

/// Rank `r`'s `i`-th input: 1 or 2 (0 or 1 for bool), so that sums, products, averages and
/// PREMUL_SUM of up to 8 ranks are exact in every dtype.
pub fn input(dtype: DType, r: usize, i: usize) -> f64 {
    let bit = ((r + i) % 2) as f64;
    if dtype == DType::Bool {
        bit
    } else {
        1.0 + bit
    }
}

/// The inputs of rank `r`, `n` elements.
pub fn inputs(dtype: DType, r: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| input(dtype, r, i)).collect()
}

/// The reduction of element `i` over `w` ranks, as the backend must produce it.
pub fn reduced(op: ReduceOp, dtype: DType, w: usize, i: usize) -> f64 {
    let vals: Vec<f64> = (0..w).map(|r| input(dtype, r, i)).collect();
    let sum: f64 = vals.iter().sum();
    let v = match op {
        ReduceOp::Sum => sum,
        ReduceOp::Avg => sum / w as f64,
        ReduceOp::Product => vals.iter().product(),
        ReduceOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
        ReduceOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::PremulSum(f) => f * sum,
        other => panic!("no expected value for {other:?}"),
    };
    if dtype == DType::Bool {
        (v != 0.0) as u8 as f64
    } else {
        v
    }
}

/// Whether `op` applies to `dtype` on NCCL (PREMUL_SUM and AVG on floating types only here).
pub fn applies(op: ReduceOp, dtype: DType) -> bool {
    let float = matches!(dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    match op {
        ReduceOp::Avg | ReduceOp::PremulSum(_) => float,
        _ => true,
    }
}

/// Compares with a tolerance fit for the dtype; `Err` names the first mismatch.
pub fn check(what: &str, got: &[f64], want: &[f64], dtype: DType) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
    }
    let tol = match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        _ => 0.0,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        // Written so that a NaN (never `<=` anything) fails.
        let close = (g - w).abs() <= tol * w.abs().max(1.0);
        if !close {
            return Err(format!("{what}: element {i} is {g}, expected {w}"));
        }
    }
    Ok(())
}

/// Rank `r`'s element `i` for the large cases: different for every rank and, within 251,
/// every element (`r * 7 + i % 251`), so that an offset or a permutation shows; exact in
/// `f32` for sums over up to 8 ranks.
pub fn distinct(r: usize, i: usize) -> f64 {
    (r * 7 + i % 251) as f64
}

/// The suite checks its own checker (a case of the parent): a NaN and an off-by-one offset
/// must fail [`check`], equal values must pass.
pub fn self_check() -> Result<(), String> {
    if check("nan", &[f64::NAN], &[1.0], DType::F32).is_ok() {
        return Err("a NaN passed the value check".into());
    }
    let want: Vec<f64> = (0..300).map(|i| distinct(1, i)).collect();
    let shifted: Vec<f64> = (1..301).map(|i| distinct(1, i)).collect();
    if check("offset", &shifted, &want, DType::F32).is_ok() {
        return Err("values shifted by one element passed the value check".into());
    }
    check("same", &want, &want, DType::F32)
}
