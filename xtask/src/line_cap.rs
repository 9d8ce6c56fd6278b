//! The line cap of `cargo xtask lint`: no Rust file of the workspace (sources, tests, benches,
//! examples, xtask itself) is longer than [`MAX_LINES`] lines. A file past the cap is split
//! along a real seam (one concept per file), not trimmed.

use std::path::{Path, PathBuf};

/// The most lines a `*.rs` file may have.
pub(crate) const MAX_LINES: usize = 1000;

/// The directories (under the workspace root) whose `*.rs` files are checked.
const ROOTS: [&str; 2] = ["crates", "xtask"];

/// Checks every `*.rs` file under `crates/` and `xtask/` of `root` (skipping `target`
/// directories and hidden ones); the error names each file over [`MAX_LINES`] with its count.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    for dir in ROOTS {
        rust_files(&root.join(dir), &mut files)?;
    }
    let over = over_cap(&files, MAX_LINES)?;
    if over.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = over
        .iter()
        .map(|(p, n)| {
            let shown = p.strip_prefix(root).unwrap_or(p);
            format!("  {} ({n} lines)", shown.display())
        })
        .collect();
    Err(format!(
        "{} Rust file(s) over {MAX_LINES} lines (split them along a seam):\n{}",
        over.len(),
        list.join("\n")
    ))
}

/// The files of `files` with more than `cap` lines, with their counts, in path order.
fn over_cap(files: &[PathBuf], cap: usize) -> Result<Vec<(PathBuf, usize)>, String> {
    let mut over = Vec::new();
    for f in files {
        let text = std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        let n = line_count(&text);
        if n > cap {
            over.push((f.clone(), n));
        }
    }
    over.sort();
    Ok(over)
}

/// Lines as `wc -l` counts them, plus a last line without its newline.
fn line_count(text: &[u8]) -> usize {
    let newlines = text.iter().filter(|&&b| b == b'\n').count();
    newlines + usize::from(text.last().is_some_and(|&b| b != b'\n'))
}

/// Appends the `*.rs` files under `dir` (recursively; not `target` nor hidden directories).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry
            .file_type()
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if kind.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out)?;
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir().join(format!(
                "xtask-line-cap-{tag}-{}-{nanos}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn write_lines(path: &Path, n: usize) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "// line\n".repeat(n)).unwrap();
    }

    #[test]
    fn a_file_of_1000_lines_passes_and_one_of_1001_fails_naming_it() {
        let root = TempDir::new("cap");
        write_lines(&root.0.join("crates/a/src/ok.rs"), 1000);
        write_lines(&root.0.join("xtask/src/also_ok.rs"), 3);
        check(&root.0).unwrap();

        write_lines(&root.0.join("crates/a/tests/long.rs"), 1001);
        let err = check(&root.0).unwrap_err();
        assert!(err.contains("crates/a/tests/long.rs (1001 lines)"), "{err}");
        assert!(!err.contains("ok.rs"), "{err}");
    }

    #[test]
    fn target_directories_and_other_files_are_skipped() {
        let root = TempDir::new("skip");
        write_lines(&root.0.join("crates/target/debug/build/gen.rs"), 2000);
        write_lines(&root.0.join("crates/a/data.txt"), 2000);
        check(&root.0).unwrap();
    }

    #[test]
    fn a_last_line_without_newline_counts() {
        assert_eq!(line_count(b""), 0);
        assert_eq!(line_count(b"a\nb"), 2);
        assert_eq!(line_count(b"a\nb\n"), 2);
    }
}
