//! The one trait every backend implements, and typed helpers over it.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytemuck::Pod;
use wm_topology::NodeIdentity;

use crate::{Error, Result};

/// `meanwhile` as the one step of a stepped in-place exchange: the
/// backends whose stepped form is their own implement the plain form
/// through it.
pub(crate) fn one_step(meanwhile: &mut dyn FnMut()) -> impl FnMut() -> bool + '_ {
    move || {
        meanwhile();
        false
    }
}

/// A part an in-place exchange hands over
/// ([`Communicator::alltoallv_in_place_keeping`]): its bytes, and a way to
/// keep them.
#[derive(Debug)]
pub struct Part<'a>(PartBytes<'a>);

#[derive(Debug)]
enum PartBytes<'a> {
    /// Bytes the backend keeps (a mailbox, its own buffer).
    Borrowed(&'a [u8]),
    /// A buffer of the backend's that may be taken: the part is its bytes
    /// from the offset on.
    Owned(&'a mut Vec<u8>, usize),
}

impl<'a> Part<'a> {
    /// A part whose bytes stay the backend's: keeping it copies them.
    pub fn borrowed(bytes: &'a [u8]) -> Self {
        Self(PartBytes::Borrowed(bytes))
    }

    /// A part that is `buf[start..]`, which [`keep`](Self::keep) takes
    /// without copying (`buf` is left empty).
    pub fn owned(buf: &'a mut Vec<u8>, start: usize) -> Self {
        let start = start.min(buf.len());
        Self(PartBytes::Owned(buf, start))
    }

    /// The part's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.0 {
            PartBytes::Borrowed(b) => b,
            PartBytes::Owned(v, start) => &v[*start..],
        }
    }

    /// Whether [`keep`](Self::keep) takes the bytes without copying them.
    pub fn keeps_without_copy(&self) -> bool {
        matches!(self.0, PartBytes::Owned(..))
    }

    /// The part's bytes, owned.
    pub fn keep(self) -> Kept {
        match self.0 {
            PartBytes::Borrowed(b) => Kept { buf: b.to_vec(), start: 0 },
            PartBytes::Owned(v, start) => Kept { buf: std::mem::take(v), start },
        }
    }
}

/// The bytes of a kept [`Part`].
#[derive(Debug, Default)]
pub struct Kept {
    buf: Vec<u8>,
    start: usize,
}

impl Kept {
    /// The buffer they lie in, to hand back with
    /// [`Communicator::recycle`].
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

impl std::ops::Deref for Kept {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Where the rows of the part one rank sends land, in
/// [`Communicator::alltoallv_in_place_landing`]: a part of exactly
/// `head + rows.len() * row_bytes` bytes is its head, then one row of
/// `row_bytes` bytes for each entry of `rows`, which goes to row
/// `rows[k]` of the output (`out[rows[k] * row_bytes..]`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Landing<'a> {
    /// Bytes before the rows, handed to `take`.
    pub head: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// The output row of each row of the part.
    pub rows: &'a [usize],
}

impl Landing<'_> {
    /// The length of a part that lands (`None` on overflow).
    pub fn len(&self) -> Option<usize> {
        self.rows.len().checked_mul(self.row_bytes)?.checked_add(self.head)
    }

    /// Whether a part lands nothing but its head.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() || self.row_bytes == 0
    }

    /// The rows of a landed part, read back from `out` in the part's order:
    /// for a part whose head says its body is not rows after all.
    ///
    /// # Panics
    /// When a row lies beyond `out` (the exchange checked that none does).
    pub fn read_back(&self, out: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.rows.len() * self.row_bytes);
        for &r in self.rows {
            v.extend_from_slice(&out[r * self.row_bytes..][..self.row_bytes]);
        }
        v
    }

    /// A part that arrived whole in `bytes`: of this landing's length, its
    /// rows are copied to their places in `out` and it has landed; of any
    /// other, it comes as it is.
    pub(crate) fn arrive<'b>(&self, bytes: &'b [u8], out: &mut [u8]) -> Arrival<'b> {
        if Some(bytes.len()) != self.len() {
            return Arrival::Bytes(bytes);
        }
        let (head, body) = bytes.split_at(self.head);
        if self.row_bytes > 0 {
            for (&r, row) in self.rows.iter().zip(body.chunks_exact(self.row_bytes)) {
                out[r * self.row_bytes..][..self.row_bytes].copy_from_slice(row);
            }
        }
        Arrival::Landed(head)
    }
}

