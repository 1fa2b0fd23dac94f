//! Device buffers every rank of a table maps: each rank's own
//! (`cuMemAlloc`, shared through CUDA IPC) and its peers', opened in it.
//! The device exchanges of distributed and hierarchy tables stage ids and
//! rows there, so a rank reads what a peer staged straight from that
//! peer's GPU memory — the same GPU (ranks sharing one, where NCCL cannot
//! run) or another one of the node, by P2P.
//!
//! Kept per table, grown collectively when a call needs more, and given
//! back in CUDA's order (peers' mappings closed, every rank met, then the
//! own buffer freed), like chunked device memory.

use wm_comm::Communicator;

use super::memory::{IPC_ALIGN, IpcMapping, SharedAlloc};
use super::storage;
use crate::CommonError;
use crate::agree::{Rule, agree};
use crate::{Error, Result, WholeMemory};

/// One table's peer buffers, behind [`WholeMemory::peer_buffers`].
///
/// Every rank holds the same view of every rank's buffer length (they
/// change only in a collective [`reserve`](Self::reserve)), so each rank
/// decides alike whether a call needs them grown.
#[derive(Debug, Default)]
pub struct PeerBuffers {
    /// Whether the ranks can map each other's buffers, once asked.
    route: Option<std::result::Result<(), String>>,
    /// Peers' buffers opened here, by rank (`None` for this rank and for
    /// ranks without one). Declared before `own`: closed before it is freed.
    peers: Vec<Option<IpcMapping>>,
    /// This rank's buffer.
    own: Option<SharedAlloc>,
    /// Every rank's buffer as this rank's GPU addresses it (0: none).
    addrs: Vec<u64>,
    /// Every rank's buffer length.
    lens: Vec<usize>,
}

/// The length a buffer grows to for `need` bytes when it holds `had`: half
/// as much again as before at least (so a slowly growing batch does not
/// reallocate every call), whole IPC blocks.
pub(crate) fn grown_len(had: usize, need: usize) -> usize {
    let want = need.max(had.saturating_add(had / 2)).max(1);
    want.checked_next_multiple_of(IPC_ALIGN).unwrap_or(want)
}

impl PeerBuffers {
    /// Whether the ranks of `mem` can map each other's device buffers:
    /// every rank on one node (by the node layout the ranks share) and
    /// every rank's GPU reachable from every other's by P2P (or the same
    /// GPU); the reason when not. Collective the first time (the P2P check
    /// is agreed across ranks), then remembered.
    ///
    /// # Errors
    /// A lost peer or a timeout while asking.
    pub fn route(&mut self, mem: &WholeMemory) -> Result<std::result::Result<(), String>> {
        if let Some(r) = &self.route {
            return Ok(r.clone());
        }
        let comm = mem.comm();
        let ids: Vec<&str> = comm.nodes().iter().map(|n| n.id()).collect();
        let nodes = wm_topology::NodeLayout::of(&ids).nodes;
        let route = if nodes > 1 {
            Err(format!("the table's {} ranks are on {nodes} nodes", comm.size()))
        } else if let Some(gpu) = mem.gpu() {
            match storage::node_gpus(comm.as_ref(), gpu) {
                Ok(_) => Ok(()),
                Err(Error::Unsupported { reason, .. }) => Err(reason),
                Err(e) => return Err(e),
            }
        } else {
            // Every rank of a device table has a GPU; a host table has no
            // device rows to exchange this way.
            Err(format!("rank {} has no GPU for this table", comm.world_rank()))
        };
        self.route = Some(route.clone());
        Ok(route)
    }

