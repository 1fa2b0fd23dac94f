//! Host storage for every memory type.
//!
//! | type | what each rank holds |
//! |---|---|
//! | Continuous | one reservation of the whole table; every rank's memfd placed in it at a page boundary |
//! | Chunked | one mapping per rank's memfd, each on its own |
//! | Distributed, Hierarchy | a memfd of its own rows only, mapped by this rank alone (shared only with one-sided readers) |
//!
//! Continuous places portions at boundaries of a layout unit, so a portion's
//! memfd backs the units from the one holding its first byte up to the one
//! holding the next portion's first byte: a rank's rows may end in a unit its
//! successor backs. Ownership of rows (the partition) is unaffected. The unit
//! is a huge page for tables of at least [`huge_layout_min`] per rank, so
//! each portion can be mapped with huge pages, and the page size otherwise.
//!
//! Portions of mapped types of at least that size are built from huge pages
//! where the kernel allows it (see `map::back_with_huge_pages`), and every
//! mapping of them starts at a huge-page boundary.

pub(crate) mod locks;
pub(crate) mod map;

use std::os::fd::{AsFd, OwnedFd};

use map::{Region, page_size};
use wm_comm::Communicator;

use crate::CommonError;
use crate::partition::Partition;
use crate::types::MemoryType;
use crate::{Error, Result};

/// The pointer of a rank without rows: never dereferenced, but aligned for
/// any element type so empty typed slices can be made from it.
const EMPTY: *mut u8 = std::ptr::without_provenance_mut(4096);

/// What a rank maps for one allocation.
#[derive(Debug)]
pub(crate) enum HostStorage {
    /// The whole table in one range (`None` for a zero-byte table).
    Continuous(Region),
    /// One mapping per rank (`None` for a rank without rows).
    Chunked(Vec<Option<Region>>),
    /// This rank's rows only.
    Local(Option<Region>),
}

/// Bytes per rank from which mapped tables are laid out for huge pages (16
/// huge pages, 32 MiB on x86-64): the at most one huge page a continuous
/// portion gains or loses at each end is then under 1/16 of it.
pub(crate) fn huge_layout_min() -> usize {
    16 * map::huge_page_size()
}

/// The unit continuous portions start at: a huge page when the average
/// portion is at least [`huge_layout_min`], else a page. A function of the
/// request alone, so every rank computes the same layout.
fn continuous_unit(total: usize, world: usize) -> usize {
    if total / world >= huge_layout_min() { map::huge_page_size() } else { page_size() }
}

/// Where rank `r`'s memfd starts in a continuous layout of `total` bytes.
pub(crate) fn continuous_split(byte_offsets: &[usize], total: usize, r: usize) -> usize {
    let world = byte_offsets.len() - 1;
    let unit = continuous_unit(total, world);
    if r == 0 {
        0
    } else if r == world {
        total.div_ceil(page_size()) * page_size()
    } else {
        byte_offsets[r] / unit * unit
    }
}

/// Bytes of rank `rank`'s memfd, and whether it is built from huge pages.
/// The creator sizes its memfd by it and every receiver (a node peer of a
/// mapped table, a one-sided reader) checks against it.
pub(crate) fn portion_bytes(ty: MemoryType, p: &Partition, granularity: usize, total: usize, rank: usize) -> (usize, bool) {
    match ty {
        MemoryType::Continuous => {
            let offs: Vec<usize> = (0..=p.world()).map(|r| p.offset(r) * granularity).collect();
            let bytes = continuous_split(&offs, total, rank + 1) - continuous_split(&offs, total, rank);
            (bytes, continuous_unit(total, p.world()) > page_size())
        }
        MemoryType::Chunked | MemoryType::Distributed | MemoryType::Hierarchy => {
            let bytes = p.count(rank) * granularity;
            (bytes, bytes >= huge_layout_min())
        }
    }
}

