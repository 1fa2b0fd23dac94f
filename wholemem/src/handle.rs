//! The WholeMemory handle: one collective allocation of a row-partitioned
//! table.

use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use wm_comm::{CommExt, Communicator};

use crate::CommonError;
use crate::agree::{Rule, agree};
use crate::capability::{Support, query};
use crate::host::locks::RowLocks;
use crate::host::{self, HostStorage};
use crate::partition::Partition;
use crate::types::{Location, MemoryType};
use crate::{Error, Result};

mod portion;
#[cfg(feature = "cuda")]
mod reach;
mod rows;
mod written;

pub use portion::{MappedPortion, Portion};

/// What a collective allocation asks for. Every rank must pass the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocRequest {
    /// The memory type.
    pub ty: MemoryType,
    /// The location.
    pub loc: Location,
    /// Bytes in the whole table.
    pub total: usize,
    /// Bytes in one row; a row is never split between ranks.
    pub granularity: usize,
    /// Rows per rank; `None` for `ceil(rows / world)` each.
    pub partition: Option<Vec<usize>>,
}

impl AllocRequest {
    fn encode(&self) -> Vec<u64> {
        let mut v = vec![u64::from(self.ty.code()), u64::from(self.loc.code()), self.total as u64, self.granularity as u64];
        match &self.partition {
            None => v.push(u64::MAX),
            Some(p) => {
                v.push(p.len() as u64);
                v.extend(p.iter().map(|&c| c as u64));
            }
        }
        v
    }

    /// The first field where two encoded requests differ, in words.
    fn difference(enc: &[u64], other: &[u64]) -> Option<String> {
        if enc.len() < 5 || other.len() < 5 {
            return Some("the request itself (a malformed encoding)".to_owned());
        }
        let names = ["memory type", "location", "total size", "granularity"];
        for (i, n) in names.iter().enumerate() {
            if enc[i] != other[i] {
                let show = |v: &[u64]| match i {
                    0 => MemoryType::ALL.get(v[0] as usize).map_or("?".into(), |t| t.to_string()),
                    1 => Location::ALL.get(v[1] as usize).map_or("?".into(), |l| l.to_string()),
                    _ => v[i].to_string(),
                };
                return Some(format!("{n}: {} vs {}", show(enc), show(other)));
            }
        }
        if enc[4..] != other[4..] {
            let show = |v: &[u64]| {
                if v[4] == u64::MAX { "the default".to_owned() } else { format!("{:?}", &v[5..]) }
            };
            return Some(format!("partition: {} vs {}", show(enc), show(other)));
        }
        None
    }
}

