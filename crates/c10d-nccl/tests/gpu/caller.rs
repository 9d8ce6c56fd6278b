//! Collectives on memory the caller owns (`c10d_nccl::caller_memory`): cudarc buffers on the
//! caller's non-blocking streams, views of parts of a buffer, the ordering after a late
//! producer (on the scope's stream and on another stream, through cudarc's events), the
//! borrow's end, and device memory from a raw pointer.

use super::cases::{dev, e2s, wait, Ctx, R};
use super::values::{check, distinct};
use c10d_core::half::{bf16, f16};
use c10d_core::*;
use c10d_nccl::caller_memory::{from_raw_device, scope, NcclElement};
use c10d_nccl::stream;
use cudarc::driver::{result as cures, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use std::time::Duration;

/// Host values of an element type, both ways (every value used here is a small integer, exact
/// in every type).
trait Value: NcclElement + cudarc::driver::ValidAsZeroBits {
    fn of(x: f64) -> Self;
    fn f64(self) -> f64;
}

macro_rules! value {
    ($($t:ty: $of:expr, $back:expr);* $(;)?) => {$(
        impl Value for $t {
            fn of(x: f64) -> Self { $of(x) }
            fn f64(self) -> f64 { $back(self) }
        }
    )*};
}
value!(
    f32: |x| x as f32, |v| v as f64;
    f64: |x| x, |v| v;
    f16: f16::from_f64, f16::to_f64;
    bf16: bf16::from_f64, bf16::to_f64;
    i8: |x| x as i8, |v| v as f64;
    u8: |x| x as u8, |v| v as f64;
    i32: |x| x as i32, |v| v as f64;
    i64: |x| x as i64, |v| v as f64;
);

/// A new non-blocking stream on this rank's device, as cudarc programs make them.
fn stream_of() -> Result<Arc<CudaStream>, String> {
    let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
    ctx.new_stream().map_err(|e| format!("{e:?}"))
}

fn upload<T: Value>(s: &Arc<CudaStream>, v: &[f64]) -> Result<CudaSlice<T>, String> {
    let host: Vec<T> = v.iter().map(|&x| T::of(x)).collect();
    s.clone_htod(&host).map_err(|e| format!("{e:?}"))
}

fn download<T: Value>(s: &Arc<CudaStream>, b: &CudaSlice<T>) -> Result<Vec<f64>, String> {
    let v = s.clone_dtoh(b).map_err(|e| format!("{e:?}"))?;
    s.synchronize().map_err(|e| format!("{e:?}"))?;
    Ok(v.into_iter().map(Value::f64).collect())
}

/// Rank r's element i for the dtype sweep: (r mod 3 + 1)·(i mod 5 + 1), summed over up to 8
/// ranks ≤ 75 (fits i8).
fn small(r: usize, i: usize) -> f64 {
    ((r % 3 + 1) * (i % 5 + 1)) as f64
}

fn sum_one<T: Value>(c: &Ctx, s: &Arc<CudaStream>) -> R {
    let n = 1001;
    let mine: Vec<f64> = (0..n).map(|i| small(c.rank, i)).collect();
    let mut buf = upload::<T>(s, &mine)?;
    scope(s, |sc| {
        let v = sc.view_mut(&mut buf)?;
        c.pg.all_reduce(&[(*v).clone()], &AllreduceOptions::default())?
            .wait()
    })
    .map_err(e2s)?;
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| small(r, i)).sum())
        .collect();
    check(
        &format!("all_reduce on CudaSlice<{}>", T::DTYPE),
        &download(s, &buf)?,
        &want,
        T::DTYPE,
    )
}

/// all_reduce SUM in place on a `CudaSlice<T>` of every NCCL element type, on a non-blocking
/// stream of the caller's.
pub fn cudarc_every_dtype(c: &Ctx) -> R {
    let s = stream_of()?;
    sum_one::<f32>(c, &s)?;
    sum_one::<f64>(c, &s)?;
    sum_one::<f16>(c, &s)?;
    sum_one::<bf16>(c, &s)?;
    sum_one::<i8>(c, &s)?;
    sum_one::<u8>(c, &s)?;
    sum_one::<i32>(c, &s)?;
    sum_one::<i64>(c, &s)
}

fn values(r: usize, n: usize, offset: usize) -> Vec<f64> {
    (0..n).map(|i| distinct(r, offset + i)).collect()
}

