//! The cases every rank runs. Each returns `Err(text)` on a wrong value or error; the worker
//! prints `case <name> ok` or `case <name> FAILED: <text>` for the parent to collect.

use super::values::{applies, check, host, inputs, read, reduced, DTYPES};
use c10d_core::*;
use c10d_nccl::{memory, NcclEnv, NcclOptions, ProcessGroupNccl};
use c10d_store::{PrefixStore, Store, TcpStore, TcpStoreOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type R = Result<(), String>;

/// This rank's device: `cuda:C10D_GPU_DEVICE` (the parent gives each rank its own GPU when
/// there are enough, else `rank % GPUs` with a distinct `NCCL_HOSTID` per rank).
pub fn dev() -> Device {
    static D: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        let i = std::env::var("C10D_GPU_DEVICE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        Device::Cuda(i)
    })
}

pub struct Ctx {
    pub rank: usize,
    pub world: usize,
    store: Arc<dyn Store>,
    pub pg: ProcessGroupNccl,
    groups: std::cell::Cell<usize>,
}

/// `TORCH_NCCL_ASYNC_ERROR_HANDLING=2`: abort the communicators, keep the process.
fn cleanup_env() -> NcclEnv {
    NcclEnv {
        async_error_handling: c10d_nccl::ErrorHandlingMode::CleanUpOnly,
        ..NcclEnv::default()
    }
}

pub fn e2s(e: DistError) -> String {
    e.to_string()
}

impl Ctx {
    /// A fresh group of every rank, on its own store prefix.
    pub fn group(&self, timeout: Duration, env: NcclEnv) -> Result<ProcessGroupNccl, String> {
        let opts = NcclOptions {
            timeout,
            ..NcclOptions::default()
        };
        self.group_with(opts, env).map(|(g, _)| g)
    }

    /// A fresh group of every rank bound to this rank's device, whose watchdog aborts its
    /// communicator on a timeout or error and keeps the process (mode 2).
    pub fn cleanup_group(&self, timeout: Duration) -> Result<ProcessGroupNccl, String> {
        let g = self.group(timeout, cleanup_env())?;
        g.bind(dev()).map_err(e2s)?;
        Ok(g)
    }

    /// A fresh group of every rank with `opts` (named here), on its own store prefix, which is
    /// returned too.
    pub fn group_with(
        &self,
        opts: NcclOptions,
        env: NcclEnv,
    ) -> Result<(ProcessGroupNccl, Arc<dyn Store>), String> {
        let n = self.groups.get();
        self.groups.set(n + 1);
        let store: Arc<dyn Store> =
            Arc::new(PrefixStore::new(&format!("g{n}/"), self.store.clone()));
        // A name the case chose is kept (it names the unique id's store keys, which the case
        // may read); else the group is `g{n}`.
        let group_name = if opts.group_name.is_empty() {
            format!("g{n}")
        } else {
            opts.group_name.clone()
        };
        let opts = NcclOptions {
            group_name,
            group_desc: format!("case group {n}"),
            ..opts
        };
        let g = ProcessGroupNccl::with_env(store.clone(), self.rank, self.world, opts, env);
        Ok((g.map_err(e2s)?, store))
    }

    /// Every rank says whether it is `ok` to go on with step `tag`; true when all are (the
    /// ranks then take the same branch, so none waits in a collective the others skip).
    pub fn agree(&self, tag: &str, ok: bool) -> Result<bool, String> {
        let n = self.groups.get();
        let key = |r: usize| format!("agree/{n}/{tag}/{r}");
        self.store
            .set(&key(self.rank), if ok { b"1" } else { b"0" })
            .map_err(e2s)?;
        let mut all = true;
        for r in 0..self.world {
            all &= self.store.get(&key(r)).map_err(e2s)? == b"1";
        }
        Ok(all)
    }

    pub fn cuda(&self, dtype: DType, v: &[f64]) -> Result<Tensor, String> {
        memory::from_cpu(&host(dtype, v), dev()).map_err(e2s)
    }

    pub fn zeros(&self, dtype: DType, n: usize) -> Result<Tensor, String> {
        memory::zeros(dtype, &[n], dev()).map_err(e2s)
    }
}

pub fn wait(w: Result<Work>) -> R {
    w.map_err(e2s)?.wait().map_err(e2s)
}

