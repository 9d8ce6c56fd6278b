//! Error types mirroring PyTorch's `torch.distributed` exception hierarchy.
//!
//! PyTorch raises `DistError` (base), `DistBackendError`, `DistNetworkError`,
//! `DistStoreError` and `QueueEmptyError` (a `DistStoreError`), plus plain
//! `ValueError` / `RuntimeError` for argument problems. [`DistError`] keeps those
//! kinds as variants so callers can match on them; the message text follows
//! PyTorch's wording wherever PyTorch's own tests assert it.
//!
//! An error of an op also carries what a program needs without parsing the text
//! ([`DistError::context`]): the group, the reporting rank, the op and its sequence number,
//! and the ranks at fault (PyTorch has no counterpart; its exceptions carry only the text).
//!
//! An error that came from an I/O error keeps it ([`DistError::io_error`],
//! [`DistError::io_kind`], and [`std::error::Error::source`]): a program can tell a time-out from
//! a refused connection without reading the text, which stays what it was.

use crate::op_type::OpType;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// What an error of an op is about, for a program to read (the text says the same in words).
/// Fields a backend does not know stay `None` / empty.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ErrorContext {
    /// The process group's name (`"0"` for the default group).
    pub group: Option<String>,
    /// The rank (within the group) that reports the error.
    pub rank: Option<usize>,
    /// The op that failed.
    pub op: Option<OpType>,
    /// The op's sequence number in the group (PyTorch's `SeqNum`, from 1).
    pub seq: Option<u64>,
    /// The ranks (within the group) the error blames: the dead, silent, mismatching or
    /// timed-out peers, in increasing order; empty when no peer is at fault.
    pub peers: Vec<usize>,
}

impl ErrorContext {
    /// A context for `op` number `seq` of `group` as seen by `rank`, blaming nobody yet.
    pub fn op(group: &str, rank: usize, op: OpType, seq: u64) -> ErrorContext {
        ErrorContext {
            group: Some(group.to_string()),
            rank: Some(rank),
            op: Some(op),
            seq: Some(seq),
            peers: Vec::new(),
        }
    }

    /// The same context blaming `peers` (sorted, without repeats).
    pub fn blaming(mut self, peers: impl IntoIterator<Item = usize>) -> ErrorContext {
        self.peers = peers.into_iter().collect();
        self.peers.sort_unstable();
        self.peers.dedup();
        self
    }
}

/// The text of a [`DistError`], its [`ErrorContext`] and the I/O error it came from, if any.
/// Reads as the text (`Deref<Target = str>`, `Display`); two messages are equal when their
/// texts are.
#[derive(Clone)]
pub struct Message {
    text: String,
    context: Option<Box<ErrorContext>>,
    /// Shared, so that the error stays cheap to clone (one failure reaches every waiter).
    io: Option<Arc<std::io::Error>>,
}

