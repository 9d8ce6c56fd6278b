//! `c10d-store`: serve a PyTorch-compatible TCPStore, or talk to any TCPStore (ours or
//! PyTorch's) like `redis-cli`.
//!
//! ```text
//! c10d-store serve [--host ADDR] [--port P] [--world-size N]
//! c10d-store --addr HOST:PORT [--timeout-ms T] <op> ARGS…
//! ```
//! Keys are user keys: they go on the wire with PyTorch's "/" prefix, so `get foo` reads what
//! `store.set("foo", …)` wrote in Python. A failed op exits with status 1 and the error on stderr.

use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "c10d-store",
    version,
    about = "PyTorch-compatible TCPStore server and client"
)]
struct Cli {
    /// Store address, HOST:PORT (IPv6 as [ADDR]:PORT). Required for every op except `serve`.
    #[arg(long, global = true)]
    addr: Option<String>,
    /// Timeout of connecting and of every blocking op, in milliseconds (also `wait`'s timeout).
    #[arg(long, global = true, default_value_t = 30_000)]
    timeout_ms: u64,
    /// The job's secret file (owner-only): `serve` requires it of every client, the other ops
    /// prove it (as `C10D_AUTH_SECRET_FILE`; never the secret itself on the command line).
    #[arg(long, global = true)]
    auth_secret_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    op: Op,
}

