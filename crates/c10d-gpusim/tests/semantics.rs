//! The simulator's stream, event, capture and memory semantics against the CUDA Driver API
//! documentation's statements (each test quotes the one it checks), calling the exported
//! functions directly.

use c10d_gpusim::abi;
use c10d_gpusim::cuda::api_context::*;
use c10d_gpusim::cuda::api_memory::*;
use c10d_gpusim::cuda::api_stream::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

fn setup() {
    assert_eq!(cuInit(0), abi::SUCCESS);
    let mut ctx = 0usize;
    // SAFETY: a valid out-pointer.
    assert_eq!(
        // SAFETY: valid out-pointers and handles of this test.
        unsafe { cuDevicePrimaryCtxRetain(&mut ctx, 0) },
        abi::SUCCESS
    );
    assert_eq!(cuCtxSetCurrent(ctx), abi::SUCCESS);
}

fn stream(flags: u32) -> usize {
    let mut s = 0usize;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuStreamCreate(&mut s, flags) }, abi::SUCCESS);
    s
}

fn event() -> usize {
    let mut e = 0usize;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuEventCreate(&mut e, 0) }, abi::SUCCESS);
    e
}

fn alloc(n: usize) -> u64 {
    let mut p = 0u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuMemAlloc_v2(&mut p, n) }, abi::SUCCESS);
    p
}

fn read_u32(p: u64) -> u32 {
    let mut v = 0u32;
    assert_eq!(
        cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), p, 4),
        abi::SUCCESS
    );
    v
}

/// A host function that sleeps the milliseconds its argument points to.
unsafe extern "C" fn sleep_ms(ms: *mut c_void) {
    // SAFETY: the tests pass a pointer to a static u64.
    let ms = unsafe { *ms.cast::<u64>() };
    std::thread::sleep(Duration::from_millis(ms));
}

static HUNDRED: u64 = 100;
static TWO_SECONDS: u64 = 2000;

fn sleep_on(s: usize) {
    sleep_for(s, &HUNDRED);
}

fn sleep_for(s: usize, ms: &'static u64) {
    let arg = (ms as *const u64).cast_mut().cast();
    assert_eq!(cuLaunchHostFunc(s, Some(sleep_ms), arg), abi::SUCCESS);
}

fn memset(p: u64, v: u32, s: usize) {
    assert_eq!(cuMemsetD32Async(p, v, 1, s), abi::SUCCESS);
}

#[test]
fn queued_work_runs_later_in_order() {
    // cuLaunchHostFunc: "The host function call is enqueued ... and will be called after
    // currently enqueued work and will block work added after it."
    setup();
    let (s, p) = (stream(abi::STREAM_NON_BLOCKING), alloc(4));
    let start = Instant::now();
    sleep_on(s);
    memset(p, 7, s);
    assert!(
        start.elapsed() < Duration::from_millis(90),
        "the call waited for the work"
    );
    assert_eq!(cuStreamQuery(s), abi::NOT_READY);
    assert_eq!(cuStreamSynchronize(s), abi::SUCCESS);
    assert_eq!(read_u32(p), 7);
}

#[test]
fn a_stream_waits_for_an_event_of_another() {
    // cuStreamWaitEvent: "Makes all future work submitted to hStream wait for all work
    // captured in hEvent."
    setup();
    let (a, b, e, p) = (stream(1), stream(1), event(), alloc(4));
    memset(p, 1, a);
    assert_eq!(cuStreamSynchronize(a), abi::SUCCESS);
    sleep_on(a);
    memset(p, 2, a);
    assert_eq!(cuEventRecord(e, a), abi::SUCCESS);
    assert_eq!(cuStreamWaitEvent(b, e, 0), abi::SUCCESS);
    let out = alloc(4);
    assert_eq!(cuMemcpyDtoDAsync_v2(out, p, 4, b), abi::SUCCESS);
    assert_eq!(cuStreamSynchronize(b), abi::SUCCESS);
    assert_eq!(read_u32(out), 2, "b copied before a's write");
}

#[test]
fn event_queries_see_the_latest_record() {
    // cuEventQuery: "If cuEventRecord() has not been called on hEvent, then CUDA_SUCCESS is
    // returned"; cuEventRecord: later queries "use the most recently captured state".
    setup();
    let (s, e) = (stream(1), event());
    assert_eq!(cuEventQuery(e), abi::SUCCESS);
    sleep_on(s);
    assert_eq!(cuEventRecord(e, s), abi::SUCCESS);
    assert_eq!(cuEventQuery(e), abi::NOT_READY);
    assert_eq!(cuEventSynchronize(e), abi::SUCCESS);
    assert_eq!(cuEventQuery(e), abi::SUCCESS);
}

#[test]
fn the_legacy_stream_synchronises_with_blocking_streams_only() {
    // Driver API, "Stream synchronization behavior": the legacy default stream waits for all
    // blocking streams of its context, and "non-blocking streams ... [do] not synchronize
    // with the NULL stream".
    setup();
    let (blocking, nonblocking) = (stream(0), stream(abi::STREAM_NON_BLOCKING));
    let (pb, pn) = (alloc(4), alloc(4));
    memset(pb, 0, 0);
    memset(pn, 0, 0);
    assert_eq!(cuStreamSynchronize(0), abi::SUCCESS);
    sleep_on(blocking);
    memset(pb, 5, blocking);
    sleep_for(nonblocking, &TWO_SECONDS);
    memset(pn, 5, nonblocking);
    let (ob, on) = (alloc(4), alloc(4));
    assert_eq!(cuMemcpyDtoDAsync_v2(ob, pb, 4, 0), abi::SUCCESS);
    assert_eq!(cuMemcpyDtoDAsync_v2(on, pn, 4, 0), abi::SUCCESS);
    assert_eq!(cuStreamSynchronize(0), abi::SUCCESS);
    assert_eq!(
        read_u32(ob),
        5,
        "the legacy stream ran before the blocking stream's work"
    );
    assert_eq!(
        read_u32(on),
        0,
        "the legacy stream waited for a non-blocking stream"
    );
    assert_eq!(cuStreamSynchronize(nonblocking), abi::SUCCESS);
}

