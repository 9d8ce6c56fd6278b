//! Shared by the flight-recorder tests: a real 3-process gloo job in which rank 2 never joins
//! the third all-reduce (its test binary re-runs itself as the ranks), and a builder of
//! synthetic dumps.
#![allow(dead_code)]

use c10d_core::flight_recorder::{Dump, DumpEntry, PgConfig};
use c10d_core::{AllreduceOptions, Collectives, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const CHILD: &str = "C10D_FR_TEST_CHILD";
const PORT: &str = "C10D_FR_TEST_PORT";
pub const N: usize = 3;

fn store(port: u16) -> Arc<dyn Store> {
    let o = TcpStoreOptions {
        timeout: Duration::from_secs(60),
        wait_for_workers: false,
        ..Default::default()
    };
    Arc::new(TcpStore::new("127.0.0.1", port, o).expect("connect to the test's store"))
}

/// A rank of the job: two all-reduces of 256 floats, then ranks 0 and 1 a third one that
/// times out after 1 s because rank 2 writes its dump on request instead (and waits until the
/// parent has sent it `SIGUSR1`, which writes it again).
pub fn child_main() {
    let rank: usize = std::env::var(CHILD).unwrap().parse().unwrap();
    let port: u16 = std::env::var(PORT).unwrap().parse().unwrap();
    let s = store(port);
    let opts = GlooOptions {
        timeout: Duration::from_secs(30),
        global_ranks: (0..N).collect(),
        ..Default::default()
    };
    let pg = ProcessGroupGloo::new(s.clone(), rank, N, opts).unwrap();
    for _ in 0..2 {
        let t = Tensor::from_vec(vec![1f32; 256]);
        pg.all_reduce(&[t], &Default::default())
            .unwrap()
            .wait()
            .unwrap();
    }
    if rank == N - 1 {
        let path = c10d_world::flight_recorder::dump().unwrap();
        println!("RANK-DUMPED {}", path.display());
        s.wait_timeout(&["finish"], Duration::from_secs(60))
            .unwrap();
        return;
    }
    let o = AllreduceOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let t = Tensor::from_vec(vec![1f32; 256]);
    let err = pg.all_reduce(&[t], &o).unwrap().wait().unwrap_err();
    println!("RANK-ERROR {}", err.message());
}

/// Kills and reaps the ranks left when dropped.
pub struct Kids(pub Vec<Child>);
impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (bounded) until `path` exists.
pub fn wait_for_file(path: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    path.exists()
}

/// Runs the job with dumps going to `<dir>/trace_<rank>`; returns the prefix once every rank
/// wrote its dump (rank 2's a second time, on `SIGUSR1`). The ranks are this test binary
/// re-run with the calling test's name (`test`), which must call [`child_main`] first thing
/// when `CHILD` is set.
pub fn run_timeout_job(dir: &Path, test: &str) -> String {
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..Default::default()
    })
    .unwrap();
    let prefix = format!("{}/trace_", dir.display());
    let exe = std::env::current_exe().unwrap();
    let kids: Vec<Child> = (0..N)
        .map(|r| {
            Command::new(&exe)
                .args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, r.to_string())
                .env(PORT, srv.port().to_string())
                .env("TORCH_FR_DUMP_TEMP_FILE", &prefix)
                .env("C10D_FR_DUMP_SIGNAL", "SIGUSR1")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut kids = Kids(kids);
    let mut outs = Vec::new();
    for c in kids.0.iter_mut().take(N - 1) {
        let out = std::io::read_to_string(c.stdout.take().unwrap()).unwrap();
        assert!(c.wait().unwrap().success(), "rank failed: {out}");
        outs.push(out);
    }
    for out in &outs {
        assert!(
            out.contains("RANK-ERROR") && out.contains("Timed out"),
            "{out}"
        );
    }
    // Rank 2 wrote its dump on request; make it write again on the signal.
    let last = PathBuf::from(format!("{prefix}{}", N - 1));
    assert!(
        wait_for_file(&last),
        "rank {} wrote no dump on request",
        N - 1
    );
    std::fs::remove_file(&last).unwrap();
    let pid = kids.0[N - 1].id() as i32;
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    assert!(
        wait_for_file(&last),
        "rank {} wrote no dump on SIGUSR1",
        N - 1
    );
    store(srv.port()).set("finish", b"1").unwrap();
    let c = &mut kids.0[N - 1];
    let out = std::io::read_to_string(c.stdout.take().unwrap()).unwrap();
    assert!(c.wait().unwrap().success(), "rank {} failed: {out}", N - 1);
    assert!(out.contains("RANK-DUMPED"), "{out}");
    prefix
}

/// A completed all-reduce #seq of `n` floats in group "0" (description "default_pg").
pub fn entry(seq: u64, op: &str, n: i64) -> DumpEntry {
    DumpEntry {
        record_id: seq - 1,
        pg_id: 0,
        process_group: ("0".into(), "default_pg".into()),
        collective_seq_id: seq,
        op_id: seq,
        profiling_name: format!("gloo:{op}"),
        time_created_ns: 1_000 + seq,
        input_sizes: vec![vec![n]],
        input_dtypes: vec!["Float".into()],
        output_sizes: vec![vec![n]],
        output_dtypes: vec!["Float".into()],
        state: "completed".into(),
        time_discovered_started_ns: Some(2_000 + seq),
        time_discovered_completed_ns: Some(3_000 + seq),
        retired: true,
        timeout_ms: 1000,
        ..Default::default()
    }
}

/// A started, not completed, entry.
pub fn started(mut e: DumpEntry) -> DumpEntry {
    e.state = "started".into();
    e.retired = false;
    e.time_discovered_completed_ns = None;
    e
}

/// A dump of group "0" over `ranks` with these entries.
pub fn dump(ranks: &str, entries: Vec<DumpEntry>) -> Dump {
    let mut d = Dump {
        version: "2.10".into(),
        entries,
        ..Default::default()
    };
    d.pg_config.insert(
        "0".into(),
        PgConfig {
            name: "0".into(),
            desc: "default_pg".into(),
            ranks: ranks.into(),
        },
    );
    d
}
