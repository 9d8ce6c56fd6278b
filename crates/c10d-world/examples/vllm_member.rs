//! A Rust member of a vLLM `StatelessProcessGroup` (the group an RL trainer or a vLLM worker
//! forms for weight sync; rank 0 hosts the store), going through the steps a weight-sync
//! receiver takes: the trainer's config by `broadcast_obj`, everyone's name by
//! `all_gather_obj`, objects round a ring by `send_obj`/`recv_obj` (ranks 0, 1, 2), the
//! `ncclUniqueId` that vLLM's
//! `PyNcclCommunicator` broadcasts through the group (read with c10d-nccl's vLLM scheme, as the
//! NCCL communicator would), and a `barrier`. Prints what it got, one `key=value` per line.
//!
//! ```sh
//! RANK=1 WORLD_SIZE=3 C10D_STORE_PORT=29500 cargo run -p c10d-world --example vllm_member
//! ```

mod common;

use c10d_nccl::unique_id::UniqueIdExchange;
use c10d_world::stateless::{StatelessOptions, StatelessProcessGroup};
use common::need;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What the trainer broadcasts first (a Python dict with these keys).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Config {
    model: String,
    tp: i64,
    names: Vec<String>,
    shapes: Vec<Vec<i64>>,
}

fn main() -> c10d_core::Result<()> {
    let (rank, world_size, port) = (need("RANK")?, need("WORLD_SIZE")?, need("C10D_STORE_PORT")?);
    let opts = StatelessOptions {
        store_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let mut g = StatelessProcessGroup::create("127.0.0.1", port as u16, rank, world_size, opts)?;
    let cfg: Config = g.broadcast_obj(None, 0)?;
    println!("config={cfg:?}");
    let all = g.all_gather_obj(&format!("rust{rank}"))?;
    println!("all={}", all.join(","));
    // Round a ring 0 -> 1 -> 2 -> 0 (vLLM's keys do not name the sender: one sender per
    // receiver).
    if rank == 1 {
        let n: i64 = g.recv_obj(0)?;
        g.send_obj(&vec![n, n + 1, n + 2], 2)?;
    } else {
        let v: Vec<i64> = g.recv_obj(1)?;
        println!("from_rank1={v:?}");
        g.send_obj(&("ok".to_string(), 2.5f64), 0)?;
    }
    // vLLM's PyNcclCommunicator: `group.broadcast_obj(unique_id, src=0)`.
    let first = g.take_broadcast_index(0)?;
    let scheme = UniqueIdExchange::Vllm { first };
    let key = scheme.keys(0, "", world_size).remove(0);
    let st = g.store();
    st.wait_timeout(&[key.as_str()], Duration::from_secs(60))?;
    let id = scheme.decode(&key, &st.get(&key)?)?;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    println!("unique_id_key={key}");
    println!("unique_id={hex}");
    g.barrier(Duration::from_secs(60))?;
    println!("done rank={rank}");
    Ok(())
}
