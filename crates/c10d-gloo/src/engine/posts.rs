//! [`Posts`]: how an algorithm sends and receives parts of its buffers while it works on other
//! parts, without `unsafe` or pointers of its own. The algorithm registers its buffers once
//! ([`Posts::buffer`], [`Posts::input`]) and then names a part by its handle and a byte range:
//! post a receive into it, a send from it, wait, fold one part into another, look at a part.
//!
//! Why this is sound (the one place that argues it): the engine reads and writes a registered
//! buffer only through the raw pointer taken when it was registered, and only inside a call on
//! the `Posts` (a post, a wait, or a drop), which holds `&mut Posts`; a slice handed out by
//! [`Posts::bytes`] / [`Posts::bytes_mut`] / [`Posts::fold`] borrows the `Posts` too, so the
//! engine never runs while the algorithm holds one. Every range is checked against its buffer
//! before a pointer is offset. The buffers stay borrowed (`'b`) for the life of the `Posts`,
//! and dropping it detaches every post not waited for, so no frame is ever read into or
//! written from a buffer once the algorithm gave it back. A `Posts` exists only inside
//! [`Comm::with_posts`], which drops it before returning, so it cannot be leaked (with
//! `mem::forget`) past the buffers it points into.
//!
//! Ordering is the algorithm's business: the ring and all-pairs post receives early into parts
//! they still send from or fold into, because causality says the data cannot arrive before
//! that work left this rank (a final chunk needs our contribution first). What `Posts`
//! refuses, with an error instead of wrong results, is two pending receives into one byte and
//! any range outside its buffer.

use super::comm::Comm;
use c10d_core::reduce::reduce_into;
use c10d_core::{DType, DistError, ReduceOp, Result};
use std::marker::PhantomData;
use std::ops::Range;

/// A registered buffer of a [`Posts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buf(usize);

/// One registered buffer: where it is, how long, and whether receives may write it.
struct Region {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

/// A receive not waited for yet: post id, buffer, byte range.
struct PendingRecv {
    id: u64,
    buf: Buf,
    range: Range<usize>,
}

/// The posts of one algorithm over its registered buffers (see the module docs).
pub(crate) struct Posts<'c, 'e, 'b> {
    comm: &'c mut Comm<'e>,
    regions: Vec<Region>,
    recvs: Vec<PendingRecv>,
    _buffers: PhantomData<&'b mut [u8]>,
}

impl<'e> Comm<'e> {
    /// Runs `f` with a [`Posts`] over this collective, for buffers that outlive this call; when
    /// `f` returns (or fails), every post not waited for is detached (the `Comm`'s outstanding
    /// posts are the `Posts`' own: every other way to post waits for what it posted). The `Posts` exists only
    /// inside this call, so it can never be leaked past its buffers.
    ///
    /// # Errors
    /// What `f` returns.
    pub(crate) fn with_posts<'b, R>(
        &mut self,
        f: impl FnOnce(&mut Posts<'_, 'e, 'b>) -> Result<R>,
    ) -> Result<R> {
        let mut posts = Posts {
            comm: self,
            regions: Vec::new(),
            recvs: Vec::new(),
            _buffers: PhantomData,
        };
        f(&mut posts)
    }
}