/// One table of `total` bytes partitioned by rows across the ranks of a
/// communicator.
///
/// Created and freed collectively. What a rank can reach depends on the
/// type: every row for Continuous and Chunked, its own rows for Distributed
/// and Hierarchy.
///
/// # Concurrency across processes
/// The memory is shared with other processes, which Rust's borrow rules
/// cannot see. So the safe accessors copy: [`read_rows`](Self::read_rows),
/// [`write_rows`](Self::write_rows), [`read_local`](Self::read_local),
/// [`write_local`](Self::write_local) (and gather and scatter) move bytes
/// through raw pointers and never hold a reference into shared memory; a
/// row another rank writes at the same time may be copied half-written,
/// never unsoundly. The in-place slices
/// ([`local_bytes`](Self::local_bytes),
/// [`local_bytes_mut`](Self::local_bytes_mut)) are `unsafe`: their caller
/// promises that no other process writes the rows while they live.
/// Separate writes from reads with a collective
/// ([`Communicator::barrier`]), as with any PGAS memory.
///
/// # Identity and writes
/// Each allocation has a [`serial`](Self::serial) number that no other
/// table of the process ever gets, and each rank's rows a
/// [`write_generation`](Self::write_generation) that every write to them
/// moves: what caches of the rows check before trusting what they hold.
#[derive(Debug)]
pub struct WholeMemory {
    /// This allocation's number in the process ([`Self::serial`]).
    serial: u64,
    /// How often this process wrote its own rows (where no shared
    /// generation is kept: see [`Self::write_generation`]).
    own_writes: AtomicU64,
    comm: Arc<dyn Communicator>,
    hierarchy: Option<(Arc<dyn Communicator>, Arc<dyn Communicator>)>,
    ty: MemoryType,
    loc: Location,
    total: usize,
    granularity: usize,
    partition: Partition,
    /// Host storage registered with CUDA, given back before the storage.
    #[cfg(feature = "cuda")]
    registrations: Vec<crate::device::HostRegistration>,
    storage: Storage,
    /// First byte of each rank's rows, where this rank maps them (host
    /// memory).
    chunk_ptrs: Vec<Option<RowPtr>>,
    /// Each rank's first row as this rank's GPU addresses it: device memory,
    /// or host memory registered with CUDA.
    device_ptrs: Vec<Option<u64>>,
    /// Striped locks shared by the node's ranks (host mapped types only).
    row_locks: Option<RowLocks>,
    /// The sealed memfds holding this rank's rows (host memory): every
    /// rank's for Continuous (a rank's rows may end in its successor's),
    /// this rank's own otherwise.
    portion_fds: Vec<OwnedFd>,
    /// [`huge_page_bytes`](Self::huge_page_bytes) of a mapped host table,
    /// measured at allocation.
    mapped_huge_bytes: usize,
    /// This rank's GPU, or why it has none.
    #[cfg(feature = "cuda")]
    gpu: std::result::Result<Arc<crate::device::driver::Gpu>, String>,
    /// Why this rank's host rows are not registered with CUDA although it
    /// has a GPU (the driver refused).
    #[cfg(feature = "cuda")]
    registration_refused: Option<String>,
    /// NCCL over the table's ranks (device distributed and hierarchy
    /// memory), or why rows travel through the host instead.
    #[cfg(feature = "cuda")]
    nccl: std::result::Result<Arc<wm_comm::nccl::NcclComm>, String>,
    /// The device buffers this table's ranks share for their device
    /// exchanges, created on first use.
    #[cfg(feature = "cuda")]
    peer: std::sync::Mutex<crate::device::PeerBuffers>,
}

#[cfg(feature = "cuda")]
impl Drop for WholeMemory {
    /// A table dropped without [`free`](Self::free) still gives device
    /// memory back in CUDA's order (see `DeviceStorage::release_on_drop`).
    fn drop(&mut self) {
        let peer = self.peer.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        peer.release_on_drop(self.comm.as_ref());
        if let Storage::Device(s) = &mut self.storage {
            s.release_on_drop(self.comm.as_ref());
        }
    }
}

