//! `cargo xtask candle-cuda-check`: compile-checks c10d-candle's `cuda` feature (candle CUDA
//! tensors through NCCL) on a machine without a CUDA toolkit. candle's `cuda` feature compiles
//! candle's kernels with `nvcc`; this provisions NVIDIA's CUDA 13.0 compiler from PyPI
//! (`nvidia-cuda-nvcc`, `-runtime`, `-cccl`, `-crt`, `nvidia-nvvm`, pinned to 13.0) into a cached
//! virtualenv (`$C10D_NVCC_VENV`, default `~/.cache/c10d-rs/nvcc-venv`), points candle's build
//! at it (`NVCC`, `CUDA_ROOT`, `CUDA_COMPUTE_CAP`, default 90: H100/H200) and runs clippy on
//! c10d-candle with the feature, warnings as errors. It checks that the code builds; running it
//! needs a GPU machine with a driver for CUDA 13 and candle's CUDA libraries (cuBLAS, cuRAND,
//! NVRTC). Not part of `cargo xtask test` (candle's kernels take minutes to compile).

use super::{cached_venv, cargo, run, Res};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGES: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-cccl==13.0.*",
    "nvidia-cuda-crt==13.0.*",
    "nvidia-nvvm==13.0.*",
];

fn venv() -> PathBuf {
    cached_venv("C10D_NVCC_VENV", "nvcc-venv")
}

/// The CUDA root inside the virtualenv (`.../site-packages/nvidia/cu13`), provisioned first
/// where its `nvcc` is missing.
fn cuda_root() -> Result<PathBuf, String> {
    let venv = venv();
    let py = venv.join("bin/python");
    if !py.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let find = |py: &Path| -> Option<PathBuf> {
        let out = Command::new(py)
            .args([
                "-c",
                "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))",
            ])
            .output()
            .ok()?;
        let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        root.join("bin/nvcc").exists().then_some(root)
    };
    if let Some(root) = find(&py) {
        return Ok(root);
    }
    eprintln!(
        "xtask: provisioning nvcc 13.0 into {} (cached afterwards)",
        venv.display()
    );
    let mut pip = Command::new(&py);
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]);
    run(pip.args(PACKAGES))?;
    find(&py).ok_or_else(|| {
        format!(
            "no nvcc under {} after installing {PACKAGES:?}",
            venv.display()
        )
    })
}

pub fn candle_cuda_check() -> Res {
    let root = cuda_root()?;
    let path = format!(
        "{}:{}",
        root.join("bin").display(),
        env::var("PATH").unwrap_or_default()
    );
    let mut cmd = cargo();
    cmd.args([
        "clippy",
        "-p",
        "c10d-candle",
        "--features",
        "cuda",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])
    .env("NVCC", root.join("bin/nvcc"))
    .env("CUDA_ROOT", &root)
    .env("CUDA_PATH", &root)
    .env("PATH", path)
    .env("CPLUS_INCLUDE_PATH", root.join("include/cccl"));
    if env::var_os("CUDA_COMPUTE_CAP").is_none() {
        cmd.env("CUDA_COMPUTE_CAP", "90");
    }
    run(&mut cmd)
}
