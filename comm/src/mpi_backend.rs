//! The MPI backend (feature `mpi`): collectives through the MPI library the
//! job was started with, descriptors through the socket mesh.
//!
//! Chosen by [`crate::init`] when `mpirun` (or another PMI launcher) started
//! the process and `WM_BACKEND` does not say `socket`. The socket mesh that
//! carries descriptors between ranks of a node meets through an MPI
//! allgather, so no `WM_RENDEZVOUS` is needed. A rank that dies is handled
//! by the MPI runtime, which ends the job (Open MPI's `mpirun` does so as
//! soon as a process exits without finalizing).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use wm_topology::NodeIdentity;

use crate::communicator::Communicator;
use crate::socket::SocketComm;
use crate::{Error, Result};

/// Keeps MPI initialised while any communicator lives; finalises after the
/// last one.
struct Runtime(#[allow(dead_code)] Universe);
// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED and every call goes
// through a communicator's mutex, so the universe is never used from two
// threads at once.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

/// An MPI communicator handle, used only under its mutex.
struct Handle(SimpleCommunicator);
// SAFETY: serialised by the owning Mutex, with MPI_THREAD_SERIALIZED.
unsafe impl Send for Handle {}

/// A communicator of the MPI backend.
#[derive(Clone)]
pub struct MpiComm {
    inner: Arc<Inner>,
}

struct Inner {
    // Field order is drop order: the handle before the runtime.
    mpi: Mutex<Handle>,
    sock: SocketComm,
    local: OnceLock<Arc<dyn Communicator>>,
    cross: OnceLock<Arc<dyn Communicator>>,
    runtime: Arc<Runtime>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

/// Whether an MPI launcher started this process (and `WM_RANK` did not).
pub fn launched_by_mpi() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    !set(wm_topology::env::WM_RANK.name) && (set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE") || set("PMIX_RANK"))
}

fn count(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{n} bytes in one MPI message; MPI counts stop at {}", i32::MAX)))
}

fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

/// The job key for the socket mesh: `WM_JOB_KEY` where set (it must then be
/// the same everywhere), else one rank 0 draws and broadcasts over MPI —
/// the MPI runtime already decides who belongs to the job.
fn job_key(world: &SimpleCommunicator) -> Result<crate::JobKey> {
    let mut bytes = [0u8; crate::auth::KEY_LEN];
    if world.rank() == 0 {
        let key = match crate::JobKey::from_env()? {
            Some(k) => k,
            None => crate::JobKey::generate()?,
        };
        bytes = *key.bytes();
    }
    world.process_at_rank(0).broadcast_into(&mut bytes[..]);
    let key = crate::JobKey::from_bytes(bytes);
    zeroize::Zeroize::zeroize(&mut bytes);
    Ok(key)
}

impl MpiComm {
    /// The world communicator: initialises MPI and the socket mesh.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when MPI is already initialised or does not
    /// offer serialised threading.
    pub fn from_env() -> Result<Self> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| Error::Bootstrap("MPI is already initialised in this process".into()))?;
        if threading < mpi::Threading::Serialized {
            return Err(Error::Bootstrap(format!("the MPI library offers only {threading:?} threading; wholemem needs Serialized")));
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let timeout = wm_topology::env::timeout().map_err(Error::Bootstrap)?;
        let handle = Handle(world);
        let key = job_key(&handle.0)?;
        let sock = {
            let mut ex = |mine: &[u8]| allgatherv(&handle.0, mine);
            SocketComm::bootstrap_with(rank, size, timeout, &key, &mut ex)?
        };
        Ok(Self::wrap(handle, sock, Arc::new(Runtime(universe))))
    }

    fn wrap(h: Handle, sock: SocketComm, runtime: Arc<Runtime>) -> Self {
        Self { inner: Arc::new(Inner { mpi: Mutex::new(h), sock, local: OnceLock::new(), cross: OnceLock::new(), runtime }) }
    }

    fn mpi(&self) -> MutexGuard<'_, Handle> {
        self.inner.mpi.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sub-communicator: MPI split by colour, matched with the socket
    /// communicator of the same members.
    /// A sub-communicator: the MPI communicator split by colour and key,
    /// paired with the socket communicator of the same members.
    fn sub(&self, color: i32, key: i32, sock: SocketComm) -> Result<Arc<dyn Communicator>> {
        let split = self.mpi().0.split_by_color_with_key(Color::with_value(color), key);
        let h = split.ok_or_else(|| Error::Bootstrap("MPI split returned no communicator".into()))?;
        Ok(Arc::new(Self::wrap(Handle(h), sock, self.inner.runtime.clone())))
    }
}

/// A buffer of `len` bytes whose pointer is a real allocation even when
/// empty: an empty slice's dangling pointer is 0x1, which Open MPI takes for
/// `MPI_IN_PLACE`.
fn real(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(1)];
    v.truncate(len);
    v
}

