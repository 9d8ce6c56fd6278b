//! The simulated CUDA driver: state (`device`, `memory`, `pool`, `stream`, `event`,
//! `capture`, `launch`) below, the exported `cu*` functions (`api_*`) above.

pub mod api_context;
pub mod api_memory;
pub mod api_stream;
pub mod capture;
pub mod device;
pub mod event;
pub mod launch;
pub mod memory;
pub mod pool;
pub mod stream;
