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
const OTHER: u8 = 4;

/// One rank's outcome of its checks, as bytes for an allgather (empty: ok).
fn encode(mine: &Result<()>) -> Vec<u8> {
    let words = |kind: u8, w: &[u64]| {
        let mut m = vec![kind];
        w.iter().for_each(|v| m.extend_from_slice(&v.to_le_bytes()));
        m
    };
    match mine {
        Ok(()) => Vec::new(),
        Err(Error::IndexOutOfRange { index, position, rows, .. }) => words(OUT_OF_RANGE, &[*index as u64, *position as u64, *rows as u64]),
        Err(Error::GradientLength { ids, dim, len, .. }) => words(GRADIENT_LENGTH, &[*ids as u64, *dim as u64, *len as u64]),
        Err(Error::NoOptimizer) => vec![NO_OPTIMIZER],
        Err(e) => [&[OTHER][..], e.to_string().as_bytes()].concat(),
    }
}

/// The error `rank` (a world rank) reported with [`encode`].
fn decode(rank: usize, m: &[u8]) -> Error {
    let word = |i: usize| m.get(1 + 8 * i..9 + 8 * i).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    match (m[0], word(0), word(1), word(2)) {
        (OUT_OF_RANGE, Some(index), Some(position), Some(rows)) => {
            Error::IndexOutOfRange { index: index as i64, position: position as usize, rank, rows: rows as usize }
        }
        (GRADIENT_LENGTH, Some(ids), Some(dim), Some(len)) => {
            Error::GradientLength { rank, ids: ids as usize, dim: dim as usize, len: len as usize }
        }
        (NO_OPTIMIZER, ..) => Error::NoOptimizer,
        _ => Error::PeerFailed { rank, detail: String::from_utf8_lossy(&m[1..]).into_owned() },
    }
}

/// Fails on every rank if any rank's checks failed, with the error of the
/// lowest failing rank (its own on that rank), so every rank returns before
/// any data moves and the communicator stays in step. `extra` travels with
/// the outcome (a value that must agree); every rank's is returned.
pub(crate) fn agree(comm: &dyn Communicator, mine: Result<()>, extra: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut msg = (extra.len() as u64).to_le_bytes().to_vec();
    msg.extend_from_slice(extra);
    msg.extend_from_slice(&encode(&mine));
    let all = comm.allgatherv(&msg)?;
    // Each message: the length of its extra, the extra, the outcome.
    let split = |m: &[u8]| {
        let n = m.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
        let n = n.min(m.len().saturating_sub(8));
        (m[8.min(m.len())..8 + n].to_vec(), m[(8 + n).min(m.len())..].to_vec())
    };
    let parts: Vec<(Vec<u8>, Vec<u8>)> = all.iter().map(|m| split(m)).collect();
    if let Some((r, (_, outcome))) = parts.iter().enumerate().find(|(_, (_, o))| !o.is_empty()) {
        if r == comm.rank() {
            mine?;
        }
        return Err(decode(comm.world_ranks()[r], outcome));
    }
    Ok(parts.into_iter().map(|(e, _)| e).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_survive_the_trip_with_the_sender_rank() {
        let e = Error::IndexOutOfRange { index: -3, position: 4, rank: 0, rows: 10 };
        let back = decode(7, &encode(&Err(e)));
        assert_eq!(back.to_string(), "id -3 at position 4 on rank 7 is out of range for an embedding of 10 rows");
        let e = Error::GradientLength { rank: 0, ids: 3, dim: 8, len: 23 };
        let back = decode(2, &encode(&Err(e)));
        assert_eq!(back.to_string(), "rank 2 passed 23 gradient values for 3 ids of dimension 8; expected 24");
        assert!(matches!(decode(1, &encode(&Err(Error::NoOptimizer))), Error::NoOptimizer));
        let back = decode(1, &encode(&Err(Error::InvalidArgument("learning rate NaN".into()))));
        assert!(matches!(back, Error::PeerFailed { rank: 1, .. }), "{back:?}");
        assert!(back.to_string().contains("rank 1 failed: invalid argument: learning rate NaN"), "{back}");
        assert!(encode(&Ok(())).is_empty());
    }
}
