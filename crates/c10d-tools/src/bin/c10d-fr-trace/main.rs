//! `c10d-fr-trace`: reads the flight-recorder dumps of all ranks of a job and says, group by
//! group, what happened — the c10d-rs counterpart of PyTorch's
//! `python -m torch.distributed.flight_recorder.fr_trace`, and it reads PyTorch's dumps too.
//!
//! ```text
//! c10d-fr-trace [--prefix P] [-v] DUMPS...
//! ```
//!
//! `DUMPS` are dump files (`<prefix><rank>`), directories holding them, or their prefix
//! (`~/.cache/torch/comm_lib_trace_rank_` reads `..._0`, `..._1` ...). For each process group
//! (by name and global ranks) it reports, in plain words:
//!
//! - members without a dump;
//! - the first collective that some ranks entered and others never did (naming the ranks that
//!   did not, with the last collective each of them entered, and the state of those waiting);
//! - the first collective the ranks ran differently (another op, other sizes or dtypes), each
//!   variant with its ranks;
//! - the ranks that are behind: the lowest last completed collective when ranks differ;
//! - per rank, the first op that failed (with its error) and the first still pending.
//!
//! Ranks are global ranks; collective numbers are the group's `collective_seq_id` (1-based).
//! Only the ops still in every rank's ring can be compared: analysis starts at the latest first
//! collective of any rank. `-v` also prints every rank's ops of every group. Exit status: 0
//! when nothing is wrong, 1 when something is reported, 2 when the dumps cannot be read.

mod analyze;
mod load;
mod report;

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Explains a hang or failure from the flight-recorder dumps of all ranks.
#[derive(Parser, Debug)]
#[command(name = "c10d-fr-trace", version)]
struct Args {
    /// Dump files, directories of dumps, or the dump prefix (`<prefix><rank>` files).
    #[arg(required = true)]
    dumps: Vec<PathBuf>,
    /// File-name prefix before the rank (inferred when all files in a directory share one).
    #[arg(short, long)]
    prefix: Option<String>,
    /// Also print every rank's recorded ops, group by group.
    #[arg(short, long)]
    verbose: bool,
}

fn print_ops(g: &analyze::GroupReport, dumps: &[load::RankDump]) {
    for d in dumps.iter().filter(|d| g.dumped.contains(&d.rank)) {
        println!("  rank {} ({}):", d.rank, d.path.display());
        for e in d
            .dump
            .entries
            .iter()
            .filter(|e| e.process_group.0 == g.name)
        {
            let op = analyze::Op {
                rank: d.rank,
                entry: e.clone(),
            };
            println!("    {}: {}", report::what(&op, &g.ranks), report::state(e));
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let dumps = match load::resolve(&args.dumps, args.prefix.as_deref()).and_then(load::read_all) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("c10d-fr-trace: {e}");
            return ExitCode::from(2);
        }
    };
    let ranks: Vec<usize> = dumps.iter().map(|d| d.rank).collect();
    println!("read {} dump(s): {}", dumps.len(), report::ranks(&ranks));
    let groups = analyze::analyze(&dumps);
    let mut problems = false;
    for g in &groups {
        print!("{}", report::render(g));
        if args.verbose {
            print_ops(g, &dumps);
        }
        problems |= !g.findings.is_empty();
    }
    if problems {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
