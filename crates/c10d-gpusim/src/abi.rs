//! The numbers of the C ABI the simulator answers with: `CUresult` codes and the enum values of
//! `cuda.h` it reads, and the handle encoding. Values from `cuda.h` (CUDA 12.8), as cudarc's
//! bindings spell them.

/// `CUresult`.
pub type CuResult = u32;
/// `CUDA_SUCCESS`.
pub const SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const OUT_OF_MEMORY: CuResult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const NOT_INITIALIZED: CuResult = 3;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const INVALID_DEVICE: CuResult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const INVALID_CONTEXT: CuResult = 201;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub const INVALID_HANDLE: CuResult = 400;
/// `CUDA_ERROR_NOT_READY`.
pub const NOT_READY: CuResult = 600;
/// `CUDA_ERROR_ILLEGAL_ADDRESS` (sticky: the context is unusable after it).
pub const ILLEGAL_ADDRESS: CuResult = 700;
/// `CUDA_ERROR_NOT_SUPPORTED`: what a function the simulator does not implement returns.
pub const NOT_SUPPORTED: CuResult = 801;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: a call not permitted during a capture.
pub const CAPTURE_UNSUPPORTED: CuResult = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture was invalidated by an earlier error.
pub const CAPTURE_INVALIDATED: CuResult = 901;
/// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`: `cuStreamEndCapture` on a stream that did not begin it.
pub const CAPTURE_UNMATCHED: CuResult = 903;
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`: the legacy stream used while a blocking stream captures.
pub const CAPTURE_IMPLICIT: CuResult = 906;
/// `CUDA_ERROR_CAPTURED_EVENT`: a query or sync of an event recorded in a capture.
pub const CAPTURED_EVENT: CuResult = 907;

/// `CU_STREAM_LEGACY`: the legacy default stream, also what the null handle means.
pub const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
pub const STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
pub const STREAM_NON_BLOCKING: u32 = 0x1;

/// `CUstreamCaptureStatus`.
pub const CAPTURE_STATUS_NONE: u32 = 0;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CAPTURE_STATUS_ACTIVE: u32 = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`.
pub const CAPTURE_STATUS_INVALIDATED: u32 = 2;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub const CAPTURE_MODE_GLOBAL: u32 = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
pub const CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CAPTURE_MODE_RELAXED: u32 = 2;

/// `CU_POINTER_ATTRIBUTE_CONTEXT`.
pub const POINTER_ATTRIBUTE_CONTEXT: u32 = 1;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub const POINTER_ATTRIBUTE_MEMORY_TYPE: u32 = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_POINTER`.
pub const POINTER_ATTRIBUTE_DEVICE_POINTER: u32 = 3;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub const POINTER_ATTRIBUTE_DEVICE_ORDINAL: u32 = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const POINTER_ATTRIBUTE_RANGE_START_ADDR: u32 = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const POINTER_ATTRIBUTE_RANGE_SIZE: u32 = 12;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: u32 = 2;

/// `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND`, `_NOR` (the low bits of the flags).
pub const WAIT_VALUE_GEQ: u32 = 0;
/// `CU_STREAM_WAIT_VALUE_EQ`.
pub const WAIT_VALUE_EQ: u32 = 1;
/// `CU_STREAM_WAIT_VALUE_AND`.
pub const WAIT_VALUE_AND: u32 = 2;
/// `CU_STREAM_WAIT_VALUE_NOR`.
pub const WAIT_VALUE_NOR: u32 = 3;

/// The name and text of a `CUresult`, as `cuGetErrorName` / `cuGetErrorString` give them.
pub fn error_text(code: CuResult) -> (&'static str, &'static str) {
    match code {
        SUCCESS => ("CUDA_SUCCESS\0", "no error\0"),
        INVALID_VALUE => ("CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
        OUT_OF_MEMORY => ("CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
        NOT_INITIALIZED => ("CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
        INVALID_DEVICE => ("CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
        INVALID_CONTEXT => ("CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
        INVALID_HANDLE => ("CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
        NOT_READY => ("CUDA_ERROR_NOT_READY\0", "device not ready\0"),
        ILLEGAL_ADDRESS => (
            "CUDA_ERROR_ILLEGAL_ADDRESS\0",
            "an illegal memory access was encountered\0",
        ),
        NOT_SUPPORTED => ("CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
        CAPTURE_UNSUPPORTED => (
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
            "operation not permitted when stream is capturing\0",
        ),
        CAPTURE_INVALIDATED => (
            "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0",
            "operation failed due to a previous error during capture\0",
        ),
        CAPTURE_UNMATCHED => (
            "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0",
            "capture was not initiated in this stream\0",
        ),
        CAPTURE_IMPLICIT => (
            "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT\0",
            "operation would make the legacy stream depend on a capturing blocking stream\0",
        ),
        CAPTURED_EVENT => (
            "CUDA_ERROR_CAPTURED_EVENT\0",
            "operation not permitted on an event last recorded in a capturing stream\0",
        ),
        _ => ("CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
    }
}