/// all_gather_into_tensor from a `CudaView` of part of a buffer, reduce_scatter_tensor into a
/// `CudaViewMut` (the rest of its buffer untouched), broadcast into the second half of a
/// buffer, a ring of send/recv, a read-only view refused as an output, and a handle cloned out
/// of a scope cut off when it ends.
pub fn cudarc_views(c: &Ctx) -> R {
    let s = stream_of()?;
    let (w, n) = (c.world, 1003);
    // A buffer of 2n whose first n are this rank's block.
    let src = upload::<f32>(&s, &values(c.rank, 2 * n, 0))?;
    let mut all = s.alloc_zeros::<f32>(w * n).map_err(|e| format!("{e:?}"))?;
    let part = src.slice(0..n);
    scope(&s, |sc| {
        let (i, o) = (sc.view(&part)?, sc.view_mut(&mut all)?);
        c.pg.all_gather_into_tensor(&o, &i, &AllgatherOptions::default())?
            .wait()
    })
    .map_err(e2s)?;
    let want: Vec<f64> = (0..w).flat_map(|r| values(r, n, 0)).collect();
    check(
        "all_gather_into_tensor (CudaView)",
        &download(&s, &all)?,
        &want,
        DType::F32,
    )?;

    let input = upload::<f32>(&s, &values(c.rank, w * n, 0))?;
    let mut out = upload::<f32>(&s, &vec![-1.0; n + 2])?;
    let mut mid = out.slice_mut(1..n + 1);
    scope(&s, |sc| {
        let (i, o) = (sc.view(&input)?, sc.view_mut(&mut mid)?);
        c.pg.reduce_scatter_tensor(&o, &i, &ReduceScatterOptions::default())?
            .wait()
    })
    .map_err(e2s)?;
    let mut want = vec![-1.0];
    want.extend((0..n).map(|i| (0..w).map(|r| distinct(r, c.rank * n + i)).sum::<f64>()));
    want.push(-1.0);
    check(
        "reduce_scatter_tensor (CudaViewMut)",
        &download(&s, &out)?,
        &want,
        DType::F32,
    )?;

    let mut halves = upload::<f32>(&s, &values(c.rank, 2 * n, 0))?;
    let mut second = halves.slice_mut(n..2 * n);
    scope(&s, |sc| {
        let t = sc.view_mut(&mut second)?;
        let root = w - 1;
        c.pg.broadcast(
            &[(*t).clone()],
            &BroadcastOptions {
                root_rank: root,
                ..Default::default()
            },
        )?
        .wait()
    })
    .map_err(e2s)?;
    let mut want = values(c.rank, n, 0);
    want.extend(values(w - 1, n, n));
    check(
        "broadcast into the second half",
        &download(&s, &halves)?,
        &want,
        DType::F32,
    )?;

    if w > 1 {
        let mine = upload::<f32>(&s, &values(c.rank, n, 0))?;
        let mut got = s.alloc_zeros::<f32>(n).map_err(|e| format!("{e:?}"))?;
        scope(&s, |sc| {
            let (to, from) = ((c.rank + 1) % w, (c.rank + w - 1) % w);
            let (m, g) = (sc.view(&mine)?, sc.view_mut(&mut got)?);
            let sent = c.pg.send(&[(*m).clone()], to, 0)?;
            let recv = c.pg.recv(&[(*g).clone()], from, 0)?;
            sent.wait()?;
            recv.wait()
        })
        .map_err(e2s)?;
        let from = (c.rank + w - 1) % w;
        check(
            "send/recv ring",
            &download(&s, &got)?,
            &values(from, n, 0),
            DType::F32,
        )?;
    }

    // Writable: broadcast writes its tensor, and a read-only view would be refused for that
    // before the block is looked at.
    let mut lent = upload::<f32>(&s, &[1.0; 4])?;
    c.pg.start_coalescing().map_err(e2s)?;
    let in_block = scope(&s, |sc| {
        let v = sc.view_mut(&mut lent)?;
        Ok(c.pg
            .broadcast(&[(*v).clone()], &BroadcastOptions::default())
            .map(|_| ()))
    })
    .map_err(e2s)?;
    let ended = c.pg.end_coalescing().map(|_| ());
    match (in_block, ended) {
        (Err(e), _) if e.to_string().contains("cannot join a coalesced block") => {}
        (r, ended) => {
            return Err(format!(
                "a scope view joined a coalesced block: {r:?}, end: {ended:?}"
            ))
        }
    }

    // A view used with another stream declared, or on another thread, is refused.
    let other = stream_of()?;
    let pg = &c.pg;
    let (elsewhere, on_thread) = scope(&s, |sc| {
        let v = sc.view_mut(&mut lent)?;
        let o = BroadcastOptions::default();
        let declared = stream::use_stream(dev(), other.clone())?;
        let elsewhere = pg.broadcast(&[(*v).clone()], &o).map(|_| ());
        drop(declared);
        let t = (*v).clone();
        let on_thread = std::thread::scope(|ts| {
            ts.spawn(move || pg.broadcast(&[t], &o).map(|_| ()))
                .join()
                .map_err(|_| DistError::invalid("the thread panicked"))
        })?;
        Ok((elsewhere, on_thread))
    })
    .map_err(e2s)?;
    for (r, want) in [
        (elsewhere, "another stream declared"),
        (on_thread, "another thread"),
    ] {
        match r {
            Err(e) if e.to_string().contains(want) => {}
            other => return Err(format!("a view used with {want} was taken: {other:?}")),
        }
    }

    let ro = upload::<f32>(&s, &[1.0; 4])?;
    let escaped = scope(&s, |sc| {
        let v = sc.view(&ro)?;
        let refused =
            c.pg.all_reduce(&[(*v).clone()], &AllreduceOptions::default());
        match refused {
            Err(e) if e.to_string().contains("read-only") => Ok((*v).clone()),
            Err(e) => Err(DistError::invalid(format!("unexpected error: {e}"))),
            Ok(_) => Err(DistError::invalid("a read-only view was written")),
        }
    })
    .map_err(e2s)?;
    match escaped.to_vec::<f32>() {
        Err(e) if e.to_string().contains("given back") => {}
        other => return Err(format!("a view read after its scope ended: {other:?}")),
    }
    // Its storage, written directly or wrapped in a new tensor, is refused too.
    let storage = escaped.device_storage().expect("a device tensor").clone();
    match storage.copy_from_host(0, &[0u8; 4]) {
        Err(e) if e.to_string().contains("read-only") || e.to_string().contains("given back") => {}
        other => return Err(format!("a given-back view was written: {other:?}")),
    }
    let rewrapped = Tensor::from_device_storage(storage, DType::F32, &[4]).map_err(e2s)?;
    let declared = stream::use_stream(dev(), s.clone()).map_err(e2s)?;
    let r = c.pg.all_reduce(&[rewrapped], &AllreduceOptions::default());
    drop(declared);
    match r {
        Err(e) if e.to_string().contains("gave the memory back") => Ok(()),
        other => Err(format!(
            "an op on a given-back view's storage ran: {:?}",
            other.map(|_| ())
        )),
    }
}

