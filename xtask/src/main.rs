//! `cargo xtask …`: orchestration for c10d-rs developers and CI.
//!
//! - `cargo xtask test [--no-interop] [--no-lint]`: the whole test suite: `lint`, every
//!   workspace test, then the interop tests against real PyTorch (provisioning it first; see
//!   `interop`).
//! - `cargo xtask lint`: clippy and rustdoc with warnings as errors, c10d-world with only
//!   its `gloo` feature (nothing of CUDA in its graph), `cargo deny check licenses bans
//!   sources` (cargo-deny installed first where missing), `cargo machete` (unused
//!   dependencies, see `unused_deps`), then `publish-check`.
//! - `cargo xtask publish-check`: `cargo publish --dry-run` of every published crate, in
//!   dependency order (cargo packages them all and verifies each against the others).
//! - `cargo xtask interop`: provisions PyTorch 2.15 (CPU use) into a cached virtualenv
//!   (`$C10D_TORCH_VENV`, default `~/.cache/c10d-rs/torch-venv`) and runs every
//!   `crates/*/tests/interop*.rs` test binary with `C10D_TORCH_PYTHON` pointing at it.
//! - `cargo xtask python`: builds the `c10d_rs` wheel (maturin, release), installs it into the
//!   PyTorch virtualenv and runs its pytest suite (`crates/c10d-python/tests`); `cargo xtask
//!   wheel` only builds the wheel into `target/wheels`; `cargo xtask pytorch-suite` runs
//!   PyTorch's own generic distributed test suite against "c10drs" (tens of minutes; not part
//!   of `test`); `cargo xtask gloo-tests --tests-dir DIR` runs PyTorch's `test_c10d_gloo.py`
//!   (from a PyTorch checkout: it is not in the wheel) on "c10drs" and on Gloo and compares.
//! - `cargo xtask demo`: the main job: builds release binaries, launches the data-parallel
//!   training demo on 4 ranks with `c10drun` (gradients reduced by c10d-world's DDP Reducer;
//!   its `ddp:` line gives the buckets and the share of communication hidden behind the backward
//!   pass), then prints a short `c10d-bench` table.
//! - `cargo xtask bench`: the benchmarks with their baselines (store server, reduction kernels,
//!   collectives vs PyTorch's Gloo, and "c10drs" vs "gloo" inside torch.distributed).
//! - `cargo xtask bench-scale [--ranks 32,64,128,256,512] [--hosts 8] [--torch 32]`: the CPU
//!   engine at many ranks over network namespaces (root; see `scale`): set-up and group
//!   creation times, sockets and memory per rank, PyTorch's Gloo at the totals `--torch` names.
//! - `cargo xtask test-multigpu [--bundle DIR] [--list]`: the GPU suites (see `test_multigpu`;
//!   `--list` prints every case, no GPU needed; `--simulated [--filter S]` runs them on
//!   c10d-gpusim, the simulated CUDA driver and NCCL, as `test` does: see `gpusim`); prints
//!   "skipped: no GPU" and succeeds where no GPU exists. `cargo xtask gpu-bundle` builds them
//!   (and the NCCL overhead benchmark) for a GPU machine without a Rust toolchain, with
//!   `run-all.sh`, the one prepared run of both (see `GPU_RUN_ALL`).
//! - `cargo xtask chaos --trials N [--seed S] [--timeout SECS] [--kinds A,B]`: the
//!   fault-injection harness (see `chaos`): N randomized multi-process trials with a rank
//!   killed, stopped, slowed, a connection closed or a network link cut, a hostile pickle sent
//!   to an object collective, a store's TLS handshake or secret challenge broken; last line
//!   `chaos: K of N trials ok`.
//!
//! - `cargo xtask candle-cuda-check`: clippy on c10d-candle's `cuda` feature, with `nvcc` from
//!   PyPI (see `candle_cuda`; minutes; not part of `test`).
//!
//! xtask depends on nothing but std and libc so it builds in seconds.

