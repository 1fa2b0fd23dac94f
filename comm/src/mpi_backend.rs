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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use wm_topology::NodeIdentity;

use crate::communicator::Communicator;
use crate::plan::{Delivery, ExchangePlan, ReceivedPart};
use crate::socket::SocketComm;
use crate::{Error, Result};

/// Keeps MPI initialised while any communicator lives (finalises after the
/// last one), and knows what threading the library granted.
struct Runtime {
    universe: Universe,
    /// `Some` where the library offers only `MPI_THREAD_SERIALIZED`: the
    /// lock that every MPI call of the process holds, on any communicator.
    /// `None` under `MPI_THREAD_MULTIPLE`, where threads may call MPI at
    /// once on different communicators and each communicator's own lock
    /// keeps the calls on it in order.
    serial: Option<Mutex<()>>,
    /// How long a call waits for another thread's MPI call under `serial`.
    timeout: std::time::Duration,
}
// SAFETY: the universe is only dropped (MPI_Finalize), after the last
// communicator; every MPI call goes through a communicator's mutex, and
// under MPI_THREAD_SERIALIZED through `serial` too, so MPI is never called
// in a way its granted threading level forbids.
unsafe impl Send for Runtime {}
// SAFETY: as above.
unsafe impl Sync for Runtime {}

/// An MPI communicator handle, used only under its mutex.
struct Handle(SimpleCommunicator);
// SAFETY: used only under the owning Mutex (and the runtime's `serial`
// lock where MPI granted only MPI_THREAD_SERIALIZED).
unsafe impl Send for Handle {}

/// A communicator's handle, held for one MPI call (or a few in a row):
/// its own lock, and the process's where MPI serialises threads.
struct Held<'a> {
    handle: MutexGuard<'a, Handle>,
    _process: Option<MutexGuard<'a, ()>>,
}

impl std::ops::Deref for Held<'_> {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

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
    /// The send and receive buffers of remote parts of an exchange plan,
    /// kept between calls (fresh ones cost a page fault per page).
    buffers: Mutex<[Vec<u8>; 2]>,
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

/// Most bytes one MPI call moves per rank: MPI's counts and displacements
/// are C `int`s, so an exchange whose parts add up past 2 GiB on some rank
/// is split into rounds ([`Rounds`]).
const MPI_LIMIT: usize = i32::MAX as usize;

/// The limit in force: [`MPI_LIMIT`], unless a test lowered it.
static ROUND_LIMIT: AtomicUsize = AtomicUsize::new(MPI_LIMIT);

/// Lowers the bytes one MPI call may move per rank (clamped to
/// `1..=i32::MAX`), so tests can exercise the split into rounds without
/// gigabytes of data. Every rank must set the same value before the
/// collectives it affects.
#[doc(hidden)]
pub fn set_round_limit(bytes: usize) {
    ROUND_LIMIT.store(bytes.clamp(1, MPI_LIMIT), Ordering::Relaxed);
}

fn round_limit() -> usize {
    ROUND_LIMIT.load(Ordering::Relaxed)
}

/// How one exchange is split into MPI calls: `rounds` calls, in each of
/// which every part moves its next `chunk` bytes (or what is left of it).
/// Every rank computes the same plan from the same (allreduced) figures.
///
/// In a split plan no part moves more than `chunk = limit / ranks` bytes
/// per round, so what one rank sends or receives in a round — at most one
/// part per rank — stays within `limit`, and so do the displacements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rounds {
    rounds: usize,
    chunk: usize,
}

impl Rounds {
    /// The plan for parts of at most `largest` bytes, where the busiest
    /// rank sends or receives `busiest` bytes in all, over `ranks` ranks,
    /// with at most `limit` bytes per rank and call (but at least a byte
    /// per rank: a limit below the rank count, which only a test sets, is
    /// taken as the rank count).
    fn plan(largest: usize, busiest: usize, ranks: usize, limit: usize) -> Self {
        if busiest <= limit && largest <= limit {
            return Self { rounds: 1, chunk: usize::MAX };
        }
        let chunk = (limit / ranks.max(1)).max(1);
        Self { rounds: largest.div_ceil(chunk).max(1), chunk }
    }