    /// Makes every rank `r`'s buffer hold at least `need[r]` bytes.
    /// Collective: every rank passes the same `need` (the callers compute
    /// it from what every rank told every rank). Buffers large enough are
    /// kept, contents and all; a grown one is new (its contents are not
    /// kept). On failure every rank returns the same error and the buffers
    /// are as they were.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when `need` does not have one entry per
    /// rank; the driver's error (allocating, opening a peer's buffer) on
    /// every rank; a lost peer.
    pub fn reserve(&mut self, mem: &WholeMemory, need: &[usize]) -> Result<()> {
        let comm = mem.comm();
        let (n, me) = (comm.size(), comm.rank());
        if need.len() != n {
            return Err(Error::Common(CommonError::InvalidArgument(format!("{} buffer sizes for {n} ranks", need.len()))));
        }
        if self.lens.len() != n {
            self.lens = vec![0; n];
            self.addrs = vec![0; n];
            self.peers = (0..n).map(|_| None).collect();
        }
        let grow: Vec<bool> = (0..n).map(|r| self.lens[r] < need[r]).collect();
        if !grow.contains(&true) {
            return Ok(());
        }
        let gpu = mem.gpu().ok_or_else(|| Error::Unsupported {
            what: "device buffers shared between ranks".into(),
            reason: mem.no_gpu_reason().unwrap_or_else(|| "this rank has no GPU".into()),
        })?;
        let lens: Vec<usize> = (0..n).map(|r| if grow[r] { grown_len(self.lens[r], need[r]) } else { self.lens[r] }).collect();
        // 1. The growing ranks allocate; every rank learns whether all did.
        let mut fresh: Option<(SharedAlloc, [u8; 64])> = None;
        let made = if grow[me] { SharedAlloc::new(gpu, lens[me]).map(|a| fresh = Some(a)).map_err(Error::from) } else { Ok(()) };
        if let Err(e) = agree(comm.as_ref(), made, Rule::Lowest) {
            // Nobody has opened the new buffer: it can go.
            fresh.into_iter().for_each(|(a, _)| a.free());
            return Err(e);
        }
        // 2. Their handles travel; every rank opens the new ones.
        let handle = fresh.as_ref().map_or(Vec::new(), |(_, h)| h.to_vec());
        let handles = match comm.allgatherv(&handle) {
            Ok(h) => h,
            Err(e) => {
                // A lost peer may hold the handle: keep the buffer (SharedAlloc's drop).
                drop(fresh);
                return Err(e.into());
            }
        };
        let opened: std::result::Result<Vec<Option<IpcMapping>>, _> = (0..n)
            .map(|r| match &handles[r] {
                h if r != me && grow[r] && h.len() == 64 => IpcMapping::open(gpu, h).map(Some),
                h if r != me && grow[r] => Err(super::driver::CuError {
                    call: "cuIpcOpenMemHandle",
                    detail: format!("rank {} sent a {}-byte IPC handle, not 64", comm.world_ranks()[r], h.len()),
                }),
                _ => Ok(None),
            })
            .collect();
        let opened = match agree(comm.as_ref(), opened.map_err(Error::from), Rule::Lowest) {
            Ok(o) => o,
            Err(e) => {
                // Every rank closed what it opened (dropped with the error);
                // once all have met the new buffers can go.
                let met = comm.barrier();
                if met.is_ok() {
                    fresh.into_iter().for_each(|(a, _)| a.free());
                }
                return Err(e);
            }
        };
        // 3. Swap in the new buffers; the old ones are closed here, and
        //    freed by their owners once every rank has closed them.
        for (r, m) in opened.into_iter().enumerate() {
            if grow[r] && r != me {
                self.addrs[r] = m.as_ref().map_or(0, IpcMapping::ptr);
                self.peers[r] = m;
            }
        }
        let old = if let Some((a, _)) = fresh {
            self.addrs[me] = a.ptr();
            self.own.replace(a)
        } else {
            None
        };
        self.lens = lens;
        comm.barrier()?;
        old.into_iter().for_each(SharedAlloc::free);
        Ok(())
    }

    /// Rank `r`'s buffer as this rank's GPU addresses it (0 before any
    /// [`reserve`](Self::reserve) gave it one).
    pub fn addr(&self, r: usize) -> u64 {
        self.addrs.get(r).copied().unwrap_or(0)
    }

    /// Rank `r`'s buffer length in bytes.
    pub fn len(&self, r: usize) -> usize {
        self.lens.get(r).copied().unwrap_or(0)
    }

    /// Whether no rank has a buffer yet.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&l| l == 0)
    }

    /// Gives the buffers back collectively, in CUDA's order: this rank
    /// closes the peers' buffers, every rank meets, then each frees its
    /// own (kept instead when the meeting fails). Nothing happens, and no
    /// rank meets, when no rank has a buffer (the same on every rank).
    ///
    /// # Errors
    /// The meeting's.
    pub(crate) fn release(&mut self, comm: &dyn Communicator) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.peers.clear();
        self.addrs.clear();
        self.lens.clear();
        let own = self.own.take();
        comm.barrier()?;
        own.into_iter().for_each(SharedAlloc::free);
        Ok(())
    }

    /// [`release`](Self::release) for a table dropped without `free()`;
    /// while unwinding from a panic the peers' buffers are closed and this
    /// rank's own is kept (a peer may still have it open).
    pub(crate) fn release_on_drop(&mut self, comm: &dyn Communicator) {
        if std::thread::panicking() {
            self.peers.clear();
            drop(self.own.take());
            return;
        }
        let _ = self.release(comm);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_grow_by_half_at_least_in_whole_ipc_blocks() {
        assert_eq!(grown_len(0, 1), IPC_ALIGN);
        assert_eq!(grown_len(0, 0), IPC_ALIGN);
        assert_eq!(grown_len(IPC_ALIGN, IPC_ALIGN + 1), 2 * IPC_ALIGN);
        // A slowly growing need: half again, not one block more.
        assert_eq!(grown_len(10 * IPC_ALIGN, 10 * IPC_ALIGN + 1), 15 * IPC_ALIGN);
        // A jump: what is needed, rounded up.
        assert_eq!(grown_len(IPC_ALIGN, 7 * IPC_ALIGN - 3), 7 * IPC_ALIGN);
        for (had, need) in [(0usize, 5usize), (3 << 20, 100 << 20), (usize::MAX / 2, usize::MAX / 2 + 1)] {
            assert!(grown_len(had, need) >= need, "{had} {need}");
        }
    }
}
