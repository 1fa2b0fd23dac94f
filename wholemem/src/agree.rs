//! How every rank of a collective call ends with the same outcome.
//!
//! Each rank passes its own result; one allgather tells every rank every
//! rank's outcome, so either all go on or all fail — and the communicator
//! stays in step whichever it is. The crates above build their collective
//! checks on [`agree`] and [`agree_sharing`] with their own error types
//! ([`PeerError`]); what differs between them is a parameter: which error a
//! failing rank returns ([`Rule`]) and which errors keep their type on the
//! trip ([`PeerError::encode`]).
//!
//! What arrives from a peer is input like any other: a message that does
//! not parse is an error blaming that peer ([`PeerError::malformed`]),
//! never a panic.

use wm_comm::Communicator;

/// Which error each rank returns when some rank failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Every rank returns the error of the lowest failing rank (that rank
    /// its own): one error everywhere.
    Lowest,
    /// A failing rank returns its own error, the others the lowest failing
    /// rank's (file loading: each rank names the file it could not read).
    OwnFirst,
}

/// An error type whose values can travel to the other ranks of a collective
/// call.
pub trait PeerError: Sized + std::fmt::Display + From<wm_comm::Error> {
    /// What other ranks report when world rank `rank` failed with the
    /// message `detail`.
    fn peer_failed(rank: usize, detail: String) -> Self;

    /// The error for data that world rank `rank` sent malformed.
    fn malformed(rank: usize, detail: String) -> Self;

    /// The peer and the detail, when this error blames a peer's malformed
    /// data (then every rank reports it as that peer's fault).
    fn as_malformed(&self) -> Option<(usize, &str)>;

    /// The rank and its message, when this error reports that another rank
    /// failed ([`peer_failed`](Self::peer_failed)); [`relayed_bytes`] keeps
    /// that rank named.
    fn as_peer_failed(&self) -> Option<(usize, &str)> {
        None
    }

    /// A typed encoding of this error for [`decode`](Self::decode), or
    /// `None` to send the message (other ranks then report
    /// [`peer_failed`](Self::peer_failed)).
    fn encode(&self) -> Option<Vec<u8>> {
        None
    }

    /// The error world rank `rank` sent with [`encode`](Self::encode);
    /// `None` when the bytes are not an encoding of this type.
    fn decode(rank: usize, bytes: &[u8]) -> Option<Self> {
        let _ = (rank, bytes);
        None
    }
}

/// Writes [`PeerError`]'s three required methods for an error enum that
/// holds the [`CommonError`](crate::CommonError)s in a variant `Common`, as
/// the crates of this workspace do: a failed peer is
/// [`CommonError::PeerFailed`](crate::CommonError::PeerFailed), malformed
/// data [`CommonError::Malformed`](crate::CommonError::Malformed). Use it
/// inside the `impl PeerError` block; `encode` and `decode` stay the type's
/// own.
#[macro_export]
macro_rules! peer_error_variants {
    () => {
        fn peer_failed(rank: usize, detail: String) -> Self {
            Self::Common($crate::CommonError::PeerFailed { rank, detail })
        }

        fn malformed(rank: usize, detail: String) -> Self {
            Self::Common($crate::CommonError::Malformed { rank, detail })
        }

        fn as_malformed(&self) -> Option<(usize, &str)> {
            match self {
                Self::Common($crate::CommonError::Malformed { rank, detail }) => Some((*rank, detail)),
                _ => None,
            }
        }

        fn as_peer_failed(&self) -> Option<(usize, &str)> {
            match self {
                Self::Common($crate::CommonError::PeerFailed { rank, detail }) => Some((*rank, detail)),
                _ => None,
            }
        }
    };
}

/// A typed error as [`PeerError::encode`] sends it: a kind byte, then each
/// word as 8 little-endian bytes.
pub fn encode_words(kind: u8, words: &[u64]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + 8 * words.len());
    m.push(kind);
    words.iter().for_each(|w| m.extend_from_slice(&w.to_le_bytes()));
    m
}

