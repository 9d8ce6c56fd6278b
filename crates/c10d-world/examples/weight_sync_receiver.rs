//! An inference worker's side of weight sync: join the trainer's group (rank 0, e.g. a
//! PyTorch process on `"c10drs"`), receive one weight update (`c10d_world::weight_sync`), write
//! each tensor's bytes to `$C10D_OUT/<name>.bin` when `C10D_OUT` is set, and print what arrived
//! and how fast. As rank 0 it is a trainer instead, sending `C10D_SYNTH_MIB` (default 1024)
//! of float32 in 64 MiB tensors (for benchmarks).
//!
//! ```sh
//! RANK=1 WORLD_SIZE=3 C10D_STORE_PORT=29500 C10D_OUT=/tmp/w1 \
//!   cargo run -p c10d-world --example weight_sync_receiver
//! ```
//!
//! The store is the trainer's TCPStore on 127.0.0.1 (a client, used as given: the trainer
//! passes its store to `init_process_group` too). `C10D_PACKED=<bytes>` receives packed
//! buffers of that size (the trainer must pack the same way); `C10D_UPDATES=<n>` receives `n`
//! updates, the later ones into the first one's tensors; `C10D_TIMEOUT_S` bounds every step
//! (default 60 s).

mod common;

use c10d_world::weight_sync::ReceiveOptions;
use common::{need, var};
use std::time::Duration;

fn main() -> c10d_core::Result<()> {
    let (rank, world_size, port) = (need("RANK")?, need("WORLD_SIZE")?, need("C10D_STORE_PORT")?);
    let out = std::env::var("C10D_OUT").ok().map(std::path::PathBuf::from);
    let timeout = Duration::from_secs(var("C10D_TIMEOUT_S").unwrap_or(60));
    let w = common::join(rank, world_size, port as u16, timeout)?;
    let opts = ReceiveOptions {
        packed_buffer_bytes: var("C10D_PACKED"),
        ..Default::default()
    };
    let updates: usize = var("C10D_UPDATES").unwrap_or(1);
    if rank == 0 {
        // A Rust trainer (benchmarks): C10D_SYNTH_MIB of float32 in 64 MiB tensors.
        let mib: usize = var("C10D_SYNTH_MIB").unwrap_or(1024);
        let tensors: Vec<(String, c10d_core::Tensor)> = (0..mib.div_ceil(64))
            .map(|i| {
                let t = c10d_core::Tensor::from_vec(vec![i as f32; 16 << 20]);
                (format!("layer{i}.weight"), t)
            })
            .collect();
        for _ in 0..updates {
            w.send_weights(&tensors, &opts)?;
        }
        return w.destroy_process_group(None);
    }
    let mut got = w.receive_weights(&opts)?;
    report(rank, 1, &got);
    for update in 2..=updates {
        // Later updates land in the tensors the first one made, as a server's weights would.
        let mine: Vec<(String, c10d_core::Tensor)> = got
            .tensors
            .iter()
            .map(|(s, t)| (s.name.clone(), t.clone()))
            .collect();
        let next = w.receive_weights_into(&mine, &opts)?;
        report(rank, update, &next);
        got = next;
    }
    if let Some(out) = &out {
        std::fs::create_dir_all(out)?;
        for (spec, t) in &got.tensors {
            let bytes = t.read_bytes(|b| b.to_vec())?;
            std::fs::write(out.join(format!("{}.bin", spec.name)), bytes)?;
        }
    }
    w.destroy_process_group(None)
}

fn report(rank: usize, update: usize, got: &c10d_world::weight_sync::Received) {
    println!(
        "rank {rank} update {update}: received {} tensors, {} bytes in {:.3} s ({:.3} GB/s)",
        got.tensors.len(),
        got.bytes,
        got.seconds,
        got.gb_per_s()
    );
}