fn allgatherv(c: &SimpleCommunicator, data: &[u8]) -> Result<Vec<Vec<u8>>> {
    let n = c.size() as usize;
    let mine = count(data.len())?;
    let mut counts = vec![0i32; n];
    c.all_gather_into(&mine, &mut counts[..]);
    let d = displs(&counts);
    let total: usize = counts.iter().map(|&x| x as usize).sum();
    let mut buf = real(total);
    let empty = [0u8; 1];
    let send = if data.is_empty() { &empty[..0] } else { data };
    {
        let mut part = PartitionMut::new(&mut buf[..], &counts[..], &d[..]);
        c.all_gather_varcount_into(send, &mut part);
    }
    Ok((0..n).map(|r| buf[d[r] as usize..][..counts[r] as usize].to_vec()).collect())
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.inner.sock.rank()
    }
    fn size(&self) -> usize {
        self.inner.sock.size()
    }
    fn world_ranks(&self) -> &[usize] {
        self.inner.sock.world_ranks()
    }
    fn nodes(&self) -> &[NodeIdentity] {
        self.inner.sock.nodes()
    }
    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn barrier(&self) -> Result<()> {
        self.mpi().0.barrier();
        Ok(())
    }

    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        if root >= self.size() {
            return Err(Error::InvalidArgument(format!("broadcast root {root} is not a rank of a communicator of {} ranks", self.size())));
        }
        let h = self.mpi();
        let p = h.0.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        p.broadcast_into(&mut len);
        data.resize(usize::try_from(len).map_err(|_| Error::InvalidArgument("broadcast too large".into()))?, 0);
        if len > 0 {
            p.broadcast_into(&mut data[..]);
        }
        Ok(())
    }

    fn allgatherv(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        allgatherv(&self.mpi().0, data)
    }

    fn alltoallv(&self, send: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        if send.len() != n {
            return Err(Error::InvalidArgument(format!("alltoallv got {} send buffers for a communicator of {n} ranks", send.len())));
        }
        let scounts = send.iter().map(|s| count(s.len())).collect::<Result<Vec<i32>>>()?;
        let sdispls = displs(&scounts);
        // Capacity of at least one byte keeps the pointer real (see `real`).
        let mut flat = Vec::with_capacity(send.iter().map(|s| s.len()).sum::<usize>().max(1));
        for s in send {
            flat.extend_from_slice(s);
        }
        let h = self.mpi();
        let mut rcounts = vec![0i32; n];
        h.0.all_to_all_into(&scounts[..], &mut rcounts[..]);
        let rdispls = displs(&rcounts);
        let mut buf = real(rcounts.iter().map(|&c| c as usize).sum());
        {
            let sp = Partition::new(&flat[..], &scounts[..], &sdispls[..]);
            let mut rp = PartitionMut::new(&mut buf[..], &rcounts[..], &rdispls[..]);
            h.0.all_to_all_varcount_into(&sp, &mut rp);
        }
        Ok((0..n).map(|r| buf[rdispls[r] as usize..][..rcounts[r] as usize].to_vec()).collect())
    }

    fn split(&self, color: u32, key: u32) -> Result<Arc<dyn Communicator>> {
        let sock = self.inner.sock.split_socket(color, key)?;
        let c = i32::try_from(color).map_err(|_| Error::InvalidArgument(format!("colour {color} does not fit MPI's int")))?;
        let k = i32::try_from(key).map_err(|_| Error::InvalidArgument(format!("key {key} does not fit MPI's int")))?;
        self.sub(c, k, sock)
    }

    /// Collective on its first call: `MPI_Comm_split_type(SHARED)`, or a
    /// split by node id when `WM_NODE_ID` poses ranks as other nodes.
    fn local(&self) -> Arc<dyn Communicator> {
        self.inner
            .local
            .get_or_init(|| {
                let sock = self.inner.sock.local_socket();
                let nodes = self.nodes();
                if nodes.iter().all(|n| !n.overridden()) {
                    let shared = self.mpi().0.split_shared(self.rank() as i32);
                    // The MPI library's idea of a node and ours (host name +
                    // boot id) must agree on every rank, or descriptors would
                    // go to ranks that cannot receive them; decided together.
                    let agrees = u8::from(shared.size() as usize == sock.size());
                    let all = self.allgatherv(&[agrees]).expect("MPI allgather on a valid communicator");
                    if all.iter().all(|v| v.first() == Some(&1)) {
                        return Arc::new(Self::wrap(Handle(shared), sock, self.inner.runtime.clone())) as Arc<dyn Communicator>;
                    }
                }
                let color = (0..nodes.len()).find(|&r| nodes[r] == nodes[self.rank()]).expect("this rank's node") as i32;
                self.sub(color, self.rank() as i32, sock).expect("MPI split of a valid communicator")
            })
            .clone()
    }

    /// Collective on its first call (it splits the MPI communicator).
    fn cross(&self) -> Arc<dyn Communicator> {
        self.inner
            .cross
            .get_or_init(|| {
                let sock = self.inner.sock.cross_socket();
                let nodes = self.nodes();
                let local_rank = wm_topology::NodeLayout::of(nodes).local[self.rank()] as i32;
                self.sub(local_rank, self.rank() as i32, sock).expect("MPI split of a valid communicator")
            })
            .clone()
    }

    fn send_fds(&self, dest: usize, fds: &[BorrowedFd<'_>]) -> Result<()> {
        self.inner.sock.send_fds(dest, fds)
    }

    fn recv_fds(&self, src: usize, count: usize) -> Result<Vec<OwnedFd>> {
        self.inner.sock.recv_fds(src, count)
    }
}
