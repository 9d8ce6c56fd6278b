//! What a failed worker said: exit statuses, torchelastic error files (written by torch's
//! `@record`) and the last lines a worker wrote on stderr (a Rust panic message).

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};

/// Lines of a worker's stderr kept for the failure summary.
pub const TAIL_LINES: usize = 12;

/// The last lines a worker wrote on stderr.
pub type Tail = Arc<Mutex<VecDeque<String>>>;

/// Name of a signal number ("SIGKILL"), or "SIGN" for others.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

pub fn describe_status(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {}", signal_name(s)),
        _ => "unknown status".into(),
    }
}

/// The error recorded in a torchelastic error file: `{"message": "text", "timestamp": T}` or
/// `{"message": {"message": "Type: text", "extraInfo": {"py_callstack": TRACEBACK,
/// "timestamp": T}}}`. Returns the traceback when there is one, else the message.
pub fn read_error_file(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Some(format!("<unreadable error file: {e}>")),
    };
    let msg = v.get("message")?;
    if let Some(s) = msg.as_str() {
        return Some(s.to_string());
    }
    let stack = msg
        .get("extraInfo")
        .and_then(|x| x.get("py_callstack"))
        .and_then(|x| x.as_str());
    let text = msg.get("message").and_then(|x| x.as_str());
    match (stack, text) {
        (Some(s), _) if !s.trim().is_empty() => Some(s.to_string()),
        (_, Some(t)) => Some(t.to_string()),
        _ => Some("<N/A>".into()),
    }
}

/// Lines describing what a failed worker said, indented for the summary.
pub fn worker_error_lines(error_file: &Path, tail: &Tail) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(err) = read_error_file(error_file) {
        out.push(format!("    error_file: {}", error_file.display()));
        out.push("    traceback:".into());
        out.extend(err.trim_end().lines().map(|l| format!("      {l}")));
        return out;
    }
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    let lines: Vec<&String> = tail.iter().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        out.push("    error_file: <N/A> (the worker wrote none and nothing on stderr)".into());
        return out;
    }
    // A Rust panic: show it from its "panicked at" line on.
    let start = lines
        .iter()
        .rposition(|l| l.contains("panicked at"))
        .unwrap_or(0);
    let what = if start > 0 || lines[0].contains("panicked at") {
        "panic"
    } else {
        "last stderr lines"
    };
    out.push(format!("    error_file: <N/A>; {what}:"));
    out.extend(
        lines[start..]
            .iter()
            .filter(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
            .map(|l| format!("      {l}")),
    );
    out
}

/// Records a stderr line in the tail.
pub fn push_tail(tail: &Tail, line: &[u8]) {
    let s = String::from_utf8_lossy(line).trim_end().to_string();
    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
    if t.len() == TAIL_LINES {
        t.pop_front();
    }
    t.push_back(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_file_formats() {
        let d = std::env::temp_dir().join(format!("c10drun-ut-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("e.json");
        std::fs::write(
            &f,
            r#"{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  x\nValueError: boom\n", "timestamp": "1"}}}"#,
        )
        .unwrap();
        assert!(read_error_file(&f).unwrap().starts_with("Traceback"));
        std::fs::write(&f, r#"{"message": "plain", "timestamp": 3}"#).unwrap();
        assert_eq!(read_error_file(&f).unwrap(), "plain");
        std::fs::remove_dir_all(&d).unwrap();
        assert!(read_error_file(&f).is_none());
    }
}