/// Runs the cases; the exit code is 0 unless setting up failed.
pub fn worker(rank: usize) -> i32 {
    let world: usize = std::env::var("C10D_GPU_WORLD").unwrap().parse().unwrap();
    let port: u16 = std::env::var("C10D_GPU_STORE_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let store = TcpStore::new(
        "127.0.0.1",
        port,
        TcpStoreOptions {
            timeout: Duration::from_secs(60),
            ..TcpStoreOptions::default()
        },
    )
    .expect("store client");
    let store: Arc<dyn Store> = Arc::new(store);
    let base = Ctx {
        rank,
        world,
        store: store.clone(),
        // A case that fails on one rank may leave the others waiting in an op of the main
        // group: it times out after 60 s and its communicator is aborted (later cases then
        // fail at once) instead of ending the process.
        pg: match ProcessGroupNccl::with_env(
            Arc::new(PrefixStore::new("main/", store.clone())),
            rank,
            world,
            NcclOptions {
                timeout: Duration::from_secs(60),
                ..NcclOptions::default()
            },
            cleanup_env(),
        ) {
            Ok(pg) => pg,
            Err(e) => {
                println!("case create FAILED: {e}");
                return 1;
            }
        },
        groups: std::cell::Cell::new(0),
    };
    for (name, case) in cases() {
        let t = Instant::now();
        println!("start {name}");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&base)))
            .unwrap_or_else(|p| {
                Err(format!(
                    "panicked: {:?}",
                    p.downcast_ref::<String>()
                        .cloned()
                        .or(p.downcast_ref::<&str>().map(|s| s.to_string()))
                ))
            });
        match r {
            Ok(()) => println!("case {name} ok ({:.0} ms)", t.elapsed().as_secs_f64() * 1e3),
            Err(e) => println!("case {name} FAILED: {}", e.replace('\n', " | ")),
        }
    }
    0
}

type Case = fn(&Ctx) -> R;

use super::caller;
use super::faults::{self, Stuck};
use super::more;

