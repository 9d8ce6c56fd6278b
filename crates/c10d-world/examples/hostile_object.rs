//! A 2-rank job in which rank 1 sends a hostile pickle through an object collective and rank 0
//! must refuse it (`cargo xtask chaos`'s "hostile pickle" kinds run it).
//!
//! Rank 1 speaks the object collective's wire pattern with plain tensor ops (sizes, then the
//! payload), so the payload is any bytes it likes: `HOSTILE=memo` (lists of references to
//! lists of references, `HOSTILE_N` levels), `wide` (one list of `HOSTILE_N` Nones referenced
//! 300 000 times), `deep` (lists nested `HOSTILE_N` deep), `length` (a `BINUNICODE`,
//! `BINBYTES8` or `LONG4` declaring more bytes than follow; `HOSTILE_N` picks which).
//! `HOSTILE_OP` is `recv` (`recv_object_list`), `broadcast` (`broadcast_object_list`, src 1)
//! or `all_gather` (`all_gather_object`).
//!
//! Rank 0 prints `hostile_object: refused in MS ms: ERROR` (or `hostile_object: ACCEPTED`)
//! and then `hostile_object: VmHWM KB kB` (its peak resident memory); rank 1 prints
//! `hostile_object: sent N bytes`.
//!
//! ```sh
//! MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 WORLD_SIZE=2 RANK=0 HOSTILE=wide HOSTILE_N=20000 \
//!   HOSTILE_OP=recv cargo run -p c10d-world --example hostile_object
//! ```

use c10d_core::{DType, DistError, Result, Tensor};
use c10d_world::{InitOptions, World};
use std::time::{Duration, Instant};

fn var(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| DistError::invalid(format!("{name} is not set")))
}

/// The hostile pickle of `kind` with parameter `n`.
fn pickle(kind: &str, n: usize) -> Result<Vec<u8>> {
    let mut p = vec![0x80, 2];
    match kind {
        "memo" => {
            // Level 0 an empty list; level i: ten references to level i−1 (10^n values).
            p.extend([b']', b'q', 0]);
            for i in 1..=n.min(250) as u8 {
                p.extend([b']', b'q', i, b'(']);
                for _ in 0..10 {
                    p.extend([b'h', i - 1]);
                }
                p.push(b'e');
            }
        }
        "wide" => {
            p.push(b'(');
            p.extend(std::iter::repeat_n(b'N', n));
            p.extend([b'l', b'q', 0, b'0', b']', b'(']);
            for _ in 0..300_000 {
                p.extend([b'h', 0]);
            }
            p.push(b'e');
        }
        "deep" => {
            p.extend(std::iter::repeat_n(b'(', n - 1));
            p.push(b']');
            p.extend(std::iter::repeat_n(b'l', n - 1));
        }
        "length" => match n % 3 {
            // A few bytes follow, not the declared length.
            0 => p.extend([b'X', 0xff, 0xff, 0xff, 0xff]),
            1 => {
                p.push(0x8e);
                p.extend((1u64 << 40).to_le_bytes());
            }
            _ => {
                p.push(0x8b);
                p.extend(i32::MAX.to_le_bytes());
            }
        },
        other => return Err(DistError::invalid(format!("HOSTILE={other}?"))),
    }
    if kind == "length" {
        p.extend(b"abc");
    }
    p.push(b'.');
    Ok(p)
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Rank 1: the object collective's wire pattern with `bytes` as the object.
fn send_hostile(w: &World, op: &str, bytes: Vec<u8>) -> Result<()> {
    let len = bytes.len();
    match op {
        "recv" => {
            w.send(&Tensor::from_vec(vec![len as i64]), 0).run()?;
            w.send(&Tensor::from_vec(bytes), 0).run()?;
        }
        "broadcast" => {
            w.broadcast(&Tensor::from_vec(vec![len as i64]), 1).run()?;
            w.broadcast(&Tensor::from_vec(bytes), 1).run()?;
        }
        "all_gather" => {
            let all = Tensor::zeros(DType::I64, &[2]);
            w.all_gather_into_tensor(&all, &Tensor::from_vec(vec![len as i64]))
                .run()?;
            let max = all.to_vec::<i64>()?.into_iter().max().unwrap_or(0) as usize;
            let mut padded = bytes;
            padded.resize(max, 0);
            let flat = Tensor::zeros(DType::U8, &[2 * max]);
            w.all_gather_into_tensor(&flat, &Tensor::from_vec(padded))
                .run()?;
        }
        other => return Err(DistError::invalid(format!("HOSTILE_OP={other}?"))),
    }
    println!("hostile_object: sent {len} bytes");
    Ok(())
}

/// Rank 0: the object collective, which must fail.
fn receive(w: &World, op: &str) -> Result<()> {
    let start = Instant::now();
    // Any type: the pickle is refused before it is read as one.
    let mut objs: Vec<Option<String>> = vec![None];
    let got = match op {
        "recv" => w.recv_object_list(&mut objs).run().map(drop),
        "broadcast" => w.broadcast_object_list(&mut objs).src(1).run(),
        "all_gather" => w.all_gather_object(&None::<String>).run().map(drop),
        other => return Err(DistError::invalid(format!("HOSTILE_OP={other}?"))),
    };
    match got {
        Err(e) => println!(
            "hostile_object: refused in {} ms: {e}",
            start.elapsed().as_millis()
        ),
        Ok(()) => println!("hostile_object: ACCEPTED"),
    }
    println!("hostile_object: VmHWM {} kB", vm_hwm_kb());
    Ok(())
}

fn main() -> Result<()> {
    let rank: usize = var("RANK")?
        .parse()
        .map_err(|_| DistError::invalid("RANK"))?;
    let (kind, op) = (var("HOSTILE")?, var("HOSTILE_OP")?);
    let n: usize = var("HOSTILE_N")?
        .parse()
        .map_err(|_| DistError::invalid("HOSTILE_N"))?;
    let w = World::new();
    w.init_process_group(InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    })?;
    if rank == 1 {
        send_hostile(&w, &op, pickle(&kind, n)?)?;
    } else {
        receive(&w, &op)?;
    }
    // Both ranks leave the store before rank 0, its host, goes.
    w.barrier().run()?;
    w.destroy_process_group(None)?;
    Ok(())
}
