//! The one error type of the embedding layer, and how its errors travel to
//! the other ranks of a collective call.

use wholemem::CommonError;

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
    /// An unusable argument, a peer that failed or sent malformed data, a
    /// wait that timed out: the kinds every layer shares.
    #[error(transparent)]
    Common(#[from] wholemem::CommonError),
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
            wm_gather::Error::Common(CommonError::Malformed { rank, detail }) => Self::Common(CommonError::Malformed { rank, detail }),
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
    wholemem::peer_error_variants!();

    fn encode(&self) -> Option<Vec<u8>> {
        use wholemem::agree::encode_words;
        match self {
            Self::IndexOutOfRange { index, position, rows, .. } => {
                Some(encode_words(OUT_OF_RANGE, &[*index as u64, *position as u64, *rows as u64]))
            }
            Self::GradientLength { ids, dim, len, .. } => Some(encode_words(GRADIENT_LENGTH, &[*ids as u64, *dim as u64, *len as u64])),
            Self::NoOptimizer => Some(encode_words(NO_OPTIMIZER, &[])),
            _ => None,
        }
    }

    fn decode(rank: usize, m: &[u8]) -> Option<Self> {
        use wholemem::agree::decode_words;
        let size = |w: u64| usize::try_from(w).ok();
        if let Some([index, position, rows]) = decode_words(m, OUT_OF_RANGE) {
            return Some(Self::IndexOutOfRange { index: index as i64, position: size(position)?, rank, rows: size(rows)? });
        }
        if let Some([ids, dim, len]) = decode_words(m, GRADIENT_LENGTH) {
            return Some(Self::GradientLength { rank, ids: size(ids)?, dim: size(dim)?, len: size(len)? });
        }
        decode_words::<0>(m, NO_OPTIMIZER).map(|[]| Self::NoOptimizer)
    }
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
        let back = trip(1, Error::Common(CommonError::InvalidArgument("learning rate NaN".into())));
        assert!(matches!(back, Error::Common(CommonError::PeerFailed { rank: 1, .. })), "{back:?}");
        assert!(back.to_string().contains("rank 1 failed: invalid argument: learning rate NaN"), "{back}");
        // Bytes that are none of these encodings are not taken for one.
        for bad in [&[][..], &[OUT_OF_RANGE, 1, 2], &[NO_OPTIMIZER, 0], &[9; 25]] {
            assert!(Error::decode(3, bad).is_none(), "{bad:?}");
        }
    }
}