mod candle_cuda;
mod chaos;
mod gpusim;
mod line_cap;
mod module_cycles;
mod scale;
mod unused_deps;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const TORCH_VERSION: &str = "2.15.0";

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let root = workspace_root();
    env::set_current_dir(&root).expect("cd to workspace root");
    let rest = &args.get(1..).unwrap_or(&[]).to_vec();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(rest),
        Some("lint") => lint(),
        Some("publish-check") => publish_check(),
        Some("interop") => interop(),
        Some("python") => python_tests(rest),
        Some("pytorch-suite") => pytorch_suite(rest),
        Some("gloo-tests") => gloo_tests(rest),
        Some("wheel") => build_wheel().map(|w| println!("{}", w.display())),
        Some("demo") => demo(rest),
        Some("bench") => bench(rest),
        Some("bench-scale") => scale::bench_scale(rest),
        Some("test-multigpu") => test_multigpu(rest),
        Some("gpu-bundle") => gpu_bundle(rest),
        Some("chaos") => chaos::chaos(rest, build_bench),
        Some("candle-cuda-check") => candle_cuda::candle_cuda_check(),
        _ => {
            eprintln!(
                "usage: cargo xtask <test [--no-interop] [--no-lint] | lint | publish-check | interop | python [pytest args] | pytorch-suite [unittest args] | gloo-tests --tests-dir DIR [-k PATTERN] | wheel | demo | bench | bench-scale [--ranks 32,64,..] [--hosts 8] [--torch 32] | test-multigpu [--bundle DIR] [--list] [--simulated [--filter S]] | gpu-bundle [DIR] | chaos --trials N [--seed S] | candle-cuda-check>"
            );
            exit(2);
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: {e}");
        exit(1);
    }
}

pub(crate) type Res = Result<(), String>;

/// The workspace this xtask was built in; a prebuilt xtask copied to another machine (a GPU
/// machine without cargo, see `gpu-bundle`) uses the current directory instead.
fn workspace_root() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = dir
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf();
    if root.join("Cargo.toml").exists() {
        root
    } else {
        env::current_dir().expect("current directory")
    }
}

pub(crate) fn run(cmd: &mut Command) -> Res {
    eprintln!("xtask: running {cmd:?}");
    let st = cmd
        .status()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {st}"))
    }
}

pub(crate) fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn test(args: &[String]) -> Res {
    if !args.iter().any(|a| a == "--no-lint") {
        lint()?;
    }
    // Unit, integration and doc tests of every crate (benches are not run here: they live in
    // `cargo xtask bench`). Examples are built, so they cannot rot. Fault tests fail ops on
    // purpose: their flight-recorder dumps go under target/, not to ~/.cache/torch.
    let mut cmd = cargo();
    cmd.args(["test", "--workspace"]);
    if env::var_os("TORCH_FR_DUMP_TEMP_FILE").is_none() {
        let prefix = workspace_root().join("target/fr-dumps/comm_lib_trace_rank_");
        cmd.env("TORCH_FR_DUMP_TEMP_FILE", prefix);
    }
    run(&mut cmd)?;
    // The GPU suites on the simulated CUDA driver and NCCL (c10d-gpusim): every commit runs
    // c10d-nccl's GPU path, with random stream delays, without a GPU.
    test_multigpu(&["--simulated".to_string()])?;
    chaos_subset()?;
    if args.iter().any(|a| a == "--no-interop") {
        eprintln!("xtask: interop and Python package tests not run (--no-interop)");
        return Ok(());
    }
    interop()?;
    python_tests(&[])
}

/// Trials of the fault-injection harness that `cargo xtask test` runs: one block (every fault
/// kind of every layer once, in the seeded order), so that a regression in how any fault ends
/// fails CI. A kind whose trial failed is tried once more (another seed): a regression fails
/// both times, while a verdict's timing bound met late once on a loaded 2-core machine (about
/// 1 trial in 100 over the full harness) does not fail CI. The full harness
/// (`cargo xtask chaos --trials 200`) is not part of CI.
fn chaos_subset() -> Res {
    let args = |seed: &str, kinds: &[&str]| -> Vec<String> {
        let mut a = vec!["--trials", "each", "--seed", seed, "--timeout", "3"];
        let filter = kinds.join(",");
        if !kinds.is_empty() {
            a.extend(["--kinds", filter.as_str()]);
        }
        a.into_iter().map(str::to_string).collect()
    };
    let failed = chaos::run(&args("2026", &[]), build_bench)?;
    if failed.is_empty() {
        return Ok(());
    }
    println!(
        "xtask: chaos: trying the failed kinds again: {}",
        failed.join(", ")
    );
    chaos::chaos(&args("2027", &failed), build_bench)
}

