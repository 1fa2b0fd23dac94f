//! The plan of one in-place all-to-all exchange: what the caller lays out
//! once per call, and what every backend carries out through
//! [`Communicator::exchange`](crate::Communicator::exchange).
//!
//! A plan holds the bytes for each rank (`sizes`) and how they are written
//! (`fill`), written straight into the buffers the transport sends from;
//! optionally where the rows of each peer's part land in an output
//! ([`ExchangePlan::land_rows`]); work that overlaps the transfer, whole or
//! in steps ([`ExchangePlan::while_in_flight`], [`ExchangePlan::between_steps`]);
//! and who receives each part ([`ExchangePlan::receive`], or
//! [`ExchangePlan::receive_parts`] where a part may be kept beyond the call
//! as a [`KeptPart`]). The plan borrows everything and allocates nothing.

use crate::{Error, Result};

/// One in-place all-to-all exchange, laid out by the caller and carried out
/// by a backend ([`Communicator::exchange`](crate::Communicator::exchange)).
///
/// `sizes[r]` bytes go to rank `r`, written in place by `fill(r, buf)`; the
/// work of [`while_in_flight`](Self::while_in_flight) or
/// [`between_steps`](Self::between_steps) runs while the parts travel; then
/// what each rank sent here is handed to the receiver, in rank order, this
/// rank's own part included.
pub struct ExchangePlan<'a> {
    /// Bytes to each rank, one entry per rank.
    pub(crate) sizes: &'a [usize],
    /// Writes the part for a rank into the buffer it is sent from.
    pub(crate) fill: &'a mut dyn FnMut(usize, &mut [u8]),
    /// The output rows land in (empty when none do).
    pub(crate) out: &'a mut [u8],
    /// Where each peer's rows land in `out`.
    pub(crate) landing: Landing<'a>,
    /// Work that overlaps the transfer.
    pub(crate) work: Work<'a>,
    /// Who gets each part.
    pub(crate) receiver: Receiver<'a>,
}

impl std::fmt::Debug for ExchangePlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExchangePlan")
            .field("sizes", &self.sizes)
            .field("out", &self.out.len())
            .field("landing", &self.landing)
            .finish_non_exhaustive()
    }
}

impl<'a> ExchangePlan<'a> {
    /// An exchange of `sizes[r]` bytes to each rank `r`, written by
    /// `fill(r, buf)`; with no work alongside, no landing, and nobody to
    /// receive the parts until [`receive`](Self::receive) or
    /// [`receive_parts`](Self::receive_parts) names one.
    pub fn new(sizes: &'a [usize], fill: &'a mut dyn FnMut(usize, &mut [u8])) -> Self {
        Self { sizes, fill, out: &mut [], landing: Landing::NONE, work: Work::None, receiver: Receiver::None }
    }

    /// `work()` runs once while the parts travel: work that needs nothing
    /// from the exchange (a gather copies this rank's own rows there). It
    /// must not use any communicator of this process.
    ///
    /// The socket backend runs it once its first writes are in the sockets;
    /// the MPI backend once the parts for other nodes have moved, while
    /// those for this node travel.
    #[must_use]
    pub fn while_in_flight(mut self, work: &'a mut dyn FnMut()) -> Self {
        self.work = Work::Once(work);
        self
    }

    /// [`while_in_flight`](Self::while_in_flight) in steps: `step(out)` does a bounded
    /// piece of the work and returns whether more remains. The socket
    /// backend calls it between its turns at the sockets, so the transfer
    /// goes on while a large copy runs (one long piece of work leaves the
    /// peers' bytes waiting in full socket buffers); every step has run
    /// before the first part is received, unless the exchange fails. `out`
    /// is the output of [`land_rows`](Self::land_rows) (empty without one);
    /// a step must leave its landing rows alone.
    #[must_use]
    pub fn between_steps(mut self, step: &'a mut dyn FnMut(&mut [u8]) -> bool) -> Self {
        self.work = Work::Steps(step);
        self
    }

