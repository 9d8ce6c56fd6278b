//! Copies a worker's stdout or stderr line by line: to c10drun's own stream (prefixed with the
//! rank), to a log file (--redirects / --tee), and into the tail kept for the failure summary.

use crate::report::{push_tail, Tail};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};

/// Lines containing any of `filters` also go, prefixed, to a file shared by the attempt's
/// workers (torchrun's `--duplicate-std{out,err}-filters`).
#[derive(Clone)]
pub struct Duplicate {
    pub file: Arc<Mutex<File>>,
    pub filters: Arc<Vec<String>>,
}

/// Where one stream goes.
pub struct Sink {
    pub prefix: Option<String>,
    pub to_stderr: bool,
    pub console: bool,
    pub file: Option<File>,
    pub tail: Option<Tail>,
    pub duplicate: Option<Duplicate>,
}

/// Returns when the stream closes.
pub fn pump(src: impl Read, mut sink: Sink) {
    let mut r = BufReader::with_capacity(64 * 1024, src);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                if let Some(t) = &sink.tail {
                    push_tail(t, &line);
                }
                // Write errors (closed stdout, full disk) are ignored: the workers must keep running.
                if let Some(f) = &mut sink.file {
                    let _ = f.write_all(&line);
                }
                let mut buf = Vec::with_capacity(line.len() + 16);
                if let Some(p) = &sink.prefix {
                    buf.extend_from_slice(p.as_bytes());
                }
                buf.extend_from_slice(&line);
                if let Some(d) = &sink.duplicate {
                    let text = String::from_utf8_lossy(&line);
                    if d.filters.iter().any(|f| text.contains(f.as_str())) {
                        let mut f = d.file.lock().unwrap_or_else(|e| e.into_inner());
                        let _ = f.write_all(&buf);
                    }
                }
                if !sink.console {
                    continue;
                }
                if sink.to_stderr {
                    let _ = std::io::stderr().lock().write_all(&buf);
                } else {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(&buf);
                    let _ = o.flush();
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// Prints one of c10drun's own messages on stderr, prefixed with `c10drun: `.
pub(crate) fn say(msg: &str) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "c10drun: {msg}");
}