impl<'e, 'b> Posts<'_, 'e, 'b> {
    /// Registers a buffer the algorithm sends from, receives into and folds into.
    pub(crate) fn buffer(&mut self, b: &'b mut [u8]) -> Buf {
        self.regions.push(Region {
            ptr: b.as_mut_ptr(),
            len: b.len(),
            writable: true,
        });
        Buf(self.regions.len() - 1)
    }

    /// Registers a buffer the algorithm only sends from or reads.
    pub(crate) fn input(&mut self, b: &'b [u8]) -> Buf {
        self.regions.push(Region {
            ptr: b.as_ptr().cast_mut(),
            len: b.len(),
            writable: false,
        });
        Buf(self.regions.len() - 1)
    }

    /// Posts a receive of `range` of `b` from `peer` as `step`; returns its id.
    ///
    /// # Errors
    /// A range outside `b`, a read-only `b`, or a range another pending receive already
    /// writes (bugs of the algorithm: the group's op fails instead of corrupting data).
    pub(crate) fn recv(
        &mut self,
        peer: usize,
        step: u32,
        b: Buf,
        range: Range<usize>,
    ) -> Result<u64> {
        let ptr = self.checked(b, &range, "receive into")?;
        if !self.regions[b.0].writable {
            return Err(self.bug(format!("receive into read-only buffer {}", b.0)));
        }
        self.check_unwritten(b, &range, "receive into")?;
        // SAFETY: `ptr..ptr + len` lies in buffer `b` (checked), borrowed for `'b`, which
        // outlives every post: waited for, or detached when this `Posts` drops. No slice of it
        // is alive while the engine writes it (slices borrow `self`).
        let id = unsafe { self.comm.post_recv(peer, step, ptr, range.len()) };
        self.recvs.push(PendingRecv { id, buf: b, range });
        Ok(id)
    }

    /// Posts a send of `range` of `b` to `peer` as `step`; returns its id.
    ///
    /// # Errors
    /// A range outside `b`.
    pub(crate) fn send(
        &mut self,
        peer: usize,
        step: u32,
        b: Buf,
        range: Range<usize>,
    ) -> Result<u64> {
        let ptr = self.checked(b, &range, "send from")?;
        // SAFETY: as in `recv`; the engine only reads these bytes.
        let id = unsafe { self.comm.post_send(peer, step, ptr, range.len()) };
        Ok(id)
    }

    /// Posts an empty frame to `peer` (a signal: "ready", "done").
    pub(crate) fn signal(&mut self, peer: usize, step: u32) -> u64 {
        // SAFETY: zero bytes: nothing is read.
        unsafe {
            self.comm
                .post_send(peer, step, std::ptr::NonNull::dangling().as_ptr(), 0)
        }
    }

    /// Like [`Posts::wait`] with its own `deadline`, but a time-out returns the peers whose
    /// receives did not complete (monitored barrier); see [`Comm::wait_or_missing`].
    pub(crate) fn wait_or_missing(
        &mut self,
        ids: &[u64],
        deadline: std::time::Instant,
    ) -> std::result::Result<(), (Vec<usize>, Option<DistError>)> {
        self.comm.wait_or_missing(ids, deadline)?;
        self.recvs.retain(|r| !ids.contains(&r.id));
        Ok(())
    }

    /// Posts the receive of an empty frame from `peer`.
    pub(crate) fn await_signal(&mut self, peer: usize, step: u32) -> u64 {
        // SAFETY: zero bytes: nothing is written.
        unsafe {
            self.comm
                .post_recv(peer, step, std::ptr::NonNull::dangling().as_ptr(), 0)
        }
    }

    /// Waits until the posts `ids` completed.
    ///
    /// # Errors
    /// As [`Comm::wait`] (the group's failure, or the op's time-out).
    pub(crate) fn wait(&mut self, ids: &[u64]) -> Result<()> {
        self.comm.wait(ids)?;
        self.recvs.retain(|r| !ids.contains(&r.id));
        Ok(())
    }

    /// Whether the posts `ids` completed, after one look at the sockets that does not block
    /// (completed ids are consumed, as by [`Posts::wait`]; call it with an empty list to just
    /// move the sockets along between pieces of work).
    ///
    /// # Errors
    /// As [`Posts::wait`], without the time-out (the wait that follows enforces it).
    pub(crate) fn test(&mut self, ids: &[u64]) -> Result<bool> {
        let done = self.comm.test(ids)?;
        if done {
            self.recvs.retain(|r| !ids.contains(&r.id));
        }
        Ok(done)
    }

    /// Waits until everything posted so far completed.
    ///
    /// # Errors
    /// As [`Posts::wait`].
    pub(crate) fn wait_all(&mut self) -> Result<()> {
        self.comm.wait_all()?;
        self.recvs.clear();
        Ok(())
    }

    /// `range` of `b`, to read (bytes a pending receive will write are read as they are now).
    ///
    /// # Errors
    /// A range outside `b`.
    pub(crate) fn bytes(&mut self, b: Buf, range: Range<usize>) -> Result<&[u8]> {
        let ptr = self.checked(b, &range, "read")?;
        // SAFETY: in bounds (checked) of a buffer borrowed for `'b`; the engine does not run
        // while the slice (which borrows `self`) lives.
        Ok(unsafe { std::slice::from_raw_parts(ptr, range.len()) })
    }

    /// `range` of writable `b`, to write.
    ///
    /// # Errors
    /// As [`Posts::bytes`]; a read-only `b`.
    pub(crate) fn bytes_mut(&mut self, b: Buf, range: Range<usize>) -> Result<&mut [u8]> {
        let ptr = self.checked(b, &range, "write")?;
        if !self.regions[b.0].writable {
            return Err(self.bug(format!("write into read-only buffer {}", b.0)));
        }
        // SAFETY: as in `bytes`, and this is the only slice alive (it borrows `self` mutably).
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, range.len()) })
    }

    /// `dst ⊕= src` elementwise (`op` on `dtype`), for two parts of the same length.
    ///
    /// # Errors
    /// As [`Posts::bytes_mut`] for either part; parts that overlap or differ in length.
    pub(crate) fn fold(
        &mut self,
        op: ReduceOp,
        dtype: DType,
        dst: (Buf, Range<usize>),
        src: (Buf, Range<usize>),
    ) -> Result<()> {
        self.with_pair(dst, src, |d, s| reduce_into(op, dtype, d, s))
    }

    /// `dst = src`, for two parts of the same length.
    ///
    /// # Errors
    /// As [`Posts::fold`].
    pub(crate) fn copy(
        &mut self,
        (db, dr): (Buf, Range<usize>),
        (sb, sr): (Buf, Range<usize>),
    ) -> Result<()> {
        self.with_pair((db, dr), (sb, sr), |dst, src| {
            dst.copy_from_slice(src);
            Ok(())
        })
    }

    /// Runs `f(dst, src)` on two parts of the same length that do not overlap.
    fn with_pair(
        &mut self,
        (db, dr): (Buf, Range<usize>),
        (sb, sr): (Buf, Range<usize>),
        f: impl FnOnce(&mut [u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        if dr.len() != sr.len() || (db == sb && dr.start < sr.end && sr.start < dr.end) {
            return Err(self.bug(format!(
                "pair {dr:?} / {sr:?} of buffers {} and {}",
                db.0, sb.0
            )));
        }
        let src = self.bytes(sb, sr)?.as_ptr();
        let len = dr.len();
        let dst = self.bytes_mut(db, dr)?;
        // SAFETY: `src` points at `len` checked, initialised bytes of a buffer borrowed for `'b`
        // that do not overlap `dst` (checked above; different buffers never overlap, each
        // being its own borrow); nothing writes them while this call runs.
        let src = unsafe { std::slice::from_raw_parts(src, len) };
        f(dst, src)
    }

    /// The pointer to `range` of `b`, after checking the range lies inside it.
    fn checked(&self, b: Buf, range: &Range<usize>, what: &str) -> Result<*mut u8> {
        match self.regions.get(b.0) {
            Some(r) if range.start <= range.end && range.end <= r.len => {
                // SAFETY: `range.start <= r.len`: the offset stays inside (or one past) the
                // registered buffer.
                Ok(unsafe { r.ptr.add(range.start) })
            }
            _ => Err(self.bug(format!(
                "{what} bytes {range:?} of buffer {} out of bounds",
                b.0
            ))),
        }
    }

    /// Fails when another pending receive writes any byte of `range` of `b`.
    fn check_unwritten(&self, b: Buf, range: &Range<usize>, what: &str) -> Result<()> {
        let busy = self.recvs.iter().any(|r| {
            r.buf == b
                && r.range.start < range.end
                && range.start < r.range.end
                && !range.is_empty()
        });
        if busy {
            return Err(self.bug(format!(
                "{what} bytes {range:?} of buffer {} while a receive into them is pending",
                b.0
            )));
        }
        Ok(())
    }

    /// An algorithm bug as the op's error (never a panic inside the library).
    fn bug(&self, what: String) -> DistError {
        DistError::backend(format!(
            "{}: internal error in the algorithm: {what}",
            self.comm.ctx()
        ))
    }
}

impl Drop for Posts<'_, '_, '_> {
    fn drop(&mut self) {
        self.comm.detach_all();
    }
}