    /// Parts go straight to their places in `out`: a part from rank `r` of
    /// exactly `head + rows[r].len() * row_bytes` bytes is a head, then one
    /// row of `row_bytes` bytes for each entry of `rows[r]`, which goes to
    /// row `rows[r][k]` of `out` (`out[rows[r][k] * row_bytes..]`); it is
    /// received as a [landed](ReceivedPart::landed) part of its head. A
    /// part of any other length is received whole. `rows` has an entry per
    /// rank.
    ///
    /// The socket backend receives parts from other nodes straight into
    /// their rows (one scattered read per 1 024 pieces, no buffer between);
    /// other parts, and other backends, are copied there on arrival. After
    /// an error, landing rows of `out` may hold anything.
    #[must_use]
    pub fn land_rows(mut self, out: &'a mut [u8], head: usize, row_bytes: usize, rows: &'a [&'a [usize]]) -> Self {
        self.out = out;
        self.landing = Landing { head, row_bytes, rows };
        self
    }

    /// `take(r, bytes)` gets the part from rank `r`; the bytes live only for
    /// that call (of a part that landed, they are its head).
    #[must_use]
    pub fn receive(mut self, take: &'a mut dyn FnMut(usize, &[u8])) -> Self {
        self.receiver = Receiver::Bytes(take);
        self
    }

    /// `take(r, part)` gets the part from rank `r` as a [`ReceivedPart`],
    /// which says whether it landed and may be kept beyond the call
    /// ([`ReceivedPart::keep`]): without a copy where the backend received
    /// it into a buffer of its own (the socket backend's inline parts), with
    /// one otherwise (shared-memory mailboxes, the MPI backend). Kept
    /// buffers go back with
    /// [`Communicator::recycle`](crate::Communicator::recycle)
    /// ([`KeptPart::into_vec`]).
    #[must_use]
    pub fn receive_parts(mut self, take: &'a mut dyn FnMut(usize, ReceivedPart<'_>)) -> Self {
        self.receiver = Receiver::Parts(take);
        self
    }

    /// The one check of a plan's layout, for every backend: a size per
    /// rank, and landing rows (where any land) for every rank, within the
    /// output.
    pub(crate) fn check(&self, ranks: usize) -> Result<()> {
        if self.sizes.len() != ranks {
            return Err(Error::InvalidArgument(format!(
                "an in-place exchange got {} sizes for a communicator of {ranks} ranks",
                self.sizes.len()
            )));
        }
        self.landing.check(ranks, self.out.len())
    }
}

/// Where the rows of each peer's part land ([`ExchangePlan::land_rows`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Landing<'a> {
    /// Bytes before the rows of a part.
    pub head: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// The output row of each row of each rank's part; no entry at all
    /// when nothing lands.
    pub rows: &'a [&'a [usize]],
}

impl Landing<'_> {
    /// Nothing lands.
    const NONE: Self = Self { head: 0, row_bytes: 0, rows: &[] };

    /// Whether any part lands.
    pub(crate) fn any(&self) -> bool {
        !self.rows.is_empty()
    }

    /// Whether the part from rank `r` can land rows (it has some, of some
    /// bytes).
    pub(crate) fn lands_rows(&self, r: usize) -> bool {
        self.rows.get(r).is_some_and(|rows| !rows.is_empty()) && self.row_bytes > 0
    }

    /// The length of a part from rank `r` that lands (`None` on overflow).
    fn len(&self, r: usize) -> Option<usize> {
        self.rows[r].len().checked_mul(self.row_bytes)?.checked_add(self.head)
    }

    fn check(&self, ranks: usize, out_len: usize) -> Result<()> {
        if !self.any() {
            return Ok(());
        }
        if self.rows.len() != ranks {
            return Err(Error::InvalidArgument(format!(
                "an in-place exchange got landing rows for {} ranks for a communicator of {ranks} ranks",
                self.rows.len()
            )));
        }
        let row_bytes = self.row_bytes;
        for (r, rows) in self.rows.iter().enumerate() {
            let beyond = |&&row: &&usize| row.checked_add(1).and_then(|e| e.checked_mul(row_bytes)).is_none_or(|e| e > out_len);
            if let Some(&bad) = rows.iter().find(beyond) {
                return Err(Error::InvalidArgument(format!(
                    "the landing of rank {r}'s part names output row {bad} of {row_bytes} bytes, beyond an output of {out_len} bytes"
                )));
            }
        }
        Ok(())
    }

    /// A part from rank `r` that arrived whole: of its landing's length,
    /// its rows are copied to their places in `out` and it has landed; of
    /// any other, it comes as it is.
    fn arrive<'b>(&self, r: usize, part: ReceivedPart<'b>, out: &mut [u8]) -> ReceivedPart<'b> {
        if part.landed() || Some(part.bytes().len()) != self.len(r) {
            return part;
        }
        let bytes = part.into_bytes();
        let (head, body) = bytes.split_at(self.head);
        if self.row_bytes > 0 {
            for (&row, bytes) in self.rows[r].iter().zip(body.chunks_exact(self.row_bytes)) {
                out[row * self.row_bytes..][..self.row_bytes].copy_from_slice(bytes);
            }
        }
        ReceivedPart(Source::Landed(head))
    }
}

