//! `c10drun`: the launcher of c10d-rs, doing `torchrun`'s job for any program (Rust or Python)
//! with torchrun's command line: replacing `torchrun` by `c10drun` just works.
//!
//! The launcher lives in the `c10d_run` library (see its `launch` module for what it does and
//! how it differs from torchrun); this binary parses the command line and runs it.

use clap::Parser;

fn main() {
    std::process::exit(c10d_run::launch(c10d_run::Args::parse()));
}