impl Message {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Message {}

impl Deref for Message {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl From<String> for Message {
    fn from(text: String) -> Message {
        Message {
            text,
            context: None,
            io: None,
        }
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Message {
        Message::from(text.to_string())
    }
}

/// The kind of a [`DistError`], one per PyTorch exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// `torch.distributed.DistError`: generic distributed failure.
    Dist,
    /// `torch.distributed.DistBackendError`: a collective backend failed (timeouts, dead peers, mismatches).
    Backend,
    /// `torch.distributed.DistNetworkError`: socket-level failure (connect, reset, EOF).
    Network,
    /// `torch.distributed.DistStoreError`: store failure, typically a wait timeout.
    Store,
    /// `torch.distributed.QueueEmptyError`: non-blocking pop on an empty store queue.
    QueueEmpty,
    /// Python `ValueError`: bad argument detected before any communication.
    InvalidArgument,
    /// Python `NotImplementedError` / `RuntimeError("... not supported")`: the backend or store lacks the op.
    Unsupported,
}

/// The single error type of c10d-rs.
///
/// Cloneable so one failure can be reported to every waiter of a [`crate::Work`].
/// `Display` prints only the message, exactly like `str(exc)` in PyTorch. Non-exhaustive: a
/// match needs a `_` arm, so that a kind PyTorch adds can be added here. An error made from an
/// [`std::io::Error`] keeps it as its [`source`](std::error::Error::source) (see
/// [`DistError::io_kind`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DistError {
    /// Mirrors `DistError`.
    Dist(Message),
    /// Mirrors `DistBackendError`.
    Backend(Message),
    /// Mirrors `DistNetworkError`.
    Network(Message),
    /// Mirrors `DistStoreError`.
    Store(Message),
    /// Mirrors `QueueEmptyError`.
    QueueEmpty(Message),
    /// Mirrors Python's `ValueError` for bad arguments.
    InvalidArgument(Message),
    /// Mirrors `NotImplementedError` / unsupported-op `RuntimeError`.
    Unsupported(Message),
}

impl fmt::Display for DistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.payload(), f)
    }
}

impl std::error::Error for DistError {
    /// The I/O error this error came from, if any.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let io = self.payload().io.as_deref()?;
        Some(io)
    }
}

impl fmt::Debug for DistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}({:?})", self.kind(), self.message())
    }
}

