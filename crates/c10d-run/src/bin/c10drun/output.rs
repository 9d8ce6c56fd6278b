//! Copies a worker's stdout or stderr line by line: to c10drun's own stream (prefixed with the
//! rank), to a log file (--redirects / --tee), and into the tail kept for the failure summary.

use super::report::{push_tail, Tail};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};

/// Where one stream goes.
pub struct Sink {
    pub prefix: Option<String>,
    pub to_stderr: bool,
    pub console: bool,
    pub file: Option<File>,
    pub tail: Option<Tail>,
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
                if !sink.console {
                    continue;
                }
                let mut buf = Vec::with_capacity(line.len() + 16);
                if let Some(p) = &sink.prefix {
                    buf.extend_from_slice(p.as_bytes());
                }
                buf.extend_from_slice(&line);
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