/// The cargo-deny release `lint` installs where none is found.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// Clippy and rustdoc with warnings as errors, then cargo-deny's license, ban and source checks
/// (`deny.toml`; advisories are checked by hand, see `docs/dependencies.md`).
fn lint() -> Res {
    line_cap::check(Path::new("."))?;
    module_cycles::check(&workspace_root())?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(cargo()
        .args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    gloo_only_has_no_cuda()?;
    let have_deny = cargo()
        .args(["deny", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_deny {
        run(cargo().args([
            "install",
            "cargo-deny",
            "--locked",
            "--version",
            CARGO_DENY_VERSION,
        ]))?;
    }
    run(cargo().args(["deny", "check", "licenses", "bans", "sources"]))?;
    unused_deps::check_unused_deps()?;
    publish_check()
}

/// `cargo publish --workspace --dry-run`: packages every crate that is not `publish = false`
/// and builds each from its package, in dependency order, against the others' packages.
///
/// Cargo unpacks the packages it verifies against into `$CARGO_HOME/registry/src/<overlay>/`
/// and treats them, and what it built from them, as immutable registry code: a second run
/// (same version, other code) would build against the first run's. So the unpacked packages
/// and the builds of our crates go first; the builds live in their own target directory
/// (`target/publish-check`), so that this touches nothing the tests built.
fn publish_check() -> Res {
    let home = env::var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(&env::var("HOME").unwrap_or_default()).join(".cargo"));
    if let Ok(registries) = std::fs::read_dir(home.join("registry/src")) {
        for reg in registries.flatten() {
            remove_ours(&reg.path())?;
        }
    }
    let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let dir = Path::new(&target).join("publish-check");
    remove_ours(&dir.join("debug/.fingerprint"))?;
    run(cargo()
        .args(["publish", "--workspace", "--dry-run", "--allow-dirty"])
        .env("CARGO_TARGET_DIR", dir))
}

/// Removes the entries of `dir` named `c10d-*` (our crates: never on crates.io, so only earlier
/// dry runs put them in the registry's unpacked sources or the fingerprints); a missing `dir`
/// is fine.
fn remove_ours(dir: &Path) -> Res {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with("c10d-") {
            std::fs::remove_dir_all(e.path())
                .map_err(|err| format!("removing {}: {err}", e.path().display()))?;
        }
    }
    Ok(())
}

/// `c10d-world` with only its `gloo` feature builds, and nothing of CUDA is in its graph.
fn gloo_only_has_no_cuda() -> Res {
    let gloo_only = [
        "-p",
        "c10d-world",
        "--no-default-features",
        "--features",
        "gloo",
    ];
    run(cargo().arg("check").args(gloo_only))?;
    let out = cargo()
        .arg("tree")
        .args(gloo_only)
        .args(["-e", "normal", "--prefix", "none"])
        .output()
        .map_err(|e| format!("cargo tree: {e}"))?;
    let tree = String::from_utf8_lossy(&out.stdout);
    let cuda: Vec<&str> = tree
        .lines()
        .filter(|l| {
            ["cudarc", "c10d-nccl", "libloading"]
                .iter()
                .any(|c| l.starts_with(c))
        })
        .collect();
    match cuda.is_empty() && out.status.success() {
        true => Ok(()),
        false => Err(format!("c10d-world with --features gloo pulls in {cuda:?}")),
    }
}

fn venv_dir() -> PathBuf {
    cached_venv("C10D_TORCH_VENV", "torch-venv")
}

/// A cached virtualenv's directory: `$var`, else `~/.cache/c10d-rs/<name>`.
fn cached_venv(var: &str, name: &str) -> PathBuf {
    if let Ok(v) = env::var(var) {
        return PathBuf::from(v);
    }
    let home = env::var("HOME").unwrap_or_else(|_| "/root".into());
    Path::new(&home).join(".cache/c10d-rs").join(name)
}

/// Makes sure the cached virtualenv has torch==2.15.0 and returns its python. Checked once per
/// xtask run (`test` needs it for interop, the wheel and pytest; the check imports torch).
fn provision_torch() -> Result<PathBuf, String> {
    static PY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(py) = PY.get() {
        return Ok(py.clone());
    }
    let py = provision_torch_once()?;
    Ok(PY.get_or_init(|| py).clone())
}

pub(crate) fn provision_torch_once() -> Result<PathBuf, String> {
    let venv = venv_dir();
    let py = venv.join("bin/python");
    let ok = py.exists()
        && Command::new(&py)
            .args(["-c", &format!("import torch,sys,pytest,maturin; sys.exit(0 if torch.__version__.startswith('{TORCH_VERSION}') else 1)")])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
    if ok {
        return Ok(py);
    }
    eprintln!(
        "xtask: provisioning torch=={TORCH_VERSION} into {} (large download, cached afterwards)",
        venv.display()
    );
    if !py.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(&py).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("torch=={TORCH_VERSION}"),
        "numpy",
        "pytest",
        "maturin>=1.7,<2",
    ]))?;
    Ok(py)
}

