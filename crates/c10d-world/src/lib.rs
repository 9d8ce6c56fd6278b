//! c10d-world: under construction.