/// Every case a rank runs, in order (`--list` prints them).
pub fn cases() -> Vec<(String, Case)> {
    let mut v: Vec<(String, Case)> = vec![
        (
            "memory_on_this_rank_device".into(),
            more::memory_on_this_rank_device,
        ),
        ("eager_init".into(), eager_init),
        ("all_reduce_every_dtype_and_op".into(), all_reduce_all),
        ("band_refused".into(), band_refused),
        ("complex_sum_and_refusal".into(), complex),
        ("high_priority_stream".into(), high_priority),
        ("all_reduce_coalesced".into(), all_reduce_coalesced),
        ("broadcast_every_dtype".into(), broadcast_all),
        ("reduce".into(), reduce),
        ("all_gather_forms".into(), all_gather_forms),
        ("gather_scatter".into(), gather_scatter),
        ("reduce_scatter_forms".into(), reduce_scatter_forms),
        (
            "all_to_all_single_even_and_uneven".into(),
            all_to_all_single,
        ),
        ("all_to_all_list".into(), all_to_all_list),
        ("send_recv".into(), send_recv),
        ("coalesced_block".into(), coalesced_block),
        (
            "recv_into_two_halves_of_one_buffer".into(),
            more::recv_into_halves,
        ),
        (
            "lazy_communicator_in_a_coalesced_block".into(),
            more::lazy_communicator_in_a_block,
        ),
        (
            "big_and_odd_all_gather_reduce_scatter".into(),
            more::big_gather_and_scatter,
        ),
        ("big_and_odd_all_to_all".into(), more::big_all_to_all),
        (
            "ordered_after_a_late_producer".into(),
            more::ordered_after_a_late_producer,
        ),
        (
            "outstanding_receive_on_another_group".into(),
            more::outstanding_receive_on_another_group,
        ),
        (
            "free_waits_for_the_callers_stream".into(),
            more::free_waits_for_the_callers_stream,
        ),
        (
            "cuda_graph_capture_replayed_three_times".into(),
            more::graph_capture,
        ),
        (
            "no_device_sync_while_a_stream_is_stuck".into(),
            more::no_device_sync_while_a_stream_is_stuck,
        ),
        (
            "unique_id_schemes_torch_legacy_and_vllm".into(),
            more::unique_id_schemes,
        ),
        (
            "cudarc_slices_every_dtype".into(),
            caller::cudarc_every_dtype,
        ),
        (
            "cudarc_views_and_parts_of_buffers".into(),
            caller::cudarc_views,
        ),
        (
            "cudarc_ordered_after_a_late_producer".into(),
            caller::cudarc_ordered_after_a_late_producer,
        ),
        (
            "cudarc_waited_on_another_stream".into(),
            caller::cudarc_waited_on_another_stream,
        ),
        (
            "raw_device_pointer_tensor".into(),
            caller::raw_device_pointer,
        ),
        ("empty_tensors".into(), empty_tensors),
        ("barrier".into(), barrier),
        ("wait_orders_current_stream".into(), wait_orders_stream),
        ("busy_tensor_refused".into(), busy_tensor_refused),
        ("cpu_tensor_refused".into(), cpu_tensor_refused),
        ("flight_recorder".into(), flight_recorder),
        ("split".into(), split),
        ("shrink".into(), shrink),
        ("blocking_wait".into(), faults::blocking_wait),
        ("desynchronised_live_peer".into(), more::desynchronised_peer),
        (
            "teardown_with_work_in_flight".into(),
            more::teardown_with_work_in_flight,
        ),
        (
            "abort_during_communicator_init".into(),
            more::abort_during_init,
        ),
        // These release a stream behind an op whose communicator was aborted: last but one, so
        // that a fault there cannot spoil the other cases.
        (
            "abort_from_another_thread".into(),
            faults::abort_from_thread,
        ),
        ("watchdog_timeout".into(), faults::watchdog_timeout),
        (
            "async_error_during_an_abort_is_the_abort".into(),
            faults::async_error_during_an_abort_is_the_abort,
        ),
        (
            "abort_from_another_thread_during_a_block".into(),
            faults::abort_from_another_thread_during_a_block,
        ),
        (
            "shutdown_after_a_stuck_peer_is_prompt".into(),
            faults::shutdown_after_a_stuck_peer_is_prompt,
        ),
        // Last: the highest rank leaves the job.
        ("dead_peer_fails_the_survivors".into(), faults::dead_peer),
    ];
    if let Ok(only) = std::env::var("C10D_GPU_CASES") {
        v.retain(|(n, _)| only.split(',').any(|o| n.contains(o)));
    }
    v
}

fn eager_init(c: &Ctx) -> R {
    c.pg.bind(dev()).map_err(e2s)?;
    if !c.pg.is_initialized() || c.pg.bound_device() != Some(dev()) {
        return Err("not initialised after bind".into());
    }
    Ok(())
}

const N: usize = 1001;

fn all_reduce_all(c: &Ctx) -> R {
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Product,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::PremulSum(2.0),
    ];
    for dtype in DTYPES {
        for op in ops.iter().copied().filter(|&op| applies(op, dtype)) {
            let t = c.cuda(dtype, &inputs(dtype, c.rank, N))?;
            let o = AllreduceOptions {
                reduce_op: op,
                ..Default::default()
            };
            wait(c.pg.all_reduce(std::slice::from_ref(&t), &o))?;
            let want: Vec<f64> = (0..N).map(|i| reduced(op, dtype, c.world, i)).collect();
            check(
                &format!("all_reduce {op:?} {dtype}"),
                &read(&t),
                &want,
                dtype,
            )?;
        }
    }
    Ok(())
}

fn band_refused(c: &Ctx) -> R {
    let t = c.cuda(DType::I32, &[1.0])?;
    let o = AllreduceOptions {
        reduce_op: ReduceOp::Band,
        ..Default::default()
    };
    match c.pg.all_reduce(&[t], &o) {
        Err(e) if e.message().contains("Cannot use ReduceOp.BAND with NCCL") => Ok(()),
        other => Err(format!("expected PyTorch's BAND refusal, got {other:?}")),
    }
}