#[derive(Subcommand)]
enum Op {
    /// Run a server until killed; prints `c10d-store listening on HOST:PORT` once.
    Serve {
        /// Address to bind (default: all interfaces, dual-stack).
        #[arg(long)]
        host: Option<String>,
        /// Port (0 = any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Expected number of workers (informational).
        #[arg(long)]
        world_size: Option<usize>,
    },
    /// Make a new job secret file at PATH (32 random bytes, owner-only; never overwrites) for
    /// `--auth-secret-file` / `C10D_AUTH_SECRET_FILE`.
    NewSecret { path: std::path::PathBuf },
    /// Make a job's TLS files in DIR: `ca.pem`, `cert.pem`, `key.pem` (owner-only), a new CA and
    /// a certificate it signed for the name `c10d-rs`; never overwrites. Point
    /// `C10D_TLS_CA_FILE`, `C10D_TLS_CERT_FILE` and `C10D_TLS_KEY_FILE` at them.
    NewTls { dir: std::path::PathBuf },
    /// Set KEY to VALUE.
    Set { key: String, value: String },
    /// Print KEY's value bytes (waits for the key up to the timeout).
    Get { key: String },
    /// Add N to KEY and print the new value.
    Add {
        key: String,
        #[arg(allow_hyphen_values = true)]
        n: i64,
    },
    /// Print true if every KEY exists, else false.
    Check {
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Wait until every KEY exists (up to --timeout-ms).
    Wait {
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Delete KEY; print true if it existed.
    Delete { key: String },
    /// Print the number of keys (including internal ones such as `init/`).
    NumKeys,
    /// Compare-and-set; print the returned value.
    CompareSet {
        key: String,
        expected: String,
        desired: String,
    },
    /// Append VALUE to KEY.
    Append { key: String, value: String },
    /// Print each KEY's value, one a line.
    MultiGet {
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// Set KEY VALUE pairs.
    MultiSet {
        #[arg(required = true, num_args = 2..)]
        pairs: Vec<String>,
    },
}

fn split_addr(addr: &str) -> Result<(String, u16), String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("--addr {addr}: expected HOST:PORT"))?;
    let port = port
        .parse::<u16>()
        .map_err(|e| format!("--addr {addr}: bad port: {e}"))?;
    Ok((host.to_string(), port))
}

fn run(cli: Cli) -> Result<(), String> {
    let timeout = Duration::from_millis(cli.timeout_ms);
    if let Op::Serve {
        host,
        port,
        world_size,
    } = cli.op
    {
        return serve(host, port, world_size);
    }
    if let Op::NewSecret { path } = &cli.op {
        c10d_store::AuthSecret::create_file(path).map_err(|e| e.to_string())?;
        println!("c10d-store: new secret file {}", path.display());
        return Ok(());
    }
    if let Op::NewTls { dir } = &cli.op {
        let f = c10d_store::tls::create_job_files(dir).map_err(|e| e.to_string())?;
        println!(
            "c10d-store: new TLS files: C10D_TLS_CA_FILE={} C10D_TLS_CERT_FILE={} C10D_TLS_KEY_FILE={}",
            f.ca.display(),
            f.cert.display(),
            f.key.display()
        );
        return Ok(());
    }
    let addr = cli.addr.ok_or("--addr HOST:PORT is required for this op")?;
    let (host, port) = split_addr(&addr)?;
    let st = TcpStore::new(
        &host,
        port,
        TcpStoreOptions {
            timeout,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    client_op(&st, cli.op, timeout)
}

/// `serve`: hosts a server and prints where it listens; runs until killed.
fn serve(host: Option<String>, port: u16, world_size: Option<usize>) -> Result<(), String> {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: host.clone(),
        port,
        world_size,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let shown = match &host {
        Some(h) if h.contains(':') && !h.starts_with('[') => format!("[{h}]:{}", srv.port()),
        Some(h) => format!("{h}:{}", srv.port()),
        None => srv.local_addr().to_string(),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "c10d-store listening on {shown}")
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())?;
    drop(out);
    loop {
        std::thread::park();
    }
}

/// One client op against the store, its answer on stdout.
fn client_op(st: &TcpStore, op: Op, timeout: Duration) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    let e = |e: c10d_core::DistError| e.to_string();
    let w = |r: std::io::Result<()>| r.map_err(|e| e.to_string());
    match op {
        Op::Serve { .. } | Op::NewSecret { .. } | Op::NewTls { .. } => {
            unreachable!("handled above")
        }
        Op::Set { key, value } => st.set(&key, value.as_bytes()).map_err(e)?,
        Op::Get { key } => w(out.write_all(&st.get(&key).map_err(e)?))?,
        Op::Add { key, n } => w(writeln!(out, "{}", st.add(&key, n).map_err(e)?))?,
        Op::Check { keys } => {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            w(writeln!(out, "{}", st.check(&refs).map_err(e)?))?
        }
        Op::Wait { keys } => {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            st.wait_timeout(&refs, timeout).map_err(e)?
        }
        Op::Delete { key } => w(writeln!(out, "{}", st.delete_key(&key).map_err(e)?))?,
        Op::NumKeys => w(writeln!(out, "{}", st.num_keys().map_err(e)?))?,
        Op::CompareSet {
            key,
            expected,
            desired,
        } => w(out.write_all(
            &st.compare_set(&key, expected.as_bytes(), desired.as_bytes())
                .map_err(e)?,
        ))?,
        Op::Append { key, value } => st.append(&key, value.as_bytes()).map_err(e)?,
        Op::MultiGet { keys } => {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            for v in st.multi_get(&refs).map_err(e)? {
                w(out.write_all(&v).and_then(|_| out.write_all(b"\n")))?;
            }
        }
        Op::MultiSet { pairs } => {
            if pairs.len() % 2 != 0 {
                return Err("multi-set expects KEY VALUE pairs".into());
            }
            let keys: Vec<&str> = pairs.iter().step_by(2).map(String::as_str).collect();
            let vals: Vec<&[u8]> = pairs
                .iter()
                .skip(1)
                .step_by(2)
                .map(|s| s.as_bytes())
                .collect();
            st.multi_set(&keys, &vals).map_err(e)?;
        }
    }
    w(out.flush())
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    if let Some(path) = &cli.auth_secret_file {
        if let Err(e) = c10d_store::AuthSecret::from_file(path) {
            eprintln!("c10d-store: error: --auth-secret-file: {e}");
            return ExitCode::FAILURE;
        }
        // Before any thread starts: every server and client below finds it there.
        std::env::set_var(c10d_store::auth::SECRET_FILE_ENV, path);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("c10d-store: error: {e}");
            ExitCode::FAILURE
        }
    }
}
