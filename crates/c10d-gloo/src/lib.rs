//! c10d-gloo: not built yet (see the project's issues). This crate exports nothing.