/// complex64 all_reduce: SUM as pairs of reals; MAX refused.
fn complex(c: &Ctx) -> R {
    let v: Vec<c10d_core::c32> = (0..5)
        .map(|i| c10d_core::c32 {
            re: (c.rank + i) as f32,
            im: 1.0,
        })
        .collect();
    let t = memory::from_cpu(&Tensor::from_vec(v), dev()).map_err(e2s)?;
    wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    let got = t.to_vec::<c10d_core::c32>().map_err(e2s)?;
    let w = c.world as f32;
    for (i, z) in got.iter().enumerate() {
        let re: f32 = (0..c.world).map(|r| (r + i) as f32).sum();
        if z.re != re || z.im != w {
            return Err(format!("element {i}: {z:?}, expected ({re}, {w})"));
        }
    }
    let o = AllreduceOptions {
        reduce_op: ReduceOp::Max,
        ..Default::default()
    };
    match c.pg.all_reduce(&[t], &o) {
        Err(e) if e.message().contains("complex") => Ok(()),
        other => Err(format!("MAX on complex: {other:?}")),
    }
}

/// A group whose NCCL stream has the highest priority runs ops like any other.
fn high_priority(c: &Ctx) -> R {
    let n = c.groups.get();
    c.groups.set(n + 1);
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(&format!("g{n}/"), c.store.clone()));
    let opts = NcclOptions {
        is_high_priority_stream: true,
        group_name: format!("g{n}"),
        ..NcclOptions::default()
    };
    let g = ProcessGroupNccl::with_env(store, c.rank, c.world, opts, NcclEnv::default())
        .map_err(e2s)?;
    let t = c.cuda(DType::F32, &[1.0; 3])?;
    wait(g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    check(
        "high-priority all_reduce",
        &read(&t),
        &[c.world as f64; 3],
        DType::F32,
    )
}

fn all_reduce_coalesced(c: &Ctx) -> R {
    let ts: Vec<Tensor> = [3usize, 1000, 17]
        .iter()
        .map(|&n| c.cuda(DType::F32, &inputs(DType::F32, c.rank, n)))
        .collect::<Result<_, _>>()?;
    wait(c.pg.all_reduce_coalesced(&ts, &AllreduceCoalescedOptions::default()))?;
    for t in &ts {
        let want: Vec<f64> = (0..t.numel())
            .map(|i| reduced(ReduceOp::Sum, DType::F32, c.world, i))
            .collect();
        check("allreduce_coalesced", &read(t), &want, DType::F32)?;
    }
    Ok(())
}

fn broadcast_all(c: &Ctx) -> R {
    let root = c.world - 1;
    for dtype in DTYPES {
        let mine = if c.rank == root {
            inputs(dtype, root, N)
        } else {
            vec![0.0; N]
        };
        let t = c.cuda(dtype, &mine)?;
        let o = BroadcastOptions {
            root_rank: root,
            ..Default::default()
        };
        wait(c.pg.broadcast(std::slice::from_ref(&t), &o))?;
        check(
            &format!("broadcast {dtype}"),
            &read(&t),
            &inputs(dtype, root, N),
            dtype,
        )?;
    }
    Ok(())
}

fn reduce(c: &Ctx) -> R {
    for dtype in [DType::F32, DType::I64] {
        let t = c.cuda(dtype, &inputs(dtype, c.rank, N))?;
        let o = ReduceOptions {
            reduce_op: ReduceOp::Max,
            root_rank: 0,
            ..Default::default()
        };
        wait(c.pg.reduce(std::slice::from_ref(&t), &o))?;
        if c.rank == 0 {
            let want: Vec<f64> = (0..N)
                .map(|i| reduced(ReduceOp::Max, dtype, c.world, i))
                .collect();
            check("reduce", &read(&t), &want, dtype)?;
        }
    }
    Ok(())
}

/// Rank `r`'s block of `n` (< 40) values: `r*40 + i`, distinct across ranks and exact in bf16
/// up to world size 6.
fn block(r: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| (r * 40 + i) as f64).collect()
}

fn gathered(w: usize, n: usize) -> Vec<f64> {
    (0..w).flat_map(|r| block(r, n)).collect()
}

