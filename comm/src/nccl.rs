//! Device collectives through NCCL (feature `cuda`), kept apart from the
//! host [`Communicator`]: a host-only build needs nothing of CUDA, and a
//! device exchange is ordered on a CUDA stream rather than on the calling
//! thread.
//!
//! A [`NcclComm`] is bootstrapped over a host communicator (rank 0's unique
//! id is broadcast over it). Its all-to-all is a group of send/recv pairs.
//! NCCL has no timeouts of its own, so every wait here polls the stream and
//! NCCL's asynchronous error, and after `WM_TIMEOUT_S` aborts the
//! communicator and fails naming the operation — a dead peer never hangs a
//! rank.
//!
//! NCCL refuses two ranks on one GPU; [`NcclComm::new`] says so (as
//! [`Error::Unsupported`]) on every rank, and callers fall back to moving
//! rows through the host communicator.

use std::ffi::CStr;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use cudarc::nccl::sys as nccl;

use crate::{Communicator, Error, Result};

/// Stream-ordered collectives on device buffers.
pub trait DeviceCommunicator: Send + Sync + fmt::Debug {
    /// This rank's index.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// Sends `send[r]` (device address, bytes) to rank `r` and receives
    /// `recv[r]` from it, as one group on `stream`, and waits for it.
    ///
    /// # Safety
    /// Every address is device memory of this rank's GPU, valid for its
    /// length until the call returns; the receive ranges do not overlap
    /// each other or the send ranges; `recv[r].1` equals what rank `r`
    /// sends here.
    ///
    /// # Errors
    /// [`Error::Timeout`] (the communicator is then aborted and unusable),
    /// or NCCL's error.
    unsafe fn alltoallv(&self, send: &[(u64, usize)], recv: &[(u64, usize)], stream: &CudaStream) -> Result<()>;
}

/// Whether NCCL can be loaded here, and why not.
pub fn nccl_status() -> std::result::Result<(), String> {
    // SAFETY: only tries to open the library.
    if unsafe { nccl::is_culib_present() } {
        Ok(())
    } else {
        Err("NCCL could not be loaded (cudarc looks for libnccl.so, which NCCL's runtime packages and wheels ship only as \
             libnccl.so.2: link one to the other in a directory on LD_LIBRARY_PATH)"
            .into())
    }
}

fn nccl_err(op: &str, r: nccl::ncclResult_t) -> Error {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(nccl::ncclGetErrorString(r)) }.to_string_lossy().into_owned();
    Error::Unsupported { what: format!("NCCL {op}"), reason: text }
}

fn check(op: &str, r: nccl::ncclResult_t) -> Result<()> {
    match r {
        nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => Ok(()),
        other => Err(nccl_err(op, other)),
    }
}

/// A NCCL communicator over the ranks of a host communicator.
pub struct NcclComm {
    raw: Mutex<nccl::ncclComm_t>,
    rank: usize,
    size: usize,
    world_ranks: Vec<usize>,
}

// SAFETY: the raw communicator is only used under the mutex, one call at a
// time, which is what NCCL requires of a communicator.
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

impl fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclComm").field("rank", &self.rank).field("size", &self.size).finish_non_exhaustive()
    }
}

impl NcclComm {
    /// Builds a NCCL communicator over `host`'s ranks. Collective over
    /// `host`; `gpu` names this rank's GPU (its PCI bus id), and the CUDA
    /// context of that GPU must be current on the calling thread.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on every rank when NCCL cannot be loaded on
    /// some rank or two ranks share a GPU (naming them); NCCL's errors.
    pub fn new(host: &dyn Communicator, gpu: &str) -> Result<Self> {
        let (me, n) = (host.rank(), host.size());
        let ranks = host.world_ranks().to_vec();
        let ids = host.allgatherv(gpu.as_bytes())?;
        for a in 0..n {
            if let Some(b) = (a + 1..n).find(|&b| ids[b] == ids[a]) {
                return Err(Error::Unsupported {
                    what: "NCCL between these ranks".into(),
                    reason: format!(
                        "ranks {} and {} share GPU {}, and NCCL needs one GPU per rank",
                        ranks[a],
                        ranks[b],
                        String::from_utf8_lossy(&ids[a])
                    ),
                });
            }
        }
        let status = host.allgatherv(nccl_status().err().unwrap_or_default().as_bytes())?;
        if let Some((r, why)) = status.iter().enumerate().find(|(_, s)| !s.is_empty()) {
            return Err(Error::Unsupported {
                what: "NCCL between these ranks".into(),
                reason: format!("rank {}: {}", ranks[r], String::from_utf8_lossy(why)),
            });
        }
        // Rank 0's unique id, or its error, for everyone.
        let mut id = vec![0u8; 129];
        if me == 0 {
            let mut raw = std::mem::MaybeUninit::<nccl::ncclUniqueId>::uninit();
            // SAFETY: writes one unique id.
            match unsafe { nccl::ncclGetUniqueId(raw.as_mut_ptr()) } {
                nccl::ncclResult_t::ncclSuccess => {
                    // SAFETY: initialised by the successful call.
                    let raw = unsafe { raw.assume_init() };
                    id[0] = 1;
                    for (d, s) in id[1..].iter_mut().zip(raw.internal) {
                        *d = s as u8;
                    }
                }
                e => id = [&[0u8][..], nccl_err("ncclGetUniqueId", e).to_string().as_bytes()].concat(),
            }
        }
        host.broadcast(0, &mut id)?;
        if id.first() != Some(&1) || id.len() != 129 {
            return Err(Error::Unsupported {
                what: "NCCL between these ranks".into(),
                reason: format!("rank {} could not make a NCCL id: {}", ranks[0], String::from_utf8_lossy(&id[1..])),
            });
        }
        // SAFETY: plain data, every byte set below.
        let mut uid: nccl::ncclUniqueId = unsafe { std::mem::zeroed() };
        for (d, s) in uid.internal.iter_mut().zip(&id[1..]) {
            *d = *s as std::ffi::c_char;
        }
        // Everyone is alive and agrees on the id right before NCCL's own,
        // untimed, rendezvous.
        host.barrier()?;
        let mut raw: nccl::ncclComm_t = std::ptr::null_mut();
        // SAFETY: writes one communicator; the id came from rank 0.
        check("ncclCommInitRank", unsafe { nccl::ncclCommInitRank(&mut raw, n as i32, uid, me as i32) })?;
        Ok(Self { raw: Mutex::new(raw), rank: me, size: n, world_ranks: ranks })
    }