/// An op whose `Work` is waited on another thread with another stream declared (only that
/// stream waits, and the view is given back at once) while rank 0 joins 300 ms late: the end
/// of the scope must still order its stream after the op, so the buffer read back on it holds
/// the sums.
pub fn cudarc_waited_on_another_stream(c: &Ctx) -> R {
    let (s, other) = (stream_of()?, stream_of()?);
    let n = 1 << 20;
    let mut buf = upload::<f32>(&s, &values(c.rank, n, 0))?;
    scope(&s, |sc| {
        let v = sc.view_mut(&mut buf)?;
        if c.rank == 0 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let work =
            c.pg.all_reduce(&[(*v).clone()], &AllreduceOptions::default())?;
        std::thread::scope(|ts| {
            ts.spawn(move || {
                let _declared = stream::use_stream(dev(), other)?;
                work.wait()
            })
            .join()
            .map_err(|_| DistError::invalid("the waiting thread panicked"))?
        })
    })
    .map_err(e2s)?;
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    check(
        "all_reduce waited on another stream",
        &download(&s, &buf)?,
        &want,
        DType::F32,
    )
}

/// Queues on `s`: a host function that sleeps `delay`, then `dst ← src` on the device.
fn produce_late(s: &Arc<CudaStream>, dst: &mut CudaSlice<f32>, src: &CudaSlice<f32>) -> R {
    unsafe extern "C" fn sleep_300ms(_: *mut std::ffi::c_void) {
        std::thread::sleep(Duration::from_millis(300));
    }
    // SAFETY: a live stream; the callback only sleeps and touches no CUDA state.
    unsafe {
        cures::stream::launch_host_function(s.cu_stream(), sleep_300ms, std::ptr::null_mut())
    }
    .map_err(|e| format!("cuLaunchHostFunc: {e:?}"))?;
    s.memcpy_dtod(src, dst).map_err(|e| format!("{e:?}"))
}

