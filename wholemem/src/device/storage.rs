//! Device storage for every memory type, built collectively from the RAII
//! handles in `memory`.
//!
//! | type | what each rank holds |
//! |---|---|
//! | Continuous | one reserved range of the whole table on its GPU; every rank's `cuMemCreate`d portion, passed as a POSIX descriptor over the node's Unix sockets, mapped in it side by side at granularity boundaries |
//! | Chunked | its own `cuMemAlloc`ed rows, and every peer's opened through a CUDA IPC handle |
//! | Distributed, Hierarchy | its own `cuMemAlloc`ed rows only |
//!
//! Every step that can fail on one rank is agreed across ranks before the
//! next one, so a failure anywhere becomes the same error everywhere and no
//! rank waits for a peer that gave up.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use wm_comm::{CommExt, Communicator};

use super::driver::{self, CuError, Gpu};
use super::memory::{AddressRange, DevPtr, DeviceAlloc, IpcMapping, Mapping, PhysicalMemory, SharedAlloc, vmm_granularity};
use crate::agree::{Rule, agree};
use crate::host;
use crate::partition::Partition;
use crate::types::MemoryType;
use crate::{Error, Result};

/// What a rank holds of one device allocation. Fields are declared in the
/// order they are given back; most are held only for their `Drop`.
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum DeviceStorage {
    /// The whole table in one range of this rank's GPU.
    Continuous { maps: Vec<Mapping>, range: AddressRange },
    /// Peers' rows opened by IPC, and this rank's own (freed only by
    /// [`DeviceStorage::release`], after every peer closed it).
    Chunked { peers: Vec<Option<IpcMapping>>, own: Option<SharedAlloc>, ptrs: Vec<DevPtr> },
    /// This rank's rows only.
    Local(Option<DeviceAlloc>),
}

impl DeviceStorage {
    /// The device address of rank `r`'s first row, if this rank maps it
    /// (0 for a rank without rows).
    pub(crate) fn rank_ptr(&self, r: usize, me: usize, p: &Partition, granularity: usize) -> Option<DevPtr> {
        match self {
            Self::Continuous { range, .. } => Some(range.base() + (p.offset(r) * granularity) as u64),
            Self::Chunked { ptrs, .. } => Some(ptrs[r]),
            Self::Local(a) if r == me => Some(a.as_ref().map_or(0, DeviceAlloc::ptr)),
            Self::Local(_) => None,
        }
    }

    /// Gives the storage back collectively, in the order CUDA requires: for
    /// chunked memory, this rank closes its IPC mappings of the peers'
    /// chunks, every rank meets, and only then does each free its own
    /// chunk (freeing memory a peer still has open is undefined). The other
    /// types meet too, so no rank gives memory back while a peer may still
    /// be using it through its own mapping. What is left is dropped with
    /// the storage.
    ///
    /// # Errors
    /// The meeting's (a lost peer, a timeout); the own chunk is then kept
    /// until the process exits.
    pub(crate) fn release(&mut self, comm: &dyn Communicator) -> Result<()> {
        let meet = || comm.barrier().map_err(Error::from);
        match self {
            Self::Chunked { peers, own, ptrs } => {
                ptrs.clear();
                let own = own.take();
                release_in_order(|| peers.clear(), meet, || own.into_iter().for_each(SharedAlloc::free))
            }
            Self::Continuous { .. } | Self::Local(_) => meet(),
        }
    }

    /// [`release`](Self::release) for a table dropped without `free()`:
    /// collective as `free()` is (every rank drops its table); while
    /// unwinding from a panic, when peers cannot be expected to meet, the
    /// peers' mappings are closed and this rank's own chunk is kept.
    pub(crate) fn release_on_drop(&mut self, comm: &dyn Communicator) {
        let Self::Chunked { peers, own, .. } = self else { return };
        if peers.is_empty() && own.is_none() {
            return;
        }
        if std::thread::panicking() {
            peers.clear();
            drop(own.take());
            return;
        }
        let _ = self.release(comm);
    }
}

/// The order shared chunks are given back in: `close` this rank's mappings
/// of the peers' chunks, `meet` every rank, then `free` this rank's own —
/// unless the meeting failed, since a peer that did not arrive may still
/// have the chunk open (it is then kept: dropping `free` unused leaves it
/// to [`SharedAlloc`]'s drop, which keeps it).
fn release_in_order(close: impl FnOnce(), meet: impl FnOnce() -> Result<()>, free: impl FnOnce()) -> Result<()> {
    close();
    let met = meet();
    if met.is_ok() {
        free();
    }
    met
}

