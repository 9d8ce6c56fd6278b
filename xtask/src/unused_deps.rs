//! The unused-dependency step of `cargo xtask lint`: `cargo machete` (installed first where
//! missing, the pinned release, as `lint` installs cargo-deny) over every crate of the
//! workspace. It fails on a `[dependencies]` entry that no source file of its crate names.
//!
//! cargo-machete reads sources, it does not build: it is fast and needs no toolchain beyond
//! stable, but it cannot see a crate that is used only through a macro of another, or only
//! under a different name. Such false positives are listed, each with a comment saying why, in
//! the crate's `[package.metadata.cargo-machete] ignored = [...]`. It does not look at
//! `[dev-dependencies]` (see `docs/dependencies.md`).

use crate::{cargo, run, Res};

/// The cargo-machete release `lint` installs where none is found.
const CARGO_MACHETE_VERSION: &str = "0.9.2";

/// The command that installs cargo-machete.
fn install_args() -> [&'static str; 5] {
    [
        "install",
        "cargo-machete",
        "--locked",
        "--version",
        CARGO_MACHETE_VERSION,
    ]
}

/// `cargo machete`, without the package variables cargo set for xtask itself: cargo-machete
/// reads `CARGO_PKG_NAME` as "run by cargo as a build step" and then takes its own name for a
/// path to scan.
fn machete() -> std::process::Command {
    let mut c = cargo();
    c.arg("machete").env_remove("CARGO_PKG_NAME");
    c
}

/// Fails when a crate of the workspace declares a dependency it does not use.
pub(crate) fn check_unused_deps() -> Res {
    let have = machete()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        run(cargo().args(install_args()))?;
    }
    run(&mut machete()).map_err(|e| {
        format!(
            "{e}: a crate declares a dependency it does not use (remove it, or list a false \
             positive in its [package.metadata.cargo-machete] ignored = [...] with a comment why)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_the_pinned_release() {
        let args = install_args();
        assert_eq!(args[1], "cargo-machete");
        assert!(args.contains(&"--locked"));
        assert_eq!(args.last(), Some(&CARGO_MACHETE_VERSION));
        assert_eq!(CARGO_MACHETE_VERSION.split('.').count(), 3);
    }
}