/// Every `crates/<crate>/tests/interop*.rs` as (package, test name).
fn interop_tests() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(crates) = std::fs::read_dir("crates") else {
        return out;
    };
    let mut crates: Vec<_> = crates.flatten().collect();
    crates.sort_by_key(|e| e.file_name());
    for c in crates {
        let Ok(tests) = std::fs::read_dir(c.path().join("tests")) else {
            continue;
        };
        let mut names: Vec<String> = tests
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("interop") && n.ends_with(".rs"))
            .map(|n| n.trim_end_matches(".rs").to_string())
            .collect();
        names.sort();
        for n in names {
            out.push((c.file_name().to_string_lossy().into_owned(), n));
        }
    }
    out
}

fn interop() -> Res {
    let py = provision_torch()?;
    let tests = interop_tests();
    if tests.is_empty() {
        return Err("no interop tests found under crates/*/tests/interop*.rs".into());
    }
    let mut cmd = cargo();
    cmd.arg("test");
    let mut pkgs: Vec<&String> = tests.iter().map(|(p, _)| p).collect();
    pkgs.dedup();
    for pkg in pkgs {
        cmd.args(["-p", pkg]);
    }
    for (_, t) in &tests {
        cmd.args(["--test", t]);
    }
    // Interop tests spawn PyTorch processes (each a few hundred MB); run them one at a time.
    cmd.args(["--", "--test-threads=1"]);
    cmd.env("C10D_TORCH_PYTHON", &py);
    run(&mut cmd)
}

/// Builds the `c10d_rs` wheel with the virtualenv's maturin and returns its path.
fn build_wheel() -> Result<PathBuf, String> {
    let py = provision_torch()?;
    let out = Path::new("target/wheels");
    let _ = std::fs::remove_dir_all(out);
    run(Command::new(&py)
        .args([
            "-m",
            "maturin",
            "build",
            "--release",
            "--quiet",
            "-m",
            "crates/c10d-python/Cargo.toml",
            "-o",
            "target/wheels",
            "--interpreter",
        ])
        .arg(&py))?;
    std::fs::read_dir(out)
        .map_err(|e| format!("no wheel in {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin left no wheel in {}", out.display()))
}

/// Builds the `c10d_rs` wheel and installs it into the PyTorch virtualenv; returns its python.
fn install_wheel() -> Result<PathBuf, String> {
    let py = provision_torch()?;
    let wheel = build_wheel()?;
    run(Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--force-reinstall", "--no-deps"])
        .arg(&wheel))?;
    Ok(py)
}