fn all_gather_forms(c: &Ctx) -> R {
    let n = 37;
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        let input = c.cuda(dtype, &block(c.rank, n))?;
        let outs: Vec<Tensor> = (0..c.world)
            .map(|_| c.zeros(dtype, n))
            .collect::<Result<_, _>>()?;
        wait(c.pg.all_gather(
            std::slice::from_ref(&outs),
            std::slice::from_ref(&input),
            &AllgatherOptions::default(),
        ))?;
        let got: Vec<f64> = outs.iter().flat_map(read).collect();
        check("all_gather list", &got, &gathered(c.world, n), dtype)?;
        let flat = c.zeros(dtype, n * c.world)?;
        wait(c.pg.all_gather_into_tensor(&flat, &input, &AllgatherOptions::default()))?;
        check(
            "all_gather_into_tensor",
            &read(&flat),
            &gathered(c.world, n),
            dtype,
        )?;
    }
    let ins: Vec<Tensor> = (0..2)
        .map(|_| c.cuda(DType::F32, &block(c.rank, n)))
        .collect::<Result<_, _>>()?;
    let flats: Vec<Tensor> = (0..2)
        .map(|_| c.zeros(DType::F32, n * c.world))
        .collect::<Result<_, _>>()?;
    wait(c.pg.all_gather_into_tensor_coalesced(&flats, &ins, &AllgatherOptions::default()))?;
    for f in &flats {
        check(
            "all_gather_into_tensor_coalesced",
            &read(f),
            &gathered(c.world, n),
            DType::F32,
        )?;
    }
    // outputs[r][i] receives input i of rank r: three inputs of distinct values, so a
    // transposed layout (or one input's data in another's slot) shows at every world size.
    let shifted = |r: usize, i: usize| -> Vec<f64> {
        block(r, n).iter().map(|v| v + 1000.0 * i as f64).collect()
    };
    let ins: Vec<Tensor> = (0..3)
        .map(|i| c.cuda(DType::F32, &shifted(c.rank, i)))
        .collect::<Result<_, _>>()?;
    let lists: Vec<Vec<Tensor>> = (0..c.world)
        .map(|_| (0..3).map(|_| c.zeros(DType::F32, n)).collect())
        .collect::<Result<_, _>>()?;
    wait(c.pg.all_gather_coalesced(&lists, &ins, &AllgatherOptions::default()))?;
    for (r, l) in lists.iter().enumerate() {
        for (i, t) in l.iter().enumerate() {
            check("all_gather_coalesced", &read(t), &shifted(r, i), DType::F32)?;
        }
    }
    Ok(())
}

fn gather_scatter(c: &Ctx) -> R {
    let n = 13;
    let root = c.world / 2;
    let input = c.cuda(DType::F64, &block(c.rank, n))?;
    let outs: Vec<Vec<Tensor>> = if c.rank == root {
        vec![(0..c.world)
            .map(|_| c.zeros(DType::F64, n))
            .collect::<Result<_, _>>()?]
    } else {
        vec![]
    };
    let o = GatherOptions {
        root_rank: root,
        ..Default::default()
    };
    wait(c.pg.gather(&outs, &[input], &o))?;
    if c.rank == root {
        let got: Vec<f64> = outs[0].iter().flat_map(read).collect();
        check("gather", &got, &gathered(c.world, n), DType::F64)?;
    }
    let out = c.zeros(DType::F64, n)?;
    let ins: Vec<Vec<Tensor>> = if c.rank == root {
        vec![(0..c.world)
            .map(|r| c.cuda(DType::F64, &block(r, n)))
            .collect::<Result<_, _>>()?]
    } else {
        vec![]
    };
    let o = ScatterOptions {
        root_rank: root,
        ..Default::default()
    };
    wait(c.pg.scatter(std::slice::from_ref(&out), &ins, &o))?;
    check("scatter", &read(&out), &block(c.rank, n), DType::F64)
}

