//! Loads a real NCCL from a PyTorch installation, when one is here: the interpreter named by
//! `C10D_TORCH_PYTHON`, or the project's PyTorch virtualenv at
//! `~/.cache/c10d-rs/torch-venv`. `ncclGetVersion` needs no GPU, so this runs on CPU-only
//! machines too. Without such an installation the test says so and passes.

use c10d_nccl::library::{OptionalFunction, COMM_SPLIT};
use c10d_nccl::loader::{locate, SearchEnv, Source};
use c10d_nccl::{sys, NcclLibrary, Version};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn torch_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("C10D_TORCH_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".cache/c10d-rs/torch-venv/bin/python");
    p.exists().then_some(p)
}

/// The version in the name of the `nvidia_nccl_cu*-X.Y.Z.dist-info` directory in `site_packages`.
fn wheel_version(site_packages: &Path) -> Option<Version> {
    std::fs::read_dir(site_packages).ok()?.find_map(|e| {
        let name = e.ok()?.file_name().to_string_lossy().into_owned();
        let rest = name
            .strip_prefix("nvidia_nccl_cu")?
            .strip_suffix(".dist-info")?;
        Version::parse(rest.split_once('-')?.1)
    })
}

#[test]
fn loads_pytorchs_nccl_and_matches_the_wheel_version() {
    let Some(python) = torch_python() else {
        eprintln!("skipped: no C10D_TORCH_PYTHON and no ~/.cache/c10d-rs/torch-venv");
        return;
    };
    let py = python.display().to_string();
    let var = move |k: &str| match k {
        "C10D_TORCH_PYTHON" => Some(py.clone()),
        "PATH" => Some(String::new()),
        _ => None,
    };
    let env = SearchEnv {
        var: &var,
        soname: "libc10d-test-no-such-nccl.so.2",
        python_timeout: Duration::from_secs(60),
    };
    let found = match locate(&env, &mut |t| NcclLibrary::open(t)) {
        Ok(f) => f,
        Err(e) => {
            // An installation without the NCCL wheel (e.g. CPU-only PyTorch) is not a failure.
            assert!(e.to_string().contains("C10D_TORCH_PYTHON"), "{e}");
            eprintln!(
                "skipped: {} has no nvidia-nccl wheel:\n{e}",
                python.display()
            );
            return;
        }
    };
    assert_eq!(found.source, Source::TorchPython);
    let lib_path = PathBuf::from(&found.target);
    assert!(
        found.target.ends_with("lib/libnccl.so.2"),
        "{}",
        found.target
    );
    // site-packages/nvidia/<nccl|cu13>/lib/libnccl.so.2
    let site_packages = lib_path.ancestors().nth(4).unwrap();
    let expected =
        wheel_version(site_packages).expect("nvidia_nccl_cu*-*.dist-info next to the library");
    let lib = &found.value;
    assert_eq!(lib.version(), expected, "loaded {}", found.target);
    assert_eq!(c10d_nccl::result::get_version(lib).unwrap(), expected);
    eprintln!("loaded NCCL {} from {}", lib.version(), found.target);

    // Error strings come from NCCL itself.
    assert!(!c10d_nccl::result::error_string(lib, sys::ncclSystemError).is_empty());

    // Optional functions: present ones resolve, the split needs 2.18.
    assert_eq!(lib.comm_split().is_ok(), lib.version() >= COMM_SPLIT.since);
    assert_eq!(
        lib.comm_init_rank_config().is_ok(),
        lib.version() >= Version::new(2, 14, 0)
    );
    assert_eq!(
        lib.comm_shrink().is_ok(),
        lib.version() >= Version::new(2, 27, 0)
    );

    // A function from a future NCCL is refused by version, naming both versions.
    let future = OptionalFunction {
        name: "ncclFromTheFuture",
        since: Version::new(99, 0, 0),
    };
    // SAFETY: the lookup fails before any symbol is read; the type is never called.
    let e = unsafe { lib.lookup_optional::<sys::ncclGroup_t>(future) }.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "ncclFromTheFuture needs NCCL >= 99.0.0, but the loaded NCCL is {}",
            lib.version()
        )),
        "{msg}"
    );
    // A symbol the version should have but the library lacks names the dynamic loader's error.
    let absent = OptionalFunction {
        name: "ncclNoSuchFunction",
        since: Version::new(2, 0, 0),
    };
    // SAFETY: the symbol does not exist, so nothing is ever called through the type.
    let e = unsafe { lib.lookup_optional::<sys::ncclGroup_t>(absent) }.unwrap_err();
    assert!(e.lookup_error.is_some(), "{e}");
    assert!(
        e.to_string()
            .contains("ncclNoSuchFunction (NCCL >= 2.0.0) was not found"),
        "{e}"
    );

    // The process-wide loader agrees when it picked the same file.
    if let Ok(global) = c10d_nccl::nccl_library() {
        if global.location() == found.target {
            assert_eq!(c10d_nccl::nccl_version().unwrap(), expected);
        }
    }
}