/// The work that overlaps an exchange's transfer.
pub(crate) enum Work<'a> {
    /// None.
    None,
    /// Run once.
    Once(&'a mut dyn FnMut()),
    /// Run a step at a time until it says it is done.
    Steps(&'a mut dyn FnMut(&mut [u8]) -> bool),
}

impl Work<'_> {
    /// Does the next piece of the work, with the exchange's output; returns
    /// whether more remains.
    pub(crate) fn step(&mut self, out: &mut [u8]) -> bool {
        match self {
            Work::None => false,
            Work::Once(work) => {
                work();
                false
            }
            Work::Steps(step) => step(out),
        }
    }
}

/// Who gets each part of an exchange.
pub(crate) enum Receiver<'a> {
    /// Nobody: the parts are dropped.
    None,
    /// A callback for the bytes.
    Bytes(&'a mut dyn FnMut(usize, &[u8])),
    /// A callback for the part, which it may keep.
    Parts(&'a mut dyn FnMut(usize, ReceivedPart<'_>)),
}

/// The receiving end of a plan: its landing and its receiver, which every
/// part goes through once it has arrived.
pub(crate) struct Delivery<'a> {
    landing: Landing<'a>,
    receiver: Receiver<'a>,
}

impl<'a> Delivery<'a> {
    /// The receiving end of a plan with this landing and receiver.
    pub(crate) fn new(landing: Landing<'a>, receiver: Receiver<'a>) -> Self {
        Self { landing, receiver }
    }

    /// Hands the part from rank `r` to the receiver, its rows first put in
    /// their places in `out` where it has its landing's length and did not
    /// land on the way.
    pub(crate) fn hand_over(&mut self, r: usize, part: ReceivedPart<'_>, out: &mut [u8]) {
        let part = if self.landing.any() { self.landing.arrive(r, part, out) } else { part };
        match &mut self.receiver {
            Receiver::None => {}
            Receiver::Bytes(take) => take(r, part.bytes()),
            Receiver::Parts(take) => take(r, part),
        }
    }
}

/// A part as the exchange hands it to its receiver
/// ([`ExchangePlan::receive_parts`]): its bytes, whether its rows landed,
/// and a way to keep it.
#[derive(Debug)]
pub struct ReceivedPart<'a>(Source<'a>);

#[derive(Debug)]
enum Source<'a> {
    /// Its rows are in their places in the output; these are its head.
    Landed(&'a [u8]),
    /// Bytes the backend keeps (a mailbox, its own buffer).
    Borrowed(&'a [u8]),
    /// A buffer of the backend's that may be taken: the part is its bytes
    /// from the offset on.
    Owned(&'a mut Vec<u8>, usize),
}

impl<'a> ReceivedPart<'a> {
    /// A part whose bytes stay the backend's: keeping it copies them.
    pub fn borrowed(bytes: &'a [u8]) -> Self {
        Self(Source::Borrowed(bytes))
    }

    /// A part that is `buf[start..]`, which [`keep`](Self::keep) takes
    /// without copying (`buf` is left empty).
    pub fn owned(buf: &'a mut Vec<u8>, start: usize) -> Self {
        let start = start.min(buf.len());
        Self(Source::Owned(buf, start))
    }

    /// A part whose rows landed in the output on the way; `head` is what
    /// came before them.
    pub(crate) fn landed_head(head: &'a [u8]) -> Self {
        Self(Source::Landed(head))
    }

    /// Whether its rows are in their places in the output
    /// ([`ExchangePlan::land_rows`]): [`bytes`](Self::bytes) are then its
    /// head.
    pub fn landed(&self) -> bool {
        matches!(self.0, Source::Landed(_))
    }

    /// The part's bytes (of a landed part, its head).
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            Source::Landed(b) | Source::Borrowed(b) => b,
            Source::Owned(v, start) => &v[*start..],
        }
    }

    fn into_bytes(self) -> &'a [u8] {
        match self.0 {
            Source::Landed(b) | Source::Borrowed(b) => b,
            Source::Owned(v, start) => &v[start..],
        }
    }

    /// Whether [`keep`](Self::keep) takes the bytes without copying them.
    pub fn keeps_without_copy(&self) -> bool {
        matches!(self.0, Source::Owned(..))
    }

    /// The part's bytes, owned.
    pub fn keep(self) -> KeptPart {
        match self.0 {
            Source::Landed(b) | Source::Borrowed(b) => KeptPart { buf: b.to_vec(), start: 0 },
            Source::Owned(v, start) => KeptPart { buf: std::mem::take(v), start },
        }
    }
}