/// What a rank holds: host or device storage.
#[derive(Debug)]
enum Storage {
    Host(HostStorage),
    #[cfg(feature = "cuda")]
    Device(#[allow(dead_code)] crate::device::DeviceStorage),
}

/// A pointer into memory owned by the handle that holds it.
#[derive(Debug, Clone, Copy)]
struct RowPtr(*mut u8);
// SAFETY: the pointee is shared memory owned by the same WholeMemory; access
// through it follows the handle's documented cross-process contract.
unsafe impl Send for RowPtr {}
// SAFETY: as above.
unsafe impl Sync for RowPtr {}

impl WholeMemory {
    /// Allocates a table collectively: every rank of `comm` calls this with
    /// the same request.
    ///
    /// Every rank first learns every other rank's request, so a bad request
    /// gives the same error on every rank and leaves the communicator usable.
    ///
    /// # Errors
    /// - [`crate::CommonError::InvalidArgument`] naming the value: a granularity of 0 or
    ///   one that does not divide `total`; a partition of the wrong length or
    ///   sum; requests that differ between ranks (naming the ranks and field).
    /// - [`Error::Unsupported`] with the reason from [`query`].
    /// - [`crate::CommonError::PeerFailed`] / [`Error::Os`] when memory cannot be had.
    /// - [`Error::Comm`] when a peer is lost or times out.
    pub fn allocate(comm: &Arc<dyn Communicator>, req: &AllocRequest) -> Result<Self> {
        let partition = Self::agree_request(comm.as_ref(), req)?;
        let me = comm.rank();
        let (total, granularity) = (req.total, req.granularity);
        let hierarchy = (req.ty == MemoryType::Hierarchy).then(|| (comm.local(), comm.cross()));
        if req.loc == Location::Device {
            return Self::allocate_device(comm, req, partition, hierarchy);
        }
        let (exchanged, own) = match req.ty {
            MemoryType::Continuous | MemoryType::Chunked => {
                let created = host::create_portion(req.ty, &partition, granularity, total, me).and_then(|portion| {
                    let locks = if me == 0 {
                        Some(host::locks::create(comm.size()).map_err(|e| Error::os("creating the row-lock table", e))?)
                    } else {
                        None
                    };
                    // Where the kernel has no pidfds, a stand-in: this rank's
                    // death then cannot be seen by the row locks' waiters,
                    // which wait for the timeout instead.
                    let pidfd = host::locks::own_pidfd()
                        .or_else(|_| std::fs::File::open("/dev/null").map(OwnedFd::from))
                        .map_err(|e| Error::os("opening a pidfd of this process", e))?;
                    Ok((portion, locks, pidfd))
                });
                let (mine, locks, pidfd) = agree(comm.as_ref(), created, Rule::Lowest)?;
                // Every descriptor that arrives is checked against the size
                // this rank computes for it from the (agreed) request.
                let sizes = |r: usize| host::portion_bytes(req.ty, &partition, granularity, total, r).0;
                let extras = host::HostExtras { pidfd, locks, sizes: &sizes };
                let exchanged = host::exchange_portions(comm.as_ref(), mine, Some(extras))?;
                (Some(agree(comm.as_ref(), exchanged, Rule::Lowest)?), None)
            }
            // This rank's rows only, in a memfd of their own: private to
            // the process until a one-sided reader is handed it.
            MemoryType::Distributed | MemoryType::Hierarchy => {
                let own = agree(comm.as_ref(), host::create_portion(req.ty, &partition, granularity, total, me), Rule::Lowest)?;
                (None, Some(own))
            }
        };
        let (fds, pidfds, lock_fd) = match (exchanged, own) {
            (Some(host::Exchanged { fds, pidfds, locks }), _) => (fds, pidfds, locks),
            (None, own) => (own.into_iter().collect(), Vec::new(), None),
        };
        let mapped = host::map_storage(req.ty, &partition, granularity, total, me, &fds).and_then(|storage| {
            let locks = match lock_fd {
                Some(fd) => {
                    let timeout = wm_topology::env::timeout().map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
                    let locks = RowLocks::open(std::os::fd::AsFd::as_fd(&fd), me, pidfds, timeout);
                    Some(locks.map_err(|e| Error::os("mapping the row-lock table", e))?)
                }
                None => None,
            };
            Ok((storage, locks))
        });
        let (storage, row_locks) = agree(comm.as_ref(), mapped, Rule::Lowest)?;
        // Keep the memfds that hold this rank's rows (for one-sided
        // readers); the mappings hold what they need of the others.
        let portion_fds: Vec<OwnedFd> = match req.ty {
            MemoryType::Continuous => fds,
            MemoryType::Chunked => fds.into_iter().nth(me).into_iter().collect(),
            MemoryType::Distributed | MemoryType::Hierarchy => fds,
        };
        let storage_huge = if req.ty.is_mapped() { storage.huge_bytes() } else { 0 };
        let chunk_ptrs: Vec<Option<RowPtr>> =
            (0..comm.size()).map(|r| storage.rank_ptr(r, me, &partition, granularity).map(RowPtr)).collect();
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut mem = Self {
            serial: written::next_serial(),
            own_writes: AtomicU64::new(0),
            comm: comm.clone(),
            hierarchy,
            ty: req.ty,
            loc: req.loc,
            total,
            granularity,
            partition,
            #[cfg(feature = "cuda")]
            registrations: Vec::new(),
            storage: Storage::Host(storage),
            device_ptrs: vec![None; chunk_ptrs.len()],
            chunk_ptrs,
            row_locks,
            portion_fds,
            mapped_huge_bytes: if req.ty.is_mapped() { storage_huge } else { 0 },
            #[cfg(feature = "cuda")]
            gpu: Err(String::new()),
            #[cfg(feature = "cuda")]
            registration_refused: None,
            #[cfg(feature = "cuda")]
            nccl: Err("host memory".into()),
            #[cfg(feature = "cuda")]
            peer: Default::default(),
        };
        #[cfg(feature = "cuda")]
        mem.register_host();
        Ok(mem)
    }