/// PyTorch's generic distributed suite (`torch.testing._internal.distributed.distributed_test`)
/// against "c10drs", WORLD_SIZE 3 unless set.
/// The packages PyTorch's test utilities import (`expecttest`, `hypothesis`).
fn install_test_helpers(py: &std::path::Path) -> Res {
    run(Command::new(py).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "expecttest",
        "hypothesis",
    ]))
}

fn pytorch_suite(extra: &[String]) -> Res {
    let py = install_wheel()?;
    install_test_helpers(&py)?;
    run(Command::new(&py)
        .arg("crates/c10d-python/suite/run_pytorch_suite.py")
        .args(extra)
        // BACKEND: the runner defaults it to "c10drs" ("gloo" with C10D_RS_AS_GLOO=1).
        .env(
            "WORLD_SIZE",
            env::var("WORLD_SIZE").unwrap_or_else(|_| "3".into()),
        ))
}

/// Builds and installs the wheel, then runs PyTorch's own `test_c10d_gloo.py` (from `--tests-dir
/// DIR`, a PyTorch checkout's `test/distributed`) on "c10drs" and on Gloo and compares
/// (`crates/c10d-python/suite/run_gloo_tests.py`).
fn gloo_tests(extra: &[String]) -> Res {
    let py = install_wheel()?;
    install_test_helpers(&py)?;
    run(Command::new(&py)
        .arg("crates/c10d-python/suite/run_gloo_tests.py")
        .args(extra))
}

/// Builds and installs the `c10d_rs` wheel, then runs its pytest suite with `extra` arguments.
fn python_tests(extra: &[String]) -> Res {
    let py = install_wheel()?;
    // The launcher test runs c10drun, the weight-sync test the Rust receiver, the mixed-job
    // test the Rust rank, the vLLM test the Rust members: build them once here rather than from
    // inside pytest.
    run(cargo().args(["build", "-p", "c10d-run", "--bin", "c10drun"]))?;
    let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let c10drun = std::fs::canonicalize(format!("{target}/debug/c10drun"))
        .map_err(|e| format!("c10drun not built: {e}"))?;
    let receiver = build_weight_sync_receiver(false)?;
    let mixed_rank = build_example("mixed_rank", false)?;
    let vllm_member = build_example("vllm_member", false)?;
    run(Command::new(&py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "crates/c10d-python/tests",
        ])
        .args(extra)
        .env("C10D_C10DRUN", c10drun)
        .env("C10D_WEIGHT_SYNC_RECEIVER", receiver)
        .env("C10D_MIXED_RANK", mixed_rank)
        .env("C10D_VLLM_MEMBER", vllm_member))
}

fn demo(args: &[String]) -> Res {
    let nproc = args
        .iter()
        .position(|a| a == "--nproc")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| "4".into());
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "c10d-ddp",
        "-p",
        "c10d-run",
        "-p",
        "c10d-tools",
        "--bins",
        "--examples",
    ]))?;
    let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let bin = |n: &str| format!("{target}/release/{n}");
    let demo = bin("examples/ddp_wine");
    println!("== data-parallel training on the wine-quality data, {nproc} ranks (c10drun) ==");
    // No "[rank N]: " prefixes: only rank 0 prints the curves, the checks and the `ddp:` line;
    // the other ranks' lines name their rank.
    run(Command::new(bin("c10drun")).args([
        "--nproc-per-node",
        &nproc,
        "--master-port",
        "0",
        "--no-prefix",
        &demo,
    ]))?;
    println!("\n== c10d-bench all_reduce, 2 ranks, float32 ==");
    run(Command::new(bin("c10d-bench")).args([
        "all_reduce",
        "--nproc",
        "2",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "4",
    ]))
}