impl DistError {
    /// The PyTorch exception class this error corresponds to.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DistError::Dist(_) => ErrorKind::Dist,
            DistError::Backend(_) => ErrorKind::Backend,
            DistError::Network(_) => ErrorKind::Network,
            DistError::Store(_) => ErrorKind::Store,
            DistError::QueueEmpty(_) => ErrorKind::QueueEmpty,
            DistError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            DistError::Unsupported(_) => ErrorKind::Unsupported,
        }
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        self.payload()
    }

    fn payload(&self) -> &Message {
        match self {
            DistError::Dist(m)
            | DistError::Backend(m)
            | DistError::Network(m)
            | DistError::Store(m)
            | DistError::QueueEmpty(m)
            | DistError::InvalidArgument(m)
            | DistError::Unsupported(m) => m,
        }
    }

    fn payload_mut(&mut self) -> &mut Message {
        match self {
            DistError::Dist(m)
            | DistError::Backend(m)
            | DistError::Network(m)
            | DistError::Store(m)
            | DistError::QueueEmpty(m)
            | DistError::InvalidArgument(m)
            | DistError::Unsupported(m) => m,
        }
    }

    /// What the error is about (group, rank, op, sequence number, ranks at fault), when the
    /// backend that raised it knows; `None` for errors that are not about an op (arguments,
    /// stores) and for backends that attach none.
    pub fn context(&self) -> Option<&ErrorContext> {
        self.payload().context.as_deref()
    }

    /// The same error carrying `context` (replacing any it had).
    pub fn with_context(mut self, context: ErrorContext) -> DistError {
        self.payload_mut().context = Some(Box::new(context));
        self
    }

    /// The I/O error this error came from (its kind, OS error code and text), if any.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.payload().io.as_deref()
    }

    /// The kind of the I/O error this error came from, if any: a program can tell a time-out
    /// (`TimedOut`, `WouldBlock`) from a refused or reset connection without reading the text.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        self.io_error().map(std::io::Error::kind)
    }

    /// The same error (kind, text, context) carrying `e` as its source (replacing any it had):
    /// for an error whose text says more than `e` does, such as which file or address failed.
    pub fn with_io_source(mut self, e: std::io::Error) -> DistError {
        self.payload_mut().io = Some(Arc::new(e));
        self
    }

    /// True for the kinds PyTorch derives from `DistStoreError` (`Store`, `QueueEmpty`).
    pub fn is_store_error(&self) -> bool {
        matches!(self, DistError::Store(_) | DistError::QueueEmpty(_))
    }

    /// Same kind, message prefixed with `prefix` (used to add rank/group context).
    pub fn with_prefix(&self, prefix: &str) -> DistError {
        self.map_message(|m| format!("{prefix}{m}"))
    }

    /// Same kind and context, message rewritten by `f`.
    pub fn map_message(&self, f: impl FnOnce(&str) -> String) -> DistError {
        let mut e = self.clone();
        let m = e.payload_mut();
        m.text = f(&m.text);
        e
    }

    /// Shorthand for [`DistError::Dist`].
    pub fn dist(msg: impl Into<String>) -> Self {
        DistError::Dist(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::QueueEmpty`].
    pub fn queue_empty(msg: impl Into<String>) -> Self {
        DistError::QueueEmpty(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        DistError::InvalidArgument(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::Backend`].
    pub fn backend(msg: impl Into<String>) -> Self {
        DistError::Backend(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::Network`].
    pub fn network(msg: impl Into<String>) -> Self {
        DistError::Network(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::Store`].
    pub fn store(msg: impl Into<String>) -> Self {
        DistError::Store(Message::from(msg.into()))
    }

    /// Shorthand for [`DistError::Unsupported`].
    pub fn unsupported(msg: impl Into<String>) -> Self {
        DistError::Unsupported(Message::from(msg.into()))
    }
}

impl From<std::io::Error> for DistError {
    /// I/O failures are network errors (`DistNetworkError`) unless they are time-outs of a store wait,
    /// which the stores map themselves. The text is the I/O error's; the error itself is kept
    /// ([`DistError::io_kind`], [`std::error::Error::source`]).
    fn from(e: std::io::Error) -> Self {
        DistError::network(e.to_string()).with_io_source(e)
    }
}

/// `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_travels_with_the_error_and_leaves_its_text_alone() {
        let ctx = ErrorContext::op("0", 1, OpType::Allreduce, 7).blaming([3, 2, 3]);
        assert_eq!(ctx.peers, vec![2, 3]);
        let e = DistError::backend("Timed out").with_context(ctx.clone());
        assert_eq!(e.to_string(), "Timed out");
        assert_eq!(e.context(), Some(&ctx));
        // A rewritten message keeps the context; equality is by kind and text.
        let prefixed = e.with_prefix("rank 1: ");
        assert_eq!(prefixed.message(), "rank 1: Timed out");
        assert_eq!(prefixed.context(), Some(&ctx));
        assert_eq!(e, DistError::backend("Timed out"));
        assert_ne!(e, DistError::network("Timed out"));
        assert_eq!(DistError::invalid("bad").context(), None);
    }

    #[test]
    fn an_io_error_keeps_its_kind_and_is_the_source() {
        use std::error::Error as _;
        use std::io;
        let e = DistError::from(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        assert_eq!(e.kind(), ErrorKind::Network);
        assert_eq!(e.to_string(), "connect timed out");
        assert_eq!(e.io_kind(), Some(io::ErrorKind::TimedOut));
        // The kind survives a clone, a prefix and a context, and the source is the I/O error.
        let e = e
            .clone()
            .with_prefix("rank 1: ")
            .with_context(ErrorContext::default());
        assert_eq!(e.io_kind(), Some(io::ErrorKind::TimedOut));
        let src = e.source().expect("a source");
        let io = src.downcast_ref::<io::Error>().expect("an io::Error");
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        assert_eq!(src.to_string(), "connect timed out");
        // A text of its own, the I/O error kept.
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let e = DistError::store("FileStore /x: open failed").with_io_source(refused);
        assert_eq!(e.to_string(), "FileStore /x: open failed");
        assert_eq!(e.io_kind(), Some(io::ErrorKind::ConnectionRefused));
        assert!(matches!(e, DistError::Store(_)));
        // Errors not made from I/O have none.
        assert_eq!(DistError::invalid("bad").io_kind(), None);
        assert!(DistError::invalid("bad").source().is_none());
    }
}