    /// [`allocate`](Self::allocate)'s first step: every rank learns every
    /// rank's request, so a request that differs, is invalid or cannot be
    /// had here is the same error on every rank. The partition.
    fn agree_request(comm: &dyn Communicator, req: &AllocRequest) -> Result<Partition> {
        let enc = req.encode();
        let all = comm.allgatherv_pod(&enc)?;
        let ranks = comm.world_ranks();
        for (r, other) in all.iter().enumerate() {
            if let Some(d) = AllocRequest::difference(&all[0], other) {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "ranks passed different allocation requests: rank {} and rank {} differ in {d}",
                    ranks[0], ranks[r]
                ))));
            }
        }
        // Every rank now holds the same request; validate it identically.
        let partition = validate(req, comm.size())?;
        let what = format!("{} {} memory", req.loc, req.ty);
        if let Support::Unsupported { reason } = query(comm, req.ty, req.loc) {
            return Err(Error::Unsupported { what, reason });
        }
        Ok(partition)
    }

    /// This rank's index among the ranks of its node.
    #[cfg(feature = "cuda")]
    fn local_rank(comm: &dyn Communicator) -> usize {
        let ids: Vec<&str> = comm.nodes().iter().map(|n| n.id()).collect();
        wm_topology::NodeLayout::of(&ids).local[comm.rank()]
    }

    #[cfg(not(feature = "cuda"))]
    fn allocate_device(
        _comm: &Arc<dyn Communicator>,
        req: &AllocRequest,
        _p: Partition,
        _h: Option<(Arc<dyn Communicator>, Arc<dyn Communicator>)>,
    ) -> Result<Self> {
        Err(Error::Unsupported { what: format!("{} {} memory", req.loc, req.ty), reason: crate::NO_CUDA.into() })
    }

    #[cfg(feature = "cuda")]
    fn allocate_device(
        comm: &Arc<dyn Communicator>,
        req: &AllocRequest,
        partition: Partition,
        hierarchy: Option<(Arc<dyn Communicator>, Arc<dyn Communicator>)>,
    ) -> Result<Self> {
        let bound = crate::device::bind(Self::local_rank(comm.as_ref()))
            .map_err(|reason| Error::Unsupported { what: format!("{} {} memory", req.loc, req.ty), reason });
        let gpu = agree(comm.as_ref(), bound, Rule::Lowest)?;
        let me = comm.rank();
        let storage = crate::device::storage::allocate(comm.as_ref(), &gpu, req.ty, &partition, req.granularity, req.total)?;
        let device_ptrs = (0..comm.size()).map(|r| storage.rank_ptr(r, me, &partition, req.granularity)).collect();
        let nccl = if req.ty.is_mapped() {
            Err(format!("{} memory is reached through the mapping", req.ty))
        } else if comm.size() == 1 {
            Err("one rank: nothing to exchange".into())
        } else {
            agree(comm.as_ref(), gpu.bind().map_err(Error::from), Rule::Lowest)?;
            match wm_comm::nccl::NcclComm::new(comm.as_ref(), &gpu.bus_id) {
                Ok(c) => Ok(Arc::new(c)),
                Err(wm_comm::Error::Unsupported { reason, .. }) => Err(reason),
                Err(e) => return Err(e.into()),
            }
        };
        Ok(Self {
            serial: written::next_serial(),
            own_writes: AtomicU64::new(0),
            comm: comm.clone(),
            hierarchy,
            ty: req.ty,
            loc: req.loc,
            total: req.total,
            granularity: req.granularity,
            partition,
            registrations: Vec::new(),
            storage: Storage::Device(storage),
            chunk_ptrs: vec![None; comm.size()],
            device_ptrs,
            row_locks: None,
            portion_fds: Vec::new(),
            mapped_huge_bytes: 0,
            gpu: Ok(gpu),
            registration_refused: None,
            nccl,
            peer: Default::default(),
        })
    }

    /// With a GPU at hand, registers the host storage with CUDA (portable,
    /// device-mapped) so kernels read it directly. Not collective, and never
    /// an error: should the driver refuse, the table keeps its GPU (device
    /// buffers, the device cache and device outputs work, copying host rows
    /// instead of reading them in place), and the reason is reported on
    /// stderr and kept ([`host_registration`](Self::host_registration)).
    #[cfg(feature = "cuda")]
    fn register_host(&mut self) {
        let bound = match crate::device::status() {
            Err(why) => Err(why),
            Ok(_) => crate::device::bind(Self::local_rank(self.comm.as_ref())),
        };
        let Storage::Host(storage) = &self.storage else { return };
        let regions: Vec<(usize, *mut u8, usize)> = match storage {
            HostStorage::Continuous(res) => vec![(0, res.ptr(), res.len())],
            HostStorage::Chunked(maps) => maps.iter().enumerate().filter_map(|(r, m)| m.as_ref().map(|m| (r, m.ptr(), m.len()))).collect(),
            HostStorage::Local(m) => m.as_ref().map(|m| (self.comm.rank(), m.ptr(), m.len())).into_iter().collect(),
        };
        let reach = reach::reach_host(bound, &regions, |gpu, ptr, len| {
            // SAFETY: the region is mapped by `self.storage`, which outlives
            // the registration (registrations are declared, so dropped,
            // first).
            unsafe { crate::device::HostRegistration::new(gpu, ptr, len) }
        });
        self.gpu = reach.gpu;
        if let Some(why) = &reach.refused {
            wm_comm::warn(&format!("rank {}'s {} host table: {why}", self.comm.world_rank(), self.ty));
        }
        self.registration_refused = reach.refused;
        for (r, reg) in reach.registered {
            if let HostStorage::Continuous(_) = storage {
                for q in 0..self.device_ptrs.len() {
                    self.device_ptrs[q] = Some(reg.device_ptr() + (self.partition.offset(q) * self.granularity) as u64);
                }
            } else {
                self.device_ptrs[r] = Some(reg.device_ptr());
            }
            self.registrations.push(reg);
        }
        // Ranks without rows have nothing to register and nothing to reach.
        if let HostStorage::Chunked(_) = storage
            && self.gpu.is_ok()
            && self.registration_refused.is_none()
        {
            for (r, p) in self.device_ptrs.iter_mut().enumerate() {
                if p.is_none() && self.partition.count(r) == 0 {
                    *p = Some(0);
                }
            }
        }
    }

    /// Whether this rank's GPU reads the host rows it maps of this table in
    /// place (registered with CUDA: page-locked and mapped for the GPU), or
    /// why not — no GPU (its reason), or the driver refused the
    /// registration (its reason, also reported on stderr when the table was
    /// allocated). A refusal only costs speed: device buffers, the device
    /// cache and gathers into device memory still work, copying host rows
    /// up instead. Always `Ok` for device memory.
    #[cfg(feature = "cuda")]
    pub fn host_registration(&self) -> std::result::Result<(), &str> {
        if self.loc == Location::Device {
            return Ok(());
        }
        match (&self.gpu, &self.registration_refused) {
            (Err(why), _) => Err(if why.is_empty() { "this rank is bound to no GPU" } else { why }),
            (Ok(_), Some(why)) => Err(why),
            (Ok(_), None) => Ok(()),
        }
    }

    /// The NCCL communicator device rows of distributed and hierarchy
    /// memory travel through, or why they travel through the host
    /// communicator instead (e.g. "ranks 0 and 1 share GPU …").
    #[cfg(feature = "cuda")]
    pub fn device_comm(&self) -> std::result::Result<&dyn wm_comm::nccl::DeviceCommunicator, &str> {
        match &self.nccl {
            Ok(c) => Ok(c.as_ref()),
            Err(why) => Err(why),
        }
    }

    /// The device buffers this table's ranks share for the device exchanges
    /// of distributed and hierarchy memory (`wm_gather`'s), locked for one
    /// collective call: see [`PeerBuffers`](crate::device::PeerBuffers).
    /// A poisoned lock (a panic during an earlier call) is taken over: the
    /// buffers themselves stay valid.
    #[cfg(feature = "cuda")]
    pub fn peer_buffers(&self) -> std::sync::MutexGuard<'_, crate::device::PeerBuffers> {
        self.peer.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This rank's GPU, when it has one for this table.
    #[cfg(feature = "cuda")]
    pub(crate) fn gpu(&self) -> Option<&Arc<crate::device::driver::Gpu>> {
        self.gpu.as_ref().ok()
    }

    /// Why this rank has no GPU for this table.
    #[cfg(feature = "cuda")]
    pub(crate) fn no_gpu_reason(&self) -> Option<String> {
        self.gpu.as_ref().err().filter(|s| !s.is_empty()).cloned()
    }

    /// Frees the table collectively: returns once every rank has stopped
    /// using it.
    ///
    /// # Errors
    /// When a peer is lost or times out (the local memory is released anyway).
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    pub fn free(mut self) -> Result<()> {
        let comm = self.comm.clone();
        // A peer may still be reading this rank's device rows through its
        // own mapping: device storage is given back in the order CUDA
        // requires (peers' mappings closed, every rank met, then freed).
        #[cfg(feature = "cuda")]
        {
            // The shared exchange buffers first, in the same order.
            let peer = self.peer.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).release(comm.as_ref());
            if let Storage::Device(s) = &mut self.storage {
                s.release(comm.as_ref())?;
            }
            peer?;
        }
        drop(self);
        comm.barrier().map_err(Error::from)
    }

    /// The communicator the table spans.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }

    /// The ranks of this node (Hierarchy only).
    pub fn local_comm(&self) -> Option<&Arc<dyn Communicator>> {
        self.hierarchy.as_ref().map(|(l, _)| l)
    }

    /// The ranks with this local rank on every node (Hierarchy only).
    pub fn cross_comm(&self) -> Option<&Arc<dyn Communicator>> {
        self.hierarchy.as_ref().map(|(_, c)| c)
    }

    /// The memory type.
    pub fn memory_type(&self) -> MemoryType {
        self.ty
    }

    /// The location.
    pub fn location(&self) -> Location {
        self.loc
    }

    /// Bytes in the whole table.
    pub fn total_bytes(&self) -> usize {
        self.total
    }

    /// Bytes per row.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Rows in the whole table.
    pub fn rows(&self) -> usize {
        self.partition.rows()
    }

    /// Which rank owns which rows.
    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    /// The rows this rank owns.
    pub fn local_rows(&self) -> Range<usize> {
        self.partition.range(self.comm.rank())
    }

    /// Threads this rank uses to copy its rows (gather, scatter, file
    /// loading): `WM_THREADS` if set, else the machine's cores (as this
    /// process first found them) divided by the ranks on this machine —
    /// ranks with this rank's host name, which share its cores even when
    /// `WM_NODE_ID` poses them as other nodes.
    pub fn copy_threads(&self) -> usize {
        if let Ok(Some(n)) = wm_topology::env::WM_THREADS.parse::<usize>() {
            return n.max(1);
        }
        let nodes = self.comm.nodes();
        let host = nodes[self.comm.rank()].hostname();
        let here = nodes.iter().filter(|n| n.hostname() == host).count();
        (crate::cores::cores() / here.max(1)).max(1)
    }

    /// Threads this rank uses for a CPU-bound call now (gather, scatter,
    /// sampling): `WM_THREADS` if set; else [`copy_threads`](Self::copy_threads)'s
    /// share of the cores, but only as many beyond the calling thread as
    /// cores are idle now ([`idle_threads_now`](crate::cores::idle_threads_now)). On cores that other work
    /// keeps busy, a second thread does not run beside the first: it waits
    /// its turn, and the call waits for it — slower than one thread.
    /// At most the calling thread's cap
    /// ([`cap_this_thread`](crate::cores::cap_this_thread)), if it has one.
    pub fn compute_threads(&self) -> usize {
        let share = self.copy_threads();
        let share = crate::cores::this_threads_cap().map_or(share, |cap| share.min(cap));
        if share <= 1 || matches!(wm_topology::env::WM_THREADS.parse::<usize>(), Ok(Some(_))) {
            return share;
        }
        share.min(1 + crate::cores::idle_threads_now())
    }

    /// Bytes of the table this process maps with huge pages (host memory;
    /// 0 for device memory), from `/proc/self/smaps`: for Continuous and
    /// Chunked measured once at allocation (every page exists by then; it
    /// counts every rank's rows this rank maps), for Distributed and
    /// Hierarchy at each call (private pages appear when first written).
    /// Compare it with [`mapped_bytes`](Self::mapped_bytes).
    ///
    /// Shared portions of at least 16 huge pages are built from huge pages
    /// where the kernel allows (`WM_HUGE_PAGES=off` declines);
    /// Distributed and Hierarchy rows are private memory, which gets huge
    /// pages as transparent huge pages allow.
    pub fn huge_page_bytes(&self) -> usize {
        match &self.storage {
            Storage::Host(_) if self.ty.is_mapped() => self.mapped_huge_bytes,
            Storage::Host(h) => h.huge_bytes(),
            #[cfg(feature = "cuda")]
            Storage::Device(_) => 0,
        }
    }

    /// Bytes of the table this process maps: the whole table for
    /// Continuous and Chunked, this rank's rows otherwise.
    pub fn mapped_bytes(&self) -> usize {
        match self.ty {
            MemoryType::Continuous | MemoryType::Chunked => self.total,
            MemoryType::Distributed | MemoryType::Hierarchy => self.partition.count(self.comm.rank()) * self.granularity,
        }
    }

    /// The first byte of rank `r`'s rows in this process's address space,
    /// if this rank maps them (every rank for Continuous and Chunked, itself
    /// only otherwise; never for device memory). Dangling but non-null for a
    /// rank without rows.
    pub fn rank_ptr(&self, r: usize) -> Option<*mut u8> {
        self.chunk_ptrs.get(r).copied().flatten().map(|p| p.0)
    }

    /// The device address of rank `r`'s first row as this rank's GPU sees
    /// it: device memory this rank maps, or host memory registered with
    /// CUDA. `None` when the GPU cannot reach those rows directly.
    pub fn device_ptr(&self, r: usize) -> Option<u64> {
        self.device_ptrs.get(r).copied().flatten()
    }

    /// The striped row locks that writers through the mapping take, so
    /// concurrent writes to one row from several ranks never tear it
    /// (Continuous and Chunked only).
    pub fn row_locks(&self) -> Option<&RowLocks> {
        self.row_locks.as_ref()
    }

    /// The pointer through which every row is reachable (Continuous only):
    /// row `i` starts at `base + i * granularity`.
    pub fn continuous_base(&self) -> Option<*mut u8> {
        match &self.storage {
            Storage::Host(HostStorage::Continuous(res)) => Some(res.ptr()),
            _ => None,
        }
    }
}

