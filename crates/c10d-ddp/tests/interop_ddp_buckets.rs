//! DDP bucket assignment against real PyTorch (gated on C10D_TORCH_PYTHON): seeded random
//! parameter lists (sizes, dtypes, limits, with and without a gradient-arrival order) go through
//! both `c10d_ddp::compute_bucket_assignment_by_size` and
//! `torch.distributed._compute_bucket_assignment_by_size`; the results must be equal.
//!
//! Run: `C10D_TORCH_PYTHON=~/.cache/c10d-rs/torch-venv/bin/python cargo test -p c10d-world --test interop_ddp_buckets`

use c10d_core::{DType, Device};
use c10d_ddp::{compute_bucket_assignment_by_size, TensorMeta};
use std::io::Write;
use std::process::{Command, Stdio};

const PY: &str = r#"
import sys, json, torch
import torch.distributed as dist
cases = json.load(sys.stdin)
out = []
for c in cases:
    ts = [torch.empty(n, dtype=getattr(torch, dt)) for n, dt in c["tensors"]]
    idx, lim = dist._compute_bucket_assignment_by_size(ts, c["limits"], [], c["indices"])
    out.append({"indices": [list(b) for b in idx], "limits": list(lim)})
print(json.dumps(out))
"#;

/// SplitMix64, so the cases are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

struct Case {
    tensors: Vec<(usize, DType)>,
    limits: Vec<usize>,
    indices: Vec<usize>,
}

fn cases() -> Vec<Case> {
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::BF16];
    let mut rng = Rng(11);
    (0..200)
        .map(|k| {
            let n = 1 + rng.below(12);
            // Half the cases use one dtype; with a gradient-arrival order and several dtypes the
            // open buckets come out in hash-map order in PyTorch (see the function's docs).
            let ndt = if k % 2 == 0 { 1 } else { 1 + rng.below(4) };
            let tensors = (0..n)
                .map(|_| (1 + rng.below(400_000), dtypes[rng.below(ndt as u64)]))
                .collect();
            let limits = match rng.below(3) {
                0 => vec![1 << 20, 25 << 20],
                1 => vec![1 + rng.below(1 << 20)],
                _ => vec![
                    1 + rng.below(1 << 19),
                    1 + rng.below(1 << 21),
                    1 + rng.below(1 << 20),
                ],
            };
            let mut indices: Vec<usize> = Vec::new();
            if k % 3 == 0 {
                indices = (0..n).collect();
                for i in (1..n).rev() {
                    indices.swap(i, rng.below(i as u64 + 1));
                }
            }
            Case {
                tensors,
                limits,
                indices,
            }
        })
        .collect()
}

fn torch_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        _ => "bfloat16",
    }
}

fn to_json(cases: &[Case]) -> String {
    let v: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            serde_json::json!({
                "tensors": c.tensors.iter().map(|(n, d)| (n, torch_dtype(*d))).collect::<Vec<_>>(),
                "limits": c.limits,
                "indices": c.indices,
            })
        })
        .collect();
    serde_json::Value::Array(v).to_string()
}

fn torch_results(py: &str, input: &str) -> Vec<(Vec<Vec<usize>>, Vec<usize>)> {
    let mut child = Command::new(py)
        .args(["-c", PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start the torch python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    v.into_iter()
        .map(|r| {
            (
                serde_json::from_value(r["indices"].clone()).unwrap(),
                serde_json::from_value(r["limits"].clone()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn bucket_assignment_matches_pytorch() {
    let py = match std::env::var("C10D_TORCH_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            println!("skipped: C10D_TORCH_PYTHON not set");
            return;
        }
    };
    let cases = cases();
    let theirs = torch_results(&py, &to_json(&cases));
    assert_eq!(theirs.len(), cases.len());
    for (k, (c, (t_idx, t_lim))) in cases.iter().zip(theirs).enumerate() {
        let metas: Vec<TensorMeta> = c
            .tensors
            .iter()
            .map(|&(numel, dtype)| TensorMeta {
                dtype,
                device: Device::Cpu,
                numel,
            })
            .collect();
        let ours = compute_bucket_assignment_by_size(&metas, &c.limits, &c.indices).unwrap();
        let mut ours_pairs: Vec<_> = ours
            .bucket_indices
            .iter()
            .cloned()
            .zip(ours.per_bucket_size_limits.iter().copied())
            .collect();
        let mut their_pairs: Vec<_> = t_idx.into_iter().zip(t_lim).collect();
        let several_dtypes = c.tensors.iter().any(|(_, d)| *d != c.tensors[0].1);
        if !c.indices.is_empty() && several_dtypes {
            // Order of the still-open buckets is PyTorch's hash-map order: compare as sets.
            ours_pairs.sort();
            their_pairs.sort();
        }
        assert_eq!(
            ours_pairs, their_pairs,
            "case {k}: tensors {:?}, limits {:?}, indices {:?}",
            c.tensors, c.limits, c.indices
        );
    }
}
