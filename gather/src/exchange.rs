//! The collective paths: distributed and hierarchy memory, where a rank maps
//! only its own rows and other rows travel through the communicator.
//!
//! What a peer sends is input: every part is checked before it is used — a
//! length that is not what the exchange implies, a row id the receiver does
//! not own (or, in the hierarchy, was not routed to it) — and a bad part is
//! dropped and recorded as [`wholemem::CommonError::Malformed`] naming its sender. The
//! exchange still runs to its end on every rank, so the ranks stay in step
//! and the next call works. What an owner finds wrong with the requests it
//! got travels with the rows it sends back, so every rank fails with it; a
//! part found malformed by the last rank to receive it fails that rank (it
//! alone would otherwise return wrong rows). Where a copy can fail on one
//! rank alone (device tables), one agreement at the end makes the first
//! error every rank's.

use std::sync::Arc;

use wholemem::CommonError;
use wholemem::WholeMemory;
use wholemem::agree::{Rule, agree};
use wm_comm::{Arrival, Communicator, Landing};

use std::time::Duration;

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::profile::{Clock, timed};
use crate::{Error, Ids, Result, RowLayout, RowSpan, threads};

/// This rank's own rows (host memory).
struct LocalRows {
    base: SendPtr,
    span: RowSpan,
}

impl LocalRows {
    fn new(mem: &WholeMemory, layout: &RowLayout) -> Result<Self> {
        let me = mem.comm().rank();
        let base = mem.rank_ptr(me).ok_or_else(|| {
            Error::Common(CommonError::InvalidArgument(format!("rank {} does not map its own rows of this table", mem.comm().world_rank())))
        })?;
        Ok(Self { base: SendPtr(base), span: RowSpan::new(mem, layout) })
    }
}

impl RowAddr for LocalRows {
    #[inline]
    fn addr(&self, local_row: usize) -> *mut u8 {
        self.base.0.wrapping_add(self.span.at(local_row))
    }
}

/// Rows of a caller's buffer.
struct BufferRows(SendPtr, usize);

impl RowAddr for BufferRows {
    #[inline]
    fn addr(&self, i: usize) -> *mut u8 {
        self.0.0.wrapping_add(i * self.1)
    }
}

/// The error for a part that member `r` of `comm` sent malformed.
fn malformed(comm: &dyn Communicator, r: usize, detail: String) -> Error {
    Error::Common(CommonError::Malformed { rank: comm.world_ranks()[r], detail: format!("{detail} (to rank {})", comm.world_rank()) })
}

/// Row ids as a peer sent them (8 bytes each, little-endian), each checked
/// to be below `bound`; what is wrong with them otherwise.
fn decode_ids(bytes: &[u8], bound: usize) -> std::result::Result<Vec<usize>, String> {
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

/// Bytes of `n` rows of `row_bytes`, or `None` past `usize::MAX`.
fn rows_bytes(n: usize, row_bytes: usize) -> Option<usize> {
    n.checked_mul(row_bytes)
}

/// Positions of `keys` grouped by key (a counting sort): `order[starts[k]..
/// starts[k + 1]]` are the positions with key `k`, in input order.
fn bucket(keys: &[usize], buckets: usize) -> (Vec<usize>, Vec<usize>) {
    let mut starts = vec![0usize; buckets + 1];
    for &k in keys {
        starts[k + 1] += 1;
    }
    for k in 0..buckets {
        starts[k + 1] += starts[k];
    }
    let mut fill = starts.clone();
    let mut order = vec![0usize; keys.len()];
    for (i, &k) in keys.iter().enumerate() {
        order[fill[k]] = i;
        fill[k] += 1;
    }
    (order, starts)
}

thread_local! {
    /// Reply buffers of earlier calls, reused so that large exchanges do not
    /// fault in fresh pages every time.
    static SCRATCH: std::cell::RefCell<wm_comm::BufferPool<u8>> = const { std::cell::RefCell::new(wm_comm::BufferPool::new(64 << 10, 16)) };
}

/// A buffer of `len` bytes, reused when one is at hand.
fn scratch(len: usize) -> Vec<u8> {
    SCRATCH.with(|s| s.borrow_mut().get(len))
}

/// Keeps large buffers for [`scratch`].
fn give_back(bufs: Vec<Vec<u8>>) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        for b in bufs {
            s.keep(b);
        }
    });
}

/// Copies this rank's own rows `rows` (converted) into `out`: row `k` to
/// output row `positions[k]`, or to row `k` without positions. Through the
/// CPU for host memory, by a kernel for device memory.
fn read_local(
    mem: &WholeMemory,
    layout: &RowLayout,
    conv: RowConv,
    rows: &[usize],
    positions: Option<&[usize]>,
    out: &mut [u8],
) -> Result<()> {
    let n = mem.local_rows().len();
    if let Some(bad) = rows.iter().find(|&&r| r >= n) {
        // Every caller checked the rows it got from peers; this stays a
        // check because the copy below trusts it.
        return Err(Error::Common(CommonError::InvalidArgument(format!("row {bad} of rank {}, which owns {n}", mem.comm().world_rank()))));
    }
    #[cfg(feature = "cuda")]
    if mem.location() == wholemem::Location::Device {
        let Some(positions) = positions else { return crate::device::gather_local(mem, layout, conv, rows, out) };
        let mut dense = scratch(rows.len() * conv.dst_bytes());
        crate::device::gather_local(mem, layout, conv, rows, &mut dense)?;
        place(out, &dense, positions, conv.dst_bytes());
        give_back(vec![dense]);
        return Ok(());
    }
    debug_assert!(out.len() >= positions.map_or(rows.len(), |p| p.iter().max().map_or(0, |m| m + 1)) * conv.dst_bytes());
    let src = LocalRows::new(mem, layout)?;
    // SAFETY: every row is below this rank's row count (checked above), and
    // the layout fits in a row (checked at the call's entry); positions are
    // distinct and `out` is sized for them (callers' invariant, checked in
    // debug builds).
    unsafe { kernel::gather_rows(&src, rows, positions, conv, out, threads(mem)) };
    Ok(())
}

/// Bytes of own rows one step of an exchange's work copies: the socket
/// backend goes back to its sockets between steps, so a rank's own copy
/// does not keep its peers' bytes waiting.
const STEP_BYTES: usize = 256 << 10;

/// Rows of `db` bytes one step copies: all of them for device tables (one
/// kernel launch), [`STEP_BYTES`] worth on the host.
fn step_rows(mem: &WholeMemory, db: usize, total: usize) -> usize {
    if mem.location() == wholemem::Location::Device { total.max(1) } else { (STEP_BYTES / db.max(1)).max(1) }
}

