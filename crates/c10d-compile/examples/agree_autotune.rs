//! A toy per-rank autotuner that must not let ranks disagree.
//!
//! Each rank times two variants of a kernel (a naive and a cache-blocked matrix multiply) on its
//! own, so ranks can pick different winners from timing noise alone — in a real JIT that means
//! different graphs and mismatched collectives. The ranks then agree through the compile-sync
//! group: they all-gather their timings, every rank picks the variant with the smallest total time
//! over all ranks (the same data gives the same pick everywhere), and a digest exchange checks the
//! decision is identical on every rank.
//!
//! ```text
//! cargo build -p c10d-run --bin c10drun && cargo build -p c10d-compile --example agree_autotune
//! target/debug/c10drun --nproc-per-node 4 target/debug/examples/agree_autotune
//! ```
//!
//! Each rank prints `rank R: local <variant>, agreed <variant>`.

use c10d_compile::CompileGroups;
use c10d_world as dist;
use std::hint::black_box;
use std::time::{Duration, Instant};

const N: usize = 96;
const REPS: usize = 5;

fn naive(a: &[f32], b: &[f32], c: &mut [f32]) {
    for i in 0..N {
        for j in 0..N {
            let mut s = 0.0;
            for k in 0..N {
                s += a[i * N + k] * b[k * N + j];
            }
            c[i * N + j] = s;
        }
    }
}

fn blocked(a: &[f32], b: &[f32], c: &mut [f32]) {
    const T: usize = 16;
    c.iter_mut().for_each(|x| *x = 0.0);
    for ii in (0..N).step_by(T) {
        for kk in (0..N).step_by(T) {
            for i in ii..(ii + T).min(N) {
                for k in kk..(kk + T).min(N) {
                    let aik = a[i * N + k];
                    for j in 0..N {
                        c[i * N + j] += aik * b[k * N + j];
                    }
                }
            }
        }
    }
}

type Kernel = fn(&[f32], &[f32], &mut [f32]);

/// Best-of-`REPS` wall time of `f`, in microseconds.
fn time(f: Kernel, a: &[f32], b: &[f32], c: &mut [f32]) -> f64 {
    (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f(black_box(a), black_box(b), black_box(&mut *c));
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> c10d_core::Result<()> {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    })?;
    let rank = dist::get_rank(None)?;
    let world_size = dist::get_world_size(None)? as usize;

    let cg = CompileGroups::global();
    cg.set_enable_compiler_collectives(Some(true));

    // Local autotuning: time both variants here only.
    let a: Vec<f32> = (0..N * N).map(|i| (i % 7) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..N * N).map(|i| (i % 5) as f32 * 0.25).collect();
    let mut c = vec![0.0f32; N * N];
    let variants: [(&str, Kernel); 2] = [("naive", naive), ("blocked", blocked)];
    let timings: Vec<(String, f64)> = variants
        .iter()
        .map(|(name, f)| (name.to_string(), time(*f, &a, &b, &mut c)))
        .collect();
    let local = timings
        .iter()
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|t| t.0.clone())
        .expect("two variants");

    // Agreement on the compile-sync group: everyone's timings → the same pick everywhere.
    let all: Vec<Vec<(String, f64)>> = cg.compile_sync_all_gather_object(&timings)?;
    assert_eq!(all.len(), world_size);
    let agreed = variants
        .iter()
        .map(|(name, _)| {
            let total: f64 = all
                .iter()
                .flat_map(|ts| ts.iter().filter(|t| t.0 == *name).map(|t| t.1))
                .sum();
            (name.to_string(), total)
        })
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|t| t.0)
        .expect("two variants");
    // Check: the decision's digest is identical on every rank (errors name any rank that differs).
    cg.compile_sync_digests(agreed.as_bytes())?
        .ensure_identical()?;
    // And the cache-hit agreement: every rank "hits" its tuned kernel only if all do.
    let all_hit = cg.cache_hit_collective(true)?;
    assert!(all_hit);

    println!("rank {rank}: local {local}, agreed {agreed}");

    // Meet before shutting down so no rank's last collective sees a peer leave mid-way.
    let store = dist::World::global().default_store()?;
    c10d_store::store_barrier(
        store.as_ref(),
        "agree_autotune_end",
        world_size,
        Duration::from_secs(60),
    )?;
    dist::destroy_process_group(None)?;
    Ok(())
}