/// The `N` words of an [`encode_words`] encoding of `kind`; `None` for any
/// other kind, or any other length.
pub fn decode_words<const N: usize>(bytes: &[u8], kind: u8) -> Option<[u64; N]> {
    let (&k, rest) = bytes.split_first()?;
    if k != kind || rest.len() != 8 * N {
        return None;
    }
    let mut words = [0u64; N];
    for (w, b) in words.iter_mut().zip(rest.chunks_exact(8)) {
        *w = u64::from_le_bytes(b.try_into().ok()?);
    }
    Some(words)
}

const OK: u8 = 0;
const MESSAGE: u8 = 1;
const MALFORMED: u8 = 2;
const TYPED: u8 = 3;
/// Another rank failed (a relayed [`PeerError::peer_failed`]): its world
/// rank, then its message.
const PEER_FAILED: u8 = 4;

/// One rank's outcome and `extra` as bytes: the length of `extra` (8
/// bytes), `extra`, a status byte, the error's payload.
fn encode<T, E: PeerError>(mine: &Result<T, E>, extra: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(9 + extra.len());
    m.extend_from_slice(&(extra.len() as u64).to_le_bytes());
    m.extend_from_slice(extra);
    match mine {
        Ok(_) => m.push(OK),
        Err(e) => encode_error(&mut m, e, false),
    }
    m
}

/// Appends `e`'s status byte and payload to `m`; `relay`: a failure of
/// another rank keeps that rank named ([`PEER_FAILED`]) instead of going
/// as this rank's message.
fn encode_error<E: PeerError>(m: &mut Vec<u8>, e: &E, relay: bool) {
    let (status, rank, detail) = if let Some((rank, detail)) = e.as_malformed() {
        (MALFORMED, rank, detail.as_bytes().to_vec())
    } else if let Some((rank, detail)) = e.as_peer_failed().filter(|_| relay) {
        (PEER_FAILED, rank, detail.as_bytes().to_vec())
    } else if let Some(typed) = e.encode() {
        m.push(TYPED);
        m.extend_from_slice(&typed);
        return;
    } else {
        m.push(MESSAGE);
        m.extend_from_slice(e.to_string().as_bytes());
        return;
    };
    m.push(status);
    m.extend_from_slice(&(rank as u64).to_le_bytes());
    m.extend_from_slice(&detail);
}

/// What world rank `rank` sent: its `extra` and its error, if it failed.
/// A message that does not parse blames `rank`.
fn decode<E: PeerError>(rank: usize, m: &[u8]) -> (&[u8], Option<E>) {
    let garbled = |why: &str| E::malformed(rank, format!("its agreement message of {} bytes {why}", m.len()));
    let Some((len, rest)) = m.split_first_chunk::<8>() else { return (&[], Some(garbled("has no length"))) };
    let len = u64::from_le_bytes(*len);
    let Some(extra) = usize::try_from(len).ok().and_then(|n| rest.get(..n)) else {
        return (&[], Some(garbled(&format!("is shorter than the {len} bytes it announces"))));
    };
    let Some((&status, payload)) = rest[extra.len()..].split_first() else { return (extra, Some(garbled("has no status"))) };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let error = match status {
        OK if payload.is_empty() => None,
        OK => Some(garbled("has bytes after its success")),
        MESSAGE => Some(E::peer_failed(rank, text(payload))),
        MALFORMED | PEER_FAILED => match payload.split_first_chunk::<8>() {
            Some((culprit, detail)) => {
                let culprit = u64::from_le_bytes(*culprit);
                Some(usize::try_from(culprit).map_or_else(
                    |_| garbled("blames no rank"),
                    |c| if status == MALFORMED { E::malformed(c, text(detail)) } else { E::peer_failed(c, text(detail)) },
                ))
            }
            None => Some(garbled("blames no rank")),
        },
        TYPED => Some(E::decode(rank, payload).unwrap_or_else(|| garbled("holds an error this rank cannot read"))),
        _ => Some(garbled(&format!("has the unknown status {status}"))),
    };
    (extra, error)
}