    /// Waits for `stream` to pass everything enqueued so far, watching
    /// NCCL's asynchronous error and the timeout.
    fn wait(&self, raw: nccl::ncclComm_t, stream: &CudaStream, op: &'static str) -> Result<()> {
        let limit = wm_topology::env::timeout().map_err(Error::InvalidArgument)?;
        let start = Instant::now();
        loop {
            // SAFETY: the stream is live (borrowed).
            match unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) } {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => return Ok(()),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(Error::Unsupported { what: format!("NCCL {op}"), reason: format!("the stream failed: {e:?}") }),
            }
            let mut async_err = nccl::ncclResult_t::ncclSuccess;
            // SAFETY: the communicator is live; writes one result.
            check("ncclCommGetAsyncError", unsafe { nccl::ncclCommGetAsyncError(raw, &mut async_err) })?;
            if async_err != nccl::ncclResult_t::ncclSuccess && async_err != nccl::ncclResult_t::ncclInProgress {
                return Err(nccl_err(op, async_err));
            }
            if start.elapsed() > limit {
                // SAFETY: aborting is NCCL's way out of a stuck operation;
                // the communicator is not used afterwards (it is nulled).
                unsafe { nccl::ncclCommAbort(raw) };
                let others: Vec<usize> = self.world_ranks.iter().copied().filter(|&r| r != self.world_ranks[self.rank]).collect();
                return Err(Error::Timeout { op, ranks: others, secs: limit.as_secs_f64() });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl DeviceCommunicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    unsafe fn alltoallv(&self, send: &[(u64, usize)], recv: &[(u64, usize)], stream: &CudaStream) -> Result<()> {
        if send.len() != self.size || recv.len() != self.size {
            return Err(Error::InvalidArgument(format!("{} send and {} receive ranges for {} ranks", send.len(), recv.len(), self.size)));
        }
        let mut raw = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        if raw.is_null() {
            return Err(Error::Unsupported {
                what: "NCCL alltoallv".into(),
                reason: "the communicator was aborted after an earlier failure".into(),
            });
        }
        let s = stream.cu_stream() as nccl::cudaStream_t;
        // SAFETY: grouped point-to-point calls on a live communicator; the
        // caller vouches for every address and length.
        let enqueued = unsafe {
            check("ncclGroupStart", nccl::ncclGroupStart())?;
            let mut r = Ok(());
            for peer in 0..self.size {
                let (sa, sl) = send[peer];
                let (ra, rl) = recv[peer];
                if sl > 0 && r.is_ok() {
                    r = check("ncclSend", nccl::ncclSend(sa as *const _, sl, nccl::ncclDataType_t::ncclUint8, peer as i32, *raw, s));
                }
                if rl > 0 && r.is_ok() {
                    r = check("ncclRecv", nccl::ncclRecv(ra as *mut _, rl, nccl::ncclDataType_t::ncclUint8, peer as i32, *raw, s));
                }
            }
            let end = check("ncclGroupEnd", nccl::ncclGroupEnd());
            r.and(end)
        };
        let waited = enqueued.and_then(|()| self.wait(*raw, stream, "alltoallv"));
        if matches!(waited, Err(Error::Timeout { .. })) {
            *raw = std::ptr::null_mut();
        }
        waited
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let raw = *self.raw.get_mut().unwrap_or_else(|p| p.into_inner());
        if !raw.is_null() {
            // SAFETY: the communicator is live and dropped once; errors are
            // ignored (Drop never panics).
            let _ = unsafe { nccl::ncclCommDestroy(raw) };
        }
    }
}
