//! c10d-compile: not built yet (see the project's issues). This crate exports nothing.
