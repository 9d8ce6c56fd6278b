//! A rank's communicator: its place (rank, size, device), its link to the hub, its sequence
//! numbers, its asynchronous error and abort flag. Init (from a unique id, or as the child of
//! a split or shrink) runs on the calling thread for a blocking communicator and on a thread
//! of its own for a non-blocking one (`ncclInProgress` until it is done).

use crate::nccl::faults;
use crate::nccl::link::{Answer, Link};
use crate::nccl::wire::{Frame, Kind, OpHeader};
use crate::registry::Registry;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use crate::nccl::codes::{INTERNAL_ERROR, INVALID_USAGE, IN_PROGRESS, SUCCESS, SYSTEM_ERROR};

/// Every live communicator, by `ncclComm_t` handle.
pub static COMMS: LazyLock<Registry<Comm>> = LazyLock::new(|| Registry::new(0x9000_0000));

/// One communicator of this process.
pub struct Comm {
    /// The hub's port.
    pub port: u16,
    place: OnceLock<(u64, u32, u32)>,
    /// The CUDA device it runs on.
    pub device: usize,
    /// Made non-blocking (`config.blocking = 0`).
    pub non_blocking: bool,
    link: Mutex<Option<Arc<Link>>>,
    seq: AtomicU64,
    p2p: Mutex<HashMap<(u32, bool), u64>>,
    async_error: AtomicI32,
    aborted: AtomicBool,
    last_error: Mutex<CString>,
    /// Ops enqueued and not finished.
    pub inflight: AtomicUsize,
    /// PreMulSum reductions: handle → scalar bytes.
    pub premul: Mutex<HashMap<i32, Vec<u8>>>,
}

impl Comm {
    /// A communicator not yet connected (its async error `ncclInProgress`).
    pub fn new(port: u16, device: usize, non_blocking: bool) -> Arc<Comm> {
        Arc::new(Comm {
            port,
            place: OnceLock::new(),
            device,
            non_blocking,
            link: Mutex::new(None),
            seq: AtomicU64::new(0),
            p2p: Mutex::new(HashMap::new()),
            async_error: AtomicI32::new(IN_PROGRESS),
            aborted: AtomicBool::new(false),
            last_error: Mutex::new(CString::default()),
            inflight: AtomicUsize::new(0),
            premul: Mutex::new(HashMap::new()),
        })
    }

    /// Fixes the communicator's key at the hub, its rank and size (once, before it connects).
    pub fn set_place(&self, key: u64, rank: u32, nranks: u32) {
        let _ = self.place.set((key, rank, nranks));
    }

    /// The key at the hub (0 before [`Comm::set_place`]).
    pub fn key(&self) -> u64 {
        self.place.get().map_or(0, |p| p.0)
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.place.get().map_or(0, |p| p.1)
    }

    /// Number of ranks.
    pub fn nranks(&self) -> u32 {
        self.place.get().map_or(0, |p| p.2)
    }

    /// The asynchronous error (`ncclCommGetAsyncError`).
    pub fn async_error(&self) -> i32 {
        self.async_error.load(Ordering::Acquire)
    }

    /// Whether init finished successfully and no error happened since.
    pub fn usable(&self) -> bool {
        self.async_error() == SUCCESS && !self.aborted()
    }

