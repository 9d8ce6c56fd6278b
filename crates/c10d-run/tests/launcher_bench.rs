//! `c10d-bench`: table format, every op on 1–3 ranks with a real element check, the check
//! catching a corrupted element, running under `c10drun`, and clear errors.

mod launcher_util;
use launcher_util::*;
use std::time::Duration;

/// The `c10d-bench` binary of c10d-tools (built with cargo when missing).
static BENCH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| workspace_bin("c10d-tools", "c10d-bench"));

/// One data row: size, count, type, redop, time(us), algbw, busbw, #wrong.
#[derive(Debug)]
struct Row {
    size: usize,
    count: usize,
    dtype: String,
    redop: String,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
}

/// Parses the table: every line is a '#' header/footer or a data row of 8 columns.
fn rows(stdout: &str, prefix: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for line in stdout.lines() {
        let Some(l) = line.strip_prefix(prefix) else {
            continue;
        };
        if l.trim_start().starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 8, "bad row {l:?}");
        out.push(Row {
            size: f[0].parse().unwrap(),
            count: f[1].parse().unwrap(),
            dtype: f[2].into(),
            redop: f[3].into(),
            time_us: f[4].parse().unwrap(),
            algbw: f[5].parse().unwrap(),
            busbw: f[6].parse().unwrap(),
            wrong: f[7].parse().unwrap(),
        });
    }
    out
}

fn bench(args: &[&str], envs: &[(&str, &str)]) -> Output {
    spawn(BENCH.as_str(), args, envs).finish(Duration::from_secs(180))
}

#[test]
fn every_op_gives_a_checked_table() {
    for op in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
        "sendrecv",
    ] {
        for n in ["1", "3"] {
            let out = bench(
                &[
                    op, "--nproc", n, "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-w", "1",
                ],
                &[],
            );
            assert_eq!(out.code, Some(0), "{op} x{n}: {out}");
            let r = rows(&out.stdout, "");
            assert_eq!(r.len(), 3, "{op} x{n}: {out}");
            let n: usize = n.parse().unwrap();
            for (row, want) in r.iter().zip([1024usize, 4096, 16384]) {
                // Sizes are rounded down to a multiple of the world size where the op needs it.
                let step = if matches!(op, "all_gather" | "reduce_scatter" | "all_to_all") {
                    4 * n
                } else {
                    4
                };
                assert_eq!(row.size, want / step * step, "{op}: {row:?}");
                assert_eq!(row.count * 4, row.size, "{op}: {row:?}");
                assert_eq!(row.dtype, "float");
                assert_eq!(
                    row.redop,
                    if matches!(op, "all_reduce" | "reduce_scatter" | "reduce") {
                        "sum"
                    } else {
                        "none"
                    }
                );
                assert_eq!(row.wrong, 0, "{op}: {row:?}");
                // algbw is printed to 3 decimals (GB/s): a slow call on a loaded machine (1 KiB
                // in 2 ms) prints 0.000, so check it against size and time, not against zero.
                assert!(row.time_us > 0.0, "{op}: {row:?}");
                let algbw = row.size as f64 / (row.time_us * 1e3);
                assert!(
                    (row.algbw - algbw).abs() <= 0.0006 + 0.01 * algbw,
                    "{op}: {row:?}"
                );
                let factor = match op {
                    "all_reduce" => 2.0 * (n as f64 - 1.0) / n as f64,
                    "all_gather" | "reduce_scatter" | "all_to_all" => (n as f64 - 1.0) / n as f64,
                    _ => 1.0,
                };
                assert!(
                    (row.busbw - row.algbw * factor).abs() <= 0.002 + 0.01 * row.busbw,
                    "{op} x{n}: {row:?}"
                );
            }
            assert!(
                out.stdout
                    .lines()
                    .next()
                    .unwrap()
                    .starts_with(&format!("# c10d-bench {op}: nranks {n}, backend gloo")),
                "{out}"
            );
            assert!(
                out.stdout.contains("# Out of bounds values : 0 OK"),
                "{out}"
            );
        }
    }
}

