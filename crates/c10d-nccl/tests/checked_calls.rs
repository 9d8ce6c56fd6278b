//! Only the checked-call layer (`src/result.rs`) calls through the function table of the
//! loaded NCCL (`src/library.rs` resolves it and calls `ncclGetVersion` while loading): every
//! NCCL call's result is then checked the same way (cudarc's `sys` / `result` / `safe` rule).

use std::path::Path;

/// `(lib.name)(`, `(self.lib.name)(`, `(e.lib.name)(`: a call through the table.
fn raw_calls(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("lib.") {
            let before = &rest[..at];
            let after = &rest[at + 4..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let opened = before
                .trim_end_matches(|c: char| c == '.' || c.is_ascii_alphanumeric() || c == '_');
            if opened.ends_with('(') && after[name.len()..].starts_with(")(") {
                found.push(format!("line {}: {}", i + 1, line.trim()));
            }
            rest = &after[name.len()..];
        }
    }
    found
}

/// Every `.rs` file under `dir`, subdirectories included (`src/memory/`,
/// `src/process_group/` …), as paths relative to `root`.
fn rust_files(dir: &Path, root: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(root).expect("under root").to_path_buf());
        }
    }
}

#[test]
fn only_the_checked_layer_calls_nccl() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    assert!(
        files.iter().any(|f| f.components().count() > 1),
        "the walk must reach subdirectories: {files:?}"
    );
    let mut offenders = Vec::new();
    for rel in files {
        let name = rel.display().to_string();
        if name == "result.rs" || name == "library.rs" {
            continue;
        }
        let text = std::fs::read_to_string(src.join(&rel)).expect("read");
        offenders.extend(raw_calls(&text).into_iter().map(|l| format!("{name} {l}")));
    }
    assert!(
        offenders.is_empty(),
        "raw NCCL calls outside result.rs:\n{}",
        offenders.join("\n")
    );
    // The detector itself sees the forms the review found.
    assert_eq!(
        raw_calls("let rc = unsafe { (self.lib.group_end)() };").len(),
        1
    );
    assert_eq!(raw_calls("    (e.lib.broadcast)(ptr, ptr, n)").len(), 1);
    assert!(raw_calls("self.lib.version()").is_empty());
}
