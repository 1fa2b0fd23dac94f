//! The one error type of the embedding layer, and how a collective call
//! makes every rank fail with the same one.

use wm_comm::Communicator;

/// What can go wrong creating, reading or training an embedding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A negative or too large id; `rank` is the world rank that passed it.
    #[error("id {index} at position {position} on rank {rank} is out of range for an embedding of {rows} rows")]
    IndexOutOfRange {
        /// The bad id.
        index: i64,
        /// Where it was in that rank's ids.
        position: usize,
        /// The world rank that passed it.
        rank: usize,
        /// Rows in the embedding.
        rows: usize,
    },
    /// The gradients are not one row of `dim` values per id.
    #[error("rank {rank} passed {len} gradient values for {ids} ids of dimension {dim}; expected {}", ids * dim)]
    GradientLength {
        /// The world rank that passed them.
        rank: usize,
        /// How many ids it passed.
        ids: usize,
        /// The embedding dimension.
        dim: usize,
        /// How many gradient values it passed.
        len: usize,
    },
    /// An optimizer parameter outside its range.
    #[error("{optimizer} parameter {name} = {value} is invalid: {reason}")]
    InvalidParameter {
        /// The optimizer ("adam", …).
        optimizer: &'static str,
        /// The parameter ("beta1", …).
        name: &'static str,
        /// The value given.
        value: f32,
        /// The valid range, in words.
        reason: &'static str,
    },
    /// Gradients were applied to an embedding created without an optimizer.
    #[error("this embedding has no optimizer: create it with one to apply gradients")]
    NoOptimizer,
    /// An optimizer state name this optimizer does not keep.
    #[error("the {optimizer} optimizer keeps no state {name:?}; it keeps {known:?}")]
    UnknownState {
        /// The optimizer.
        optimizer: &'static str,
        /// The name asked for.
        name: String,
        /// The names it keeps.
        known: Vec<&'static str>,
    },
    /// Anything else a caller passed that cannot work; the message names
    /// the value (and the ranks, for values that must agree).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Another rank of a collective call failed its checks.
    #[error("rank {rank} failed: {detail}")]
    PeerFailed {
        /// The world rank.
        rank: usize,
        /// Its error.
        detail: String,
    },
    /// A peer sent something the exchange cannot have produced (a row it
    /// does not own, gradients that are not one row per id). Every rank of
    /// the collective call reports it, naming that peer.
    #[error("rank {rank} sent malformed data: {detail}")]
    Malformed {
        /// The world rank that sent it.
        rank: usize,
        /// What was wrong with it.
        detail: String,
    },
    /// Moving rows failed.
    #[error(transparent)]
    Gather(wm_gather::Error),
    /// The memory layer refused (allocation, mapping).
    #[error(transparent)]
    Memory(#[from] wholemem::Error),
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
}

