//! The one error type of one-sided reads.

use std::io;
use wholemem::CommonError;

/// What can go wrong reading a table one-sidedly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A negative or too large id; nothing was read.
    #[error("id {index} at position {position} is out of range for table {table:?} of {rows} rows")]
    IndexOutOfRange {
        /// The table.
        table: String,
        /// The bad id.
        index: i64,
        /// Where it was in the ids.
        position: usize,
        /// Rows in the table.
        rows: usize,
    },
    /// An unusable argument, a peer that failed or sent malformed data, a
    /// wait that timed out: the kinds every layer shares.
    #[error(transparent)]
    Common(#[from] wholemem::CommonError),
    /// The transport or operation cannot work here; the reason says why.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// Why it cannot be done.
        reason: String,
    },
    /// The table is gone: its job freed it, or the job (or the rank owning
    /// the rows) ended. Every later read of this reader fails the same way.
    #[error("table {table:?} is gone: {detail}")]
    Gone {
        /// The table.
        table: String,
        /// How it was noticed.
        detail: String,
    },
    /// No table of this name is published where the reader looked.
    #[error("no table {name:?} is published at {at}: {detail}")]
    NotPublished {
        /// The name asked for.
        name: String,
        /// Where it was looked for.
        at: String,
        /// What was found instead.
        detail: String,
    },
    /// A reader was used in a process forked from the one that opened it:
    /// its connections, mappings and endpoints are the parent's (a socket
    /// shared by two processes mixes their requests and answers). Nothing
    /// was read, and nothing of the parent's was touched.
    #[error(
        "this reader of table {table:?} was opened by process {opened_by}, and this is process {this}, a fork of it: \
         the parent's connections are not this process's to use; call Reader::reopen() in the child for a reader of its own \
         (or Reader::join after exec)"
    )]
    Forked {
        /// The table.
        table: String,
        /// The process that opened the reader.
        opened_by: u32,
        /// This process.
        this: u32,
    },
    /// A server, catalogue or record sent something the protocol does not
    /// allow.
    #[error("{from} sent malformed data: {detail}")]
    Malformed {
        /// Who sent it.
        from: String,
        /// What was wrong.
        detail: String,
    },
    /// A server or catalogue refused this reader (a key mismatch, or its
    /// policy), or could not prove it holds the job's key; `detail` says
    /// which.
    #[error("{at} refused the connection: {detail}")]
    Refused {
        /// Where it connected.
        at: String,
        /// Why, in words.
        detail: String,
    },
    /// Converting or placing rows failed.
    #[error(transparent)]
    Gather(#[from] wm_gather::Error),
    /// The memory layer refused.
    #[error(transparent)]
    Memory(#[from] wholemem::Error),
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
    /// A libfabric call failed.
    #[error("libfabric: {call} failed: {detail}")]
    Fabric {
        /// The call.
        call: &'static str,
        /// libfabric's words.
        detail: String,
    },
    /// An MPI call failed.
    #[error("MPI: {call} failed: {detail}")]
    Mpi {
        /// The call.
        call: &'static str,
        /// MPI's words.
        detail: String,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// An [`Error::Io`] with context.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }
}

impl wholemem::agree::PeerError for Error {
    fn peer_failed(rank: usize, detail: String) -> Self {
        Self::Common(CommonError::PeerFailed { rank, detail })
    }

    fn malformed(rank: usize, detail: String) -> Self {
        Self::Malformed { from: format!("rank {rank}"), detail }
    }

    fn as_malformed(&self) -> Option<(usize, &str)> {
        None
    }

    fn as_peer_failed(&self) -> Option<(usize, &str)> {
        match self {
            Self::Common(CommonError::PeerFailed { rank, detail }) => Some((*rank, detail)),
            _ => None,
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