fn reduce_scatter_forms(c: &Ctx) -> R {
    let n = 29;
    for op in [ReduceOp::Sum, ReduceOp::Avg] {
        // Rank r's input block k holds k*1000 + r + i: the reduction of block `me` is exact.
        let blk = |k: usize, r: usize| -> Vec<f64> {
            (0..n).map(|i| (k * 1000 + r + i) as f64).collect()
        };
        let want: Vec<f64> = (0..n)
            .map(|i| {
                let s: f64 = (0..c.world).map(|r| (c.rank * 1000 + r + i) as f64).sum();
                if op == ReduceOp::Avg {
                    s / c.world as f64
                } else {
                    s
                }
            })
            .collect();
        let ins: Vec<Tensor> = (0..c.world)
            .map(|k| c.cuda(DType::F64, &blk(k, c.rank)))
            .collect::<Result<_, _>>()?;
        let out = c.zeros(DType::F64, n)?;
        let o = ReduceScatterOptions {
            reduce_op: op,
            ..Default::default()
        };
        wait(c.pg.reduce_scatter(std::slice::from_ref(&out), &[ins], &o))?;
        check("reduce_scatter list", &read(&out), &want, DType::F64)?;
        let flat_v: Vec<f64> = (0..c.world).flat_map(|k| blk(k, c.rank)).collect();
        let flat = c.cuda(DType::F64, &flat_v)?;
        let out = c.zeros(DType::F64, n)?;
        wait(c.pg.reduce_scatter_tensor(&out, &flat, &o))?;
        check("reduce_scatter_tensor", &read(&out), &want, DType::F64)?;
        let flats = vec![c.cuda(DType::F64, &flat_v)?, c.cuda(DType::F64, &flat_v)?];
        let outs = vec![c.zeros(DType::F64, n)?, c.zeros(DType::F64, n)?];
        wait(c.pg.reduce_scatter_tensor_coalesced(&outs, &flats, &o))?;
        for out in &outs {
            check(
                "reduce_scatter_tensor_coalesced",
                &read(out),
                &want,
                DType::F64,
            )?;
        }
    }
    Ok(())
}

fn all_to_all_single(c: &Ctx) -> R {
    let (w, me) = (c.world, c.rank);
    // Even: rank r sends block j (value r*100 + j) to rank j.
    let input = c.cuda(
        DType::F32,
        &(0..w).map(|j| (me * 100 + j) as f64).collect::<Vec<_>>(),
    )?;
    let out = c.zeros(DType::F32, w)?;
    wait(c.pg.all_to_all_single(&out, &input, &[], &[], &AllToAllOptions::default()))?;
    let want: Vec<f64> = (0..w).map(|r| (r * 100 + me) as f64).collect();
    check("all_to_all_single even", &read(&out), &want, DType::F32)?;
    // Uneven: rank r sends (r + j + 1) elements of value r*100 + j to rank j.
    let send: Vec<usize> = (0..w).map(|j| me + j + 1).collect();
    let recv: Vec<usize> = (0..w).map(|r| r + me + 1).collect();
    let in_v: Vec<f64> = (0..w)
        .flat_map(|j| vec![(me * 100 + j) as f64; send[j]])
        .collect();
    let input = c.cuda(DType::F32, &in_v)?;
    let out = c.zeros(DType::F32, recv.iter().sum())?;
    wait(c.pg.all_to_all_single(&out, &input, &recv, &send, &AllToAllOptions::default()))?;
    let want: Vec<f64> = (0..w)
        .flat_map(|r| vec![(r * 100 + me) as f64; recv[r]])
        .collect();
    check("all_to_all_single uneven", &read(&out), &want, DType::F32)
}

fn all_to_all_list(c: &Ctx) -> R {
    let (w, me) = (c.world, c.rank);
    let ins: Vec<Tensor> = (0..w)
        .map(|j| c.cuda(DType::I32, &vec![(me * 10 + j) as f64; j + 1]))
        .collect::<Result<_, _>>()?;
    let outs: Vec<Tensor> = (0..w)
        .map(|_| c.zeros(DType::I32, me + 1))
        .collect::<Result<_, _>>()?;
    wait(c.pg.all_to_all(&outs, &ins, &AllToAllOptions::default()))?;
    for (r, o) in outs.iter().enumerate() {
        check(
            "all_to_all list",
            &read(o),
            &vec![(r * 10 + me) as f64; me + 1],
            DType::I32,
        )?;
    }
    Ok(())
}

fn send_recv(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    // Pairs (0,1), (2,3) …: the even rank sends first, the odd one receives first.
    let peer = c.rank ^ 1;
    if peer >= c.world {
        return Ok(());
    }
    let mine = c.cuda(DType::F32, &block(c.rank, 8))?;
    let theirs = c.zeros(DType::F32, 8)?;
    if c.rank.is_multiple_of(2) {
        wait(c.pg.send(&[mine], peer, 0))?;
        wait(c.pg.recv(std::slice::from_ref(&theirs), peer, 0))?;
    } else {
        wait(c.pg.recv(std::slice::from_ref(&theirs), peer, 0))?;
        wait(c.pg.send(&[mine], peer, 0))?;
    }
    check("send/recv", &read(&theirs), &block(peer, 8), DType::F32)
}