/// The ordering rule for caller memory: a producer writes the buffer 300 ms late, (a) on the
/// buffer's own stream, which the scope runs on, (b) on another stream, which the scope's
/// stream waits for through cudarc's event on the buffer. Nothing is declared beforehand.
pub fn cudarc_ordered_after_a_late_producer(c: &Ctx) -> R {
    let n = 4096;
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    for other_stream in [false, true] {
        let producer = stream_of()?;
        let src = upload::<f32>(&producer, &values(c.rank, n, 0))?;
        // Without cudarc's event tracking (as in candle's single-stream contexts): the scope's
        // own joins must order the streams.
        let ctx = c10d_nccl::device::context(dev()).map_err(e2s)?;
        // SAFETY: only this thread uses the context while tracking is off; it is back on
        // before anything else runs.
        unsafe { ctx.disable_event_tracking() };
        let buf = producer.alloc_zeros::<f32>(n);
        // SAFETY: as above.
        unsafe { ctx.enable_event_tracking() };
        let mut buf = buf.map_err(|e| format!("{e:?}"))?;
        producer.synchronize().map_err(|e| format!("{e:?}"))?;
        produce_late(&producer, &mut buf, &src)?;
        let on = if other_stream {
            stream_of()?
        } else {
            producer.clone()
        };
        scope(&on, |sc| {
            let v = sc.view_mut(&mut buf)?;
            c.pg.all_reduce(&[(*v).clone()], &AllreduceOptions::default())?
                .wait()
        })
        .map_err(e2s)?;
        let what = if other_stream {
            "producer on another stream"
        } else {
            "producer on the scope's stream"
        };
        check(
            &format!("all_reduce after a late producer ({what})"),
            &download(&producer, &buf)?,
            &want,
            DType::F32,
        )?;
    }
    Ok(())
}

/// `from_raw_device`: a tensor over a cudarc buffer's raw pointer (the buffer kept as its
/// owner) all_reduces on a declared stream; a host pointer and a misaligned one are refused.
pub fn raw_device_pointer(c: &Ctx) -> R {
    let s = stream_of()?;
    let n = 777;
    let buf = upload::<f32>(&s, &values(c.rank, n, 0))?;
    let (ptr, used) = buf.device_ptr(&s);
    drop(used);
    // SAFETY: `buf` (n f32 on this device) moves into the tensor as its owner; nothing else
    // touches it.
    let t = unsafe { from_raw_device(ptr, DType::F32, &[n], &s, Box::new(buf)) }.map_err(e2s)?;
    let declared = stream::use_stream(dev(), s.clone()).map_err(e2s)?;
    wait(c.pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default()))?;
    drop(declared);
    let got: Vec<f64> = t
        .to_vec::<f32>()
        .map_err(e2s)?
        .into_iter()
        .map(f64::from)
        .collect();
    let want: Vec<f64> = (0..n)
        .map(|i| (0..c.world).map(|r| distinct(r, i)).sum())
        .collect();
    check(
        "all_reduce on a raw device pointer",
        &got,
        &want,
        DType::F32,
    )?;
    let host = [0f32; 4];
    // SAFETY: refused before anything touches the pointer.
    let e = unsafe { from_raw_device(host.as_ptr() as u64, DType::F32, &[4], &s, Box::new(())) };
    match e {
        Err(e) if e.to_string().contains("is not CUDA memory") => {}
        other => return Err(format!("a host pointer was taken: {:?}", other.map(|_| ()))),
    }
    // SAFETY: refused before anything touches the pointer.
    let e = unsafe { from_raw_device(ptr + 2, DType::F32, &[1], &s, Box::new(())) };
    match e {
        Err(e) if e.to_string().contains("not aligned") => Ok(()),
        other => Err(format!(
            "a misaligned pointer was taken: {:?}",
            other.map(|_| ())
        )),
    }
}
