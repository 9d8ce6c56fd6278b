//! Rank process for benchmarks and process tests of c10d-gloo.
//!
//! ```text
//! c10d-gloo-worker launch --nproc N [--op all_reduce] [--min-bytes 1024] [--max-bytes 67108864] [--iters 20] [--algo auto|direct|ring]
//!     starts a TcpStore server on 127.0.0.1:0 and N rank processes of itself in `bench` mode;
//!     rank 0 prints an nccl-tests style table.
//! c10d-gloo-worker bench --port P --rank R --size N [same options]
//! c10d-gloo-worker allreduce-loop --port P --rank R --size N [--bytes B]
//!     all-reduces forever (until an error); on error prints
//!     "ERROR <unix-ms> <message>" and exits with status 3. Used by the kill test.
//! ```

use c10d_core::{
    AllToAllOptions, AllgatherOptions, AllreduceOptions, Backend, BarrierOptions, BroadcastOptions,
    DType, ReduceScatterOptions, Tensor,
};
use c10d_core::{Collectives, Op};
use c10d_gloo::{AllreduceAlgorithm, GlooOptions, ProcessGroupGloo};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn args() -> (String, HashMap<String, String>) {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_default();
    let mut m = HashMap::new();
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        m.insert(k.trim_start_matches('-').to_string(), v);
    }
    (mode, m)
}

