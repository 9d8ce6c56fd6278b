//! c10d-nccl: not built yet (see the project's issues). This crate exports nothing.