/// [`crate::gather_owned`] for distributed and hierarchy tables: this
/// rank's rows `rows` (local numbers, checked), straight from its memory.
pub(crate) fn gather_owned(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], out: &mut [u8]) -> Result<()> {
    read_local(mem, layout, conv, rows, None, out)
}

/// [`crate::scatter_owned`] for distributed and hierarchy tables: `src`'s
/// rows (converted) into this rank's rows `rows` (local numbers, checked),
/// the last occurrence of a row winning.
pub(crate) fn scatter_owned(mem: &mut WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], src: &[u8]) -> Result<()> {
    #[cfg(feature = "cuda")]
    if mem.location() == wholemem::Location::Device {
        return crate::device::scatter_local(mem, layout, conv, rows, src);
    }
    let n = mem.local_rows().len();
    if let Some(bad) = rows.iter().find(|&&r| r >= n) {
        return Err(Error::Common(CommonError::InvalidArgument(format!("row {bad} of rank {}, which owns {n}", mem.comm().world_rank()))));
    }
    debug_assert_eq!(src.len(), rows.len() * conv.src_bytes());
    let table = LocalRows::new(mem, layout)?;
    // SAFETY: every row is below this rank's row count (checked above) and
    // the layout fits in a row (checked at the call's entry); `src` holds
    // `rows.len()` rows of the source type (checked at the call's entry).
    // Distributed and hierarchy host rows are this process's private
    // memory, and `&mut WholeMemory` keeps its other users away.
    unsafe { kernel::scatter_rows(&table, rows, conv, src, threads(mem), None) }?;
    Ok(())
}

/// The distinct ids of every rank's list in the order they first appear —
/// list `first` read first, then the others in order — and for each list
/// the index into them of each of its ids. With `first` this rank's own
/// requests in the order of its output, rows fetched in this order land in
/// ascending places of the output (writes that stream rather than scatter).
///
/// By a hash table (one pass); where the ids defeat the hash — more probes
/// than a few per id, as ids chosen against it would cause — by sorting.
fn dedup(lists: &[Vec<u64>], first: usize) -> (Vec<u64>, Vec<Vec<usize>>) {
    let order: Vec<usize> = std::iter::once(first).chain((0..lists.len()).filter(|&l| l != first)).filter(|&l| l < lists.len()).collect();
    dedup_hashed(lists, &order, PROBES_PER_ID).unwrap_or_else(|| in_first_appearance(dedup_sorted(lists), &order))
}

/// `unique` and `answer` as [`dedup_sorted`] gives them, renumbered in the
/// order of first appearance in `answer`'s lists taken in `order`.
fn in_first_appearance((unique, mut answer): (Vec<u64>, Vec<Vec<usize>>), order: &[usize]) -> (Vec<u64>, Vec<Vec<usize>>) {
    let mut number = vec![usize::MAX; unique.len()];
    let mut renumbered = Vec::with_capacity(unique.len());
    for &l in order {
        for u in &mut answer[l] {
            if number[*u] == usize::MAX {
                number[*u] = renumbered.len();
                renumbered.push(unique[*u]);
            }
            *u = number[*u];
        }
    }
    (renumbered, answer)
}

/// The hash table's probes per id, on average over a call, past which
/// [`dedup`] gives up on it.
const PROBES_PER_ID: usize = 4;

/// [`dedup`] by open addressing, lists read in `order`; `None` when the
/// probes past the first exceed `probes_per_id` per id (and 64 more), or an
/// id or the count of ids does not fit in 32 bits.
fn dedup_hashed(lists: &[Vec<u64>], order: &[usize], probes_per_id: usize) -> Option<(Vec<u64>, Vec<Vec<usize>>)> {
    let total: usize = lists.iter().map(Vec::len).sum();
    if u32::try_from(total).is_err() {
        return None;
    }
    // At most half full. A slot holds an id in its high half and the id's
    // number in its low half, or is empty; one cache line per probe.
    const EMPTY: u64 = u64::MAX;
    let bits = (2 * total).max(16).next_power_of_two().trailing_zeros();
    let (mask, shift) = ((1usize << bits) - 1, u64::BITS - bits);
    let mut slots: Vec<u64> = crate::sort::KEYS.with(|k| k.borrow_mut().get(1 << bits));
    slots.fill(EMPTY);
    let seed = hash_seed();
    let mut budget = probes_per_id.saturating_mul(total).saturating_add(64);
    let mut unique = Vec::with_capacity(total);
    let mut answer: Vec<Vec<usize>> = lists.iter().map(|l| Vec::with_capacity(l.len())).collect();
    let mut fits = true;
    'lists: for &l in order {
        for &id in &lists[l] {
            // Ids of 32 bits (the empty mark's high half included) are left
            // to the sort.
            if id >= u64::from(u32::MAX) {
                fits = false;
                break 'lists;
            }
            // Fibonacci hashing of the id mixed with this process's seed.
            let mut slot = ((id ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize;
            let u = loop {
                let s = slots[slot];
                if s == EMPTY {
                    let u = unique.len();
                    unique.push(id);
                    slots[slot] = (id << 32) | u as u64;
                    break u;
                }
                if s >> 32 == id {
                    break (s & u64::from(u32::MAX)) as usize;
                }
                match budget.checked_sub(1) {
                    Some(b) => budget = b,
                    None => {
                        fits = false;
                        break 'lists;
                    }
                }
                slot = (slot + 1) & mask;
            };
            answer[l].push(u);
        }
    }
    crate::sort::KEYS.with(|k| k.borrow_mut().keep(slots));
    fits.then_some((unique, answer))
}

/// A seed for [`dedup_hashed`], fixed for the process and unknown outside
/// it (so nobody can pick ids that collide; those who try anyway only
/// cost the fallback).
fn hash_seed() -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
}

/// [`dedup`]'s fallback: the distinct ids ascending, by sorting.
fn dedup_sorted(lists: &[Vec<u64>]) -> (Vec<u64>, Vec<Vec<usize>>) {
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut flat = vec![0usize; total];
    let mut unique = Vec::with_capacity(total);
    // Requests numbered across the lists, in order.
    crate::sort::for_each_by_id(lists.iter().flatten().copied(), |id, g| {
        if unique.last() != Some(&id) {
            unique.push(id);
        }
        flat[g] = unique.len() - 1;
    });
    let mut rest = &flat[..];
    let answer = lists
        .iter()
        .map(|l| {
            let (mine, more) = rest.split_at(l.len());
            rest = more;
            mine.to_vec()
        })
        .collect();
    (unique, answer)
}

/// Copies row `k` of `rows` into output row `positions[k]`.
fn place(out: &mut [u8], rows: &[u8], positions: &[usize], row_bytes: usize) {
    for (k, &p) in positions.iter().enumerate() {
        out[p * row_bytes..][..row_bytes].copy_from_slice(&rows[k * row_bytes..][..row_bytes]);
    }
}