fn get<T: std::str::FromStr>(m: &HashMap<String, String>, k: &str, d: T) -> T {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn connect(m: &HashMap<String, String>) -> (Arc<ProcessGroupGloo>, usize, usize) {
    let port: u16 = get(m, "port", 0);
    let rank: usize = get(m, "rank", 0);
    let size: usize = get(m, "size", 1);
    let store: Arc<dyn Store> = Arc::new(
        TcpStore::new(
            "127.0.0.1",
            port,
            TcpStoreOptions {
                timeout: Duration::from_secs(60),
                wait_for_workers: false,
                ..Default::default()
            },
        )
        .expect("connect to store"),
    );
    let algo = match m.get("algo").map(String::as_str) {
        Some("direct") => AllreduceAlgorithm::Direct,
        Some("ring") => AllreduceAlgorithm::Ring,
        Some("allpairs") => AllreduceAlgorithm::AllPairs,
        _ => AllreduceAlgorithm::Auto,
    };
    let opts = GlooOptions {
        timeout: Duration::from_secs(get(m, "timeout-s", 120)),
        allreduce_algorithm: algo,
        socket_buffer_bytes: get(m, "sockbuf", GlooOptions::default().socket_buffer_bytes),
        local_unix_sockets: get(m, "unix", GlooOptions::default().local_unix_sockets),
        pipeline_chunk_bytes: get(m, "chunk", GlooOptions::default().pipeline_chunk_bytes),
        small_allreduce_bytes: get(m, "small", GlooOptions::default().small_allreduce_bytes),
        ..Default::default()
    };
    let pg = ProcessGroupGloo::new(store, rank, size, opts).expect("create ProcessGroupGloo");
    (pg, rank, size)
}

fn run_op(pg: &ProcessGroupGloo, op: &str, t: &Tensor, out: &Tensor) {
    let n = pg.size();
    let w = match op {
        "all_reduce" => pg.all_reduce(
            std::slice::from_ref(t),
            &AllreduceOptions {
                async_op: false,
                ..Default::default()
            },
        ),
        "broadcast" => pg.broadcast(
            std::slice::from_ref(t),
            &BroadcastOptions {
                async_op: false,
                ..Default::default()
            },
        ),
        "all_gather" => pg.all_gather_into_tensor(
            out,
            t,
            &AllgatherOptions {
                async_op: false,
                ..Default::default()
            },
        ),
        "reduce_scatter" => {
            let o = out.flat_slice(0, t.numel() / n).expect("slice");
            pg.reduce_scatter_tensor(
                &o,
                t,
                &ReduceScatterOptions {
                    async_op: false,
                    ..Default::default()
                },
            )
        }
        "all_to_all" => pg.run(Op::AllToAllSingle {
            output: std::borrow::Cow::Owned(out.flat_slice(0, t.numel()).expect("slice")),
            input: std::borrow::Cow::Borrowed(t),
            output_split_sizes: Vec::new().into(),
            input_split_sizes: Vec::new().into(),
            opts: AllToAllOptions {
                async_op: false,
                ..Default::default()
            },
        }),
        other => panic!("unknown op {other}"),
    };
    w.expect("launch").wait().expect("collective failed");
}

fn bus_factor(op: &str, n: usize) -> f64 {
    let n = n as f64;
    match op {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

fn bench(m: &HashMap<String, String>) {
    let (pg, rank, n) = connect(m);
    let op = m.get("op").cloned().unwrap_or_else(|| "all_reduce".into());
    let min: usize = get(m, "min-bytes", 1024);
    let max: usize = get(m, "max-bytes", 64 << 20);
    let iters: usize = get(m, "iters", 20);
    if rank == 0 {
        println!("# c10d-gloo {op}, {n} ranks, float32, 127.0.0.1");
        println!(
            "{:>12} {:>12} {:>6} {:>12} {:>10} {:>10} {:>8}",
            "size(B)", "count", "type", "time(us)", "algbw", "busbw", "#wrong"
        );
    }
    let mut bytes = min;
    while bytes <= max {
        let count = (bytes / 4).max(n) / n * n;
        let t = Tensor::from_vec(vec![(rank + 1) as f32; count]);
        let out = Tensor::zeros(DType::F32, &[count * n]);
        // Fewer iterations for big messages, more for tiny ones.
        let its = if bytes <= 64 << 10 {
            iters * 20
        } else if bytes >= 16 << 20 {
            iters.div_ceil(2).max(5)
        } else {
            iters
        };
        for _ in 0..5 {
            run_op(&pg, &op, &t, &out);
        }
        pg.barrier(&BarrierOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        let start = Instant::now();
        for _ in 0..its {
            run_op(&pg, &op, &t, &out);
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / its as f64;
        // Correctness of one more run with fresh data.
        let t = Tensor::from_vec(vec![(rank + 1) as f32; count]);
        run_op(&pg, &op, &t, &out);
        let wrong = if op == "all_reduce" {
            let want = (n * (n + 1) / 2) as f32;
            t.to_vec::<f32>()
                .unwrap()
                .iter()
                .filter(|x| **x != want)
                .count()
        } else {
            0
        };
        // nccl-tests convention: all_gather's size is the gathered (output) size.
        let total = if op == "all_gather" {
            count * n * 4
        } else {
            count * 4
        };
        let b = total as f64;
        let algbw = b / us / 1e3;
        if rank == 0 {
            println!(
                "{:>12} {:>12} {:>6} {:>12.1} {:>10.3} {:>10.3} {:>8}",
                total,
                total / 4,
                "float",
                us,
                algbw,
                algbw * bus_factor(&op, n),
                wrong
            );
        }
        bytes *= 4;
    }
    pg.barrier(&BarrierOptions::default())
        .unwrap()
        .wait()
        .unwrap();
}

fn allreduce_loop(m: &HashMap<String, String>) {
    let (pg, rank, _n) = connect(m);
    let bytes: usize = get(m, "bytes", 4 << 20);
    let t = Tensor::from_vec(vec![1.0f32; bytes / 4]);
    println!("READY {rank}");
    loop {
        let r = pg
            .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .and_then(|w| w.wait());
        if let Err(e) = r {
            println!("ERROR {} {}", now_ms(), e);
            std::process::exit(3);
        }
    }
}

fn launch(m: &HashMap<String, String>) {
    let n: usize = get(m, "nproc", 2);
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        port: 0,
        ..Default::default()
    })
    .expect("store server");
    let port = server.port();
    let exe = std::env::current_exe().expect("own path");
    let mut children: Vec<_> = (0..n)
        .map(|r| {
            let mut c = std::process::Command::new(&exe);
            c.arg("bench").args([
                "--port",
                &port.to_string(),
                "--rank",
                &r.to_string(),
                "--size",
                &n.to_string(),
            ]);
            for (k, v) in m {
                if k != "nproc" {
                    c.args([format!("--{k}"), v.clone()]);
                }
            }
            c.spawn().expect("spawn rank")
        })
        .collect();
    let mut ok = true;
    for c in &mut children {
        ok &= c.wait().map(|s| s.success()).unwrap_or(false);
    }
    if !ok {
        std::process::exit(1);
    }
}

fn main() {
    let (mode, m) = args();
    match mode.as_str() {
        "launch" => launch(&m),
        "bench" => bench(&m),
        "allreduce-loop" => allreduce_loop(&m),
        _ => {
            eprintln!("usage: c10d-gloo-worker launch|bench|allreduce-loop [--key value]...");
            std::process::exit(2);
        }
    }
}
