//! The cases added after the multi-GPU review: large and odd sizes with values that differ per
//! element and rank, the ordering rule against a producer on a non-blocking stream, CUDA graph
//! capture, and failures that hit running kernels (a desynchronised live peer, teardown with
//! work in flight, abort during communicator creation).

use super::cases::{dev, e2s, wait, Ctx, R};
use super::values::{check, distinct, host, read, read_when_released};
use c10d_core::*;
use c10d_nccl::{memory, stream, NcclEnv};
use cudarc::driver::{result as cures, sys as cusys, CudaStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 64 MiB of f32, and an odd count (1 Mi + 3 elements).
const BIG: usize = 16 << 20;
const ODD: usize = (1 << 20) + 3;

fn values(r: usize, n: usize, offset: usize) -> Vec<f64> {
    (0..n).map(|i| distinct(r, offset + i)).collect()
}

/// all_gather_into_tensor, the list all_gather and reduce_scatter_tensor with a 64 MiB flat
/// side and with blocks of 1 Mi + 3 elements.
pub fn big_gather_and_scatter(c: &Ctx) -> R {
    for flat_numel in [BIG, ODD * c.world] {
        let n = flat_numel / c.world;
        let mine = c.cuda(DType::F32, &values(c.rank, n, 0))?;
        let flat = c.zeros(DType::F32, n * c.world)?;
        wait(c.pg.all_gather_into_tensor(&flat, &mine, &AllgatherOptions::default()))?;
        let want: Vec<f64> = (0..c.world).flat_map(|r| values(r, n, 0)).collect();
        check(
            &format!("all_gather_into_tensor {n}/rank"),
            &read(&flat),
            &want,
            DType::F32,
        )?;
        let outs: Vec<Tensor> = (0..c.world)
            .map(|_| c.zeros(DType::F32, n))
            .collect::<Result<_, _>>()?;
        wait(c.pg.all_gather(
            std::slice::from_ref(&outs),
            std::slice::from_ref(&mine),
            &AllgatherOptions::default(),
        ))?;
        let got: Vec<f64> = outs.iter().flat_map(read).collect();
        check(
            &format!("all_gather list {n}/rank"),
            &got,
            &want,
            DType::F32,
        )?;
        // Rank r's flat input: block k holds distinct(r, k*n + i); the result of block `me` is
        // the sum over ranks of distinct(r, me*n + i).
        let input = c.cuda(DType::F32, &values(c.rank, n * c.world, 0))?;
        let out = c.zeros(DType::F32, n)?;
        wait(c.pg.reduce_scatter_tensor(&out, &input, &ReduceScatterOptions::default()))?;
        let want: Vec<f64> = (0..n)
            .map(|i| (0..c.world).map(|r| distinct(r, c.rank * n + i)).sum())
            .collect();
        check(
            &format!("reduce_scatter_tensor {n}/rank"),
            &read(&out),
            &want,
            DType::F32,
        )?;
    }
    Ok(())
}

/// all_to_all_single at 64 MiB and with odd blocks: rank r's block j holds
/// distinct(r, j*n + i) and must land as block r of rank j.
pub fn big_all_to_all(c: &Ctx) -> R {
    for flat_numel in [BIG, ODD * c.world] {
        let n = flat_numel / c.world;
        let input = c.cuda(DType::F32, &values(c.rank, n * c.world, 0))?;
        let out = c.zeros(DType::F32, n * c.world)?;
        wait(c.pg.all_to_all_single(&out, &input, &[], &[], &AllToAllOptions::default()))?;
        let want: Vec<f64> = (0..c.world)
            .flat_map(|r| values(r, n, c.rank * n))
            .collect();
        check(
            &format!("all_to_all_single {n}/block"),
            &read(&out),
            &want,
            DType::F32,
        )?;
    }
    Ok(())
}

/// Queues on `s`: a host function that sleeps `delay`, then the device copy `t ← src` (fully
/// asynchronous: a host-to-device copy from pageable memory would wait for the stream first).
fn produce_late(s: &CudaStream, t: &Tensor, src: &Tensor, delay: Duration) -> R {
    unsafe extern "C" fn sleep_ms(arg: *mut std::ffi::c_void) {
        std::thread::sleep(Duration::from_millis(arg as u64));
    }
    let ms = delay.as_millis() as usize as *mut std::ffi::c_void;
    // SAFETY: a live stream; the callback only sleeps and touches no CUDA state.
    unsafe { cures::stream::launch_host_function(s.cu_stream(), sleep_ms, ms) }
        .map_err(|e| format!("cuLaunchHostFunc: {e:?}"))?;
    let (dst, from) = (t.device_ptr().unwrap(), src.device_ptr().unwrap());
    // SAFETY: both are live device allocations of `t.nbytes()` bytes on this context, kept by
    // the caller until the stream has been synchronised.
    unsafe { cures::memcpy_dtod_async(dst, from, t.nbytes(), s.cu_stream()) }
        .map_err(|e| format!("cuMemcpyDtoDAsync: {e:?}"))
}

/// The ordering rule: a producer writes the tensor 300 ms late on the thread's current stream
/// (the legacy default stream with nothing declared; a declared non-blocking stream); the
/// all_reduce must see the written values.
pub fn ordered_after_a_late_producer(c: &Ctx) -> R {
    let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
    let n = 4096;
    let src = c.cuda(DType::F32, &values(c.rank, n, 0))?;
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    for declared in [false, true] {
        // Nothing declared: the current stream is the legacy default stream, as in PyTorch, so
        // that is where the producer runs; declared: cudarc's own (non-blocking) stream.
        let producer = if declared {
            ctx.new_stream().map_err(|e| format!("{e:?}"))?
        } else {
            ctx.default_stream()
        };
        let t = c.zeros(DType::F32, n)?;
        produce_late(&producer, &t, &src, Duration::from_millis(300))?;
        let guard = if declared {
            Some(stream::use_stream(dev(), producer.clone()).map_err(e2s)?)
        } else {
            None
        };
        wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
        producer.synchronize().map_err(|e| format!("{e:?}"))?;
        drop(guard);
        let what = if declared {
            "declared stream"
        } else {
            "nothing declared"
        };
        check(
            &format!("all_reduce after a late producer ({what})"),
            &read(&t),
            &want,
            DType::F32,
        )?;
    }
    Ok(())
}

/// `torch.cuda.graph` + `dist.all_reduce`: an all_reduce captured on a declared stream does
/// nothing while captured, and each of three replays sums again.
pub fn graph_capture(c: &Ctx) -> R {
    let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
    let s = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    let n = 1000;
    let t = c.cuda(DType::F32, &values(c.rank, n, 0))?;
    // Warm up (the communicator exists before the capture, as PyTorch requires).
    let warm = c.zeros(DType::F32, 1)?;
    wait(c.pg.all_reduce(std::slice::from_ref(&warm), &AllreduceOptions::default()))?;
    let guard = stream::use_stream(dev(), s.clone()).map_err(e2s)?;
    s.begin_capture(cusys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
        .map_err(|e| format!("begin_capture: {e:?}"))?;
    let captured =
        c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default());
    let waited = captured.and_then(|w| w.wait());
    let graph = s.end_capture(cusys::CUgraphInstantiate_flags(0));
    drop(guard);
    let graph = match (waited, graph) {
        (Ok(()), Ok(Some(g))) => Ok(g),
        (Err(e), _) => Err(format!("captured all_reduce: {e}")),
        (_, Err(e)) => Err(format!("end_capture: {e:?}")),
        (_, Ok(None)) => Err("the capture recorded nothing".to_string()),
    };
    let untouched = check(
        "before any replay",
        &read(&t),
        &values(c.rank, n, 0),
        DType::F32,
    );
    // Replays are collectives: every rank replays, or none does.
    if !c.agree("graph-capture", graph.is_ok())? {
        return graph.and(Err("another rank's capture failed".into()));
    }
    let graph = graph?;
    let sum: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    let replayed = ctx.new_event(None).map_err(|e| format!("{e:?}"))?;
    let mut first_error = untouched.err();
    for k in 0..3 {
        graph.launch().map_err(|e| format!("replay {k}: {e:?}"))?;
        // Replays are not watched: waited for here, with a deadline.
        replayed.record(&s).map_err(|e| format!("{e:?}"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !replayed.try_is_complete().map_err(|e| format!("{e:?}"))? {
            if Instant::now() > deadline {
                c.pg.abort();
                return Err(format!("replay {} did not finish within 30 s", k + 1));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let scale = (c.world as f64).powi(k);
        let want: Vec<f64> = sum.iter().map(|x| x * scale).collect();
        let what = format!("after replay {}", k + 1);
        if let Err(e) = check(&what, &read(&t), &want, DType::F32) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// A desynchronised but live peer: the last rank skips an all_reduce the others run, so their
/// kernels are running (waiting for it) when the watchdog times them out and aborts the
/// communicator (mode 2); the skipper's later op fails too. Every rank sees an error well
/// within its bound, and the tensors stay readable afterwards.
pub fn desynchronised_peer(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let g = c.cleanup_group(Duration::from_secs(60))?;
    let t = c.cuda(DType::F32, &values(c.rank, 1 << 20, 0))?;
    wait(g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    let o = AllreduceOptions {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let skipper = c.rank == c.world - 1;
    if skipper {
        std::thread::sleep(Duration::from_secs(4));
    }
    let start = Instant::now();
    let r = g
        .all_reduce(std::slice::from_ref(&t), &o)
        .and_then(|w| w.wait_timeout(Duration::from_secs(30)));
    let took = start.elapsed();
    let e = match r {
        Err(e) => e,
        Ok(()) => return Err("an all_reduce a peer skipped completed".into()),
    };
    if took > Duration::from_secs(10) {
        return Err(format!("the error took {took:?}: {e}"));
    }
    read_when_released(&t)?;
    println!(
        "rank {}: {} after {took:?}: {}",
        c.rank,
        if skipper { "skipper" } else { "waiting rank" },
        e.message().lines().next().unwrap_or("")
    );
    Ok(())
}

/// A group dropped while its op's kernel runs (the last rank skips the op, so the others'
/// kernels spin waiting for it): the drop aborts the communicator and returns promptly, the
/// dropped op's work fails, and the device and the main group go on working.
pub fn teardown_with_work_in_flight(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let g = c.cleanup_group(Duration::from_secs(600))?;
    let t = c.cuda(DType::F32, &[1.0; 1 << 16])?;
    let w = if c.rank == c.world - 1 {
        None
    } else {
        let w = g
            .all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .map_err(e2s)?;
        std::thread::sleep(Duration::from_millis(300));
        Some(w)
    };
    let start = Instant::now();
    drop(g);
    let took = start.elapsed();
    let dropped = match w.map(|w| w.wait_timeout(Duration::from_secs(10))) {
        None => Ok(()),
        Some(Err(e)) if e.message().contains("destroyed") => Ok(()),
        Some(other) => Err(format!("the dropped group's work: {other:?}")),
    };
    let released = read_when_released(&t).map(|_| ());
    // Every rank runs the main group's op, whatever happened above (a rank that skipped it
    // would leave the others waiting).
    let x = c.cuda(DType::F32, &[1.0; 16])?;
    wait(c.pg.all_reduce(std::slice::from_ref(&x), &AllreduceOptions::default()))?;
    dropped?;
    released?;
    if took > Duration::from_secs(12) {
        return Err(format!("dropping the group took {took:?}"));
    }
    check(
        "main group after the teardown",
        &read(&x),
        &[c.world as f64; 16],
        DType::F32,
    )?;
    println!(
        "rank {}: group with work in flight dropped in {took:?}",
        c.rank
    );
    Ok(())
}

/// `abort()` while the communicator is being made: the last rank never joins, the others'
/// `bind` (eager init) is interrupted by an abort from another thread within a second, not
/// after the 60 s timeout.
pub fn abort_during_init(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let g = Arc::new(c.group(Duration::from_secs(60), NcclEnv::default())?);
    if c.rank == c.world - 1 {
        return Ok(());
    }
    let g2 = g.clone();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        g2.abort();
    });
    let start = Instant::now();
    let r = g.bind(dev());
    let took = start.elapsed();
    aborter.join().map_err(|_| "the aborting thread panicked")?;
    match r {
        Err(e) if took < Duration::from_secs(5) => {
            println!("rank {}: init aborted after {took:?}: {e}", c.rank);
            Ok(())
        }
        other => Err(format!("bind after {took:?}: {other:?}")),
    }
}

/// Rank `r`'s `n` distinct host values as a CPU tensor (for callers that upload themselves).
pub fn host_values(r: usize, n: usize) -> Tensor {
    host(DType::F32, &values(r, n, 0))
}

/// Two receives into the two `narrow()` halves of one buffer in one coalesced block (a ring:
/// from the previous and the next rank), with one send each way.
pub fn recv_into_halves(c: &Ctx) -> R {
    let (w, me) = (c.world, c.rank);
    let n = 1000;
    let (next, prev) = ((me + 1) % w, (me + w - 1) % w);
    let mine = c.cuda(DType::F32, &values(me, n, 0))?;
    let buf = c.zeros(DType::F32, 2 * n)?;
    let (lo, hi) = (
        buf.narrow(0, n).map_err(e2s)?,
        buf.narrow(n, n).map_err(e2s)?,
    );
    c.pg.start_coalescing().map_err(e2s)?;
    let queued =
        c.pg.send(std::slice::from_ref(&mine), next, 0)
            .and_then(|_| c.pg.send(std::slice::from_ref(&mine), prev, 0))
            .and_then(|_| c.pg.recv(std::slice::from_ref(&lo), prev, 0))
            .and_then(|_| c.pg.recv(std::slice::from_ref(&hi), next, 0));
    let ended = c.pg.end_coalescing();
    queued.map_err(e2s)?;
    ended.map_err(e2s)?.wait().map_err(e2s)?;
    let want: Vec<f64> = values(prev, n, 0)
        .into_iter()
        .chain(values(next, n, 0))
        .collect();
    check("receives into both halves", &read(&buf), &want, DType::F32)
}

/// A coalesced block whose first op needs the communicator (a fresh lazy group): it is made
/// with the NCCL group closed, and the block's ring exchange arrives.
pub fn lazy_communicator_in_a_block(c: &Ctx) -> R {
    let g = c.group(Duration::from_secs(60), NcclEnv::default())?;
    let (w, me) = (c.world, c.rank);
    let mine = c.cuda(DType::F32, &values(me, 64, 0))?;
    let got = c.zeros(DType::F32, 64)?;
    g.start_coalescing().map_err(e2s)?;
    let queued = g
        .send(std::slice::from_ref(&mine), (me + 1) % w, 0)
        .and_then(|_| g.recv(std::slice::from_ref(&got), (me + w - 1) % w, 0));
    let ended = g.end_coalescing();
    queued.map_err(e2s)?;
    ended.map_err(e2s)?.wait().map_err(e2s)?;
    check(
        "ring in a lazily initialised group",
        &read(&got),
        &values((me + w - 1) % w, 64, 0),
        DType::F32,
    )?;
    // A failed op inside a block fails end_coalescing, and the next op really runs.
    g.start_coalescing().map_err(e2s)?;
    let bad = g.send(std::slice::from_ref(&mine), w + 3, 0);
    let ended = g.end_coalescing();
    if bad.is_ok() {
        return Err(format!(
            "a send to rank {} inside a block was accepted",
            w + 3
        ));
    }
    if let Err(e) = &ended {
        println!("rank {me}: end_coalescing after the failed send: {e}");
    }
    let x = c.cuda(DType::F32, &[1.0; 4])?;
    wait(g.all_reduce(std::slice::from_ref(&x), &AllreduceOptions::default()))?;
    check(
        "all_reduce after a failed block",
        &read(&x),
        &[w as f64; 4],
        DType::F32,
    )
}

/// Sanity of the device handle the cases use.
pub fn memory_on_this_rank_device(c: &Ctx) -> R {
    let t = memory::from_cpu(&host_values(c.rank, 8), dev()).map_err(e2s)?;
    if t.device() != dev() {
        return Err(format!("tensor on {}, expected {}", t.device(), dev()));
    }
    check("upload", &read(&t), &values(c.rank, 8, 0), DType::F32)
}

/// No device-wide synchronisation on the op path or the watchdog thread: while a user stream
/// of the device is stuck (waiting on a flag), a thread with its own declared stream runs ops
/// that need a temporary buffer (list reduce_scatter), the list all_gather, barrier, and drops
/// their tensors. A `cuMemAlloc`/`cuMemFree` or context synchronisation anywhere on that path
/// would wait for the stuck stream forever; each op must finish within its bound instead.
pub fn no_device_sync_while_a_stream_is_stuck(c: &Ctx) -> R {
    let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
    let own = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    let stuck = super::faults::Stuck::new()?;
    let guard = stream::use_stream(dev(), own).map_err(e2s)?;
    // Every rank issues every collective (errors are reported after all of them).
    let within = |w: Result<Work>| {
        w.and_then(|w| w.wait_timeout(Duration::from_secs(60)))
            .map_err(e2s)
    };
    let n = 4099;
    let ins: Vec<Tensor> = (0..c.world)
        .map(|k| c.cuda(DType::F32, &values(c.rank, n, k * n)))
        .collect::<Result<_, _>>()?;
    let out = c.zeros(DType::F32, n)?;
    let scattered = within(c.pg.reduce_scatter(
        std::slice::from_ref(&out),
        &[ins],
        &ReduceScatterOptions::default(),
    ));
    let outs: Vec<Tensor> = (0..c.world)
        .map(|_| c.zeros(DType::F32, 5))
        .collect::<Result<_, _>>()?;
    let mine = c.cuda(DType::F32, &values(c.rank, 5, 0))?;
    let gathered = within(c.pg.all_gather(
        std::slice::from_ref(&outs),
        std::slice::from_ref(&mine),
        &AllgatherOptions::default(),
    ));
    let barrier = within(c.pg.barrier(&BarrierOptions::default()));
    let r = (|| -> R {
        scattered?;
        gathered?;
        barrier?;
        let want: Vec<f64> = (0..n)
            .map(|i| (0..c.world).map(|r| distinct(r, c.rank * n + i)).sum())
            .collect();
        check(
            "reduce_scatter list beside a stuck stream",
            &read(&out),
            &want,
            DType::F32,
        )?;
        let got: Vec<f64> = outs.iter().flat_map(read).collect();
        let all: Vec<f64> = (0..c.world).flat_map(|r| values(r, 5, 0)).collect();
        check(
            "all_gather list beside a stuck stream",
            &got,
            &all,
            DType::F32,
        )
    })();
    drop((outs, mine, out));
    drop(guard);
    stuck.release()?;
    r
}

/// Groups made with PyTorch's legacy, PyTorch 2.15 nccl2 (one root, and several roots through
/// `ncclCommInitRankScalable`) and vLLM's unique-id schemes: the (first) id is under the
/// scheme's key in the group's store, encoded as the scheme says (vLLM's: a pickle of its
/// ctypes class, decoded without loading it), vLLM's warm-up all_reduce is joined, and a
/// collective on the group gives the right values.
pub fn unique_id_schemes(c: &Ctx) -> R {
    use c10d_nccl::unique_id::UniqueIdExchange;
    for scheme in [
        UniqueIdExchange::TorchLegacy,
        UniqueIdExchange::TorchNccl2 {
            ranks_per_root: 128,
        },
        // Two roots even for two ranks: the multi-root path.
        UniqueIdExchange::TorchNccl2 { ranks_per_root: 1 },
        UniqueIdExchange::Vllm { first: 0 },
    ] {
        let opts = c10d_nccl::NcclOptions {
            timeout: Duration::from_secs(60),
            unique_id_exchange: scheme,
            group_name: "uid".into(),
            ..Default::default()
        };
        let (g, store) = c.group_with(opts, NcclEnv::default())?;
        g.bind(dev()).map_err(e2s)?;
        let key = scheme.keys(0, "uid", c.world).remove(0);
        let value = store.get(&key).map_err(e2s)?;
        scheme.decode(&key, &value).map_err(e2s)?;
        let n = 333;
        let t = c.cuda(DType::F32, &values(c.rank, n, 0))?;
        wait(g.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
        let want: Vec<f64> = (0..n)
            .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
            .collect();
        check(
            &format!("all_reduce on a {scheme:?} group"),
            &read(&t),
            &want,
            DType::F32,
        )?;
    }
    Ok(())
}

/// A tensor dropped while work queued on the caller's stream still reads it: its block must
/// not be reused before that work ran (the free is ordered after the stream the tensor was
/// made on, as PyTorch's caching allocator orders it). The consumer copies 300 ms late; a new
/// tensor of the same size, made and written at once, must not land in the old block.
pub fn free_waits_for_the_callers_stream(c: &Ctx) -> R {
    let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
    let s = ctx.new_stream().map_err(|e| format!("{e:?}"))?;
    let n = 1 << 16;
    let guard = stream::use_stream(dev(), s.clone()).map_err(e2s)?;
    let src = c.cuda(DType::F32, &values(c.rank, n, 0))?;
    let out = c.zeros(DType::F32, n)?;
    produce_late(&s, &out, &src, Duration::from_millis(300))?;
    drop(src);
    let other = c.cuda(DType::F32, &vec![-1.0; n])?;
    s.synchronize().map_err(|e| format!("{e:?}"))?;
    drop(guard);
    check(
        "a late consumer of a dropped tensor",
        &read(&out),
        &values(c.rank, n, 0),
        DType::F32,
    )?;
    check("the new tensor", &read(&other), &vec![-1.0; n], DType::F32)
}

/// A pipeline schedule's pattern: a receive outstanding on one group while the thread (no
/// stream declared) runs a collective on another, and the peer sends only after that
/// collective. Nothing may wait for the whole device (the receive's kernel would hold it until
/// its group's timeout).
pub fn outstanding_receive_on_another_group(c: &Ctx) -> R {
    if c.world < 2 {
        return Ok(());
    }
    let b = c.cleanup_group(Duration::from_secs(20))?;
    let (first, last, n) = (0, c.world - 1, 1024);
    let inbox = c.zeros(DType::F32, n)?;
    let recv = if c.rank == first {
        Some(b.recv(std::slice::from_ref(&inbox), last, 0).map_err(e2s)?)
    } else {
        None
    };
    let t = c.cuda(DType::F32, &values(c.rank, n, 0))?;
    let start = Instant::now();
    wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    check(
        "all_reduce with a receive outstanding",
        &read(&t),
        &want,
        DType::F32,
    )?;
    let took = start.elapsed();
    if c.rank == last {
        let sent = c.cuda(DType::F32, &values(99, n, 0))?;
        wait(b.send(std::slice::from_ref(&sent), first, 0))?;
        // The send is done once the current stream, which waits for it, has reached this read
        // (dropping `b` before would abort it).
        read(&sent);
    }
    if let Some(r) = recv {
        r.wait().map_err(e2s)?;
        check(
            "the pipeline's receive",
            &read(&inbox),
            &values(99, n, 0),
            DType::F32,
        )?;
    }
    if took > Duration::from_secs(5) {
        return Err(format!(
            "the all_reduce waited {took:?} for another group's receive"
        ));
    }
    Ok(())
}
