//! The one error type of the memory layer.

/// What can go wrong when allocating or accessing WholeMemory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The combination cannot work here; the reason says why.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for, e.g. "host continuous memory".
        what: String,
        /// Why, naming ranks, nodes or devices.
        reason: String,
    },
    /// A caller passed something unusable; the message names the value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A row id outside the table.
    #[error("row {index} is out of range for a table of {rows} rows")]
    IndexOutOfRange {
        /// The bad id.
        index: i64,
        /// Rows in the table.
        rows: usize,
    },
    /// Another rank failed its part of a collective step.
    #[error("rank {rank} failed: {detail}")]
    PeerFailed {
        /// The world rank that failed.
        rank: usize,
        /// Its error.
        detail: String,
    },
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
    /// A CUDA driver call failed.
    #[error("CUDA: {call} failed: {detail}")]
    Cuda {
        /// The driver entry point.
        call: &'static str,
        /// The driver's error name and description.
        detail: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn os(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Os { context: context.into(), source }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