/// The memfds that hold rank `rank`'s rows, as indices into every rank's
/// memfds (non-empty ones only, in order: placed side by side they are
/// contiguous), and where the rank's first row starts in them. A
/// continuous rank's rows may begin in an earlier unit than its memfd's
/// and end in a later rank's; the others' are exactly their own memfd.
pub(crate) fn portion_pieces(ty: MemoryType, p: &Partition, granularity: usize, total: usize, rank: usize) -> (Vec<usize>, usize) {
    match ty {
        MemoryType::Continuous => {
            let offs: Vec<usize> = (0..=p.world()).map(|r| p.offset(r) * granularity).collect();
            let (start, end) = (offs[rank], offs[rank + 1]);
            if start == end {
                return (Vec::new(), 0);
            }
            let split = |k: usize| continuous_split(&offs, total, k);
            let pieces: Vec<usize> =
                (0..p.world()).filter(|&k| split(k) < split(k + 1) && split(k) < end && split(k + 1) > start).collect();
            let first = pieces.first().map_or(0, |&k| split(k));
            (pieces, start - first)
        }
        MemoryType::Chunked | MemoryType::Distributed | MemoryType::Hierarchy => (vec![rank], 0),
    }
}

/// The memfd this rank contributes, sized for the layout and sealed.
pub(crate) fn create_portion(ty: MemoryType, p: &Partition, granularity: usize, total: usize, rank: usize) -> Result<OwnedFd> {
    let (bytes, huge) = portion_bytes(ty, p, granularity, total, rank);
    map::memfd(&format!("wholemem-r{rank}"), bytes, huge).map_err(|e| Error::os(format!("creating a shared portion of {bytes} bytes"), e))
}

/// A memfd that world rank `from` sent, checked before anything maps it:
/// sealed against resizing and exactly `len` bytes. A short or resizable
/// file would fault (SIGBUS) at first touch of its missing pages; here it
/// is an error naming the sender.
pub(crate) fn received(fd: OwnedFd, len: usize, from: usize, what: &str) -> Result<OwnedFd> {
    match map::check_received(fd.as_fd(), len) {
        Ok(()) => Ok(fd),
        Err(detail) => Err(Error::Common(CommonError::Malformed { rank: from, detail: format!("as its {what}, {detail}") })),
    }
}

/// What host tables send beside each rank's portion, and how what arrives
/// is checked.
pub(crate) struct HostExtras<'a> {
    /// This rank's pidfd (or a stand-in where the kernel has none): how the
    /// node's ranks tell that it died holding a row lock.
    pub(crate) pidfd: OwnedFd,
    /// The row-lock table: rank 0's to hand out, `None` elsewhere.
    pub(crate) locks: Option<OwnedFd>,
    /// The bytes of rank `r`'s portion, as the layout gives them.
    pub(crate) sizes: &'a dyn Fn(usize) -> usize,
}

/// What every rank of the node handed this one.
#[derive(Debug)]
pub(crate) struct Exchanged {
    /// Every rank's portion, indexed by rank (this rank's own a duplicate).
    pub(crate) fds: Vec<OwnedFd>,
    /// Every rank's pidfd (host tables; `None` for this rank, and for a
    /// rank that sent a stand-in).
    pub(crate) pidfds: Vec<Option<OwnedFd>>,
    /// The row-lock table (host tables).
    pub(crate) locks: Option<OwnedFd>,
}

