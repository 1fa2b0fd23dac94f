//! The one trait every backend implements, and typed helpers over it.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use bytemuck::Pod;
use wm_topology::NodeIdentity;

use crate::plan::ExchangePlan;
use crate::{Error, Result};

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
/// All communicators of a process share its connections. Several threads
/// may run collectives at once, each on a different communicator (the
/// socket endpoint hands itself over between frames to a thread waiting
/// for it); one communicator is used by one thread at a time.
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

    /// Carries out an in-place all-to-all exchange: [`alltoallv`](Self::alltoallv)
    /// without intermediate buffers, laid out by `plan` (what goes to each
    /// rank, written in place; where each peer's rows land; the work that
    /// overlaps the transfer; who receives each part). See [`ExchangePlan`].
    ///
    /// The socket backend has `fill` write payloads of 16 KiB or more for
    /// ranks on this node straight into shared memory, where the receiver
    /// reads them: one copy each side and no trip through the socket. The
    /// MPI backend moves the parts for other nodes through MPI, filled
    /// straight into the one buffer it sends from, and those for this node
    /// as the socket backend does. Parts are received in rank order.
    ///
    /// # Errors
    /// As [`alltoallv`](Self::alltoallv); [`Error::InvalidArgument`] when
    /// the plan's sizes or landing rows are not one per rank, or its rows
    /// lie beyond its output. On an error, steps of the plan's work may be
    /// left undone.
    fn exchange(&self, plan: ExchangePlan<'_>) -> Result<()>;

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

    /// This communicator as [`Any`](std::any::Any), so that a backend's
    /// own extension (the MPI backend's `MpiExt::as_mpi`) can find its
    /// type behind a `dyn Communicator`.
    fn as_any(&self) -> &dyn std::any::Any;

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