/// The first byte of a part of the row-id exchange: row ids follow.
const IDS: u8 = 0;
/// The first byte of a part of the row-id exchange: the sender failed its
/// checks, and its outcome follows ([`wholemem::agree::outcome_bytes`]).
const FAILED: u8 = 1;
/// The first byte of a part of the rows exchange of a distributed gather:
/// the rows asked for follow.
const ROWS: u8 = 2;
/// The first byte of a part of the rows exchange: the owner could not copy
/// the rows (its own error stays with it).
const COPY_FAILED: u8 = 3;

/// Drops the requests of every member `r` of `comm` but `me` whose rows
/// would not fit a part, recording the first as this rank's finding.
fn drop_oversized(comm: &dyn Communicator, asked: &mut [Vec<usize>], me: usize, db: usize, problem: &mut Option<Error>) {
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
fn reply_sizes(members: usize, me: usize, db: usize, verdict: Option<&[u8]>, rows: impl Fn(usize) -> usize) -> Vec<usize> {
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
fn fill_reply(buf: &mut [u8], verdict: Option<&[u8]>, copy: impl FnOnce(&mut [u8]) -> Result<()>) -> Option<Error> {
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
enum Reply<'a> {
    /// The rows asked for.
    Rows(&'a [u8]),
    /// The sender's verdict ([`wholemem::agree::outcome_bytes`]).
    Verdict(&'a [u8]),
    /// A failed copy, or a part no reply can be: the error naming the sender.
    Failed(Error),
}

/// Reads the part member `from` of `comm` replied with, `rows` rows of
/// `db` bytes asked of it.
fn read_reply<'a>(comm: &dyn Communicator, from: usize, bytes: &'a [u8], rows: usize, db: usize) -> Reply<'a> {
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
/// ([`Communicator::alltoallv_in_place_landing`]) holds.
enum Arrived {
    /// The rows asked for, in their places.
    Rows,
    /// A verdict of the very length of the rows: its bytes are in their
    /// places (`Landing::read_back`).
    VerdictInRows,
    /// A verdict.
    Verdict(Vec<u8>),
    /// A failed copy, or a part no reply can be: the error naming the sender.
    Failed(Error),
}

/// Reads the part member `from` of `comm` replied with, `rows` rows of
/// `db` bytes asked of it, landed behind its kind byte or whole.
fn read_arrival(comm: &dyn Communicator, from: usize, arrival: Arrival<'_>, rows: usize, db: usize) -> Arrived {
    match arrival {
        Arrival::Landed([ROWS]) => Arrived::Rows,
        Arrival::Landed([FAILED]) => Arrived::VerdictInRows,
        Arrival::Landed(head) => Arrived::Failed(match read_reply(comm, from, head, 0, db) {
            Reply::Failed(e) => e,
            _ => malformed(comm, from, format!("a reply of unknown kind {head:?}")),
        }),
        // Not the length of the rows asked for: a verdict, or a part no
        // reply can be (rows of that length would have landed).
        Arrival::Bytes(bytes) => match read_reply(comm, from, bytes, rows, db) {
            Reply::Verdict(v) => Arrived::Verdict(v.to_vec()),
            Reply::Failed(e) => Arrived::Failed(e),
            Reply::Rows(_) => Arrived::Failed(malformed(comm, from, "rows that did not land".into())),
        },
    }
}

/// The first exchange of a distributed gather or scatter, which also
/// carries every rank's outcome of its checks (`checked`), so no separate
/// agreement is needed before it.
///
/// Tells each owner which of its rows this rank names: to rank `r` the
/// local row numbers of `rows[i]` for every `i` in `positions(r)`, written
/// straight into the exchange. Returns the rows every rank named here —
/// each checked to be below `count`, this rank's row count — and a
/// malformed part's error (the part itself is dropped), reported at the end
/// of the call so every rank stays in step; and the checks'
/// outcome decided as [`agree`] does: when any rank failed, every rank
/// returns the lowest failing rank's error right after this exchange.
#[allow(clippy::type_complexity)]
fn exchange_row_ids<'a>(
    comm: &dyn Communicator,
    p: &wholemem::Partition,
    rows: &[usize],
    positions: impl Fn(usize) -> &'a [usize],
    count: usize,
    checked: Result<RowConv>,
) -> Result<(Vec<Vec<usize>>, Option<Error>, Result<RowConv>)> {
    let n = comm.size();
    let failure = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
    let sizes: Vec<usize> = (0..n).map(|r| 1 + failure.as_ref().map_or(positions(r).len() * 8, Vec::len)).collect();
    let mut named: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut outcomes: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut problem = None;
    comm.alltoallv_in_place(
        &sizes,
        &mut |r, buf| match &failure {
            Some(f) => {
                buf[0] = FAILED;
                buf[1..].copy_from_slice(f);
            }
            None => {
                buf[0] = IDS;
                for (slot, &i) in buf[1..].chunks_exact_mut(8).zip(positions(r)) {
                    slot.copy_from_slice(&((rows[i] - p.offset(r)) as u64).to_le_bytes());
                }
            }
        },
        &mut || {},
        &mut |r, bytes| {
            let detail = match bytes.split_first() {
                Some((&IDS, ids)) => match decode_ids(ids, count) {
                    Ok(ids) => {
                        named[r] = ids;
                        return;
                    }
                    Err(detail) => detail,
                },
                Some((&FAILED, outcome)) => {
                    outcomes[r] = Some(outcome.to_vec());
                    return;
                }
                Some((kind, _)) => format!("a part of the row-id exchange of unknown kind {kind}"),
                None => "an empty part of the row-id exchange".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(comm, r, detail));
        },
    )?;
    // Every rank got every rank's part: the same decision everywhere.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let parts: Vec<&[u8]> = outcomes.iter().map(|o| o.as_deref().unwrap_or(&ok)).collect();
    let decided = wholemem::agree::decide(comm, checked, wholemem::agree::Rule::Lowest, &parts);
    Ok((named, problem, decided))
}

/// The ids as row indices when this rank's checks passed (so every id is in
/// range), none otherwise.
fn checked_rows<T>(checked: &Result<T>, ids: Ids<'_>) -> Vec<usize> {
    if checked.is_ok() { ids.to_rows() } else { Vec::new() }
}

/// `also` runs once while the rows travel, after this rank's own rows are
/// in place (work of the caller's that needs nothing from the exchange, and
/// not `out`), unless the call fails before the rows exchange.
pub(crate) fn gather_distributed(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    mut clock: Clock,
    also: &mut dyn FnMut(),
) -> Result<()> {
    let comm = mem.comm();
    let (n, me) = (comm.size(), comm.rank());
    let p = mem.partition();
    let rows = checked_rows(&checked, ids);
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let (order, starts) = bucket(&owners, n);
    let wanted = |r: usize| &order[starts[r]..starts[r + 1]];

    // 1. Each owner learns which of its rows each rank wants (own rows are
    //    not sent), and every rank whether every rank passed its checks.
    let count = mem.local_rows().len();
    let (mut asked, mut problem, conv) =
        exchange_row_ids(comm.as_ref(), p, &rows, |r| if r == me { &[] } else { wanted(r) }, count, checked)?;
    clock.lap("ids");
    let conv = conv?;
    let db = conv.dst_bytes();

    // 2. Owners copy the rows asked of them straight into the exchange,
    //    each part behind a kind byte: rows follow, or the owner found a
    //    request malformed (its error follows, so every rank learns it with
    //    the rows), or the copy failed. Each part lands in its places in
    //    `out` (straight from the socket, from other nodes), and this
    //    rank's own rows are copied straight into place while the others
    //    travel.
    drop_oversized(comm.as_ref(), &mut asked, me, db, &mut problem);
    let verdict = finding_bytes(&mut problem);
    let sizes = reply_sizes(n, me, db, verdict.as_deref(), |r| asked[r].len());
    let mut failed: Option<Error> = None;
    let mut misfit: Option<Error> = None;
    let mut verdicts: Vec<Option<Vec<u8>>> = vec![None; n];
    let (on, mut copying, mut own, mut placing) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut own_failed: Option<Error> = None;
    let local: Vec<usize> = wanted(me).iter().map(|&i| rows[i] - p.offset(me)).collect();
    let (mut next, chunk) = (0, step_rows(mem, db, local.len()));
    let mut also = Some(also);
    // A reply of rows lands in the rows of `out` asked of its owner; a
    // verdict of that very length lands there too, and is read back.
    let landings: Vec<Landing<'_>> =
        (0..n).map(|r| if r == me { Landing::default() } else { Landing { head: 1, row_bytes: db, rows: wanted(r) } }).collect();
    let mut landed_verdict = vec![false; n];
    comm.alltoallv_in_place_landing(
        &sizes,
        &mut |r, buf| {
            if r == me {
                return;
            }
            let copy = |body: &mut [u8]| timed(on, &mut copying, || read_local(mem, layout, conv, &asked[r], None, body));
            if let Some(e) = fill_reply(buf, verdict.as_deref(), copy) {
                failed.get_or_insert(e);
            }
        },
        out,
        &landings,
        // This rank's own rows go straight to their places while the
        // others' travel, a piece per step; then the caller's work.
        &mut |out| {
            if next < local.len() {
                let end = (next + chunk).min(local.len());
                timed(on, &mut own, || {
                    if let Err(e) = read_local(mem, layout, conv, &local[next..end], Some(&wanted(me)[next..end]), out) {
                        own_failed.get_or_insert(e);
                    }
                });
                next = if own_failed.is_some() { local.len() } else { end };
                return true;
            }
            if let Some(a) = also.take() {
                a();
            }
            false
        },
        // Parts that arrived through the socket landed as they came in;
        // the others are copied to their places before this is called.
        &mut |r, arrival| {
            if r == me {
                // Its part is empty: own rows are not sent.
                return;
            }
            timed(on, &mut placing, || match read_arrival(comm.as_ref(), r, arrival, wanted(r).len(), db) {
                Arrived::Rows => {}
                Arrived::VerdictInRows => landed_verdict[r] = true,
                Arrived::Verdict(v) => verdicts[r] = Some(v),
                Arrived::Failed(e) => {
                    misfit.get_or_insert(e);
                }
            })
        },
    )?;
    for (r, _) in landed_verdict.iter().enumerate().filter(|(_, l)| **l) {
        verdicts[r] = Some(landings[r].read_back(out));
    }
    clock.lap_split("rows", &[("owner copy", copying), ("own rows", own), ("place", placing)]);
    // Every rank holds every owner's verdict on the requests it got: the
    // lowest owner's error is every rank's.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let parts: Vec<&[u8]> = verdicts.iter().map(|v| v.as_deref().unwrap_or(&ok)).collect();
    let decided = wholemem::agree::decide(comm.as_ref(), problem.map_or(Ok(()), Err), wholemem::agree::Rule::Lowest, &parts);
    // What only this rank can know — a part it received malformed, a copy
    // of its own that failed — is its own error: on the host a copy cannot
    // fail once the ids are checked, and a malformed part fails the rank
    // that would otherwise return wrong rows. A device copy can fail on one
    // rank, so device tables agree on the outcome once more.
    let local = decided.and(failed.or(own_failed).or(misfit).map_or(Ok(()), Err));
    let done = if mem.location() == wholemem::Location::Host { local } else { agree(comm.as_ref(), local, Rule::Lowest) };
    clock.lap("agree");
    done
}

/// A communicator of a table.
type Comm = Arc<dyn Communicator>;

/// The local and cross communicators of a hierarchy table.
fn hierarchy_comms(mem: &WholeMemory) -> Result<(&Comm, &Comm)> {
    match (mem.local_comm(), mem.cross_comm()) {
        (Some(l), Some(c)) => Ok((l, c)),
        _ => {
            Err(Error::Common(CommonError::InvalidArgument(format!("a {} table has no local and cross communicators", mem.memory_type()))))
        }
    }
}

/// `also` as in [`gather_distributed`], while the rows cross nodes.
pub(crate) fn gather_hierarchy(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    mut clock: Clock,
    also: &mut dyn FnMut(),
) -> Result<()> {
    let comm = mem.comm();
    // Every rank of a hierarchy table has both communicators (from
    // allocation), so this fails everywhere or nowhere.
    let (local, cross) = hierarchy_comms(mem)?;
    if cross.size() == 1 {
        // One node: nothing crosses nodes, so there is nothing to de-duplicate.
        return gather_distributed(mem, layout, checked, ids, out, clock, also);
    }
    let p = mem.partition();
    let placement = wm_topology::NodeLayout::of(comm.nodes());
    let (node_of, local_rank_of) = (&placement.node, &placement.local);
    let rows = checked_rows(&checked, ids);
    let lme = local.rank();
    let mut problem: Option<Error> = None;

    // 1. Within the node: each id goes to the local rank with its owner's
    //    local rank (that rank's cross communicator reaches the owner). The
    //    parts also carry each rank's check outcome: after this exchange a
    //    rank knows its node's, after the next one every node's.
    let via: Vec<usize> = rows.iter().map(|&r| local_rank_of[p.owner(r)]).collect();
    let (order, starts) = bucket(&via, local.size());
    let wanted = |q: usize| &order[starts[q]..starts[q + 1]];
    let mine = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
    // This rank's own part is only its kind byte: its ids stay here.
    let sizes: Vec<usize> =
        (0..local.size()).map(|q| 1 + mine.as_ref().map_or(if q == lme { 0 } else { wanted(q).len() * 8 }, Vec::len)).collect();
    let mut from_local: Vec<Vec<u64>> = vec![Vec::new(); local.size()];
    // The node's failures: (world rank, outcome), this rank's own included.
    let mut failures: Vec<(usize, Vec<u8>)> = mine.iter().map(|m| (comm.world_rank(), m.clone())).collect();
    local.alltoallv_in_place(
        &sizes,
        &mut |q, buf| match &mine {
            Some(m) => {
                buf[0] = FAILED;
                buf[1..].copy_from_slice(m);
            }
            None => {
                buf[0] = IDS;
                if q != lme {
                    for (slot, &i) in buf[1..].chunks_exact_mut(8).zip(wanted(q)) {
                        slot.copy_from_slice(&(rows[i] as u64).to_le_bytes());
                    }
                }
            }
        },
        &mut || {},
        &mut |q, bytes| {
            if q == lme {
                from_local[q] = wanted(q).iter().map(|&i| rows[i] as u64).collect();
                return;
            }
            let detail = match bytes.split_first() {
                // Rows of the table routed here (the owner's local rank is
                // this rank's); a bad part is dropped.
                Some((&IDS, ids)) => match decode_ids(ids, p.rows()) {
                    Ok(ids) => match ids.iter().position(|&id| local_rank_of[p.owner(id)] != lme) {
                        Some(i) => format!("row id {} at position {i}, which another local rank serves", ids[i]),
                        None => {
                            from_local[q] = ids.into_iter().map(|id| id as u64).collect();
                            return;
                        }
                    },
                    Err(detail) => detail,
                },
                Some((&FAILED, outcome)) => {
                    failures.push((local.world_ranks()[q], outcome.to_vec()));
                    return;
                }
                Some((kind, _)) => format!("a part of the node's id exchange of unknown kind {kind}"),
                None => "an empty part of the node's id exchange".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(local.as_ref(), q, format!("in the node's exchange, {detail}")));
        },
    )?;
    clock.lap("node ids");
    // The node's verdict: its lowest failing rank, if any.
    failures.sort_by_key(|(r, _)| *r);
    let node_verdict = failures.first().cloned();

    // 2. De-duplicate what the node asked of this rank, remembering for each
    //    request which unique id answers it (so the fan-out needs no search).
    let (unique, answer) = dedup(&from_local, lme);
    clock.lap("dedup");

    // 3. Across nodes, unique ids only (the owner is this cross
    //    communicator's member on the owner's node), with the node's verdict.
    //    Each node's ids keep the de-duplication's order (this rank's
    //    requests first), so that its rows come back — and this rank's own
    //    are copied — in the order of `out`.
    let owner_node: Vec<usize> = unique.iter().map(|&id| node_of[p.owner(id as usize)]).collect();
    let (uorder, ustarts) = bucket(&owner_node, cross.size());
    let uwanted = |c: usize| &uorder[ustarts[c]..ustarts[c + 1]];
    let cme = cross.rank();
    let verdict_bytes = node_verdict.as_ref().map(|(r, o)| [&(*r as u64).to_le_bytes()[..], o].concat());
    let sizes: Vec<usize> = (0..cross.size())
        .map(|c| {
            1 + match &verdict_bytes {
                Some(v) => v.len(),
                // This rank's own unique ids stay out of the exchange.
                None if c == cme => 0,
                None => uwanted(c).len() * 8,
            }
        })
        .collect();
    let count = mem.local_rows().len();
    let mut asked: Vec<Vec<usize>> = vec![Vec::new(); cross.size()];
    let mut verdicts: Vec<(usize, Vec<u8>)> = node_verdict.into_iter().collect();
    cross.alltoallv_in_place(
        &sizes,
        &mut |c, buf| match &verdict_bytes {
            Some(v) => {
                buf[0] = FAILED;
                buf[1..].copy_from_slice(v);
            }
            None => {
                buf[0] = IDS;
                for (slot, &k) in buf[1..].chunks_exact_mut(8).zip(if c == cme { &[][..] } else { uwanted(c) }) {
                    let id = unique[k] as usize;
                    slot.copy_from_slice(&((id - p.offset(p.owner(id))) as u64).to_le_bytes());
                }
            }
        },
        &mut || {},
        &mut |c, bytes| {
            if c == cme {
                return;
            }
            let detail = match bytes.split_first() {
                Some((&IDS, ids)) => match decode_ids(ids, count) {
                    Ok(ids) => {
                        asked[c] = ids;
                        return;
                    }
                    Err(detail) => detail,
                },
                Some((&FAILED, v)) => match v.split_first_chunk::<8>() {
                    Some((r, outcome)) => match usize::try_from(u64::from_le_bytes(*r)) {
                        Ok(r) if r < comm.size() && node_of[r] == node_of[cross.world_ranks()[c]] => {
                            verdicts.push((r, outcome.to_vec()));
                            return;
                        }
                        _ => format!("a verdict naming rank {} of another node", u64::from_le_bytes(*r)),
                    },
                    None => "a verdict without a rank".to_owned(),
                },
                Some((kind, _)) => format!("a part of the id exchange across nodes of unknown kind {kind}"),
                None => "an empty part of the id exchange across nodes".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(cross.as_ref(), c, detail));
        },
    )?;
    clock.lap("cross ids");
    // Every rank now holds every node's verdict: the same decision
    // everywhere, without an agreement of its own.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let mut parts: Vec<&[u8]> = vec![&ok; comm.size()];
    for (r, outcome) in &verdicts {
        if *r != comm.rank() {
            parts[*r] = outcome;
        }
    }
    let conv = wholemem::agree::decide(comm.as_ref(), checked, wholemem::agree::Rule::Lowest, &parts)?;
    let db = conv.dst_bytes();

    // 4. Owners copy the rows asked of them straight into the exchange;
    //    this rank's own unique rows are copied while the others travel.
    //    Each unique row goes straight to this rank's requests for it in
    //    `out`; a row from another node is also kept for the fan-out when
    //    another local rank asked for it — its whole part, where the backend
    //    hands it over without a copy, else the row — and this rank's own
    //    rows go to the fan-out straight from the table.
    let mut for_others = vec![false; unique.len()];
    for (q, a) in answer.iter().enumerate() {
        if q != lme {
            for &u in a {
                for_others[u] = owner_node[u] != cme;
            }
        }
    }
    // When no row from another node is for another local rank (one rank
    // per node, say), every unique row has a place in `out` here: the
    // parts land there straight from the exchange, each row at its first
    // place, and nothing is kept for the fan-out.
    let lands = !for_others.contains(&true);
    let mut unique_rows = scratch(if lands { 0 } else { unique.len() * db });
    // This rank's requests by unique row: positions in `out` of unique row
    // `u` are `mine[mine_at[u]..mine_at[u + 1]]`.
    let mut mine_at = vec![0usize; unique.len() + 1];
    for &u in &answer[lme] {
        mine_at[u + 1] += 1;
    }
    for u in 0..unique.len() {
        mine_at[u + 1] += mine_at[u];
    }
    let mut mine = vec![0usize; answer[lme].len()];
    {
        let mut next = mine_at.clone();
        for (&u, &pos) in answer[lme].iter().zip(wanted(lme)) {
            mine[next[u]] = pos;
            next[u] += 1;
        }
    }
    // Each part behind a kind byte: rows follow, or what this rank found
    // wrong so far (its verdict travels instead of rows, and on from the
    // receivers to their nodes in the fan-out, so every rank learns it).
    drop_oversized(cross.as_ref(), &mut asked, cme, db, &mut problem);
    let verdict = finding_bytes(&mut problem);
    let sizes = reply_sizes(cross.size(), cme, db, verdict.as_deref(), |c| asked[c].len());
    // Verdicts heard from other ranks: their bytes (to pass on) and error.
    let mut heard: Vec<(Vec<u8>, Error)> = Vec::new();
    let (on, mut copying, mut own_time, mut placing) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut failed, mut own_failed): (Option<Error>, Option<Error>) = (None, None);
    // Unique row `u` (`row`): to each of this rank's places for it, and to
    // the fan-out's kept rows when another local rank wants it and its part
    // is not kept whole (`to_kept`).
    let deliver = |kept: &mut [u8], out: &mut [u8], u: usize, row: &[u8], to_kept: bool| {
        if to_kept && for_others[u] {
            kept[u * db..][..db].copy_from_slice(row);
        }
        for &pos in &mine[mine_at[u]..mine_at[u + 1]] {
            out[pos * db..][..db].copy_from_slice(row);
        }
    };
    // Parts from other nodes kept whole for the fan-out (where the backend
    // lets them be kept without a copy), with each unique row's place in
    // its part.
    let mut frames: Vec<Option<wm_comm::Kept>> = (0..cross.size()).map(|_| None).collect();
    // (Only where some row is for another local rank: with a rank per
    // node nothing is kept.)
    let mut in_part = Vec::new();
    if for_others.contains(&true) {
        in_part.resize(unique.len(), 0);
        for c in 0..cross.size() {
            for (k, &u) in uwanted(c).iter().enumerate() {
                in_part[u] = k;
            }
        }
    }
    let first = p.offset(comm.rank());
    let (mut to_out, mut out_at) = (Vec::new(), Vec::new());
    for &u in uwanted(cme) {
        if mine_at[u] < mine_at[u + 1] {
            to_out.push(unique[u] as usize - first);
            out_at.push(mine[mine_at[u]]);
        }
    }
    let (mut next, chunk) = (0, step_rows(mem, db, to_out.len()));
    let mut also = Some(also);
    // Copies each row of the part from cross rank `c`, in `out` at the
    // first of its places, on to the others.
    let spread = |out: &mut [u8], c: usize| {
        for &u in uwanted(c) {
            let places = &mine[mine_at[u]..mine_at[u + 1]];
            let Some((&at, more)) = places.split_first() else { continue };
            for &pos in more {
                out.copy_within(at * db..(at + 1) * db, pos * db);
            }
        }
    };
    let mut fill = |c: usize, buf: &mut [u8]| {
        if c == cme {
            return;
        }
        let copy = |body: &mut [u8]| timed(on, &mut copying, || read_local(mem, layout, conv, &asked[c], None, body));
        if let Some(e) = fill_reply(buf, verdict.as_deref(), copy) {
            failed.get_or_insert(e);
        }
    };
    // Rows this rank asked for go straight to the first of their places in
    // `out`, a piece per step, then on to their further places; then the
    // caller's work.
    let mut own_step = |out: &mut [u8]| {
        if next < to_out.len() {
            let end = (next + chunk).min(to_out.len());
            timed(on, &mut own_time, || {
                if let Err(e) = read_local(mem, layout, conv, &to_out[next..end], Some(&out_at[next..end]), out) {
                    own_failed.get_or_insert(e);
                }
            });
            next = if own_failed.is_some() { to_out.len() } else { end };
            return true;
        }
        if let Some(a) = also.take() {
            if own_failed.is_none() {
                timed(on, &mut own_time, || spread(out, cme));
            }
            a();
        }
        false
    };
    if lands {
        let firsts: Vec<Vec<usize>> =
            (0..cross.size()).map(|c| if c == cme { Vec::new() } else { uwanted(c).iter().map(|&u| mine[mine_at[u]]).collect() }).collect();
        let landings: Vec<Landing<'_>> = firsts.iter().map(|f| Landing { head: 1, row_bytes: db, rows: f }).collect();
        let (mut landed, mut verdicts): (Vec<bool>, Vec<Option<Vec<u8>>>) = (vec![false; cross.size()], vec![None; cross.size()]);
        let mut landed_verdict = vec![false; cross.size()];
        cross.alltoallv_in_place_landing(&sizes, &mut fill, out, &landings, &mut own_step, &mut |c, arrival| {
            if c == cme {
                return;
            }
            timed(on, &mut placing, || match read_arrival(cross.as_ref(), c, arrival, uwanted(c).len(), db) {
                Arrived::Rows => landed[c] = true,
                Arrived::VerdictInRows => landed_verdict[c] = true,
                Arrived::Verdict(v) => verdicts[c] = Some(v),
                Arrived::Failed(e) => {
                    problem.get_or_insert(e);
                }
            });
        })?;
        // Rows that landed at their first place go on to the others, and
        // verdicts of the rows' very length are read back; heard in rank
        // order, as they arrive in the other branch.
        timed(on, &mut placing, || {
            for c in (0..cross.size()).filter(|&c| landed[c]) {
                spread(out, c);
            }
        });
        for c in 0..cross.size() {
            let v = if landed_verdict[c] { Some(landings[c].read_back(out)) } else { verdicts[c].take() };
            if let Some(v) = v {
                let e = verdict_error(cross.as_ref(), c, &v);
                heard.push((v, e));
            }
        }
    } else {
        let cells = std::cell::RefCell::new((&mut unique_rows, &mut *out));
        cross.alltoallv_in_place_keeping(&sizes, &mut fill, &mut || own_step(cells.borrow_mut().1), &mut |c, part| {
            if c == cme {
                return;
            }
            let whole = part.keeps_without_copy() && uwanted(c).iter().any(|&u| for_others[u]);
            let rows_arrived = timed(on, &mut placing, || match read_reply(cross.as_ref(), c, part.bytes(), uwanted(c).len(), db) {
                Reply::Rows(body) => {
                    let mut cells = cells.borrow_mut();
                    let (kept, out) = &mut *cells;
                    for (row, &u) in body.chunks_exact(db).zip(uwanted(c)) {
                        deliver(kept, out, u, row, !whole);
                    }
                    true
                }
                Reply::Verdict(v) => {
                    heard.push((v.to_vec(), verdict_error(cross.as_ref(), c, v)));
                    false
                }
                Reply::Failed(e) => {
                    problem.get_or_insert(e);
                    false
                }
            });
            if rows_arrived && whole {
                frames[c] = Some(part.keep());
            }
        })?;
    }
    clock.lap_split("cross rows", &[("owner copy", copying), ("own rows", own_time), ("place", placing)]);

    // 5. Back within the node: each local rank gets its rows in the order it
    //    asked for them, written straight into the exchange (this rank's own
    //    requests are in `out` already).
    //    Behind a kind byte again: rows, or the verdict this rank found or
    //    heard across nodes.
    let mut problem = failed.or(own_failed).or(problem);
    let verdict = finding_bytes(&mut problem).or_else(|| heard.first().map(|(v, _)| v.clone()));
    let unique_row = |u: usize| &unique_rows[u * db..][..db];
    let sizes = reply_sizes(local.size(), lme, db, verdict.as_deref(), |q| from_local[q].len());
    let out = std::cell::RefCell::new(out);
    let first = p.offset(comm.rank());
    let mut fan_failed: Option<Error> = None;
    let (mut fan_copy, mut fan_place) = (Duration::ZERO, Duration::ZERO);
    local.alltoallv_in_place(
        &sizes,
        &mut |q, buf| {
            if q == lme {
                return;
            }
            // Rows from other nodes from where they were kept, this rank's
            // own from the table.
            let copy = |body: &mut [u8]| {
                let (mut own, mut own_at) = (Vec::new(), Vec::new());
                for (k, (slot, &u)) in body.chunks_exact_mut(db).zip(&answer[q]).enumerate() {
                    if owner_node[u] == cme {
                        own.push(unique[u] as usize - first);
                        own_at.push(k);
                    } else if let Some(f) = &frames[owner_node[u]] {
                        // The part this row crossed in: kind byte, rows.
                        slot.copy_from_slice(&f[1 + in_part[u] * db..][..db]);
                    } else {
                        slot.copy_from_slice(unique_row(u));
                    }
                }
                read_local(mem, layout, conv, &own, Some(&own_at), body)
            };
            if let Some(e) = timed(on, &mut fan_copy, || fill_reply(buf, verdict.as_deref(), copy)) {
                fan_failed.get_or_insert(e);
            }
        },
        &mut || {},
        &mut |q, bytes| {
            if q == lme {
                return;
            }
            match read_reply(local.as_ref(), q, bytes, wanted(q).len(), db) {
                Reply::Rows(body) => timed(on, &mut fan_place, || place(&mut out.borrow_mut(), body, wanted(q), db)),
                Reply::Verdict(v) => heard.push((v.to_vec(), verdict_error(local.as_ref(), q, v))),
                Reply::Failed(e) => {
                    problem.get_or_insert(e);
                }
            }
        },
    )?;
    if let Some(e) = fan_failed {
        problem.get_or_insert(e);
    }
    give_back(vec![unique_rows]);
    cross.recycle(frames.into_iter().flatten().map(wm_comm::Kept::into_vec).collect());
    clock.lap_split("fan out", &[("fan copy", fan_copy), ("fan place", fan_place)]);
    // This rank's own finding first, else the first verdict it heard: every
    // rank has heard of every finding made before the rows crossed nodes
    // (a malformed part found later fails the ranks its finder reaches).
    // Device copies can fail on one rank alone: device tables agree once
    // more.
    let local_outcome = match problem.or_else(|| heard.into_iter().next().map(|(_, e)| e)) {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let done = if mem.location() == wholemem::Location::Host { local_outcome } else { agree(comm.as_ref(), local_outcome, Rule::Lowest) };
    clock.lap("agree");
    done
}

/// The outcome bytes of `problem` (which stays where it is), to send as a
/// verdict.
fn finding_bytes(problem: &mut Option<Error>) -> Option<Vec<u8>> {
    let outcome: Result<()> = Err(problem.take()?);
    let bytes = wholemem::agree::outcome_bytes(&outcome);
    *problem = outcome.err();
    Some(bytes)
}

/// The error a verdict from member `from` of `comm` holds.
fn verdict_error(comm: &dyn Communicator, from: usize, verdict: &[u8]) -> Error {
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let mut parts: Vec<&[u8]> = vec![&ok; comm.size()];
    parts[from] = verdict;
    match wholemem::agree::decide(comm, Ok(()), wholemem::agree::Rule::Lowest, &parts) {
        Err(e) => e,
        // A verdict that says all is well: the sender broke the protocol.
        Ok(()) => malformed(comm, from, "a verdict of success where rows belong".into()),
    }
}

/// Scatter for distributed and hierarchy memory: ids and rows (converted to
/// the table's type by the sender) travel to their owners, which write them
/// in rank order, each rank's in its order — so the last occurrence of the
/// highest rank wins.
pub(crate) fn scatter_distributed(
    mem: &mut WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    src: &[u8],
    mut clock: Clock,
) -> Result<()> {
    let comm = mem.comm().clone();
    let n = comm.size();
    let p = mem.partition().clone();
    let rows = checked_rows(&checked, ids);
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let (order, starts) = bucket(&owners, n);
    let positions = |r: usize| &order[starts[r]..starts[r + 1]];

    // 1. Owners learn which of their rows arrive (each checked to be one
    //    of theirs), and every rank whether every rank passed its checks.
    let count = mem.local_rows().len();
    let (incoming, mut problem, conv) = exchange_row_ids(comm.as_ref(), &p, &rows, positions, count, checked)?;
    clock.lap("ids");
    let conv = conv?;
    // Every rank's checks passed: rows of this rank are about to change
    // (private rows, so counting the write before it is as good as after,
    // and no early return below can skip it).
    if incoming.iter().any(|part| !part.is_empty()) {
        mem.note_written(mem.local_rows());
    }
    let (sb, tb) = (conv.src_bytes(), conv.dst_bytes());

    // 2. The rows, converted to the table's type by their senders straight
    //    into the exchange; owners write each part as it is handed over, in
    //    rank order. A host table's own rows skip the exchange: they are
    //    written from `src` a piece at a time while the others travel, and
    //    the parts of lower ranks, written after them, leave those rows
    //    alone — so the highest rank's rows still win, as in rank order.
    let device = mem.location() == wholemem::Location::Device;
    let me = comm.rank();
    let direct = !device;
    let sizes: Vec<usize> = (0..n).map(|r| if r == me && direct { 0 } else { positions(r).len() * tb }).collect();
    let input = BufferRows(SendPtr(src.as_ptr().cast_mut()), sb);
    let (mut device_rows, mut device_data) = (Vec::new(), Vec::new());
    let table = if device {
        None
    } else {
        LocalRows::new(mem, layout).map(Some).unwrap_or_else(|e| {
            problem.get_or_insert(e);
            None
        })
    };
    // This rank's own rows, a bit each, where a lower rank's part may
    // name them too: `count` is this rank's row count from the agreed
    // partition (not from a peer), so the bitmap is an eighth of a byte per
    // row the table already holds.
    let own = &incoming[me];
    let mut written = Vec::new();
    if direct && table.is_some() && !own.is_empty() && (0..me).any(|r| !incoming[r].is_empty()) {
        written = vec![0u64; count.div_ceil(64)];
        for &row in own {
            written[row / 64] |= 1 << (row % 64);
        }
    }
    let is_own = |row: usize| written.get(row / 64).is_some_and(|w| w & (1 << (row % 64)) != 0);
    let mut misfit: Option<Error> = None;
    let (on, mut packing, mut writing, mut own_time) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut next, chunk) = (0, step_rows(mem, tb, own.len()));
    comm.alltoallv_in_place_stepped(
        &sizes,
        &mut |r, buf| {
            if r == me && direct {
                return;
            }
            // SAFETY: every position is below ids.len(), and `src` holds
            // that many rows of `sb` bytes (checked); `buf` is sized for
            // them by `sizes`.
            timed(on, &mut packing, || unsafe { kernel::gather_rows(&input, positions(r), None, conv, buf, 1) });
        },
        &mut || {
            let Some(table) = table.as_ref().filter(|_| direct && next < own.len()) else { return false };
            let end = (next + chunk).min(own.len());
            timed(on, &mut own_time, || {
                for (k, (&i, &row)) in positions(me)[next..end].iter().zip(&own[next..end]).enumerate() {
                    // Random rows of the table: ask for their lines early.
                    if let Some(&ahead) = own.get(next + k + kernel::PREFETCH_DISTANCE) {
                        kernel::prefetch(table.addr(ahead), tb);
                    }
                    // SAFETY: `i` is below ids.len() and `src` holds that
                    // many rows of `sb` bytes (checked); `row` is below this
                    // rank's row count (checked on receipt) and the layout
                    // fits in a row (checked at the call's entry). Private
                    // rows, kept from other users by `&mut WholeMemory`.
                    unsafe { conv.row(input.addr(i), table.addr(row)) };
                }
            });
            next = end;
            next < own.len()
        },
        &mut |r, bytes| {
            if r == me && direct {
                return;
            }
            let t = on.then(std::time::Instant::now);
            let idx = &incoming[r];
            if Some(bytes.len()) != rows_bytes(idx.len(), tb) {
                misfit.get_or_insert_with(|| {
                    malformed(comm.as_ref(), r, format!("{} bytes for {} rows of {tb} bytes", bytes.len(), idx.len()))
                });
            } else if device {
                device_rows.extend_from_slice(idx);
                device_data.extend_from_slice(bytes);
            } else if let Some(table) = &table {
                // A lower rank's rows give way to this rank's own.
                let yields = r < me && !written.is_empty();
                for (k, &row) in idx.iter().enumerate() {
                    if yields && is_own(row) {
                        continue;
                    }
                    // SAFETY: `row` is below this rank's row count (checked
                    // on receipt) and the layout fits in a row (checked at
                    // the call's entry), so `tb` bytes at its address lie in
                    // this rank's rows; `bytes` holds `idx.len()` rows of
                    // `tb` bytes (checked above). Distributed and hierarchy
                    // host rows are this process's private memory, and
                    // `&mut WholeMemory` keeps its other users away.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(k * tb), table.addr(row), tb) };
                }
            }
            if let Some(t) = t {
                writing += t.elapsed();
            }
        },
    )?;
    clock.lap_split("rows", &[("pack", packing), ("own rows", own_time), ("write", writing)]);
    let outcome = problem.or(misfit).map_or(Ok(()), Err);
    #[cfg(feature = "cuda")]
    let outcome = outcome.and_then(|()| {
        if !device {
            return Ok(());
        }
        // In rank order, each peer's rows in its order: the same "last one
        // wins" as the host writes. The senders converted the rows already.
        let same = RowConv::new(layout.dtype(), layout.dtype(), layout.cols())?;
        crate::device::scatter_local(mem, layout, same, &device_rows, &device_data)
    });
    let _ = (device_rows, device_data);
    let done = agree(comm.as_ref(), outcome, Rule::Lowest);
    clock.lap("agree");
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_answers_every_request_with_its_unique_id() {
        // Small ids (packed keys) and ids too large to pack (pairs).
        for big in [0, u64::MAX - 20] {
            let lists: Vec<Vec<u64>> =
                vec![vec![9, 3, 9], vec![], vec![3, 7, 1, 7]].into_iter().map(|l| l.into_iter().map(|x| x + big).collect()).collect();
            let (unique, answer) = dedup_sorted(&lists);
            assert_eq!(unique, [1 + big, 3 + big, 7 + big, 9 + big]);
            for first in 0..3 {
                let (unique, answer) = dedup(&lists, first);
                let expect = [[9, 3, 7, 1], [9, 3, 7, 1], [3, 7, 1, 9]][first];
                assert_eq!(unique, expect.map(|x| x + big), "list {first} first");
                for (l, a) in lists.iter().zip(&answer) {
                    assert_eq!(l.len(), a.len());
                    for (&id, &u) in l.iter().zip(a) {
                        assert_eq!(unique[u], id);
                    }
                }
            }
            for (l, a) in lists.iter().zip(&answer) {
                for (&id, &u) in l.iter().zip(a) {
                    assert_eq!(unique[u], id);
                }
            }
        }
        assert_eq!(dedup(&[vec![], vec![]], 1), (vec![], vec![vec![], vec![]]));
    }

    #[test]
    fn the_hash_and_its_fallback_agree() {
        // Three lists of 30 000 ids drawn from 50 000 random 31-bit ids, so
        // with many repeats; the sort's answer renumbered must be the hash
        // table's exactly.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let pool: Vec<u64> = (0..50_000).map(|_| next() >> 33).collect();
        let lists: Vec<Vec<u64>> = (0..3).map(|_| (0..30_000).map(|_| pool[(next() % 50_000) as usize]).collect()).collect();
        let order = [1, 0, 2];
        let hashed = dedup_hashed(&lists, &order, PROBES_PER_ID).expect("random ids stay within the probe budget");
        assert_eq!(hashed, in_first_appearance(dedup_sorted(&lists), &order));
        assert!(hashed.0.len() < 50_000);
        // A budget that runs out (as ids chosen to collide would make it)
        // leaves the work to the sort.
        assert_eq!(dedup_hashed(&lists, &order, 0), None);
    }
}