/// `batch_isend_irecv` on a ring (a send to the next rank and a receive from the previous one
/// in one coalesced block; at world size 1, to and from itself), plus an all_reduce.
fn coalesced_block(c: &Ctx) -> R {
    let (w, me) = (c.world, c.rank);
    let mine = c.cuda(DType::F32, &block(me, 8))?;
    let prev = c.zeros(DType::F32, 8)?;
    let sum = c.cuda(DType::F32, &inputs(DType::F32, me, 8))?;
    c.pg.start_coalescing().map_err(e2s)?;
    c.pg.send(&[mine], (me + 1) % w, 0).map_err(e2s)?;
    c.pg.recv(std::slice::from_ref(&prev), (me + w - 1) % w, 0)
        .map_err(e2s)?;
    c.pg.all_reduce(std::slice::from_ref(&sum), &AllreduceOptions::default())
        .map_err(e2s)?;
    c.pg.end_coalescing().map_err(e2s)?.wait().map_err(e2s)?;
    check(
        "ring recv",
        &read(&prev),
        &block((me + w - 1) % w, 8),
        DType::F32,
    )?;
    let want: Vec<f64> = (0..8)
        .map(|i| reduced(ReduceOp::Sum, DType::F32, w, i))
        .collect();
    check("coalesced all_reduce", &read(&sum), &want, DType::F32)
}

fn empty_tensors(c: &Ctx) -> R {
    let t = c.zeros(DType::F32, 0)?;
    wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    let out = c.zeros(DType::F32, 0)?;
    wait(c.pg.all_gather_into_tensor(&out, &t, &AllgatherOptions::default()))?;
    wait(c.pg.broadcast(&[t], &BroadcastOptions::default()))
}

fn barrier(c: &Ctx) -> R {
    let w = c.pg.barrier(&BarrierOptions::default()).map_err(e2s)?;
    w.wait().map_err(e2s)?;
    if !w.is_completed() {
        return Err("barrier's wait returned before the barrier completed".into());
    }
    Ok(())
}

/// 64 MiB all_reduces back to back, each waited on (stream-ordered, host not blocked), then
/// read: the values are those of the last one.
fn wait_orders_stream(c: &Ctx) -> R {
    let n = 16 << 20;
    let t = c.cuda(DType::F32, &vec![1.0; n])?;
    let start = Instant::now();
    for _ in 0..3 {
        wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    }
    let queued = start.elapsed();
    let got = read(&t);
    let want = (c.world as f64).powi(3);
    if got.iter().any(|&g| g != want) {
        return Err(format!("expected {want} everywhere, got {} at 0", got[0]));
    }
    println!(
        "rank {}: 3 x 64 MiB all_reduce queued in {:?}",
        c.rank, queued
    );
    Ok(())
}

/// A tensor held by an in-flight op (kept in flight behind a stuck stream, so the check cannot
/// race the op's completion) is refused by a second op, without waiting for the device.
fn busy_tensor_refused(c: &Ctx) -> R {
    let t = c.cuda(DType::F32, &vec![1.0; 1 << 20])?;
    let stuck = Stuck::new()?;
    let w1 =
        c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default());
    let second =
        c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default());
    stuck.release()?;
    w1.map_err(e2s)?.wait().map_err(e2s)?;
    match second {
        Err(e) if e.message().contains("in use") => Ok(()),
        Ok(w) => {
            let _ = w.wait();
            Err("a tensor held by an in-flight all_reduce was accepted by another".into())
        }
        Err(e) => Err(format!("unexpected error {e}")),
    }
}

fn cpu_tensor_refused(c: &Ctx) -> R {
    match c.pg.all_reduce(
        &[Tensor::from_vec(vec![1.0f32])],
        &AllreduceOptions::default(),
    ) {
        Err(e) if e.message().contains("Tensors must be CUDA and dense") => Ok(()),
        other => Err(format!(
            "expected PyTorch's CUDA-only refusal, got {other:?}"
        )),
    }
}