/// Fails on every rank if any rank's `mine` failed, by `rule`; otherwise
/// returns this rank's value. Collective: one allgather.
///
/// # Errors
/// The agreed error; a communication failure.
pub fn agree<T, E: PeerError>(comm: &dyn Communicator, mine: Result<T, E>, rule: Rule) -> Result<T, E> {
    agree_sharing(comm, mine, rule, &[]).map(|(v, _)| v)
}

/// [`agree`], with `extra` (a value that must agree, say) travelling
/// alongside: on success every rank's `extra`, indexed by rank.
///
/// # Errors
/// As [`agree`].
pub fn agree_sharing<T, E: PeerError>(
    comm: &dyn Communicator,
    mine: Result<T, E>,
    rule: Rule,
    extra: &[u8],
) -> Result<(T, Vec<Vec<u8>>), E> {
    let all = comm.allgatherv(&encode(&mine, extra))?;
    decide_sharing(comm, mine, rule, extra, &all)
}

/// This rank's outcome as bytes, for a collective that carries every
/// rank's outcome itself instead of an allgather of its own (the first
/// exchange of a distributed gather, say); [`decide`] reads them.
pub fn outcome_bytes<T, E: PeerError>(mine: &Result<T, E>) -> Vec<u8> {
    encode(mine, &[])
}

/// An error this rank heard from another rank, as outcome bytes for
/// [`decide`] on a third rank that hears it from this one: a sender of
/// malformed data, or a rank that failed, stays named, not this rank that
/// only passes it on. Other errors go as [`outcome_bytes`] sends them.
pub fn relayed_bytes<E: PeerError>(heard: &E) -> Vec<u8> {
    let mut m = encode::<(), E>(&Ok(()), &[]);
    m.pop();
    encode_error(&mut m, heard, true);
    m
}

/// The error in outcome bytes ([`outcome_bytes`], [`relayed_bytes`]) that
/// world rank `rank` sent, or `None` where they say it succeeded. Bytes
/// that do not parse are an error blaming `rank`.
pub fn outcome_error<E: PeerError>(rank: usize, bytes: &[u8]) -> Option<E> {
    decode(rank, bytes).1
}

/// What [`agree`] decides, from every rank's [`outcome_bytes`] (`parts[r]`
/// from rank `r`; this rank's own is `mine` and not read) that a collective
/// of the caller's delivered: every rank holds the same parts, so every
/// rank decides the same.
///
/// # Errors
/// As [`agree`], without its communication.
pub fn decide<T, E: PeerError, B: AsRef<[u8]>>(comm: &dyn Communicator, mine: Result<T, E>, rule: Rule, parts: &[B]) -> Result<T, E> {
    decide_sharing(comm, mine, rule, &[], parts).map(|(v, _)| v)
}