/// How a part of [`Communicator::alltoallv_in_place_landing`] arrived.
#[derive(Debug, Clone, Copy)]
pub enum Arrival<'a> {
    /// It had its [`Landing`]'s length: its rows are in their places in
    /// the output, and this is its head.
    Landed(&'a [u8]),
    /// It had another length: all its bytes, nothing placed.
    Bytes(&'a [u8]),
}

/// Checks that every landing's rows lie within an output of `out_len`
/// bytes, naming the first that does not.
pub(crate) fn check_landings(landings: &[Landing<'_>], ranks: usize, out_len: usize) -> Result<()> {
    if landings.len() != ranks {
        return Err(Error::InvalidArgument(format!(
            "alltoallv_in_place_landing got {} landings for a communicator of {ranks} ranks",
            landings.len()
        )));
    }
    for (r, l) in landings.iter().enumerate() {
        let Some(&bad) =
            l.rows.iter().find(|&&row| row.checked_add(1).and_then(|e| e.checked_mul(l.row_bytes)).is_none_or(|e| e > out_len))
        else {
            continue;
        };
        return Err(Error::InvalidArgument(format!(
            "the landing of rank {r}'s part names output row {bad} of {} bytes, beyond an output of {out_len} bytes",
            l.row_bytes
        )));
    }
    Ok(())
}

/// A group of ranks that run collectives together.
///
/// Object-safe, so tools can hold `&dyn Communicator` or
/// `Arc<dyn Communicator>`. Every method except the accessors is
/// **collective**: all ranks of the communicator call it, in the same order.
/// [`send_fds`](Communicator::send_fds) and
/// [`recv_fds`](Communicator::recv_fds) are point-to-point.
///
/// Every blocking call gives up after `WM_TIMEOUT_S` seconds without progress
/// and names the ranks it waited for; a rank that dies is named within
/// seconds. After such an error the communicator (and every other one of the
/// process) keeps failing with the same cause. A collective mismatch (ranks
/// calling different collectives) fails on the ranks that notice it and
/// leaves that communicator failing from then on; the others stay usable.
///
/// All communicators of a process share its connections: drive them from
/// one thread at a time. Collectives issued concurrently from several
/// threads on different communicators serialize, and can wait on each other
/// across processes until the timeout.
pub trait Communicator: Send + Sync + fmt::Debug {
    /// This rank within the communicator.
    fn rank(&self) -> usize;
    /// Number of ranks in the communicator.
    fn size(&self) -> usize;
    /// The world rank of each member, indexed by rank in this communicator.
    fn world_ranks(&self) -> &[usize];
    /// The node each member runs on, indexed by rank in this communicator.
    fn nodes(&self) -> &[NodeIdentity];
    /// The backend's name (`"socket"`, `"mpi"`).
    fn backend(&self) -> &'static str;

    /// Waits until every rank has arrived.
    ///
    /// # Errors
    /// A lost peer or a timeout.
    fn barrier(&self) -> Result<()>;

    /// Replaces `data` on every rank with `root`'s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `root` is not a rank; lost peer; timeout.
    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()>;

    /// Every rank's `data` (any length, zero included), indexed by rank.
    ///
    /// # Errors
    /// A lost peer or a timeout.
    fn allgatherv(&self, data: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Sends `send[r]` to rank `r` and returns what each rank sent here.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `send.len()` is not the size; lost
    /// peer; timeout.
    fn alltoallv(&self, send: &[&[u8]]) -> Result<Vec<Vec<u8>>>;

    /// [`alltoallv`](Self::alltoallv) without intermediate buffers:
    /// `sizes[r]` bytes go to rank `r`, written in place by `fill(r, buf)`;
    /// `meanwhile()` runs once while the parts travel; then what each rank
    /// sent here is handed to `take(r, bytes)`, in rank order, this rank's
    /// own part included. `take`'s bytes live only for that call.
    ///
    /// `meanwhile` is for work that needs nothing from the exchange — a
    /// gather copies this rank's own rows there — so it overlaps the
    /// transfer; it must not use any communicator of this process.
    ///
    /// The socket backend has `fill` write payloads of 16 KiB or more for
    /// ranks on this node straight into shared memory, where the receiver's
    /// `take` reads them: one copy each side and no trip through the socket;
    /// it runs `meanwhile` once its first writes are in the sockets. Other
    /// backends (and the default) fill buffers, run `meanwhile`, and use
    /// `alltoallv`.
    ///
    /// # Errors
    /// As [`alltoallv`](Self::alltoallv).
    fn alltoallv_in_place(
        &self,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        meanwhile: &mut dyn FnMut(),
        take: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        check_sizes(sizes, self.size())?;
        let bufs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(r, &n)| {
                let mut b = vec![0u8; n];
                fill(r, &mut b);
                b
            })
            .collect();
        meanwhile();
        let refs: Vec<&[u8]> = bufs.iter().map(Vec::as_slice).collect();
        let got = self.alltoallv(&refs)?;
        for (r, g) in got.iter().enumerate() {
            take(r, g);
        }
        self.recycle(got);
        Ok(())
    }

    /// [`alltoallv_in_place`](Self::alltoallv_in_place) with the work
    /// meanwhile in steps: `step()` does a bounded piece of it and returns
    /// whether more remains. The socket backend calls it between its turns
    /// at the sockets, so the transfer goes on while a large copy runs (one
    /// long `meanwhile` leaves the peers' bytes waiting in full socket
    /// buffers); every step has run before `take` is called. Other backends
    /// (and the default) run every step where `alltoallv_in_place` runs
    /// `meanwhile`.
    ///
    /// # Errors
    /// As [`alltoallv`](Self::alltoallv); on an error, steps may be left
    /// undone.
    fn alltoallv_in_place_stepped(
        &self,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        step: &mut dyn FnMut() -> bool,
        take: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.alltoallv_in_place(sizes, fill, &mut || while step() {}, take)
    }

    /// [`alltoallv_in_place_stepped`](Self::alltoallv_in_place_stepped)
    /// whose `take` may keep a part beyond the call: it gets each as a
    /// [`Part`], which [`Part::keep`] turns into an owned [`Kept`] — without
    /// a copy where the backend received the part into a buffer of its own
    /// (the socket backend's parts from other nodes), with one otherwise
    /// (the default, shared-memory mailboxes). Kept buffers go back with
    /// [`recycle`](Self::recycle) ([`Kept::into_vec`]).
    ///
    /// # Errors
    /// As [`alltoallv_in_place_stepped`](Self::alltoallv_in_place_stepped).
    fn alltoallv_in_place_keeping(
        &self,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        step: &mut dyn FnMut() -> bool,
        take: &mut dyn FnMut(usize, Part<'_>),
    ) -> Result<()> {
        self.alltoallv_in_place_stepped(sizes, fill, step, &mut |r, bytes| take(r, Part::borrowed(bytes)))
    }

    /// [`alltoallv_in_place_stepped`](Self::alltoallv_in_place_stepped)
    /// whose parts go straight to their places in `out`: a part from rank
    /// `r` of `landings[r]`'s length puts its rows there, and `take` gets
    /// [`Arrival::Landed`] with its head; a part of another length is handed
    /// over whole as [`Arrival::Bytes`]. `step` gets `out` between its
    /// turns; it must leave the landing rows alone.
    ///
    /// The socket backend receives parts from other nodes straight into
    /// their rows (one scattered read per 1 024 pieces, no buffer between);
    /// other parts, and other backends, are copied there on arrival.
    ///
    /// # Errors
    /// As [`alltoallv_in_place_stepped`](Self::alltoallv_in_place_stepped);
    /// [`Error::InvalidArgument`] when a landing's count differs from the
    /// size or names rows beyond `out`. After an error, landing rows of
    /// `out` may hold anything.
    fn alltoallv_in_place_landing(
        &self,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]),
        out: &mut [u8],
        landings: &[Landing<'_>],
        step: &mut dyn FnMut(&mut [u8]) -> bool,
        take: &mut dyn FnMut(usize, Arrival<'_>),
    ) -> Result<()> {
        check_landings(landings, self.size(), out.len())?;
        let out = std::cell::RefCell::new(out);
        self.alltoallv_in_place_stepped(sizes, fill, &mut || step(&mut out.borrow_mut()), &mut |r, bytes| {
            take(r, landings[r].arrive(bytes, &mut out.borrow_mut()));
        })
    }

    /// Splits into communicators of the ranks that pass the same `color`,
    /// ordered by `(key, rank)`.
    ///
    /// # Errors
    /// A lost peer or a timeout.
    fn split(&self, color: u32, key: u32) -> Result<Arc<dyn Communicator>>;

    /// The ranks of this communicator on this rank's node, in rank order.
    /// Computed from node identities, without communication.
    fn local(&self) -> Arc<dyn Communicator>;

    /// The ranks with this rank's local rank on every node, in node order
    /// (nodes ordered by their lowest rank). Without communication.
    fn cross(&self) -> Arc<dyn Communicator>;

    /// Sends descriptors to `dest`, a rank on this node (point-to-point).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `dest` is on another node; lost peer;
    /// timeout.
    fn send_fds(&self, dest: usize, fds: &[BorrowedFd<'_>]) -> Result<()>;

    /// Receives the descriptors `src` sent with [`send_fds`](Self::send_fds).
    ///
    /// # Errors
    /// [`Error::Mismatch`] when the count differs from `count`; lost peer;
    /// timeout.
    fn recv_fds(&self, src: usize, count: usize) -> Result<Vec<OwnedFd>>;

    /// Hands back buffers that a collective returned, so the backend can
    /// reuse them for later large messages instead of faulting in fresh
    /// pages. Optional; the default drops them.
    fn recycle(&self, bufs: Vec<Vec<u8>>) {
        drop(bufs);
    }

    /// This communicator as the MPI backend's, when it is one: the seam
    /// through which `wm-onesided` opens MPI RMA windows on it.
    #[cfg(feature = "mpi")]
    fn as_mpi(&self) -> Option<&crate::mpi_backend::MpiComm> {
        None
    }

    /// This rank's world rank.
    fn world_rank(&self) -> usize {
        self.world_ranks()[self.rank()]
    }

    /// Whether two ranks of this communicator are on one node.
    fn same_node(&self, a: usize, b: usize) -> bool {
        self.nodes()[a] == self.nodes()[b]
    }

    /// Every rank's equally long `data`, concatenated in rank order.
    ///
    /// # Errors
    /// [`Error::Mismatch`] naming a rank whose length differs; lost peer;
    /// timeout.
    fn allgather(&self, data: &[u8]) -> Result<Vec<u8>> {
        let parts = self.allgatherv(data)?;
        if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() != data.len()) {
            return Err(Error::Mismatch {
                op: "allgather",
                detail: format!(
                    "rank {} passed {} bytes, rank {} passed {}",
                    self.world_ranks()[r],
                    p.len(),
                    self.world_rank(),
                    data.len()
                ),
            });
        }
        Ok(parts.concat())
    }
}

/// The one check of `alltoallv_in_place`'s arguments, for every backend.
pub(crate) fn check_sizes(sizes: &[usize], ranks: usize) -> Result<()> {
    if sizes.len() != ranks {
        return Err(Error::InvalidArgument(format!("alltoallv_in_place got {} sizes for a communicator of {ranks} ranks", sizes.len())));
    }
    Ok(())
}

/// Typed collectives over any [`Communicator`], for `bytemuck::Pod` data.
pub trait CommExt: Communicator {
    /// [`Communicator::allgatherv`] of typed slices.
    ///
    /// # Errors
    /// As the byte version; [`Error::Mismatch`] if a length is not a multiple
    /// of `T`'s size.
    fn allgatherv_pod<T: Pod>(&self, data: &[T]) -> Result<Vec<Vec<T>>> {
        self.allgatherv(bytemuck::cast_slice(data))?.iter().map(|b| typed(b, "allgatherv")).collect()
    }

    /// Every rank's equally long slice, concatenated.
    ///
    /// # Errors
    /// As [`Communicator::allgather`].
    fn allgather_pod<T: Pod>(&self, data: &[T]) -> Result<Vec<T>> {
        typed(&self.allgather(bytemuck::cast_slice(data))?, "allgather")
    }

    /// One value from every rank.
    ///
    /// # Errors
    /// As [`Communicator::allgather`].
    fn allgather_value<T: Pod>(&self, v: T) -> Result<Vec<T>> {
        self.allgather_pod(std::slice::from_ref(&v))
    }

    /// [`Communicator::alltoallv`] of typed slices.
    ///
    /// # Errors
    /// As the byte version.
    fn alltoallv_pod<T: Pod>(&self, send: &[&[T]]) -> Result<Vec<Vec<T>>> {
        let bytes: Vec<&[u8]> = send.iter().map(|s| bytemuck::cast_slice(s)).collect();
        self.alltoallv(&bytes)?.iter().map(|b| typed(b, "alltoallv")).collect()
    }

    /// [`Communicator::broadcast`] of a typed vector.
    ///
    /// # Errors
    /// As the byte version.
    fn broadcast_pod<T: Pod>(&self, root: usize, data: &mut Vec<T>) -> Result<()> {
        let mut bytes = bytemuck::cast_slice::<T, u8>(data).to_vec();
        self.broadcast(root, &mut bytes)?;
        *data = typed(&bytes, "broadcast")?;
        Ok(())
    }
}

impl<C: Communicator + ?Sized> CommExt for C {}

fn typed<T: Pod>(b: &[u8], op: &'static str) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if size == 0 || b.len() % size != 0 {
        return Err(Error::Mismatch { op, detail: format!("{} bytes is not a whole number of {size}-byte elements", b.len()) });
    }
    Ok(bytemuck::pod_collect_to_vec(b))
}
