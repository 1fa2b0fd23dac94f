//! The parts the exchanges carry: a kind byte, then row ids, rows, or a
//! verdict (an error every rank must learn); how each is written, read and
//! checked, and the error that names a peer whose part is malformed.

use super::local::rows_bytes;
use crate::kernel::RowConv;
use crate::{Error, Result, RowLayout};
use wholemem::CommonError;
use wm_comm::{Communicator, ReceivedPart};

/// The error for a part that member `r` of `comm` sent malformed.
pub(super) fn malformed(comm: &dyn Communicator, r: usize, detail: String) -> Error {
    Error::Common(CommonError::Malformed { rank: comm.world_ranks()[r], detail: format!("{detail} (to rank {})", comm.world_rank()) })
}

/// Row ids as a peer sent them (8 bytes each, little-endian), each checked
/// to be below `bound`; what is wrong with them otherwise.
pub(super) fn decode_ids(bytes: &[u8], bound: usize) -> std::result::Result<Vec<usize>, String> {
    if bytes.len() % 8 != 0 {
        return Err(format!("{} bytes of row ids, not a whole number of 8-byte ids", bytes.len()));
    }
    let mut ids = Vec::with_capacity(bytes.len() / 8);
    for (i, c) in bytes.chunks_exact(8).enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let id = u64::from_le_bytes(b);
        match usize::try_from(id) {
            Ok(x) if x < bound => ids.push(x),
            _ => return Err(format!("row id {id} at position {i}, past the {bound} rows there")),
        }
    }
    Ok(ids)
}

/// The first byte of a part of the row-id exchange: row ids follow.
pub(super) const IDS: u8 = 0;

/// The first byte of a part of the row-id exchange: the sender failed its
/// checks, and its outcome follows ([`wholemem::agree::outcome_bytes`]).
pub(super) const FAILED: u8 = 1;

/// The first byte of a part of the rows exchange of a distributed gather:
/// the rows asked for follow.
pub(super) const ROWS: u8 = 2;

/// The first byte of a part of the rows exchange: the owner could not copy
/// the rows (its own error stays with it).
pub(super) const COPY_FAILED: u8 = 3;

/// What every rank of a collective gather or scatter must pass alike
/// besides its ids: the operation, the row layout and the conversion, as
/// text (at most 255 bytes) that leads each part of row ids. The exchanges
/// cannot see otherwise that two ranks disagree: an owner reads and
/// converts rows by its own call's layout, and rows of another type of the
/// same width, or other columns, would arrive as rows. Empty where this
/// rank's checks failed (its parts then carry that instead).
pub(super) fn call_shape(op: &str, layout: &RowLayout, checked: &Result<RowConv>) -> Vec<u8> {
    let Ok(conv) = checked else { return Vec::new() };
    let mut text = format!(
        "{op} of {} {} columns from column {}, converted from {} to {}",
        layout.cols(),
        layout.dtype(),
        layout.offset(),
        conv.from(),
        conv.to()
    )
    .into_bytes();
    text.truncate(usize::from(u8::MAX));
    text
}

/// The size of a part of an id exchange: the sender's failed checks
/// (`failure`) behind the kind byte, or the call's `shape` (its length in a
/// byte, then its text) and `ids` row ids.
pub(super) fn ids_part_size(failure: Option<&[u8]>, shape: &[u8], ids: usize) -> usize {
    1 + failure.map_or(1 + shape.len() + 8 * ids, <[u8]>::len)
}

/// Why a part of row ids was refused.
pub(super) enum Refused {
    /// It does not parse: what is wrong with it (the sender's fault).
    Malformed(String),
    /// The sender's call is of another shape ([`call_shape`]): the error
    /// naming both calls.
    OtherCall(Error),
}

/// The row ids of a part of an id exchange from member `from` of `comm`
/// (`body`: after its kind byte), each below `bound`, once its shape is
/// this rank's `shape`.
pub(super) fn read_ids(
    comm: &dyn Communicator,
    from: usize,
    body: &[u8],
    shape: &[u8],
    bound: usize,
) -> std::result::Result<Vec<usize>, Refused> {
    let Some((&len, rest)) = body.split_first() else {
        return Err(Refused::Malformed("a part of row ids without its call's shape".into()));
    };
    let Some((theirs, ids)) = rest.split_at_checked(usize::from(len)) else {
        return Err(Refused::Malformed(format!("a call's shape of {len} bytes in {} bytes", rest.len())));
    };
    if theirs != shape {
        let (them, me) = (comm.world_ranks()[from], comm.world_rank());
        return Err(Refused::OtherCall(Error::Common(CommonError::InvalidArgument(format!(
            "the ranks of a collective call passed different calls: rank {them} called a {}, rank {me} a {} (every rank must pass the same operation, row layout, and output or source type)",
            String::from_utf8_lossy(theirs),
            String::from_utf8_lossy(shape)
        )))));
    }
    decode_ids(ids, bound).map_err(Refused::Malformed)
}

/// Writes a part of an id exchange: the sender's failed checks (`failure`,
/// their outcome) behind [`FAILED`], else the call's `shape` and its `ids`
/// behind [`IDS`] ([`ids_part_size`]).
pub(super) fn fill_ids(buf: &mut [u8], failure: Option<&[u8]>, shape: &[u8], ids: impl Iterator<Item = u64>) {
    match failure {
        Some(f) => {
            buf[0] = FAILED;
            buf[1..].copy_from_slice(f);
        }
        None => {
            buf[0] = IDS;
            buf[1] = shape.len() as u8;
            buf[2..2 + shape.len()].copy_from_slice(shape);
            for (slot, id) in buf[2 + shape.len()..].chunks_exact_mut(8).zip(ids) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
        }
    }
}