/// Where rank `r`'s piece starts in a continuous layout cut at multiples of
/// `unit` (the same rule as host memory, with the VMM granularity in place
/// of the page).
fn split(byte_offsets: &[usize], total: usize, r: usize, unit: usize) -> usize {
    let world = byte_offsets.len() - 1;
    if r == 0 {
        0
    } else if r == world {
        total.div_ceil(unit) * unit
    } else {
        byte_offsets[r] / unit * unit
    }
}

/// Every rank's GPU, as a CUDA ordinal of this process, checked for P2P
/// access from this rank's GPU.
pub(crate) fn node_gpus(comm: &dyn Communicator, gpu: &Gpu) -> Result<Vec<usize>> {
    let ids = comm.allgatherv(gpu.bus_id.as_bytes())?;
    let ranks = comm.world_ranks();
    let mine = (|| -> std::result::Result<Vec<usize>, String> {
        let mut ords = Vec::with_capacity(ids.len());
        for (r, id) in ids.iter().enumerate() {
            let bus = String::from_utf8_lossy(id);
            let o = driver::ordinal_of(&bus)?.ok_or_else(|| {
                format!("rank {}'s GPU {bus} is not visible to rank {} (check CUDA_VISIBLE_DEVICES)", ranks[r], comm.world_rank())
            })?;
            if !driver::can_access_peer(gpu.ordinal, o).map_err(|e| e.to_string())? {
                return Err(format!("rank {} (GPU {}) cannot reach rank {} (GPU {bus}) by P2P", comm.world_rank(), gpu.bus_id, ranks[r]));
            }
            ords.push(o);
        }
        Ok(ords)
    })()
    .map_err(|reason| Error::Unsupported { what: "mapping device memory of the node's ranks".into(), reason });
    agree(comm, mine, Rule::Lowest)
}

fn cu<T>(r: std::result::Result<T, CuError>) -> Result<T> {
    r.map_err(Error::from)
}