/// The flight recorder holds this group's ops as PyTorch names them, completed, with sizes.
fn flight_recorder(c: &Ctx) -> R {
    let t = c.cuda(DType::F32, &[1.0; 6])?;
    wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    c.pg.barrier(&BarrierOptions::default())
        .map_err(e2s)?
        .wait()
        .map_err(e2s)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dump = c10d_core::FlightRecorder::global().map_err(e2s)?.dump();
        let pg = c.pg.flight_recorder().pg_id();
        let mine: Vec<_> = dump.entries.iter().filter(|e| e.pg_id == pg).collect();
        let last_ar = mine
            .iter()
            .rev()
            .find(|e| e.profiling_name == "nccl:all_reduce");
        match last_ar {
            Some(e)
                if e.state == "completed"
                    && e.input_sizes == vec![vec![6]]
                    && e.input_dtypes == vec!["Float".to_string()] =>
            {
                return Ok(())
            }
            Some(e) if Instant::now() > deadline => {
                return Err(format!(
                    "last all_reduce entry: {} {:?} {:?}",
                    e.state, e.input_sizes, e.input_dtypes
                ))
            }
            None if Instant::now() > deadline => {
                return Err(format!(
                    "no nccl:all_reduce among {:?}",
                    mine.iter().map(|e| &e.profiling_name).collect::<Vec<_>>()
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn split(c: &Ctx) -> R {
    c.pg.bind(dev()).map_err(e2s)?;
    let evens: Vec<usize> = (0..c.world).step_by(2).collect();
    let before = c.pg.comm_split_count();
    let bopts = BackendOptions {
        group_name: "evens".into(),
        group_desc: "evens".into(),
        ..Default::default()
    };
    let child = c.pg.split(&evens, &bopts).map_err(e2s)?;
    if c.pg.comm_split_count() != before + 1 {
        return Err("comm_split_count did not grow by one".into());
    }
    match (child, c.rank.is_multiple_of(2)) {
        (Some(ch), true) => {
            if ch.size() != evens.len() || ch.rank() != c.rank / 2 {
                return Err(format!(
                    "child rank {} of {}, expected {} of {}",
                    ch.rank(),
                    ch.size(),
                    c.rank / 2,
                    evens.len()
                ));
            }
            let t = c.cuda(DType::F32, &[c.rank as f64])?;
            wait(ch.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
            let want: f64 = evens.iter().map(|&r| r as f64).sum();
            check("split child all_reduce", &read(&t), &[want], DType::F32)
        }
        (None, false) => Ok(()),
        (got, member) => Err(format!("member {member} but child {}", got.is_some())),
    }
}

fn shrink(c: &Ctx) -> R {
    if c10d_nccl::nccl_version().map_err(e2s)? < c10d_nccl::Version::new(2, 27, 0) {
        println!("rank {}: shrink skipped (NCCL < 2.27)", c.rank);
        return Ok(());
    }
    if c.world < 2 {
        // NCCL refuses an empty exclusion list; check that the refusal is a clean error.
        let g = c.group(Duration::from_secs(60), NcclEnv::default())?;
        g.bind(dev()).map_err(e2s)?;
        return match g.shrink(&[], false, NcclOptions::default()) {
            Err(e) if e.message().contains("ncclCommShrink") => Ok(()),
            other => Err(format!(
                "shrink excluding nobody: {:?}",
                other.map(|o| o.is_some())
            )),
        };
    }
    let g = c.group(Duration::from_secs(60), NcclEnv::default())?;
    g.bind(dev()).map_err(e2s)?;
    let exclude = vec![c.world - 1];
    let opts = NcclOptions {
        group_name: "shrunk".into(),
        ..NcclOptions::default()
    };
    let child = g.shrink(&exclude, false, opts).map_err(e2s)?;
    match child {
        Some(ch) => {
            let t = c.cuda(DType::F32, &[1.0])?;
            wait(ch.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
            check(
                "shrunk all_reduce",
                &read(&t),
                &[(c.world - exclude.len()) as f64],
                DType::F32,
            )
        }
        None if exclude.contains(&c.rank) => Ok(()),
        None => Err("a survivor got no shrunk group".into()),
    }
}