fn bench(_args: &[String]) -> Res {
    run(cargo().args(["bench", "-p", "c10d-core", "--bench", "reduce_kernels"]))?;
    let py = provision_torch()?;
    let store_bench = [
        "run",
        "--release",
        "-p",
        "c10d-tools",
        "--bin",
        "c10d-store-bench",
        "--",
    ];
    run(cargo().args(store_bench).env("C10D_TORCH_PYTHON", &py))?;
    run(Command::new("bash")
        .arg("crates/c10d-world/benches/compare.sh")
        .env("C10D_TORCH_PYTHON", &py))?;
    run(cargo()
        .args(["bench", "-p", "c10d-world", "--bench", "device_mesh"])
        .env("C10D_TORCH_PYTHON", &py))?;
    let py = install_wheel()?;
    run(Command::new(&py).arg("crates/c10d-python/benches/torch_backends.py"))?;
    let receiver = build_weight_sync_receiver(true)?;
    run(Command::new(&py)
        .args(["crates/c10d-python/benches/weight_sync.py", "--receiver"])
        .arg(receiver))
}

/// Builds the example `weight_sync_receiver` (release for benchmarks) and returns its path.
fn build_weight_sync_receiver(release: bool) -> Result<PathBuf, String> {
    build_example("weight_sync_receiver", release)
}

/// Builds c10d-world's example `name` and returns its path.
fn build_example(name: &str, release: bool) -> Result<PathBuf, String> {
    let mut cmd = cargo();
    cmd.args(["build", "-p", "c10d-world", "--example", name]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let profile = if release { "release" } else { "debug" };
    std::fs::canonicalize(format!("{target}/{profile}/examples/{name}"))
        .map_err(|e| format!("{name} not built: {e}"))
}

/// Builds `c10d-bench` (debug, as the tests use it) and returns its path.
fn build_bench() -> Result<PathBuf, String> {
    run(cargo().args(["build", "-p", "c10d-tools", "--bin", "c10d-bench"]))?;
    let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    std::fs::canonicalize(format!("{target}/debug/c10d-bench"))
        .map_err(|e| format!("c10d-bench not built: {e}"))
}

fn has_gpu() -> bool {
    Path::new("/dev/nvidiactl").exists()
        || Command::new("nvidia-smi")
            .arg("-L")
            .output()
            .map(|o| o.status.success() && !o.stdout.is_empty())
            .unwrap_or(false)
}

/// The GPU suites: `c10d-nccl`'s `gpu` (every op and dtype, eager init, split, shrink, abort,
/// watchdog timeout, blocking wait; world sizes 1, 2 and 4 on however many GPUs, ranks sharing a
/// GPU through distinct `NCCL_HOSTID`s) and `c10d-world`'s `gpu_world` ("cpu:gloo,cuda:nccl"
/// through the world layer). Built and run with cargo, or, with `--bundle DIR`, run from the
/// binaries `cargo xtask gpu-bundle` put in DIR (for a GPU machine without a Rust toolchain).
/// Prints `N passed, M failed` over both; `skipped: no GPU` without a GPU.
fn test_multigpu(args: &[String]) -> Res {
    let bundle = args
        .iter()
        .position(|a| a == "--bundle")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    if args.iter().any(|a| a == "--list") {
        return list_gpu_cases(bundle.as_deref());
    }
    if args.iter().any(|a| a == "--simulated") {
        return gpusim::test_simulated(args);
    }
    if !has_gpu() {
        println!("skipped: no GPU");
        return Ok(());
    }
    let (binaries, bench) = match &bundle {
        Some(dir) => (
            vec![dir.join("gpu"), dir.join("gpu_world")],
            dir.join("c10d-bench"),
        ),
        None => {
            run(cargo().args([
                "build",
                "--release",
                "-p",
                "c10d-tools",
                "--bin",
                "c10d-bench",
            ]))?;
            let target = env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
            (
                build_gpu_tests(false)?,
                PathBuf::from(format!("{target}/release/c10d-bench")),
            )
        }
    };
    let (mut passed, mut failed) = bench_every_op(&bench);
    let (p, f) = run_gpu_binaries(&binaries, &[]);
    passed += p;
    failed += f;
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        return Err(format!("{failed} GPU test(s) failed"));
    }
    Ok(())
}

