//! c10d-world: not built yet (see the project's issues). This crate exports nothing.
