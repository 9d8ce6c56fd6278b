//! Error types mirroring PyTorch's `torch.distributed` exception hierarchy.
//!
//! PyTorch raises `DistError` (base), `DistBackendError`, `DistNetworkError`,
//! `DistStoreError` and `QueueEmptyError` (a `DistStoreError`), plus plain
//! `ValueError` / `RuntimeError` for argument problems. [`DistError`] keeps those
//! kinds as variants so callers can match on them; the message text follows
//! PyTorch's wording wherever PyTorch's own tests assert it.

use std::fmt;

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
    Dist(String),
    /// Mirrors `DistBackendError`.
    #[error("{0}")]
    Backend(String),
    /// Mirrors `DistNetworkError`.
    #[error("{0}")]
    Network(String),
    /// Mirrors `DistStoreError`.
    #[error("{0}")]
    Store(String),
    /// Mirrors `QueueEmptyError`.
    #[error("{0}")]
    QueueEmpty(String),
    /// Mirrors Python's `ValueError` for bad arguments.
    #[error("{0}")]
    InvalidArgument(String),
    /// Mirrors `NotImplementedError` / unsupported-op `RuntimeError`.
    #[error("{0}")]
    Unsupported(String),
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

    /// True for the kinds PyTorch derives from `DistStoreError` (`Store`, `QueueEmpty`).
    pub fn is_store_error(&self) -> bool {
        matches!(self, DistError::Store(_) | DistError::QueueEmpty(_))
    }

    /// Same kind, message prefixed with `prefix` (used to add rank/group context).
    pub fn with_prefix(&self, prefix: &str) -> DistError {
        self.map_message(|m| format!("{prefix}{m}"))
    }

    /// Same kind, message rewritten by `f`.
    pub fn map_message(&self, f: impl FnOnce(&str) -> String) -> DistError {
        let m = f(self.message());
        match self.kind() {
            ErrorKind::Dist => DistError::Dist(m),
            ErrorKind::Backend => DistError::Backend(m),
            ErrorKind::Network => DistError::Network(m),
            ErrorKind::Store => DistError::Store(m),
            ErrorKind::QueueEmpty => DistError::QueueEmpty(m),
            ErrorKind::InvalidArgument => DistError::InvalidArgument(m),
            ErrorKind::Unsupported => DistError::Unsupported(m),
        }
    }

    /// Shorthand for [`DistError::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        DistError::InvalidArgument(msg.into())
    }

    /// Shorthand for [`DistError::Backend`].
    pub fn backend(msg: impl Into<String>) -> Self {
        DistError::Backend(msg.into())
    }

    /// Shorthand for [`DistError::Network`].
    pub fn network(msg: impl Into<String>) -> Self {
        DistError::Network(msg.into())
    }

    /// Shorthand for [`DistError::Store`].
    pub fn store(msg: impl Into<String>) -> Self {
        DistError::Store(msg.into())
    }

    /// Shorthand for [`DistError::Unsupported`].
    pub fn unsupported(msg: impl Into<String>) -> Self {
        DistError::Unsupported(msg.into())
    }
}

impl From<std::io::Error> for DistError {
    /// I/O failures are network errors (`DistNetworkError`) unless they are time-outs of a store wait,
    /// which the stores map themselves.
    fn from(e: std::io::Error) -> Self {
        DistError::Network(e.to_string())
    }
}

/// `Result` with [`DistError`].
pub type Result<T, E = DistError> = std::result::Result<T, E>;
