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

use crate::op_type::OpType;
use std::fmt;
use std::ops::Deref;

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

/// The text of a [`DistError`] and its [`ErrorContext`], if any. Reads as the text
/// (`Deref<Target = str>`, `Display`); two messages are equal when their texts are.
#[derive(Clone, Eq)]
pub struct Message {
    text: String,
    context: Option<Box<ErrorContext>>,
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
/// `Display` prints only the message, exactly like `str(exc)` in PyTorch.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
pub enum DistError {
    /// Mirrors `DistError`.
    #[error("{0}")]
    Dist(Message),
    /// Mirrors `DistBackendError`.
    #[error("{0}")]
    Backend(Message),
    /// Mirrors `DistNetworkError`.
    #[error("{0}")]
    Network(Message),
    /// Mirrors `DistStoreError`.
    #[error("{0}")]
    Store(Message),
    /// Mirrors `QueueEmptyError`.
    #[error("{0}")]
    QueueEmpty(Message),
    /// Mirrors Python's `ValueError` for bad arguments.
    #[error("{0}")]
    InvalidArgument(Message),
    /// Mirrors `NotImplementedError` / unsupported-op `RuntimeError`.
    #[error("{0}")]
    Unsupported(Message),
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
    /// which the stores map themselves.
    fn from(e: std::io::Error) -> Self {
        DistError::Network(e.to_string().into())
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
}