/// Runs the GPU suite binaries with `envs` set: (passed, failed) from their summary lines (a
/// binary that fails without one counts as one failure).
pub(crate) fn run_gpu_binaries(binaries: &[PathBuf], envs: &[(String, String)]) -> (usize, usize) {
    let (mut passed, mut failed) = (0, 0);
    for bin in binaries {
        eprintln!("xtask: running {}", bin.display());
        let out = Command::new(bin)
            .env("C10D_REQUIRE_GPU", "1")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stderr(std::process::Stdio::inherit())
            .output();
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                println!("{} FAILED: cannot start: {e}", bin.display());
                failed += 1;
                continue;
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        let summary = text.lines().rev().find_map(parse_summary);
        match summary {
            Some((p, f)) => {
                passed += p;
                failed += f;
            }
            None => failed += 1,
        }
        if !out.status.success() && summary.is_none_or(|(_, f)| f == 0) {
            failed += 1;
        }
    }
    (passed, failed)
}

/// `cargo xtask test-multigpu --list`: every case of the GPU suites (no GPU needed), and the
/// c10d-bench checks.
fn list_gpu_cases(bundle: Option<&Path>) -> Res {
    let binaries = match bundle {
        Some(dir) => vec![dir.join("gpu"), dir.join("gpu_world")],
        None => build_gpu_tests(false)?,
    };
    for bin in binaries {
        let out = Command::new(&bin)
            .arg("--list")
            .output()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
    for op in chaos::BENCH_OPS {
        println!("c10d-bench {op} --backend nccl (2 ranks, 1 KiB … 1 MiB, result checked)");
    }
    Ok(())
}

/// `c10d-bench --backend nccl` on 2 ranks, every op, 1 KiB … 1 MiB with its result check
/// (2 ranks share a GPU through distinct `NCCL_HOSTID`s when there is only one): (passed, failed).
/// Its watchdog timeout (30 s) is tens of times what a run takes, and short enough that a
/// timed loop queuing far more ops than it measured (as a warm-up timed on the host once did)
/// fails here rather than now and then.
fn bench_every_op(bench: &Path) -> (usize, usize) {
    bench_every_op_with(bench, &[])
}

/// [`bench_every_op`] with `envs` set for the benchmark.
pub(crate) fn bench_every_op_with(bench: &Path, envs: &[(String, String)]) -> (usize, usize) {
    let (mut passed, mut failed) = (0, 0);
    for &op in chaos::BENCH_OPS {
        let out = Command::new(bench)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .args([
                op,
                "--nproc",
                "2",
                "--backend",
                "nccl",
                "-b",
                "1K",
                "-e",
                "1M",
                "-f",
                "32",
                "--timeout",
                "30",
            ])
            .output();
        match out {
            Ok(o) if o.status.success() => {
                passed += 1;
                let text = String::from_utf8_lossy(&o.stdout);
                let last_row = text.lines().rfind(|l| !l.starts_with('#')).unwrap_or("");
                println!("c10d-bench {op} --backend nccl ok: {}", last_row.trim());
            }
            Ok(o) => {
                failed += 1;
                println!(
                    "c10d-bench {op} --backend nccl FAILED ({}):\n{}{}",
                    o.status,
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            Err(e) => {
                failed += 1;
                println!(
                    "c10d-bench {op} --backend nccl FAILED: cannot start {}: {e}",
                    bench.display()
                );
            }
        }
    }
    (passed, failed)
}

/// "N passed, M failed" → (N, M).
fn parse_summary(line: &str) -> Option<(usize, usize)> {
    let (p, f) = line.split_once(" passed, ")?;
    Some((
        p.trim().parse().ok()?,
        f.strip_suffix(" failed")?.trim().parse().ok()?,
    ))
}

/// Builds the GPU test binaries (release with `release`) and returns their paths.
pub(crate) fn build_gpu_tests(release: bool) -> Result<Vec<PathBuf>, String> {
    let mut paths = Vec::new();
    for (pkg, test) in [("c10d-nccl", "gpu"), ("c10d-world", "gpu_world")] {
        let mut cmd = cargo();
        cmd.args([
            "test",
            "--no-run",
            "--message-format=json",
            "-p",
            pkg,
            "--test",
            test,
        ]);
        if release {
            cmd.arg("--release");
        }
        paths.push(built_executable(&mut cmd, test)?);
    }
    Ok(paths)
}

/// Runs a `--message-format=json` cargo build and returns the executable of target `name`.
pub(crate) fn built_executable(cmd: &mut Command, name: &str) -> Result<PathBuf, String> {
    built_artifact(cmd, name, "executable", |l| {
        let rest = l.split("\"executable\":\"").nth(1)?;
        Some(PathBuf::from(rest.split('"').next()?))
    })
}

/// Runs a `--message-format=json` cargo build (failing when it fails) and returns what `pick`
/// finds in the first JSON line about target `name` that has it (`what` names it in errors).
pub(crate) fn built_artifact(
    cmd: &mut Command,
    name: &str,
    what: &str,
    pick: impl Fn(&str) -> Option<PathBuf>,
) -> Result<PathBuf, String> {
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("building {name} failed"));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains(&format!("\"name\":\"{name}\"")))
        .find_map(pick)
        .ok_or_else(|| format!("cargo did not report the {name} {what}"))
}

/// `cargo xtask gpu-bundle [DIR]`: release builds of the GPU suites, the NCCL overhead
/// benchmark and this xtask, stripped, into DIR (default `gpu-bundle/`, git-ignored), for a
/// GPU machine without a Rust toolchain: there, from the repository root, run
/// `gpu-bundle/xtask test-multigpu --bundle gpu-bundle` and `gpu-bundle/overhead`.
fn gpu_bundle(args: &[String]) -> Res {
    let dir = PathBuf::from(args.first().map_or("gpu-bundle", String::as_str));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut bins: Vec<(PathBuf, &str)> = build_gpu_tests(true)?
        .into_iter()
        .zip(["gpu", "gpu_world"])
        .collect();
    let mut bench = cargo();
    bench.args([
        "bench",
        "--no-run",
        "--message-format=json",
        "-p",
        "c10d-nccl",
        "--bench",
        "overhead",
    ]);
    bins.push((built_executable(&mut bench, "overhead")?, "overhead"));
    let mut xtask = cargo();
    xtask.args(["build", "--release", "--message-format=json", "-p", "xtask"]);
    bins.push((built_executable(&mut xtask, "xtask")?, "xtask"));
    let mut bench = cargo();
    bench.args([
        "build",
        "--release",
        "--message-format=json",
        "-p",
        "c10d-tools",
        "--bin",
        "c10d-bench",
    ]);
    bins.push((built_executable(&mut bench, "c10d-bench")?, "c10d-bench"));
    for (src, name) in bins {
        let dst = dir.join(name);
        std::fs::copy(&src, &dst)
            .map_err(|e| format!("{} → {}: {e}", src.display(), dst.display()))?;
        run(Command::new("strip").arg(&dst))?;
    }
    let script = dir.join("run-all.sh");
    std::fs::write(&script, GPU_RUN_ALL).map_err(|e| format!("{}: {e}", script.display()))?;
    run(Command::new("chmod").arg("+x").arg(&script))?;
    println!("{}", dir.display());
    Ok(())
}

/// The bundle's one prepared run (`run-all.sh [OUT_DIR]`): `nvidia-smi -L`, the GPU suites
/// (bounded at 300 s), then the overhead benchmark at world sizes 1, 2 and 4 (bounded at 240 s);
/// everything is also written to `OUT_DIR/gpu-run.log` (default `$OUT`, else `.`). Exits
/// non-zero when either step failed.
const GPU_RUN_ALL: &str = r#"#!/bin/bash
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:-.}}
mkdir -p "$out"
{
  nvidia-smi -L
  timeout 300 "$here/xtask" test-multigpu --bundle "$here"; suite=$?
  echo "suite exit: $suite"
  C10D_BENCH_WORLD_SIZES=${C10D_BENCH_WORLD_SIZES:-1,2,4} C10D_BENCH_LIMIT_S=230 \
    timeout 240 "$here/overhead" 1000; bench=$?
  echo "overhead exit: $bench"
  [ "$suite" = 0 ] && [ "$bench" = 0 ]
} 2>&1 | tee "$out/gpu-run.log"
exit "${PIPESTATUS[0]}"
"#;