/// Hands this rank's memfd to every other rank of `comm` (all on one node)
/// and returns everyone's, indexed by rank.
///
/// Pairwise rounds (send to `me + k`, receive from `me - k`) keep one
/// message per rank in flight. A local failure (out of descriptors) does
/// not stop the rounds — an empty frame stands in for the descriptors — so
/// every rank finishes the exchange and the caller can agree on the inner
/// result. The outer error is a lost peer or a timeout, which ends it early.
///
/// With `host` (host tables, the same on every rank), each rank also sends
/// its pidfd, rank 0 the row-lock table, and every descriptor that arrives
/// is checked ([`received`]): rank `r`'s portion must be a sealed memfd of
/// `sizes(r)` bytes, the lock table one of [`locks::table_bytes`]; a pidfd that is
/// not one counts as a rank whose death cannot be seen. Device memory passes
/// `None`: its descriptors are the driver's, checked by the import.
pub(crate) fn exchange_portions(comm: &dyn Communicator, mine: OwnedFd, host: Option<HostExtras<'_>>) -> Result<Result<Exchanged>> {
    let fatal = |e: wm_comm::Error| match e {
        e @ (wm_comm::Error::PeerLost { .. } | wm_comm::Error::Protocol { .. } | wm_comm::Error::Timeout { .. }) => Err(Error::Comm(e)),
        e => Ok(Error::Comm(e)),
    };
    let (me, n) = (comm.rank(), comm.size());
    let mut first_err: Option<Error> = None;
    let mut all: Vec<Option<OwnedFd>> = (0..n).map(|_| None).collect();
    let mut pidfds: Vec<Option<OwnedFd>> = (0..n).map(|_| None).collect();
    match mine.try_clone() {
        Ok(fd) => all[me] = Some(fd),
        Err(e) => first_err = Some(Error::os("duplicating a descriptor", e)),
    }
    let mut lock_fd = None;
    let mut outgoing = vec![mine.as_fd()];
    if let Some(h) = &host {
        outgoing.push(h.pidfd.as_fd());
        if let Some(l) = &h.locks {
            outgoing.push(l.as_fd());
        }
    }
    for k in 1..n {
        let (to, from) = ((me + k) % n, (me + n - k) % n);
        if let Err(e) = comm.send_fds(to, &outgoing) {
            let e = fatal(e)?;
            first_err.get_or_insert(e);
            comm.send_fds(to, &[])?;
        }
        let sender = comm.world_ranks()[from];
        let count = 1 + usize::from(host.is_some()) + usize::from(host.is_some() && from == 0);
        match comm.recv_fds(from, count) {
            Ok(fds) => {
                let mut fds = fds.into_iter();
                let (portion, pidfd, locks) = (fds.next(), fds.next(), fds.next());
                let checked = match &host {
                    None => Ok(portion),
                    Some(h) => portion.map(|fd| received(fd, (h.sizes)(from), sender, "table portion")).transpose(),
                };
                match checked {
                    Ok(fd) => all[from] = fd,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
                pidfds[from] = pidfd.filter(|fd| locks::is_pidfd(fd.as_fd()));
                match locks.map(|fd| received(fd, locks::table_bytes(n), sender, "row-lock table")).transpose() {
                    Ok(Some(fd)) => lock_fd = Some(fd),
                    Ok(None) => {}
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            Err(e) => {
                let e = fatal(e)?;
                first_err.get_or_insert(e);
            }
        }
    }
    let is_host = host.is_some();
    let lock_fd = lock_fd.or_else(|| host.and_then(|h| h.locks));
    if let Some(e) = first_err {
        return Ok(Err(e));
    }
    if is_host && lock_fd.is_none() {
        return Ok(Err(Error::Common(CommonError::Malformed {
            rank: comm.world_ranks()[0],
            detail: "no row-lock table with its portion".into(),
        })));
    }
    let mut fds = Vec::with_capacity(n);
    for (r, fd) in all.into_iter().enumerate() {
        match fd {
            Some(fd) => fds.push(fd),
            None => {
                return Ok(Err(Error::Common(CommonError::Malformed {
                    rank: comm.world_ranks()[r],
                    detail: "no descriptor for its portion".into(),
                })));
            }
        }
    }
    Ok(Ok(Exchanged { fds, pidfds, locks: lock_fd }))
}

/// Maps what this rank needs: every rank's memfd `fds` of a mapped type,
/// this rank's own (`fds[0]`) of the others.
pub(crate) fn map_storage(
    ty: MemoryType,
    p: &Partition,
    granularity: usize,
    total: usize,
    rank: usize,
    fds: &[OwnedFd],
) -> Result<HostStorage> {
    match ty {
        MemoryType::Continuous => {
            let offs: Vec<usize> = (0..=p.world()).map(|r| p.offset(r) * granularity).collect();
            let span = continuous_split(&offs, total, p.world());
            let res =
                Region::reserve_aligned(span, continuous_unit(total, p.world())).map_err(oops("reserving address space for the table"))?;
            for (r, fd) in fds.iter().enumerate() {
                let (at, end) = (continuous_split(&offs, total, r), continuous_split(&offs, total, r + 1));
                if end > at {
                    // SAFETY: the reservation is fresh; no pointer into it
                    // has been handed out yet.
                    unsafe { res.place(at, fd.as_fd(), end - at) }.map_err(oops("mapping a rank's portion"))?;
                }
            }
            Ok(HostStorage::Continuous(res))
        }
        MemoryType::Chunked => {
            let maps = fds
                .iter()
                .enumerate()
                .map(|(r, fd)| {
                    let len = p.count(r) * granularity;
                    (len > 0).then(|| Region::shared(fd.as_fd(), len)).transpose().map_err(oops("mapping a rank's portion"))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(HostStorage::Chunked(maps))
        }
        MemoryType::Distributed | MemoryType::Hierarchy => {
            let len = p.count(rank) * granularity;
            let fd = fds.first().filter(|_| len > 0);
            let region = fd.map(|fd| Region::shared(fd.as_fd(), len)).transpose().map_err(oops("mapping this rank's rows"))?;
            Ok(HostStorage::Local(region))
        }
    }
}

impl HostStorage {
    /// Bytes of the table this rank maps with huge pages now.
    pub(crate) fn huge_bytes(&self) -> usize {
        match self {
            HostStorage::Continuous(res) => res.huge_bytes(),
            HostStorage::Chunked(maps) => maps.iter().flatten().map(Region::huge_bytes).sum(),
            HostStorage::Local(region) => region.as_ref().map_or(0, Region::huge_bytes),
        }
    }

    /// The first byte of rank `r`'s rows, if this rank maps them.
    pub(crate) fn rank_ptr(&self, r: usize, me: usize, p: &Partition, granularity: usize) -> Option<*mut u8> {
        match self {
            HostStorage::Continuous(res) => Some(res.ptr().wrapping_add(p.offset(r) * granularity)),
            HostStorage::Chunked(maps) => Some(maps[r].as_ref().map_or(EMPTY, Region::ptr)),
            HostStorage::Local(region) if r == me => Some(region.as_ref().map_or(EMPTY, Region::ptr)),
            HostStorage::Local(_) => None,
        }
    }
}

fn oops(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::os(what, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split for `counts` rows of `granularity` bytes.
    fn splits(counts: &[usize], granularity: usize) -> (Vec<usize>, usize) {
        let p = Partition::from_counts(counts);
        let total = p.rows() * granularity;
        let offs: Vec<usize> = (0..=p.world()).map(|r| p.offset(r) * granularity).collect();
        ((0..=p.world()).map(|r| continuous_split(&offs, total, r)).collect(), total)
    }

    #[test]
    fn large_continuous_tables_split_at_huge_pages() {
        let huge = map::huge_page_size();
        // Rows of 516 bytes never line up with a huge page; one rank holds
        // most of the table, one nothing.
        let g = 516;
        let per = 40 * huge / g;
        for counts in [vec![per, per + 3, per - 7], vec![3 * per, 0, per / 2 + 5]] {
            let (s, total) = splits(&counts, g);
            assert_eq!(s[0], 0);
            assert_eq!(*s.last().unwrap(), total.div_ceil(page_size()) * page_size());
            assert!(s.windows(2).all(|w| w[0] <= w[1]), "{s:?}");
            for (r, &at) in s.iter().enumerate().take(counts.len()).skip(1) {
                assert_eq!(at % huge, 0, "rank {r} starts at {at}, inside a huge page");
                // At most one huge page away from the rank's first byte.
                let first = counts[..r].iter().sum::<usize>() * g;
                assert!(at <= first && first - at < huge, "rank {r}: split {at}, first byte {first}");
            }
        }
    }

    #[test]
    fn a_short_or_resizable_portion_is_an_error_naming_its_sender() {
        let page = page_size();
        let p = Partition::from_counts(&[3, 5]);
        let g = page;
        let (want, _) = portion_bytes(MemoryType::Chunked, &p, g, 8 * g, 1);
        assert_eq!(want, 5 * page);
        // What a rank creates passes the receiver's check.
        let good = create_portion(MemoryType::Chunked, &p, g, 8 * g, 1).unwrap();
        received(good, want, 7, "table portion").unwrap();
        // A sealed portion one page short: the size check refuses it.
        let short = map::memfd("wholemem-test-short", want - page, false).unwrap();
        let e = received(short, want, 7, "table portion").unwrap_err();
        assert!(matches!(&e, Error::Common(CommonError::Malformed { rank: 7, detail }) if detail.contains("table portion")), "{e}");
        assert!(e.to_string().starts_with("rank 7 sent malformed data"), "{e}");
        // An unsealed one of the right size: it could shrink under the
        // mapping later, so it is refused too.
        let e = received(map::unsealed_memfd(want), want, 3, "row-lock table").unwrap_err();
        assert!(matches!(&e, Error::Common(CommonError::Malformed { rank: 3, detail }) if detail.contains("without its seals")), "{e}");
    }

    #[test]
    fn small_continuous_tables_split_at_pages() {
        let page = page_size();
        let (s, total) = splits(&[1000, 999, 0, 5], 12);
        assert_eq!(s, vec![0, 12_000 / page * page, 23_988 / page * page, 23_988 / page * page, total.div_ceil(page) * page]);
    }
}