/// Allocates this rank's part of a device table. Collective over `comm`
/// (one node for the mapped types: the capability query said so).
pub(crate) fn allocate(
    comm: &dyn Communicator,
    gpu: &Arc<Gpu>,
    ty: MemoryType,
    p: &Partition,
    granularity: usize,
    total: usize,
) -> Result<DeviceStorage> {
    let me = comm.rank();
    let own_bytes = p.count(me) * granularity;
    // Every driver call below needs this GPU's context current on this
    // thread.
    agree(comm, cu(gpu.bind()), Rule::Lowest)?;
    match ty {
        MemoryType::Distributed | MemoryType::Hierarchy => {
            let own = (own_bytes > 0).then(|| DeviceAlloc::new(gpu, own_bytes)).transpose();
            Ok(DeviceStorage::Local(agree(comm, cu(own), Rule::Lowest)?))
        }
        MemoryType::Chunked => {
            let ords = node_gpus(comm, gpu)?;
            debug_assert_eq!(ords[me], gpu.ordinal);
            // Rounded up to 2 MiB (SharedAlloc::new): IPC shares whole blocks.
            let own = cu((own_bytes > 0).then(|| SharedAlloc::new(gpu, own_bytes)).transpose());
            let own = agree(comm, own, Rule::Lowest)?;
            let handle = own.as_ref().map_or(Vec::new(), |(_, h)| h.to_vec());
            let own = own.map(|(a, _)| a);
            // From here on a peer may hold this rank's chunk open: on any
            // early return `own` is kept (SharedAlloc), never freed early.
            let handles = comm.allgatherv(&handle)?;
            let peers = handles
                .iter()
                .enumerate()
                .map(|(r, h)| if r == me || h.is_empty() { Ok(None) } else { IpcMapping::open(gpu, h).map(Some) })
                .collect::<std::result::Result<Vec<_>, _>>();
            // A failed open on any rank: every rank closes what it opened
            // (the partial vector is dropped already), all meet, then free.
            let peers = match agree(comm, cu(peers), Rule::Lowest) {
                Ok(p) => p,
                Err(e) => {
                    let _ = release_in_order(|| (), || comm.barrier().map_err(Error::from), || own.into_iter().for_each(SharedAlloc::free));
                    return Err(e);
                }
            };
            let ptrs = (0..p.world())
                .map(|r| if r == me { own.as_ref().map_or(0, SharedAlloc::ptr) } else { peers[r].as_ref().map_or(0, IpcMapping::ptr) })
                .collect();
            Ok(DeviceStorage::Chunked { peers, own, ptrs })
        }
        MemoryType::Continuous => {
            let ords = node_gpus(comm, gpu)?;
            let vmm = driver::vmm_support(gpu.ordinal)
                .map_err(|reason| Error::Unsupported { what: "continuous device memory (CUDA virtual memory management)".into(), reason });
            agree(comm, vmm, Rule::Lowest)?;
            let g = agree(comm, cu(vmm_granularity(gpu.ordinal)), Rule::Lowest)?;
            let unit = comm.allgather_value(g as u64)?.into_iter().max().unwrap_or(1) as usize;
            let offs: Vec<usize> = (0..=p.world()).map(|r| p.offset(r) * granularity).collect();
            let piece = |r: usize| split(&offs, total, r + 1, unit) - split(&offs, total, r, unit);
            // This rank's pages, and a descriptor for them (an empty piece
            // sends a stand-in that nobody imports).
            let created = (|| -> Result<(Option<PhysicalMemory>, OwnedFd)> {
                if piece(me) == 0 {
                    let f = std::fs::File::open("/dev/null").map_err(|e| Error::os("opening /dev/null", e))?;
                    return Ok((None, f.into()));
                }
                let mem = cu(PhysicalMemory::create(gpu, piece(me)))?;
                let fd = cu(mem.export_fd())?;
                Ok((Some(mem), fd))
            })();
            let (own, fd) = agree(comm, created, Rule::Lowest)?;
            let exchanged = host::exchange_portions(comm, fd, None)?;
            let fds = agree(comm, exchanged, Rule::Lowest)?.fds;
            let span = split(&offs, total, p.world(), unit);
            let mapped = (|| -> Result<(Vec<Mapping>, AddressRange)> {
                let range = cu(AddressRange::reserve(gpu, span, unit))?;
                let mut maps = Vec::with_capacity(p.world());
                for (r, fd) in fds.iter().enumerate() {
                    if piece(r) == 0 {
                        continue;
                    }
                    let at = split(&offs, total, r, unit);
                    let m = match (&own, r == me) {
                        (Some(mine), true) => cu(range.map(at, mine))?,
                        _ => cu(range.map(at, &cu(PhysicalMemory::import(gpu, fd, piece(r)))?))?,
                    };
                    maps.push(m);
                }
                let mut gpus = ords.clone();
                gpus.sort_unstable();
                gpus.dedup();
                cu(range.set_access(0, span, &gpus))?;
                Ok((maps, range))
            })();
            let (maps, range) = agree(comm, mapped, Rule::Lowest)?;
            // The mappings hold the memory now; the creation handle and the
            // descriptors can go.
            drop(own);
            drop(fds);
            Ok(DeviceStorage::Continuous { maps, range })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::{release_in_order, split};
    use crate::{CommonError, Error};

    #[test]
    fn shared_chunks_are_freed_only_after_every_rank_closed_its_mappings() {
        let log = RefCell::new(Vec::new());
        let step = |s: &'static str| log.borrow_mut().push(s);
        let meet = || {
            step("meet");
            Ok(())
        };
        release_in_order(|| step("close"), meet, || step("free")).unwrap();
        assert_eq!(*log.borrow(), ["close", "meet", "free"]);
        // A peer lost on the way: its mapping may still be open, so the
        // chunk is kept, and the error is the meeting's.
        log.borrow_mut().clear();
        let e = release_in_order(
            || step("close"),
            || {
                step("meet");
                Err(Error::Common(CommonError::InvalidArgument("rank 3 lost".into())))
            },
            || step("free"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("rank 3 lost"), "{e}");
        assert_eq!(*log.borrow(), ["close", "meet"]);
    }

    #[test]
    fn continuous_pieces_cover_the_table_at_unit_boundaries() {
        // Rows of 100 bytes, ranks owning 30, 0, 50 and 20 rows; a 2 MiB unit.
        let offs = [0, 3000, 3000, 8000, 10_000];
        let unit = 2 << 20;
        let cuts: Vec<usize> = (0..=4).map(|r| split(&offs, 10_000, r, unit)).collect();
        assert_eq!(cuts, vec![0, 0, 0, 0, unit]);
        let offs = [0, 3 << 20, 5 << 20, 9 << 20];
        let cuts: Vec<usize> = (0..=3).map(|r| split(&offs, 9 << 20, r, unit)).collect();
        assert_eq!(cuts, vec![0, 2 << 20, 4 << 20, 10 << 20]);
        assert!(cuts.windows(2).all(|w| w[0] <= w[1]));
    }
}