/// Drops the requests of every member `r` of `comm` but `me` whose rows
/// would not fit a part, recording the first as this rank's finding.
pub(super) fn drop_oversized(comm: &dyn Communicator, asked: &mut [Vec<usize>], me: usize, db: usize, problem: &mut Option<Error>) {
    for (r, a) in asked.iter_mut().enumerate() {
        if r != me && rows_bytes(a.len(), db).and_then(|b| b.checked_add(1)).is_none() {
            problem.get_or_insert_with(|| malformed(comm, r, format!("a request for {} rows of {db} bytes", a.len())));
            a.clear();
        }
    }
}

/// The part sizes of a reply of rows to `members` ranks (`rows(r)` rows of
/// `db` bytes to member `r`, nothing to `me`), each behind its kind byte —
/// or, when this rank has a `verdict`, the verdict to every other member.
pub(super) fn reply_sizes(members: usize, me: usize, db: usize, verdict: Option<&[u8]>, rows: impl Fn(usize) -> usize) -> Vec<usize> {
    (0..members)
        .map(|r| match verdict {
            _ if r == me => 0,
            Some(v) => 1 + v.len(),
            None => 1 + rows(r) * db,
        })
        .collect()
}

/// Fills one part of a reply: the kind byte, then the verdict, or the rows
/// `copy` writes. A failed copy is marked in the part and returned.
pub(super) fn fill_reply(buf: &mut [u8], verdict: Option<&[u8]>, copy: impl FnOnce(&mut [u8]) -> Result<()>) -> Option<Error> {
    let (kind, body) = buf.split_first_mut()?;
    match verdict {
        Some(v) => {
            *kind = FAILED;
            body.copy_from_slice(v);
            None
        }
        None => match copy(body) {
            Ok(()) => {
                *kind = ROWS;
                None
            }
            Err(e) => {
                *kind = COPY_FAILED;
                Some(e)
            }
        },
    }
}

/// What one part of a reply holds.
pub(super) enum Reply<'a> {
    /// The rows asked for.
    Rows(&'a [u8]),
    /// The sender's verdict ([`wholemem::agree::outcome_bytes`]).
    Verdict(&'a [u8]),
    /// A failed copy, or a part no reply can be: the error naming the sender.
    Failed(Error),
}

/// Reads the part member `from` of `comm` replied with, `rows` rows of
/// `db` bytes asked of it.
pub(super) fn read_reply<'a>(comm: &dyn Communicator, from: usize, bytes: &'a [u8], rows: usize, db: usize) -> Reply<'a> {
    match bytes.split_first() {
        Some((&ROWS, body)) if Some(body.len()) == rows_bytes(rows, db) => Reply::Rows(body),
        Some((&FAILED, v)) => Reply::Verdict(v),
        Some((&COPY_FAILED, _)) => Reply::Failed(Error::Common(CommonError::PeerFailed {
            rank: comm.world_ranks()[from],
            detail: "it could not copy the rows asked of it".into(),
        })),
        _ => Reply::Failed(malformed(comm, from, format!("{} bytes for {rows} rows of {db} bytes and a kind byte", bytes.len()))),
    }
}

/// What a part of a rows reply that may have landed
/// ([`ExchangePlan::land_rows`]) holds.
pub(super) enum Arrived {
    /// The rows asked for, in their places.
    Rows,
    /// A verdict of the very length of the rows: its bytes are in their
    /// places (`wm_comm::plan::read_back`).
    VerdictInRows,
    /// A verdict.
    Verdict(Vec<u8>),
    /// A failed copy, or a part no reply can be: the error naming the sender.
    Failed(Error),
}

/// Reads the part member `from` of `comm` replied with, `rows` rows of
/// `db` bytes asked of it, landed behind its kind byte or whole.
pub(super) fn read_arrival(comm: &dyn Communicator, from: usize, part: &ReceivedPart<'_>, rows: usize, db: usize) -> Arrived {
    match (part.landed(), part.bytes()) {
        (true, [ROWS]) => Arrived::Rows,
        (true, [FAILED]) => Arrived::VerdictInRows,
        (true, head) => Arrived::Failed(match read_reply(comm, from, head, 0, db) {
            Reply::Failed(e) => e,
            _ => malformed(comm, from, format!("a reply of unknown kind {head:?}")),
        }),
        // Not the length of the rows asked for: a verdict, or a part no
        // reply can be (rows of that length would have landed).
        (false, bytes) => match read_reply(comm, from, bytes, rows, db) {
            Reply::Verdict(v) => Arrived::Verdict(v.to_vec()),
            Reply::Failed(e) => Arrived::Failed(e),
            Reply::Rows(_) => Arrived::Failed(malformed(comm, from, "rows that did not land".into())),
        },
    }
}

/// The outcome bytes of `problem` (which stays where it is), to send as a
/// verdict.
pub(super) fn finding_bytes(problem: &mut Option<Error>) -> Option<Vec<u8>> {
    let outcome: Result<()> = Err(problem.take()?);
    let bytes = wholemem::agree::outcome_bytes(&outcome);
    *problem = outcome.err();
    Some(bytes)
}

/// The error a verdict from member `from` of `comm` holds.
pub(super) fn verdict_error(comm: &dyn Communicator, from: usize, verdict: &[u8]) -> Error {
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let mut parts: Vec<&[u8]> = vec![&ok; comm.size()];
    parts[from] = verdict;
    match wholemem::agree::decide(comm, Ok(()), wholemem::agree::Rule::Lowest, &parts) {
        Err(e) => e,
        // A verdict that says all is well: the sender broke the protocol.
        Ok(()) => malformed(comm, from, "a verdict of success where rows belong".into()),
    }
}
