//! Finding the `site-packages` directories of a Python installation, where the
//! `nvidia-nccl-cu12` / `nvidia-nccl-cu13` wheels (PyTorch's dependencies) put `libnccl.so.2`.
//!
//! Two ways: a prefix (`$VIRTUAL_ENV`, `$CONDA_PREFIX`) is scanned for `lib/python3*/site-packages`
//! without running anything; an interpreter (`C10D_TORCH_PYTHON`, `python3` on `PATH`) is asked
//! with a bounded wait, so a hanging or broken interpreter costs at most the timeout.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long an interpreter may take to print its site-packages before it is killed.
pub const DEFAULT_PYTHON_TIMEOUT: Duration = Duration::from_secs(10);

/// The program an interpreter runs: prints each site-packages directory on its own line.
const QUERY: &str = "import site, sys\n\
dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
u = getattr(site, 'getusersitepackages', lambda: '')()\n\
dirs += [u] if u else []\n\
dirs += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]\n\
print('\\n'.join(dirs))";

/// `prefix/lib/python3*/site-packages` (and `lib64`), sorted; missing ones are skipped.
pub fn prefix_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect();
        found.sort();
        for p in found {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// Asks `python` for its site-packages directories, killing it after `timeout`.
///
/// # Errors
/// A message saying why: the program could not start, exited with an error (its stderr's last
/// line is included), or ran past the timeout.
pub fn interpreter_site_packages(python: &Path, timeout: Duration) -> Result<Vec<PathBuf>, String> {
    let mut child = Command::new(python)
        .args(["-c", QUERY])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {:?} and was killed",
                    python.display(),
                    timeout
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {}: {e}", python.display())),
        }
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut stdout);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    if !status.success() {
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!("{} failed ({status}): {last}", python.display()));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for line in stdout.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let p = PathBuf::from(line);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// The first `name` found in the directories of a `PATH`-style string (an executable file).
pub fn find_on_path(name: &str, path_var: &str) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn prefix_scan_finds_versioned_site_packages() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("lib/python3.11/site-packages")).unwrap();
        std::fs::create_dir_all(d.path().join("lib/python3.12/site-packages")).unwrap();
        std::fs::create_dir_all(d.path().join("lib/ruby/site-packages")).unwrap();
        let sp = prefix_site_packages(d.path());
        assert_eq!(
            sp,
            vec![
                d.path().join("lib/python3.11/site-packages"),
                d.path().join("lib/python3.12/site-packages")
            ]
        );
        assert!(prefix_site_packages(&d.path().join("missing")).is_empty());
    }

    #[test]
    fn interpreter_answers_failures_and_hangs() {
        let d = tempfile::tempdir().unwrap();
        // A fake interpreter that ignores its arguments and prints two directories (one twice).
        let ok = script(
            d.path(),
            "okpy",
            "echo /a/site-packages; echo /b/site-packages; echo /a/site-packages",
        );
        assert_eq!(
            interpreter_site_packages(&ok, DEFAULT_PYTHON_TIMEOUT).unwrap(),
            vec![
                PathBuf::from("/a/site-packages"),
                PathBuf::from("/b/site-packages")
            ]
        );
        let bad = script(
            d.path(),
            "badpy",
            "echo 'ModuleNotFoundError: no site' >&2; exit 3",
        );
        let e = interpreter_site_packages(&bad, DEFAULT_PYTHON_TIMEOUT).unwrap_err();
        assert!(
            e.contains("failed") && e.contains("ModuleNotFoundError: no site"),
            "{e}"
        );
        let hang = script(d.path(), "hangpy", "exec sleep 30");
        let t = Instant::now();
        let e = interpreter_site_packages(&hang, Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("did not answer"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let e =
            interpreter_site_packages(&d.path().join("nopy"), DEFAULT_PYTHON_TIMEOUT).unwrap_err();
        assert!(e.contains("could not run"), "{e}");
    }

    #[test]
    fn path_lookup_needs_an_executable() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("python3"), "not executable").unwrap();
        let other = tempfile::tempdir().unwrap();
        let exe = script(other.path(), "python3", "true");
        let path = std::env::join_paths([d.path(), other.path()]).unwrap();
        assert_eq!(find_on_path("python3", path.to_str().unwrap()), Some(exe));
        assert_eq!(find_on_path("python3", d.path().to_str().unwrap()), None);
    }
}
