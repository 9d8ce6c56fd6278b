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

#[test]
fn only_the_checked_layer_calls_nccl() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name == "result.rs" || name == "library.rs" || !name.ends_with(".rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
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