#[test]
fn dtypes_and_reductions_are_checked() {
    for (d, o) in [
        ("double", "max"),
        ("half", "sum"),
        ("bfloat16", "avg"),
        ("int8", "prod"),
        ("int64", "bxor"),
        ("bool", "min"),
        ("int32", "avg"),
    ] {
        let out = bench(
            &[
                "all_reduce",
                "--nproc",
                "3",
                "-b",
                "1K",
                "-e",
                "2K",
                "-d",
                d,
                "-o",
                o,
                "-n",
                "2",
                "-w",
                "1",
            ],
            &[],
        );
        assert_eq!(out.code, Some(0), "{d} {o}: {out}");
        let r = rows(&out.stdout, "");
        assert_eq!(r.len(), 2);
        assert!(
            r.iter().all(|r| r.wrong == 0 && r.redop == o),
            "{d} {o}: {out}"
        );
    }
}

#[test]
fn a_corrupted_element_is_counted_and_fails_the_run() {
    let out = bench(
        &[
            "all_gather",
            "--nproc",
            "3",
            "-b",
            "1K",
            "-e",
            "4K",
            "-n",
            "2",
        ],
        &[("C10D_BENCH_CORRUPT_RANK", "1")],
    );
    assert_eq!(out.code, Some(1), "{out}");
    let r = rows(&out.stdout, "");
    assert_eq!(r.len(), 3);
    assert!(r.iter().all(|r| r.wrong == 1), "{out}");
    assert!(
        out.stdout.contains("# Out of bounds values : 3 FAILED"),
        "{out}"
    );
}

#[test]
fn runs_as_ranks_of_a_c10drun_job() {
    let out = run_c10drun(
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            BENCH.as_str(),
            "reduce_scatter",
            "-b",
            "1K",
            "-e",
            "2K",
            "-n",
            "3",
        ],
        Duration::from_secs(180),
    );
    assert_eq!(out.code, Some(0), "{out}");
    let r = rows(&out.stdout, "[rank 0]: ");
    assert_eq!(r.len(), 2, "{out}");
    assert!(r.iter().all(|r| r.wrong == 0));
    assert!(
        out.stdout
            .contains("[rank 0]: # c10d-bench reduce_scatter: nranks 2"),
        "{out}"
    );
    // Only rank 0 prints the table.
    assert!(!out.stdout.contains("[rank 1]: #"), "{out}");
}

#[test]
fn bad_requests_fail_clearly() {
    if !c10d_world::is_nccl_available() {
        // Without a GPU or NCCL the reason is c10d-nccl's (no GPU first, as PyTorch checks).
        let out = bench(&["all_reduce", "--nproc", "2", "--backend", "nccl"], &[]);
        assert_eq!(out.code, Some(1), "{out}");
        let reason = c10d_nccl::check_available().unwrap_err().to_string();
        assert!(
            out.stderr.contains(&format!(
                "backend 'nccl' is not available: {reason}; use --backend gloo"
            )),
            "{out}"
        );
    }
    let out = bench(
        &["all_reduce", "--nproc", "2", "-d", "float", "-o", "band"],
        &[],
    );
    assert_eq!(out.code, Some(1), "{out}");
    assert!(
        out.stderr
            .contains("Cannot use ReduceOp.BAND with non-integral dtype torch.float32"),
        "{out}"
    );
    let out = bench(&["all_reduce", "-b", "1K", "-e", "1K"], &[]);
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("RANK/WORLD_SIZE not set"), "{out}");
    let out = bench(&["all_reduce", "--nproc", "2", "-b", "1X"], &[]);
    assert_ne!(out.code, Some(0), "{out}");
    assert!(out.stderr.contains("invalid size '1X'"), "{out}");
    let out = bench(&["gather", "--nproc", "2"], &[]);
    assert_ne!(out.code, Some(0), "{out}");
}
