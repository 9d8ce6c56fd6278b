//! A Rust rank in a job shared with PyTorch ranks: joins the group through the job's TCPStore
//! with `"gloo"` (PyTorch ranks use `"c10drs"`: the same engine and wire), then runs the same
//! sequence as its PyTorch peers and checks every result: all_reduce, all_gather, broadcast
//! from the last rank, an all_reduce on the subgroup of ranks 0 and 2, barrier, and
//! all_gather_object. Prints `mixed rank R: OK` at the end.
//!
//! ```sh
//! RANK=1 WORLD_SIZE=3 C10D_STORE_PORT=29500 cargo run -p c10d-world --example mixed_rank
//! ```
//!
//! `crates/c10d-python/tests/test_mixed.py` runs it beside a PyTorch rank.

mod common;

use c10d_core::{DistError, Result, Tensor};
use c10d_world::GroupOptions;
use common::need;
use std::time::Duration;

fn expect(what: &str, got: Vec<f32>, want: Vec<f32>) -> Result<()> {
    if got != want {
        return Err(DistError::backend(format!(
            "{what}: got {got:?}, want {want:?}"
        )));
    }
    Ok(())
}

fn main() -> Result<()> {
    let (rank, world, port) = (need("RANK")?, need("WORLD_SIZE")?, need("C10D_STORE_PORT")?);
    let w = common::join(rank, world, port as u16, Duration::from_secs(60))?;
    let sum: f32 = (1..=world).map(|r| r as f32).sum();
    let t = Tensor::from_vec(vec![(rank + 1) as f32; 4]);
    w.all_reduce(&t).run()?;
    expect("all_reduce", t.to_vec()?, vec![sum; 4])?;

    let outs: Vec<Tensor> = (0..world)
        .map(|_| Tensor::from_vec(vec![0f32; 2]))
        .collect();
    w.all_gather(&outs, &Tensor::from_vec(vec![(10 * rank) as f32; 2]))
        .run()?;
    for (r, o) in outs.iter().enumerate() {
        expect("all_gather", o.to_vec()?, vec![(10 * r) as f32; 2])?;
    }

    let last = world - 1;
    let b = Tensor::from_vec((0..3).map(|i| (i + 100 * rank) as f32).collect());
    w.broadcast(&b, last).run()?;
    expect(
        "broadcast",
        b.to_vec()?,
        (0..3).map(|i| (i + 100 * last) as f32).collect(),
    )?;

    let sub = w.new_group(Some(&[0, 2]), GroupOptions::default())?;
    if sub.group().is_some() {
        let s = Tensor::from_vec(vec![rank as f32; 2]);
        w.all_reduce(&s).group(&sub).run()?;
        expect("subgroup all_reduce", s.to_vec()?, vec![2.0; 2])?;
    }
    w.barrier().run()?;

    let names: Vec<String> = w.all_gather_object(&format!("rank{rank}")).run()?;
    let want: Vec<String> = (0..world).map(|r| format!("rank{r}")).collect();
    if names != want {
        return Err(DistError::backend(format!(
            "all_gather_object: got {names:?}"
        )));
    }
    println!("mixed rank {rank}: OK");
    w.destroy_process_group(None)
}
