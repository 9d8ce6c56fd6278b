//! Holding back failure dumps on one thread while it runs an op it has not recorded yet.
//!
//! A backend may record an op late: c10d-gloo records a collective it runs at once on the
//! caller's thread at the op's first wait for a peer, where writing the entry costs the op
//! nothing. If the group fails before that wait (another op of the group fails first, say a
//! receive posted earlier whose peer died), the dump that failure writes would miss the op
//! that was running. While a [`DumpHold`] lives, failures reported on its thread note the
//! dump instead of writing it, and dropping the hold writes it: by then the op is recorded.
//!
//! Thread-bound on purpose: a backend reports its ops' ends on the thread that drives it, the
//! one that holds; a plain thread-local flag costs a few nanoseconds and no atomic operation.
//! A failure reported on another thread meanwhile dumps at once, as without a hold.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

thread_local! {
    /// How many holds the thread has open (a const `Cell`: usable until the thread is gone).
    static HOLDS: Cell<u32> = const { Cell::new(0) };
    /// The groups whose failure wanted a dump while the thread held (each dumps once).
    static WANTED: RefCell<Vec<&'static dyn HeldDump>> = const { RefCell::new(Vec::new()) };
}

/// What a failure held back on a thread writes once the hold ends (a group's dump).
pub(super) trait HeldDump: Sync {
    /// Writes the dump now.
    fn write_dump(&self);
}

/// While alive, failures reported on this thread write their flight-recorder dump when it is
/// dropped instead of at once ([`hold_failure_dumps`]). Not `Send`: it belongs to its thread.
/// Forgetting one (`mem::forget`) leaves the thread holding for good: its failures then
/// never dump.
#[derive(Debug)]
#[must_use = "the hold ends when the guard is dropped"]
pub struct DumpHold {
    _thread_bound: PhantomData<*const ()>,
}

/// Holds back the dumps that failures reported on the calling thread would write, until the
/// returned guard is dropped; then each group that wanted one writes it (as
/// [`super::FlightRecorder::dump_to_file`] does, errors printed to stderr). Holds nest.
///
/// For a backend that records an op late: it holds from the op's submission until the op is
/// recorded, so that a failure noticed in between dumps with the op in it. The waiters of
/// the op whose failure wanted the dump may see its error before the file exists (for as
/// long as the hold lasts), where without a hold the file exists first.
pub fn hold_failure_dumps() -> DumpHold {
    HOLDS.with(|h| h.set(h.get() + 1));
    DumpHold {
        _thread_bound: PhantomData,
    }
}

impl Drop for DumpHold {
    fn drop(&mut self) {
        let open = HOLDS.with(|h| {
            h.set(h.get() - 1);
            h.get()
        });
        if open > 0 {
            return;
        }
        // Taken out first: a dump must not find the list borrowed. (In thread-local teardown
        // the list may be gone, and its notes with it.)
        let wanted = WANTED.try_with(|w| std::mem::take(&mut *w.borrow_mut()));
        wanted
            .unwrap_or_default()
            .into_iter()
            .for_each(|d| d.write_dump());
    }
}

/// Whether the calling thread holds dumps; if so, notes that `core` wants one (once).
/// Returns false when the note cannot be kept (thread-local teardown): the dump is then
/// written at once.
pub(super) fn defer_dump(core: &'static dyn HeldDump) -> bool {
    HOLDS.with(|h| h.get() > 0)
        && WANTED
            .try_with(|w| {
                let mut w = w.borrow_mut();
                if !w.iter().any(|c| std::ptr::addr_eq(*c, core)) {
                    w.push(core);
                }
            })
            .is_ok()
}