impl From<wm_gather::Error> for Error {
    fn from(e: wm_gather::Error) -> Self {
        match e {
            wm_gather::Error::IndexOutOfRange { index, position, rank, rows } => Self::IndexOutOfRange { index, position, rank, rows },
            wm_gather::Error::Malformed { rank, detail } => Self::Malformed { rank, detail },
            wm_gather::Error::Memory(m) => Self::Memory(m),
            wm_gather::Error::Comm(c) => Self::Comm(c),
            other => Self::Gather(other),
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

const OUT_OF_RANGE: u8 = 1;
const GRADIENT_LENGTH: u8 = 2;
const NO_OPTIMIZER: u8 = 3;

/// The errors that keep their type on the way to other ranks: the bad id,
/// the gradient length, the missing optimizer.
impl wholemem::agree::PeerError for Error {
    fn peer_failed(rank: usize, detail: String) -> Self {
        Self::PeerFailed { rank, detail }
    }

    fn malformed(rank: usize, detail: String) -> Self {
        Self::Malformed { rank, detail }
    }

    fn as_malformed(&self) -> Option<(usize, &str)> {
        match self {
            Self::Malformed { rank, detail } => Some((*rank, detail)),
            _ => None,
        }
    }

    fn encode(&self) -> Option<Vec<u8>> {
        let words = |kind: u8, w: [usize; 3]| {
            let mut m = vec![kind];
            w.iter().for_each(|&v| m.extend_from_slice(&(v as u64).to_le_bytes()));
            m
        };
        match self {
            Self::IndexOutOfRange { index, position, rows, .. } => Some(words(OUT_OF_RANGE, [*index as usize, *position, *rows])),
            Self::GradientLength { ids, dim, len, .. } => Some(words(GRADIENT_LENGTH, [*ids, *dim, *len])),
            Self::NoOptimizer => Some(vec![NO_OPTIMIZER]),
            _ => None,
        }
    }

    fn decode(rank: usize, m: &[u8]) -> Option<Self> {
        let (&kind, rest) = m.split_first()?;
        let word = |i: usize| usize::try_from(u64::from_le_bytes(*rest.get(8 * i..)?.first_chunk::<8>()?)).ok();
        match (kind, rest.len()) {
            (OUT_OF_RANGE, 24) => {
                let index = u64::from_le_bytes(*rest.first_chunk::<8>()?) as i64;
                Some(Self::IndexOutOfRange { index, position: word(1)?, rank, rows: word(2)? })
            }
            (GRADIENT_LENGTH, 24) => Some(Self::GradientLength { rank, ids: word(0)?, dim: word(1)?, len: word(2)? }),
            (NO_OPTIMIZER, 0) => Some(Self::NoOptimizer),
            _ => None,
        }
    }
}

/// Fails on every rank if any rank's checks failed, with the error of the
/// lowest failing rank (its own on that rank), so every rank returns before
/// any data moves and the communicator stays in step. `extra` travels with
/// the outcome (a value that must agree); every rank's is returned.
pub(crate) fn agree(comm: &dyn Communicator, mine: Result<()>, extra: &[u8]) -> Result<Vec<Vec<u8>>> {
    wholemem::agree::agree_sharing(comm, mine, wholemem::agree::Rule::Lowest, extra).map(|((), all)| all)
}

#[cfg(test)]
mod tests {
    use wholemem::agree::PeerError;

    use super::*;

    /// What other ranks rebuild from `e`, sent by world rank `rank`.
    fn trip(rank: usize, e: Error) -> Error {
        let bytes = e.encode();
        match bytes {
            Some(b) => Error::decode(rank, &b).expect("a typed error decodes"),
            None => Error::peer_failed(rank, e.to_string()),
        }
    }

    #[test]
    fn outcomes_survive_the_trip_with_the_sender_rank() {
        let e = Error::IndexOutOfRange { index: -3, position: 4, rank: 0, rows: 10 };
        let back = trip(7, e);
        assert_eq!(back.to_string(), "id -3 at position 4 on rank 7 is out of range for an embedding of 10 rows");
        let e = Error::GradientLength { rank: 0, ids: 3, dim: 8, len: 23 };
        let back = trip(2, e);
        assert_eq!(back.to_string(), "rank 2 passed 23 gradient values for 3 ids of dimension 8; expected 24");
        assert!(matches!(trip(1, Error::NoOptimizer), Error::NoOptimizer));
        let back = trip(1, Error::InvalidArgument("learning rate NaN".into()));
        assert!(matches!(back, Error::PeerFailed { rank: 1, .. }), "{back:?}");
        assert!(back.to_string().contains("rank 1 failed: invalid argument: learning rate NaN"), "{back}");
        // Bytes that are none of these encodings are not taken for one.
        for bad in [&[][..], &[OUT_OF_RANGE, 1, 2], &[NO_OPTIMIZER, 0], &[9; 25]] {
            assert!(Error::decode(3, bad).is_none(), "{bad:?}");
        }
    }
}
