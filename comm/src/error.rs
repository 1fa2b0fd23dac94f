//! The one error type of the communication layer.

use std::io;

/// What can go wrong when ranks talk.
///
/// Ranks named in errors are **world** ranks, whatever communicator the call
/// was made on, so a message means the same thing on every rank.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A peer process went away without shutting down: it crashed, was
    /// killed, or another rank reported it lost.
    #[error("rank {rank} was lost during {op}: {detail}")]
    PeerLost {
        /// The world rank that is gone.
        rank: usize,
        /// The operation that noticed it.
        op: &'static str,
        /// How it was noticed.
        detail: String,
    },
    /// A peer sent something the protocol does not allow: a frame over the
    /// size limit, a garbled header, a payload that does not describe
    /// itself. Every rank learns of it (the peer is then treated as lost).
    #[error("rank {rank} broke the protocol during {op}: {detail}")]
    Protocol {
        /// The world rank that sent it.
        rank: usize,
        /// The operation that received it.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// No progress was made for the whole timeout (`WM_TIMEOUT_S`).
    #[error("{op} timed out after {secs:.1} s waiting for {} (set WM_TIMEOUT_S to change the limit)", rank_list(ranks))]
    Timeout {
        /// The operation that waited.
        op: &'static str,
        /// The world ranks it was still waiting for.
        ranks: Vec<usize>,
        /// The timeout, in seconds.
        secs: f64,
    },
    /// Ranks called different collectives, or passed arguments that must
    /// agree but do not.
    #[error("collective mismatch in {op}: {detail}")]
    Mismatch {
        /// The operation on this rank.
        op: &'static str,
        /// What differs, naming ranks.
        detail: String,
    },
    /// Ranks could not find each other.
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// A directory or file another user could have planted or swapped
    /// (writable by others, not ours, a symbolic link, readable by others):
    /// refused before anything in it is used.
    #[error("not trusted: {0}")]
    Untrusted(String),
    /// A caller passed something unusable; the message names the value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operation cannot be done with this backend or between these ranks.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// Why it cannot be done.
        reason: String,
    },
    /// NCCL reported an error (synchronously, or asynchronously while a
    /// rank waited); the communicator is aborted and unusable afterwards.
    #[error("NCCL {op} failed: {detail}")]
    Nccl {
        /// The NCCL operation.
        op: &'static str,
        /// NCCL's words, or what failed around it.
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
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }

    /// The world rank this error blames, if it blames exactly one.
    pub fn blamed_rank(&self) -> Option<usize> {
        match self {
            Self::PeerLost { rank, .. } | Self::Protocol { rank, .. } => Some(*rank),
            Self::Timeout { ranks, .. } if ranks.len() == 1 => Some(ranks[0]),
            _ => None,
        }
    }
}

/// "rank 3", "ranks 1 and 2", "ranks 0, 1 and 5".
pub fn rank_list(ranks: &[usize]) -> String {
    match ranks {
        [] => "no rank".to_owned(),
        [r] => format!("rank {r}"),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(ToString::to_string).collect();
            format!("ranks {} and {last}", init.join(", "))
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