    /// Where round `k`'s piece of a part of `len` bytes starts, and its
    /// length (0 once the part is done).
    fn part(&self, len: usize, k: usize) -> (usize, usize) {
        let start = k.saturating_mul(self.chunk).min(len);
        (start, (len - start).min(self.chunk))
    }
}

/// An MPI count: below [`MPI_LIMIT`] by the plan.
fn count(n: usize) -> i32 {
    debug_assert!(n <= MPI_LIMIT);
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Displacements of parts laid end to end (their sum is within the limit).
fn displs(counts: &[i32]) -> Vec<i32> {
    counts
        .iter()
        .scan(0i32, |acc, &c| {
            let d = *acc;
            *acc = acc.saturating_add(c);
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
    /// [`Error::Bootstrap`] when MPI is already initialised or offers
    /// less than serialised threading.
    ///
    /// MPI is asked for `MPI_THREAD_MULTIPLE`, under which two threads may
    /// run collectives on two communicators at once (a prefetch thread
    /// beside the training loop). A library that grants only
    /// `MPI_THREAD_SERIALIZED` is used with one lock for every MPI call of
    /// the process; a call that waits for it longer than `WM_TIMEOUT_S`
    /// fails naming the cause (two threads in collectives at once can wait
    /// on each other there).
    pub fn from_env() -> Result<Self> {
        let timeout = wm_topology::env::timeout().map_err(Error::Bootstrap)?;
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple)
            .ok_or_else(|| Error::Bootstrap("MPI is already initialised in this process".into()))?;
        if threading < mpi::Threading::Serialized {
            return Err(Error::Bootstrap(format!("the MPI library offers only {threading:?} threading; wholemem needs Serialized")));
        }
        let serial = (threading < mpi::Threading::Multiple).then(|| Mutex::new(()));
        let runtime = Arc::new(Runtime { universe, serial, timeout });
        let world = runtime.universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let handle = Handle(world);
        let key = job_key(&handle.0)?;
        let sock = {
            let mut ex = |mine: &[u8]| allgatherv(&handle.0, mine);
            SocketComm::bootstrap_with(rank, size, timeout, &key, &mut ex)?
        };
        Ok(Self::wrap(handle, sock, runtime))
    }

    fn wrap(h: Handle, sock: SocketComm, runtime: Arc<Runtime>) -> Self {
        Self {
            inner: Arc::new(Inner {
                mpi: Mutex::new(h),
                sock,
                local: OnceLock::new(),
                cross: OnceLock::new(),
                buffers: Mutex::new(Default::default()),
                runtime,
            }),
        }
    }

    /// Whether the MPI library granted `MPI_THREAD_MULTIPLE` (else every
    /// MPI call of the process is serialised by one lock).
    pub fn threads_multiple(&self) -> bool {
        self.inner.runtime.serial.is_none()
    }

    /// This communicator's handle for an MPI call. Under
    /// `MPI_THREAD_SERIALIZED`, also the process's MPI lock, waited for at
    /// most the timeout.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when another thread's MPI call held the
    /// process's lock for the whole timeout.
    fn mpi(&self) -> Result<Held<'_>> {
        let handle = self.inner.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(serial) = &self.inner.runtime.serial else {
            return Ok(Held { handle, _process: None });
        };
        let deadline = std::time::Instant::now() + self.inner.runtime.timeout;
        loop {
            match serial.try_lock() {
                Ok(g) => return Ok(Held { handle, _process: Some(g) }),
                Err(std::sync::TryLockError::Poisoned(p)) => return Ok(Held { handle, _process: Some(p.into_inner()) }),
                Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(Error::Unsupported {
                        what: "MPI calls from two threads at once".into(),
                        reason: format!(
                            "this MPI library grants only MPI_THREAD_SERIALIZED, and another thread's MPI call held MPI for \
                             {:.0} s (WM_TIMEOUT_S); two threads in collectives on two communicators can wait on each other \
                             there: use an MPI built with MPI_THREAD_MULTIPLE, or one thread per rank (WM_THREADS=1)",
                            self.inner.runtime.timeout.as_secs_f64()
                        ),
                    });
                }
            }
        }
    }

    /// Runs `f` with this communicator's raw MPI handle, holding the locks
    /// that keep MPI calls within the threading MPI granted (see
    /// [`MpiComm::from_env`]). The seam through which `wm-onesided` opens
    /// and uses MPI RMA windows — the one public signature of this crate
    /// with an FFI type, documented in ARCHITECTURE.md.
    ///
    /// # Errors
    /// As a collective's, when another thread held MPI for the whole
    /// timeout under `MPI_THREAD_SERIALIZED`; then `f` does not run.
    pub fn with_raw<R>(&self, f: impl FnOnce(mpi::ffi::MPI_Comm) -> R) -> Result<R> {
        use mpi::raw::AsRaw;
        let h = self.mpi()?;
        Ok(f(h.0.as_raw()))
    }

    /// The MPI half of [`Communicator::exchange`]: the parts for
    /// ranks marked `remote`, filled in place into one send buffer laid out
    /// by rank, exchanged in MPI calls within MPI's int counts; returns the
    /// send and receive buffers (to keep for the next call) and where each
    /// rank's part starts in the receive buffer (`n + 1` offsets).
    fn exchange_remote(
        &self,
        sizes: &[usize],
        remote: &[bool],
        fill: &mut dyn FnMut(usize, &mut [u8]),
    ) -> Result<([Vec<u8>; 2], Vec<usize>)> {
        let n = sizes.len();
        let slen: Vec<usize> = (0..n).map(|r| if remote[r] { sizes[r] } else { 0 }).collect();
        let offsets = |lens: &[usize]| -> Result<Vec<usize>> {
            let mut o = Vec::with_capacity(lens.len() + 1);
            o.push(0usize);
            for &l in lens {
                let next =
                    o[o.len() - 1].checked_add(l).ok_or_else(|| Error::InvalidArgument("an exchange past usize::MAX bytes".into()))?;
                o.push(next);
            }
            Ok(o)
        };
        let sdispl = offsets(&slen)?;
        let [mut sbuf, mut rbuf] = std::mem::take(&mut *self.inner.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        reuse(&mut sbuf, sdispl[n]);
        for r in (0..n).filter(|&r| remote[r]) {
            fill(r, &mut sbuf[sdispl[r]..sdispl[r + 1]]);
        }
        let h = self.mpi()?;
        // To each rank: the count of its part, and this rank's largest part
        // and send total, so every rank can plan the rounds from what it
        // receives, without a reduction of its own.
        let (largest_sent, total_sent) = (slen.iter().copied().max().unwrap_or(0) as u64, sdispl[n] as u64);
        let scounts: Vec<u64> = slen.iter().flat_map(|&l| [l as u64, largest_sent, total_sent]).collect();
        let mut rcounts = vec![0u64; 3 * n];
        h.0.all_to_all_into(&scounts[..], &mut rcounts[..]);
        // A rank on this node sends nothing here; anything else it claims
        // is a broken peer, and so is a count past what memory can address.
        let mut rlen = Vec::with_capacity(n);
        for (r, &c) in rcounts.iter().step_by(3).enumerate() {
            match usize::try_from(c) {
                Ok(l) if remote[r] || l == 0 => rlen.push(l),
                _ => {
                    return Err(Error::Protocol {
                        rank: self.world_ranks()[r],
                        op: "alltoallv in place",
                        detail: format!("it announced {c} bytes for a part it does not send this way"),
                    });
                }
            }
        }
        let rdispl = offsets(&rlen)?;
        // The total is what this job's ranks (who hold its key) send here.
        // Should it not fit in memory, the allocation aborts this process,
        // and the MPI runtime ends the job: an error returned here would
        // leave the other ranks waiting in the exchange below for ever.
        reuse(&mut rbuf, rdispl[n]);
        // One plan for every rank, from figures every rank holds alike: the
        // largest part any rank sends, and as the busiest rank's traffic
        // the larger of the largest send total and the sum of all (no rank
        // receives more than every rank sends).
        let largest = rcounts.chunks_exact(3).map(|c| c[1]).max().unwrap_or(0);
        let most_sent = rcounts.chunks_exact(3).map(|c| c[2]).max().unwrap_or(0);
        let all_sent = rcounts.chunks_exact(3).fold(0u64, |a, c| a.saturating_add(c[2]));
        let [largest, busiest] = [largest, most_sent.max(all_sent)].map(|v| usize::try_from(v).unwrap_or(usize::MAX));
        let plan = Rounds::plan(largest, busiest, n, round_limit());
        if plan.rounds == 1 {
            // Straight from and into the buffers: every count and
            // displacement is within the limit.
            let (sc, sd): (Vec<i32>, Vec<i32>) =
                (slen.iter().map(|&l| count(l)).collect(), sdispl[..n].iter().map(|&d| count(d)).collect());
            let (rc, rd): (Vec<i32>, Vec<i32>) =
                (rlen.iter().map(|&l| count(l)).collect(), rdispl[..n].iter().map(|&d| count(d)).collect());
            let sp = Partition::new(&sbuf[..], &sc[..], &sd[..]);
            let mut rp = PartitionMut::new(&mut rbuf[..], &rc[..], &rd[..]);
            h.0.all_to_all_varcount_into(&sp, &mut rp);
        } else {
            for k in 0..plan.rounds {
                let sparts: Vec<(usize, usize)> = slen.iter().map(|&l| plan.part(l, k)).collect();
                let rparts: Vec<(usize, usize)> = rlen.iter().map(|&l| plan.part(l, k)).collect();
                let sc: Vec<i32> = sparts.iter().map(|&(_, l)| count(l)).collect();
                let rc: Vec<i32> = rparts.iter().map(|&(_, l)| count(l)).collect();
                let (sd, rd) = (displs(&sc), displs(&rc));
                let mut flat = real(sc.iter().map(|&c| c as usize).sum());
                let mut at = 0;
                for (r, &(start, len)) in sparts.iter().enumerate() {
                    flat[at..at + len].copy_from_slice(&sbuf[sdispl[r] + start..][..len]);
                    at += len;
                }
                let mut piece = real(rc.iter().map(|&c| c as usize).sum());
                {
                    let sp = Partition::new(&flat[..], &sc[..], &sd[..]);
                    let mut rp = PartitionMut::new(&mut piece[..], &rc[..], &rd[..]);
                    h.0.all_to_all_varcount_into(&sp, &mut rp);
                }
                for (r, &(start, len)) in rparts.iter().enumerate() {
                    rbuf[rdispl[r] + start..][..len].copy_from_slice(&piece[rd[r] as usize..][..len]);
                }
            }
        }
        Ok(([sbuf, rbuf], rdispl))
    }

    /// A sub-communicator: the MPI communicator split by colour and key,
    /// paired with the socket communicator of the same members.
    fn sub(&self, color: i32, key: i32, sock: SocketComm) -> Result<Arc<dyn Communicator>> {
        let split = self.mpi()?.0.split_by_color_with_key(Color::with_value(color), key);
        let h = split.ok_or_else(|| Error::Bootstrap("MPI split returned no communicator".into()))?;
        Ok(Arc::new(Self::wrap(Handle(h), sock, self.inner.runtime.clone())))
    }
}

/// Makes `buf` (kept from an earlier call) hold at least `len` bytes, in a
/// real allocation even when `len` is 0 (see [`real`]); bytes past what a
/// call writes are never read.
fn reuse(buf: &mut Vec<u8>, len: usize) {
    if buf.len() < len.max(1) {
        buf.resize(len.max(1), 0);
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
    let mut lens = vec![0u64; n];
    c.all_gather_into(&(data.len() as u64), &mut lens[..]);
    let lens: Vec<usize> = lens.iter().map(|&l| usize::try_from(l).unwrap_or(usize::MAX)).collect();
    // Every rank receives every part: the total is the busiest figure.
    let total = lens.iter().fold(0usize, |a, &l| a.saturating_add(l));
    let plan = Rounds::plan(lens.iter().copied().max().unwrap_or(0), total, n, round_limit());
    let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| Vec::with_capacity(l)).collect();
    let empty = [0u8; 1];
    for k in 0..plan.rounds {
        let counts: Vec<i32> = lens.iter().map(|&l| count(plan.part(l, k).1)).collect();
        let d = displs(&counts);
        let mut buf = real(counts.iter().map(|&x| x as usize).sum());
        let (start, len) = plan.part(data.len(), k);
        let send = if len == 0 { &empty[..0] } else { &data[start..start + len] };
        {
            let mut part = PartitionMut::new(&mut buf[..], &counts[..], &d[..]);
            c.all_gather_varcount_into(send, &mut part);
        }
        for (r, o) in out.iter_mut().enumerate() {
            o.extend_from_slice(&buf[d[r] as usize..][..counts[r] as usize]);
        }
    }
    Ok(out)
}

/// The MPI backend's extension of [`Communicator`]: the seam through which
/// `wm-onesided` opens MPI RMA windows on a communicator.
pub trait MpiExt {
    /// This communicator as the MPI backend's, when it is one.
    fn as_mpi(&self) -> Option<&MpiComm>;
}

impl<C: Communicator + ?Sized> MpiExt for C {
    fn as_mpi(&self) -> Option<&MpiComm> {
        self.as_any().downcast_ref()
    }
}

impl Communicator for MpiComm {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
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
        self.mpi()?.0.barrier();
        Ok(())
    }

    fn broadcast(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        if root >= self.size() {
            return Err(Error::InvalidArgument(format!("broadcast root {root} is not a rank of a communicator of {} ranks", self.size())));
        }
        let h = self.mpi()?;
        let p = h.0.process_at_rank(root as i32);
        let mut len = data.len() as u64;
        p.broadcast_into(&mut len);
        data.resize(usize::try_from(len).map_err(|_| Error::InvalidArgument("broadcast too large".into()))?, 0);
        // In pieces MPI's int counts can hold.
        let limit = round_limit();
        let mut at = 0;
        while at < data.len() {
            let piece = (data.len() - at).min(limit);
            p.broadcast_into(&mut data[at..at + piece]);
            at += piece;
        }
        Ok(())
    }

    fn allgatherv(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        allgatherv(&self.mpi()?.0, data)
    }

    fn alltoallv(&self, send: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        if send.len() != n {
            return Err(Error::InvalidArgument(format!("alltoallv got {} send buffers for a communicator of {n} ranks", send.len())));
        }
        let h = self.mpi()?;
        let scounts: Vec<u64> = send.iter().map(|s| s.len() as u64).collect();
        let mut rcounts = vec![0u64; n];
        h.0.all_to_all_into(&scounts[..], &mut rcounts[..]);
        let rlens: Vec<usize> = rcounts.iter().map(|&c| usize::try_from(c).unwrap_or(usize::MAX)).collect();
        // One plan for every rank: the largest part and the busiest rank
        // of the whole exchange.
        let sum = |v: &[u64]| v.iter().fold(0u64, |a, &c| a.saturating_add(c));
        let largest = scounts.iter().chain(&rcounts).copied().max().unwrap_or(0);
        let mine = [largest, sum(&scounts).max(sum(&rcounts))];
        let mut all = [0u64; 2];
        h.0.all_reduce_into(&mine[..], &mut all[..], SystemOperation::max());
        let [largest, busiest] = all.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
        let plan = Rounds::plan(largest, busiest, n, round_limit());
        let mut out: Vec<Vec<u8>> = rlens.iter().map(|&l| Vec::with_capacity(l)).collect();
        for k in 0..plan.rounds {
            let sparts: Vec<(usize, usize)> = send.iter().map(|s| plan.part(s.len(), k)).collect();
            let sc: Vec<i32> = sparts.iter().map(|&(_, l)| count(l)).collect();
            let rc: Vec<i32> = rlens.iter().map(|&l| count(plan.part(l, k).1)).collect();
            let (sd, rd) = (displs(&sc), displs(&rc));
            // Capacity of at least one byte keeps the pointer real (see `real`).
            let mut flat = Vec::with_capacity(sc.iter().map(|&c| c as usize).sum::<usize>().max(1));
            for (s, &(start, len)) in send.iter().zip(&sparts) {
                flat.extend_from_slice(&s[start..start + len]);
            }
            let mut buf = real(rc.iter().map(|&c| c as usize).sum());
            {
                let sp = Partition::new(&flat[..], &sc[..], &sd[..]);
                let mut rp = PartitionMut::new(&mut buf[..], &rc[..], &rd[..]);
                h.0.all_to_all_varcount_into(&sp, &mut rp);
            }
            for (r, o) in out.iter_mut().enumerate() {
                o.extend_from_slice(&buf[rd[r] as usize..][..rc[r] as usize]);
            }
        }
        Ok(out)
    }

    /// Parts for ranks of this node go through the paired socket
    /// communicator's shared-memory mailboxes (as with the socket backend);
    /// parts for other nodes through MPI, filled straight into the one
    /// buffer MPI sends from and handed over from the one buffer it
    /// receives into (borrowed: keeping one copies it). The MPI part runs
    /// first; the socket exchange then hands every part over in rank order,
    /// the remote ones from MPI's buffer, so the order callers rely on (a
    /// scatter's last writer) holds. The plan's work runs while the parts
    /// for ranks of this node travel (after the MPI part, which it does not
    /// overlap); its rows land by a copy on arrival.
    fn exchange(&self, plan: ExchangePlan<'_>) -> Result<()> {
        plan.check(self.size())?;
        let ExchangePlan { sizes, fill, out, landing, mut work, receiver } = plan;
        let mut delivery = Delivery::new(landing, receiver);
        let (n, me) = (self.size(), self.rank());
        let remote: Vec<bool> = (0..n).map(|r| !self.same_node(r, me)).collect();
        let (bufs, rdispl) = if remote.contains(&true) {
            let (bufs, rdispl) = self.exchange_remote(sizes, &remote, fill)?;
            (Some(bufs), rdispl)
        } else {
            (None, Vec::new())
        };
        let local_sizes: Vec<usize>;
        let sock_sizes = if bufs.is_some() {
            local_sizes = (0..n).map(|r| if remote[r] { 0 } else { sizes[r] }).collect();
            &local_sizes[..]
        } else {
            sizes
        };
        let rbuf = bufs.as_ref().map_or(&[][..], |[_, rbuf]| &rbuf[..]);
        let out = std::cell::RefCell::new(out);
        let mut local_fill = |r: usize, buf: &mut [u8]| {
            if !remote[r] {
                fill(r, buf);
            }
        };
        let mut step = |_: &mut [u8]| work.step(&mut out.borrow_mut());
        let mut take = |r: usize, part: ReceivedPart<'_>| {
            let bytes = if remote[r] { &rbuf[rdispl[r]..rdispl[r + 1]] } else { part.bytes() };
            delivery.hand_over(r, ReceivedPart::borrowed(bytes), &mut out.borrow_mut());
        };
        let done =
            self.inner.sock.exchange(ExchangePlan::new(sock_sizes, &mut local_fill).between_steps(&mut step).receive_parts(&mut take));
        if let Some(bufs) = bufs {
            *self.inner.buffers.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = bufs;
        }
        done
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
                    let shared = self.mpi().expect("MPI for the node's communicator").0.split_shared(self.rank() as i32);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a plan over a matrix of parts (`parts[s][r]` bytes from `s` to
    /// `r`) the way `alltoallv` does, and checks every round against the
    /// limit and the result against the parts.
    fn simulate(parts: &[Vec<usize>], limit: usize) -> usize {
        let n = parts.len();
        let largest = parts.iter().flatten().copied().max().unwrap_or(0);
        let sent = |s: usize| parts[s].iter().sum::<usize>();
        let received = |r: usize| parts.iter().map(|p| p[r]).sum::<usize>();
        let busiest = (0..n).map(|i| sent(i).max(received(i))).max().unwrap_or(0);
        let plan = Rounds::plan(largest, busiest, n, limit);
        let limit = limit.max(n);
        let mut moved = vec![vec![0usize; n]; n];
        for k in 0..plan.rounds {
            for i in 0..n {
                let out: Vec<(usize, usize)> = parts[i].iter().map(|&l| plan.part(l, k)).collect();
                let inn: usize = (0..n).map(|s| plan.part(parts[s][i], k).1).sum();
                let total: usize = out.iter().map(|p| p.1).sum();
                assert!(total <= limit && inn <= limit, "round {k}: rank {i} sends {total}, receives {inn}, limit {limit}");
                for (r, &(start, len)) in out.iter().enumerate() {
                    // Pieces arrive in order, each where the last ended.
                    assert_eq!(start, moved[i][r], "round {k}: part {i}→{r}");
                    moved[i][r] += len;
                }
            }
        }
        assert_eq!(moved, parts, "every byte moved once");
        plan.rounds
    }

    #[test]
    fn exchanges_within_the_limit_take_one_round() {
        assert_eq!(Rounds::plan(100, 300, 4, 1000), Rounds { rounds: 1, chunk: usize::MAX });
        assert_eq!(simulate(&[vec![10, 20], vec![30, 0]], 60), 1);
        assert_eq!(Rounds::plan(0, 0, 3, 1), Rounds { rounds: 1, chunk: usize::MAX });
        assert_eq!(Rounds::plan(0, 0, 3, 1).part(0, 0), (0, 0));
    }

    #[test]
    fn larger_exchanges_are_split_into_rounds_within_the_limit() {
        // One rank sends far more than the limit to one peer.
        assert_eq!(simulate(&[vec![0, 1000, 3], vec![5, 0, 0], vec![0, 0, 0]], 64), 1000usize.div_ceil(64 / 3));
        // Every part fits, but one rank receives too much in all.
        simulate(&[vec![50, 50, 50, 50], vec![50, 50, 50, 50], vec![0; 4], vec![0; 4]], 120);
        // Odd sizes; a limit of a byte per rank; and a limit below the
        // rank count, taken as one byte per rank.
        let n = 7;
        let parts: Vec<Vec<usize>> = (0..n).map(|s| (0..n).map(|r| (s * 31 + r * 17) % 23).collect()).collect();
        simulate(&parts, 30);
        simulate(&parts, 7);
        simulate(&parts, 1);
        // The real limit, with parts of the sizes that overflowed i32.
        let gib = 1usize << 30;
        let plan = Rounds::plan(3 * gib, 3 * gib, 4, MPI_LIMIT);
        assert!(plan.rounds > 1 && plan.chunk * 4 <= MPI_LIMIT, "{plan:?}");
        assert_eq!(plan.part(3 * gib, plan.rounds - 1).0 + plan.part(3 * gib, plan.rounds - 1).1, 3 * gib);
    }

    #[test]
    fn displacements_stay_within_the_counts() {
        assert_eq!(displs(&[3, 0, 5, 1]), vec![0, 3, 3, 8]);
        assert_eq!(displs(&[]), Vec::<i32>::new());
    }
}