/// The bytes of a part kept beyond its exchange ([`ReceivedPart::keep`]).
#[derive(Debug, Default)]
pub struct KeptPart {
    buf: Vec<u8>,
    start: usize,
}

impl KeptPart {
    /// The buffer they lie in, to hand back with
    /// [`Communicator::recycle`](crate::Communicator::recycle).
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

impl std::ops::Deref for KeptPart {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// The rows of a landed part, read back from `out` in the part's order:
/// for a part whose head says its body is not rows after all.
///
/// # Panics
/// When a row lies beyond `out` (the exchange checked that none does).
pub fn read_back(out: &[u8], rows: &[usize], row_bytes: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(rows.len() * row_bytes);
    for &r in rows {
        v.extend_from_slice(&out[r * row_bytes..][..row_bytes]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_their_landing_length_land_and_others_come_whole() {
        // Rank 0's rows go to output rows 2 and 0, rank 1's to row 1.
        let rows: [&[usize]; 2] = [&[2, 0], &[1]];
        let landing = Landing { head: 1, row_bytes: 2, rows: &rows };
        let mut seen = Vec::new();
        let mut take = |r: usize, part: ReceivedPart<'_>| seen.push((r, part.landed(), part.bytes().to_vec()));
        let mut out = [0u8; 6];
        {
            let mut delivery = Delivery::new(landing, Receiver::Parts(&mut take));
            delivery.hand_over(0, ReceivedPart::borrowed(&[9, 1, 2, 3, 4]), &mut out);
            // Not rank 1's landing length: handed over whole, nothing placed.
            delivery.hand_over(1, ReceivedPart::borrowed(&[8, 5, 6, 7]), &mut out);
        }
        assert_eq!(out, [3, 4, 0, 0, 1, 2]);
        assert_eq!(seen, vec![(0, true, vec![9]), (1, false, vec![8, 5, 6, 7])]);
        assert_eq!(read_back(&out, rows[0], 2), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_part_in_a_buffer_of_its_own_is_kept_without_a_copy() {
        let mut buf = vec![0, 0, 7, 8];
        let part = ReceivedPart::owned(&mut buf, 2);
        assert!(part.keeps_without_copy() && !part.landed());
        let kept = part.keep();
        assert_eq!(&*kept, &[7, 8]);
        assert!(buf.is_empty(), "the buffer was taken, not copied");
        let borrowed = ReceivedPart::borrowed(&[5]);
        assert!(!borrowed.keeps_without_copy());
        assert_eq!(borrowed.keep().into_vec(), vec![5]);
    }

    #[test]
    fn a_plan_is_checked_against_the_ranks_and_its_output() {
        let mut fill = |_: usize, _: &mut [u8]| {};
        assert!(ExchangePlan::new(&[1, 2], &mut fill).check(2).is_ok());
        let mut fill = |_: usize, _: &mut [u8]| {};
        let err = ExchangePlan::new(&[1, 2, 3], &mut fill).check(2).unwrap_err();
        assert!(err.to_string().contains("3 sizes"), "{err}");
        let rows: [&[usize]; 2] = [&[0], &[4]];
        let mut out = [0u8; 8];
        let mut fill = |_: usize, _: &mut [u8]| {};
        let err = ExchangePlan::new(&[0, 0], &mut fill).land_rows(&mut out, 0, 2, &rows).check(2).unwrap_err();
        assert!(err.to_string().contains("output row 4"), "{err}");
        let mut fill = |_: usize, _: &mut [u8]| {};
        let err = ExchangePlan::new(&[0, 0], &mut fill).land_rows(&mut out, 0, 2, &rows[..1]).check(2).unwrap_err();
        assert!(err.to_string().contains("for 1 ranks"), "{err}");
    }
}
