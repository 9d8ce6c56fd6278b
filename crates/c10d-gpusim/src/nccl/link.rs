//! A rank's connection to its communicator's hub: frames go out under a lock; a reader thread
//! files every answer under the wait it answers, where the waiting op (on a stream worker, or
//! the host thread of an init or split) picks it up.

use crate::nccl::wire::{Frame, Kind};
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What a wait is for: `(kind answered, seq, peer)`.
pub type WaitKey = (Kind, u64, u32);

/// An answer: the data, or (NCCL result code, message).
pub type Answer = Result<Vec<u8>, (i32, String)>;

use crate::nccl::codes::SYSTEM_ERROR;

/// One connection to a hub.
pub struct Link {
    writer: Mutex<BufWriter<TcpStream>>,
    socket: TcpStream,
    answers: Mutex<HashMap<WaitKey, Answer>>,
    cv: Condvar,
    closed: AtomicBool,
}

impl Link {
    /// Connects to the hub on 127.0.0.1:`port`.
    pub fn connect(port: u16) -> std::io::Result<Arc<Link>> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        let link = Arc::new(Link {
            writer: Mutex::new(BufWriter::new(s.try_clone()?)),
            socket: s.try_clone()?,
            answers: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let l = link.clone();
        std::thread::Builder::new()
            .name("gpusim-nccl-link".into())
            .spawn(move || l.read_loop(s))?;
        Ok(link)
    }

    fn read_loop(&self, s: TcpStream) {
        let mut r = BufReader::new(s);
        while let Ok(f) = Frame::read_from(&mut r) {
            let (key, answer) = match f.kind {
                Kind::Error => {
                    let wait = f.payload.first().copied().unwrap_or(0);
                    let kind = [Kind::Ready, Kind::Result, Kind::Deliver]
                        .into_iter()
                        .find(|k| *k as u8 == wait)
                        .unwrap_or(Kind::Result);
                    let msg =
                        String::from_utf8_lossy(f.payload.get(1..).unwrap_or(&[])).into_owned();
                    ((kind, f.seq, f.aux), Err((f.rank as i32, msg)))
                }
                k => ((k, f.seq, f.aux), Ok(f.payload)),
            };
            self.answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, answer);
            self.cv.notify_all();
        }
        self.closed.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    /// Sends `f`; an error when the hub is gone.
    pub fn send(&self, f: &Frame) -> Result<(), (i32, String)> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        f.write_to(&mut *w).and_then(|()| w.flush()).map_err(|e| {
            (
                SYSTEM_ERROR,
                format!("c10d-gpusim: lost the connection to the communicator's hub: {e}"),
            )
        })
    }

    /// Waits for the answer to `key`; `None` once `stop()` is true (checked every 20 ms).
    pub fn wait(&self, key: WaitKey, stop: &dyn Fn() -> bool) -> Option<Answer> {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(a) = answers.remove(&key) {
                return Some(a);
            }
            if self.closed.load(Ordering::Acquire) {
                let msg =
                    "c10d-gpusim: the communicator's hub closed the connection (its process ended)";
                return Some(Err((SYSTEM_ERROR, msg.into())));
            }
            if stop() {
                return None;
            }
            answers = self
                .cv
                .wait_timeout(answers, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Closes the connection (the hub sees it closed: after a `Bye`, a departure; without
    /// one, a lost rank).
    pub fn close(&self) {
        let _ = self.socket.shutdown(Shutdown::Both);
    }
}