fn decide_sharing<T, E: PeerError, B: AsRef<[u8]>>(
    comm: &dyn Communicator,
    mine: Result<T, E>,
    rule: Rule,
    extra: &[u8],
    all: &[B],
) -> Result<(T, Vec<Vec<u8>>), E> {
    let ranks = comm.world_ranks();
    let me = comm.rank();
    let mut extras = Vec::with_capacity(all.len());
    let mut first: Option<(usize, E)> = None;
    for (r, m) in all.iter().enumerate() {
        if r == me {
            // This rank's own outcome is `mine`; its message is not read back.
            extras.push(extra.to_vec());
            if mine.is_err() && first.is_none() {
                first = Some((r, E::peer_failed(ranks[r], String::new())));
            }
            continue;
        }
        let (x, error) = decode::<E>(ranks.get(r).copied().unwrap_or(r), m.as_ref());
        extras.push(x.to_vec());
        if let (Some(e), None) = (error, &first) {
            first = Some((r, e));
        }
    }
    match (mine, first) {
        (Ok(v), None) => Ok((v, extras)),
        (Err(own), Some((r, _))) if r == me || rule == Rule::OwnFirst => Err(own),
        (_, Some((_, theirs))) => Err(theirs),
        (Err(own), None) => Err(own),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CommonError, Error};

    #[test]
    fn typed_words_come_back_only_with_their_kind_and_length() {
        let m = encode_words(7, &[u64::MAX, 0, 42]);
        assert_eq!(m.len(), 25);
        assert_eq!(decode_words::<3>(&m, 7), Some([u64::MAX, 0, 42]));
        assert_eq!(decode_words::<3>(&m, 6), None, "another kind");
        assert_eq!(decode_words::<2>(&m, 7), None, "another length");
        assert_eq!(decode_words::<3>(&m[..24], 7), None, "cut short");
        assert_eq!(decode_words::<0>(&[], 7), None, "no kind");
        assert_eq!(decode_words::<0>(&encode_words(9, &[]), 9), Some([]));
    }

    #[test]
    fn outcomes_travel_and_garbage_blames_its_sender() {
        let ok: Result<(), Error> = Ok(());
        let sent = encode(&ok, b"lr 0.1");
        let (extra, e) = decode::<Error>(3, &sent);
        assert_eq!(extra, b"lr 0.1");
        assert!(e.is_none());

        let failed: Result<(), Error> = Err(Error::Common(CommonError::InvalidArgument("granularity 0".into())));
        let (_, e) = decode::<Error>(2, &encode(&failed, &[]));
        let e = e.expect("an error");
        assert!(matches!(&e, Error::Common(CommonError::PeerFailed { rank: 2, detail }) if detail.contains("granularity 0")), "{e}");

        let blamed: Result<(), Error> = Err(Error::Common(CommonError::Malformed { rank: 5, detail: "a short portion".into() }));
        let (_, e) = decode::<Error>(1, &encode(&blamed, &[]));
        assert!(matches!(e, Some(Error::Common(CommonError::Malformed { rank: 5, .. }))), "{e:?}");

        for garbage in
            [&b""[..], &[1, 0, 0], &[200, 0, 0, 0, 0, 0, 0, 0, 1], &[0; 8], &[0, 0, 0, 0, 0, 0, 0, 0, 9], &[0, 0, 0, 0, 0, 0, 0, 0, 2, 1]]
        {
            let (_, e) = decode::<Error>(4, garbage);
            assert!(matches!(&e, Some(Error::Common(CommonError::Malformed { rank: 4, .. }))), "{garbage:?}: {e:?}");
        }
    }

    #[test]
    fn a_relayed_error_names_the_rank_it_named_not_the_relay() {
        // Rank 1 relays what it heard; rank 3 reads it from rank 1.
        let failed = Error::Common(CommonError::PeerFailed { rank: 5, detail: "could not copy".into() });
        let (_, e) = decode::<Error>(1, &relayed_bytes(&failed));
        assert!(matches!(&e, Some(Error::Common(CommonError::PeerFailed { rank: 5, detail })) if detail == "could not copy"), "{e:?}");
        let blamed = Error::Common(CommonError::Malformed { rank: 6, detail: "a short part".into() });
        let (_, e) = decode::<Error>(1, &relayed_bytes(&blamed));
        assert!(matches!(&e, Some(Error::Common(CommonError::Malformed { rank: 6, detail })) if detail == "a short part"), "{e:?}");
        // An error of the relay's own kind is the relay's.
        let own = Error::Common(CommonError::InvalidArgument("granularity 0".into()));
        let (_, e) = decode::<Error>(1, &relayed_bytes(&own));
        assert!(
            matches!(&e, Some(Error::Common(CommonError::PeerFailed { rank: 1, detail })) if detail.contains("granularity 0")),
            "{e:?}"
        );
        // Outside a relay, a failure heard goes as this rank's message.
        let (_, e) = decode::<Error>(1, &encode::<(), Error>(&Err(failed), &[]));
        assert!(matches!(&e, Some(Error::Common(CommonError::PeerFailed { rank: 1, .. }))), "{e:?}");
        // A relay that names no rank is garbled.
        let (_, e) = decode::<Error>(2, &[0, 0, 0, 0, 0, 0, 0, 0, PEER_FAILED, 1]);
        assert!(matches!(&e, Some(Error::Common(CommonError::Malformed { rank: 2, .. }))), "{e:?}");
    }
}
