//! Finding the dump files (`<prefix><rank>`) and reading them.

use c10d_world::flight_recorder::Dump;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One rank's dump.
pub struct RankDump {
    pub rank: usize,
    pub path: PathBuf,
    pub dump: Dump,
}

/// `name` as `<prefix><rank>`: the rank in its trailing digits. Temporary files of a dump
/// being written (`….tmp<pid>`) are not dumps.
fn split_rank(name: &str) -> Option<(&str, usize)> {
    if name.contains(".tmp") {
        return None;
    }
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let rank = name[stem.len()..].parse().ok()?;
    Some((stem, rank))
}

/// Dump files of a directory: those named `<prefix><rank>`, the prefix given or, when every
/// file ending in digits shares one, inferred (as PyTorch's analyzer does).
fn in_dir(dir: &Path, prefix: Option<&str>) -> Result<Vec<(usize, PathBuf)>, String> {
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut by_prefix: BTreeMap<String, Vec<(usize, PathBuf)>> = BTreeMap::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((stem, rank)) = split_rank(&name) {
            if prefix.is_none_or(|p| p == stem) && entry.path().is_file() {
                by_prefix
                    .entry(stem.to_string())
                    .or_default()
                    .push((rank, entry.path()));
            }
        }
    }
    match by_prefix.len() {
        1 => Ok(by_prefix.into_values().next().unwrap_or_default()),
        0 => Err(format!(
            "no dump files (named <prefix><rank>) in {}",
            dir.display()
        )),
        _ => Err(format!(
            "{} holds files of several prefixes ({}); pick one with --prefix",
            dir.display(),
            by_prefix.keys().cloned().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Each input is a dump file, a directory of dumps, or a prefix (`/tmp/trace_` for
/// `/tmp/trace_0`, `/tmp/trace_1` ...). Returns (rank, path) sorted by rank.
pub fn resolve(inputs: &[PathBuf], prefix: Option<&str>) -> Result<Vec<(usize, PathBuf)>, String> {
    let mut found = Vec::new();
    for input in inputs {
        if input.is_dir() {
            found.extend(in_dir(input, prefix)?);
        } else if input.is_file() {
            let name = input.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            let rank = match prefix {
                Some(p) => name.strip_prefix(p).and_then(|r| r.parse().ok()),
                None => split_rank(&name).map(|(_, r)| r),
            };
            let rank = rank.ok_or_else(|| {
                format!(
                    "cannot tell the rank of {}: dump files are named <prefix><rank>",
                    input.display()
                )
            })?;
            found.push((rank, input.clone()));
        } else {
            let dir = match input.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let base = input.file_name().map(|n| n.to_string_lossy().into_owned());
            let base = base.ok_or_else(|| format!("{} is not a dump prefix", input.display()))?;
            found.extend(
                in_dir(&dir, Some(&base))
                    .map_err(|_| format!("no dump files {}<rank> found", input.display()))?,
            );
        }
    }
    found.sort();
    if let Some(w) = found.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!(
            "two dumps of rank {}: {} and {}",
            w[0].0,
            w[0].1.display(),
            w[1].1.display()
        ));
    }
    Ok(found)
}

/// Reads every dump.
pub fn read_all(files: Vec<(usize, PathBuf)>) -> Result<Vec<RankDump>, String> {
    files
        .into_iter()
        .map(|(rank, path)| {
            let dump = Dump::read(&path).map_err(|e| e.to_string())?;
            Ok(RankDump { rank, path, dump })
        })
        .collect()
}