    /// Whether `ncclCommAbort` was called.
    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Blocks until `ncclCommAbort` (a kernel whose peers are gone, or an init that never
    /// finishes, holds its stream or caller until then).
    pub fn wait_until_aborted(&self) {
        while !self.aborted() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Records a failure: the async error (the first one stays) and `ncclGetLastError`'s text.
    pub fn fail(&self, code: i32, msg: &str) {
        let _ =
            self.async_error
                .compare_exchange(SUCCESS, code, Ordering::AcqRel, Ordering::Acquire);
        let _ = self.async_error.compare_exchange(
            IN_PROGRESS,
            code,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.set_last_error(msg);
        eprintln!("{msg}");
    }

    /// A non-blocking call on the communicator began (finalize, or a split or shrink of it):
    /// `ncclInProgress` until [`Comm::finished_finalize`].
    pub fn begin_finalize(&self) {
        let _ = self.async_error.compare_exchange(
            SUCCESS,
            IN_PROGRESS,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// The finalize's flush is done.
    pub fn finished_finalize(&self) {
        let _ = self.async_error.compare_exchange(
            IN_PROGRESS,
            SUCCESS,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Sets `ncclGetLastError`'s text.
    pub fn set_last_error(&self, msg: &str) {
        let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    /// A pointer to the last error's text, valid until the next error of this communicator.
    pub fn last_error_ptr(&self) -> *const std::ffi::c_char {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ptr()
    }

    /// The next collective sequence number (every rank numbers its collectives alike).
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The next message number to (`sending`) or from `peer`.
    pub fn next_p2p(&self, peer: u32, sending: bool) -> u64 {
        let mut m = self.p2p.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry((peer, sending)).or_insert(0);
        *n += 1;
        *n
    }

    fn link(&self) -> Option<Arc<Link>> {
        self.link.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sends a frame to the hub.
    pub fn send(&self, f: &Frame) -> Result<(), (i32, String)> {
        match self.link() {
            Some(l) => l.send(f),
            None => Err((
                INVALID_USAGE,
                "c10d-gpusim: communicator not connected".into(),
            )),
        }
    }

    /// Waits for an answer; `None` when the communicator was aborted meanwhile.
    pub fn wait(&self, kind: Kind, seq: u64, peer: u32) -> Option<Answer> {
        let link = self.link()?;
        link.wait((kind, seq, peer), &|| self.aborted())
    }

    /// Connects and joins the hub; blocks until every rank joined, an error, or an abort.
    pub fn connect(&self) {
        if faults::next_init_hangs() {
            eprintln!(
                "c10d-gpusim: injected fault: communicator init of rank {} never finishes",
                self.rank()
            );
            self.wait_until_aborted();
            return;
        }
        let link = match Link::connect(self.port) {
            Ok(l) => l,
            Err(e) => {
                return self.fail(
                    SYSTEM_ERROR,
                    &format!(
                        "c10d-gpusim: cannot reach the hub on 127.0.0.1:{}: {e}",
                        self.port
                    ),
                )
            }
        };
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) = Some(link);
        let host = std::env::var("NCCL_HOSTID").unwrap_or_else(|_| "this host".into());
        let place = crate::nccl::transport::place(&host, self.device);
        let hello = Frame::new(Kind::Hello, self.key(), 0, self.rank(), self.nranks())
            .with(place.into_bytes());
        let answer =
            self.send(&hello)
                .map_err(Some)
                .and_then(|()| match self.wait(Kind::Ready, 0, 0) {
                    Some(Ok(places)) => {
                        crate::nccl::transport::report(self.rank(), &places);
                        Ok(())
                    }
                    Some(Err(e)) => Err(Some(e)),
                    None => Err(None),
                });
        match answer {
            Ok(()) => {
                let _ = self.async_error.compare_exchange(
                    IN_PROGRESS,
                    SUCCESS,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            Err(Some((code, msg))) => self.fail(code, &msg),
            Err(None) => {}
        }
    }

    /// A host-side collective of the parent (split, shrink): sends `header` + `data` and waits
    /// for this rank's placement (new key, rank, size).
    pub fn place(
        &self,
        header: OpHeader,
        data: &[u8],
        stop: &dyn Fn() -> bool,
    ) -> Result<(u64, u32, u32), (i32, String)> {
        let seq = self.next_seq();
        self.send(
            &Frame::new(Kind::Contribute, self.key(), seq, self.rank(), 0)
                .with(header.encode(data)),
        )?;
        let link = self.link().ok_or((
            INVALID_USAGE,
            "c10d-gpusim: communicator not connected".to_string(),
        ))?;
        match link.wait((Kind::Result, seq, 0), &|| self.aborted() || stop()) {
            Some(Ok(p)) if p.len() == 16 => Ok((
                u64::from_le_bytes(p[..8].try_into().expect("8 bytes")),
                u32::from_le_bytes(p[8..12].try_into().expect("4 bytes")),
                u32::from_le_bytes(p[12..16].try_into().expect("4 bytes")),
            )),
            Some(Ok(_)) => Err((INTERNAL_ERROR, "c10d-gpusim: malformed placement".into())),
            Some(Err(e)) => Err(e),
            None => Err((
                INVALID_USAGE,
                "c10d-gpusim: communicator aborted during split".into(),
            )),
        }
    }

    /// `ncclCommAbort`: every wait of this communicator ends, the hub sees the rank gone.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        if let Some(l) = self.link() {
            l.close();
        }
    }

    /// `ncclCommDestroy` / end of `ncclCommFinalize`: a departure on purpose.
    pub fn leave(&self) {
        let _ = self.send(&Frame::new(Kind::Bye, self.key(), 0, self.rank(), 0));
        self.aborted.store(true, Ordering::Release);
        if let Some(l) = self.link() {
            l.close();
        }
    }
}