fn validate(req: &AllocRequest, world: usize) -> Result<Partition> {
    if req.granularity == 0 {
        return Err(Error::Common(CommonError::InvalidArgument("granularity 0: a row must have at least one byte".into())));
    }
    if req.total == 0 {
        return Err(Error::Common(CommonError::InvalidArgument("total size 0: a table needs at least one row".into())));
    }
    // No mapping can be larger, and the layout's page rounding stays far
    // from overflowing below this.
    if req.total > isize::MAX as usize {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "total size {}: larger than any address space (at most isize::MAX = {} bytes)",
            req.total,
            isize::MAX
        ))));
    }
    if req.total % req.granularity != 0 {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "granularity {} does not divide the total size {} (a row is never split)",
            req.granularity, req.total
        ))));
    }
    let rows = req.total / req.granularity;
    match &req.partition {
        None => Ok(Partition::even(rows, world)),
        Some(p) if p.len() != world => {
            Err(Error::Common(CommonError::InvalidArgument(format!("the partition has {} entries for {world} ranks: {p:?}", p.len()))))
        }
        Some(p) => {
            let sum = p.iter().try_fold(0usize, |a, &c| a.checked_add(c));
            if sum != Some(rows) {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "the partition {p:?} sums to {} rows, the table has {rows}",
                    sum.map_or("more than usize::MAX".to_owned(), |s| s.to_string())
                ))));
            }
            Ok(Partition::from_counts(p))
        }
    }
}