static RUNS: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    RUNS.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn captured_work_runs_only_when_the_graph_is_launched() {
    // cuStreamBeginCapture: work queued in capture mode is "not enqueued for execution" but
    // recorded into the graph; cuGraphLaunch runs the graph's work each time it is launched.
    setup();
    let s = stream(1);
    assert_eq!(
        cuStreamBeginCapture_v2(s, abi::CAPTURE_MODE_THREAD_LOCAL),
        abi::SUCCESS
    );
    assert_eq!(
        cuLaunchHostFunc(s, Some(count_run), std::ptr::null_mut()),
        abi::SUCCESS
    );
    let mut status = 0u32;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cuStreamIsCapturing(s, &mut status), abi::SUCCESS);
        assert_eq!(status, abi::CAPTURE_STATUS_ACTIVE);
        let mut graph = 0usize;
        assert_eq!(cuStreamEndCapture(s, &mut graph), abi::SUCCESS);
        assert_eq!(
            RUNS.load(Ordering::SeqCst),
            0,
            "captured work ran at capture"
        );
        let mut exec = 0usize;
        assert_eq!(
            cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            abi::SUCCESS
        );
        assert_eq!(cuGraphLaunch(exec, s), abi::SUCCESS);
        assert_eq!(cuGraphLaunch(exec, s), abi::SUCCESS);
    }
    assert_eq!(cuStreamSynchronize(s), abi::SUCCESS);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
}

#[test]
fn a_synchronisation_during_a_capture_is_refused_and_invalidates_it() {
    // CUstreamCaptureMode: under GLOBAL / THREAD_LOCAL a thread with an ongoing (non-relaxed)
    // capture "is prohibited from potentially unsafe API calls"; the capture is then
    // invalidated and cuStreamEndCapture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
    setup();
    let s = stream(1);
    assert_eq!(
        cuStreamBeginCapture_v2(s, abi::CAPTURE_MODE_THREAD_LOCAL),
        abi::SUCCESS
    );
    assert_eq!(cuCtxSynchronize(), abi::CAPTURE_UNSUPPORTED);
    let mut graph = 0usize;
    // SAFETY: a valid out-pointer.
    assert_eq!(
        // SAFETY: valid out-pointers and handles of this test.
        unsafe { cuStreamEndCapture(s, &mut graph) },
        abi::CAPTURE_INVALIDATED
    );
    // A relaxed thread may synchronise while its capture runs.
    let mut mode = abi::CAPTURE_MODE_RELAXED;
    assert_eq!(
        cuStreamBeginCapture_v2(s, abi::CAPTURE_MODE_THREAD_LOCAL),
        abi::SUCCESS
    );
    // SAFETY: a valid in/out pointer.
    assert_eq!(
        // SAFETY: valid out-pointers and handles of this test.
        unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) },
        abi::SUCCESS
    );
    assert_eq!(cuCtxSynchronize(), abi::SUCCESS);
    // SAFETY: as above.
    assert_eq!(
        // SAFETY: valid out-pointers and handles of this test.
        unsafe { cuThreadExchangeStreamCaptureMode(&mut mode) },
        abi::SUCCESS
    );
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { cuStreamEndCapture(s, &mut graph) }, abi::SUCCESS);
}

#[test]
fn device_memory_is_not_host_memory_and_freed_blocks_are_poisoned() {
    // cuPointerGetAttribute: CU_POINTER_ATTRIBUTE_MEMORY_TYPE is CU_MEMORYTYPE_DEVICE for
    // device memory; a host pointer is not one of its allocations (CUDA_ERROR_INVALID_VALUE).
    setup();
    let s = stream(1);
    let mut p = 0u64;
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(cuMemAllocAsync(&mut p, 64, s), abi::SUCCESS);
        let mut kind = 0u32;
        let host = 0u64;
        let at = (&mut kind as *mut u32).cast();
        assert_eq!(
            cuPointerGetAttribute(at, abi::POINTER_ATTRIBUTE_MEMORY_TYPE, p),
            abi::SUCCESS
        );
        assert_eq!(kind, abi::MEMORYTYPE_DEVICE);
        let host_ptr = &host as *const u64 as u64;
        assert_eq!(
            cuPointerGetAttribute(at, abi::POINTER_ATTRIBUTE_MEMORY_TYPE, host_ptr),
            abi::INVALID_VALUE
        );
        memset(p, 3, s);
        // Stream-ordered allocation: a block freed on a stream may be handed out again to
        // later work of that stream; it then holds the poison, not the old data.
        assert_eq!(cuMemFreeAsync(p, s), abi::SUCCESS);
        let mut q = 0u64;
        assert_eq!(cuMemAllocAsync(&mut q, 64, s), abi::SUCCESS);
        assert_eq!(q, p, "the same stream reuses its freed block");
        assert_eq!(cuStreamSynchronize(s), abi::SUCCESS);
        assert_eq!(
            read_u32(q),
            u32::MAX,
            "a reused block still held its old data"
        );
    }
    assert!(
        p >= 0x7e00_0000_0000_0000,
        "device addresses are above every host address"
    );
}
