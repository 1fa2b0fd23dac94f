//! Device collectives through NCCL (feature `cuda`), kept apart from the
//! host [`Communicator`]: a host-only build needs nothing of CUDA, and a
//! device exchange is ordered on a CUDA stream rather than on the calling
//! thread.
//!
//! A [`NcclComm`] is bootstrapped over a host communicator (rank 0's unique
//! id, or why it has none, is broadcast over it). Its all-to-all is a group
//! of send/recv pairs. NCCL has no timeouts of its own, so the communicator
//! is non-blocking: its initialisation and every wait poll NCCL's
//! asynchronous state (and the stream), and an asynchronous error or
//! `WM_TIMEOUT_S` without progress aborts the communicator and fails naming
//! the operation — a dead peer never hangs a rank.
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
    /// [`Error::Timeout`] or [`Error::Nccl`]; after an error while waiting
    /// (a timeout, an asynchronous NCCL error, a failed stream) the
    /// communicator is aborted and unusable.
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

fn error_text(r: nccl::ncclResult_t) -> String {
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string
    // (the library is loaded: every caller got a result from it first).
    let p = unsafe { nccl::ncclGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, static and NUL-terminated.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn nccl_err(op: &'static str, r: nccl::ncclResult_t) -> Error {
    Error::Nccl { op, detail: error_text(r) }
}

fn check(op: &'static str, r: nccl::ncclResult_t) -> Result<()> {
    match r {
        nccl::ncclResult_t::ncclSuccess | nccl::ncclResult_t::ncclInProgress => Ok(()),
        other => Err(nccl_err(op, other)),
    }
}

/// Runs a NCCL call, turning cudarc's panic for a symbol the loaded
/// library lacks (an old NCCL) into an error.
fn guarded<T>(op: &'static str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        Error::Nccl { op, detail: format!("this NCCL library is unusable: {msg}") }
    })
}

/// Bytes of `ncclUniqueId`.
const ID_BYTES: usize = 128;

/// What rank 0 broadcasts before NCCL's rendezvous: a status byte (1: an id
/// follows; 0: an error message follows) and the id or the message, so a
/// rank 0 that cannot make an id never leaves the others waiting.
fn encode_id(id: std::result::Result<[u8; ID_BYTES], String>) -> Vec<u8> {
    match id {
        Ok(id) => [&[1u8][..], &id].concat(),
        Err(why) => [&[0u8][..], why.as_bytes()].concat(),
    }
}

/// The id from rank `root`'s broadcast, or its error.
fn decode_id(msg: &[u8], root: usize) -> Result<[u8; ID_BYTES]> {
    let unsupported = |reason: String| Error::Unsupported { what: "NCCL between these ranks".into(), reason };
    match msg.split_first() {
        Some((1, id)) if id.len() == ID_BYTES => Ok(id.try_into().expect("length checked")),
        Some((0, why)) => Err(unsupported(format!("rank {root} could not make a NCCL id: {}", String::from_utf8_lossy(why)))),
        _ => Err(unsupported(format!(
            "rank {root} sent a malformed NCCL id message ({} bytes; expected a status byte and {ID_BYTES} bytes)",
            msg.len()
        ))),
    }
}

/// Where a polled NCCL operation stands.
#[derive(Debug)]
enum Progress {
    /// Finished.
    Done,
    /// Still running.
    Pending,
    /// Failed; the communicator must be aborted.
    Failed(Error),
}

/// Polls `step` until it is done or failed, or `limit` has passed (then
/// [`Progress::Pending`] is returned: the caller aborts). Sleeps `pause`
/// between polls.
fn drive(limit: Duration, pause: Duration, mut step: impl FnMut() -> Progress) -> Progress {
    let start = Instant::now();
    loop {
        match step() {
            Progress::Pending if start.elapsed() >= limit => return Progress::Pending,
            Progress::Pending => std::thread::sleep(pause),
            other => return other,
        }
    }
}

/// NCCL's asynchronous state of `raw` as [`Progress`]: in progress (a
/// non-blocking call still running), success, or the error to abort on.
fn async_state(raw: nccl::ncclComm_t, op: &'static str) -> Progress {
    let mut state = nccl::ncclResult_t::ncclSuccess;
    // SAFETY: the communicator is live; writes one result.
    match guarded(op, || unsafe { nccl::ncclCommGetAsyncError(raw, &mut state) }) {
        Ok(nccl::ncclResult_t::ncclSuccess) => {}
        Ok(r) => return Progress::Failed(nccl_err("ncclCommGetAsyncError", r)),
        Err(e) => return Progress::Failed(e),
    }
    match state {
        nccl::ncclResult_t::ncclSuccess => Progress::Done,
        nccl::ncclResult_t::ncclInProgress => Progress::Pending,
        e => Progress::Failed(nccl_err(op, e)),
    }
}

/// A communicator configuration that asks for non-blocking calls and
/// leaves every other attribute to NCCL: what `NCCL_CONFIG_INITIALIZER`
/// gives, with `blocking = 0`. The version says 2.14 (the first NCCL with
/// `ncclCommInitRankConfig`), so NCCL reads `blocking` and takes its own
/// defaults for every later field, whichever NCCL is installed.
fn nonblocking_config() -> nccl::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    const MAGIC: u32 = 0xcafe_beef;
    const VERSION_2_14: u32 = 2 * 10_000 + 14 * 100;
    nccl::ncclConfig_t {
        size: std::mem::size_of::<nccl::ncclConfig_t>(),
        magic: MAGIC,
        version: VERSION_2_14,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

/// Aborts `raw` (NCCL's way out of a stuck or failed communicator).
fn abort(raw: nccl::ncclComm_t) {
    if !raw.is_null() {
        // SAFETY: the communicator is live and not used afterwards (callers
        // null their copy); a failure here cannot be acted on.
        let _ = guarded("ncclCommAbort", || unsafe { nccl::ncclCommAbort(raw) });
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

/// How often a wait polls NCCL and the stream.
const POLL: Duration = Duration::from_micros(50);

impl NcclComm {
    /// Builds a NCCL communicator over `host`'s ranks. Collective over
    /// `host`; `gpu` names this rank's GPU (its PCI bus id), and the CUDA
    /// context of that GPU must be current on the calling thread.
    ///
    /// The communicator is non-blocking (`ncclCommInitRankConfig` with
    /// `blocking = 0`): its initialisation is polled, and aborted after
    /// `WM_TIMEOUT_S`, so a rank that never joins NCCL's rendezvous cannot
    /// hang the others.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on every rank when NCCL cannot be loaded on
    /// some rank, two ranks share a GPU (naming them) or rank 0 cannot make
    /// an id; [`Error::Timeout`] when initialisation does not finish in
    /// time; [`Error::Nccl`].
    pub fn new(host: &dyn Communicator, gpu: &str) -> Result<Self> {
        let (me, n) = (host.rank(), host.size());
        let ranks = host.world_ranks().to_vec();
        let limit = wm_topology::env::timeout().map_err(Error::InvalidArgument)?;
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
        let mut msg = Vec::new();
        if me == 0 {
            let mut raw = std::mem::MaybeUninit::<nccl::ncclUniqueId>::uninit();
            // SAFETY: writes one unique id.
            let made = guarded("ncclGetUniqueId", || unsafe { nccl::ncclGetUniqueId(raw.as_mut_ptr()) }).and_then(|r| match r {
                nccl::ncclResult_t::ncclSuccess => {
                    // SAFETY: initialised by the successful call.
                    let raw = unsafe { raw.assume_init() };
                    Ok(raw.internal.map(|c| c as u8))
                }
                e => Err(nccl_err("ncclGetUniqueId", e)),
            });
            msg = encode_id(made.map_err(|e| e.to_string()));
        }
        host.broadcast(0, &mut msg)?;
        let id = decode_id(&msg, ranks[0])?;
        // SAFETY: plain data, every byte set below.
        let mut uid: nccl::ncclUniqueId = unsafe { std::mem::zeroed() };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = s as std::ffi::c_char;
        }
        // Everyone is alive and agrees on the id right before NCCL's own
        // rendezvous, which is polled against the timeout below.
        host.barrier()?;
        let mut raw: nccl::ncclComm_t = std::ptr::null_mut();
        let mut config = nonblocking_config();
        // SAFETY: writes one communicator; the id came from rank 0; the
        // config is initialised as NCCL_CONFIG_INITIALIZER would.
        let started =
            guarded("ncclCommInitRankConfig", || unsafe { nccl::ncclCommInitRankConfig(&mut raw, n as i32, uid, me as i32, &mut config) })
                .and_then(|r| check("ncclCommInitRankConfig", r));
        if let Err(e) = started {
            abort(raw);
            return Err(e);
        }
        if raw.is_null() {
            return Err(Error::Nccl { op: "ncclCommInitRankConfig", detail: "NCCL returned no communicator".into() });
        }
        match drive(limit, Duration::from_millis(1), || async_state(raw, "ncclCommInitRankConfig")) {
            Progress::Done => Ok(Self { raw: Mutex::new(raw), rank: me, size: n, world_ranks: ranks }),
            Progress::Failed(e) => {
                abort(raw);
                Err(e)
            }
            Progress::Pending => {
                abort(raw);
                let others: Vec<usize> = ranks.iter().copied().filter(|&r| r != ranks[me]).collect();
                Err(Error::Timeout { op: "ncclCommInitRankConfig", ranks: others, secs: limit.as_secs_f64() })
            }
        }
    }

    /// Waits until NCCL has enqueued the group (a non-blocking
    /// communicator may still be doing that after `ncclGroupEnd`) and
    /// `stream` has passed everything enqueued so far, watching NCCL's
    /// asynchronous error and the timeout. On anything but success the
    /// caller aborts the communicator.
    fn wait(&self, raw: nccl::ncclComm_t, stream: &CudaStream, op: &'static str) -> Result<()> {
        let limit = wm_topology::env::timeout().map_err(Error::InvalidArgument)?;
        let step = || match async_state(raw, op) {
            Progress::Done => {
                // SAFETY: the stream is live (borrowed).
                match unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) } {
                    cudarc::driver::sys::CUresult::CUDA_SUCCESS => Progress::Done,
                    cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => Progress::Pending,
                    e => Progress::Failed(Error::Nccl { op, detail: format!("the stream failed: {e:?}") }),
                }
            }
            other => other,
        };
        match drive(limit, POLL, step) {
            Progress::Done => Ok(()),
            Progress::Failed(e) => Err(e),
            Progress::Pending => {
                let others: Vec<usize> = self.world_ranks.iter().copied().filter(|&r| r != self.world_ranks[self.rank]).collect();
                Err(Error::Timeout { op, ranks: others, secs: limit.as_secs_f64() })
            }
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
        // caller vouches for every address and length. (The symbols were
        // loaded when the communicator was made, so these do not panic.)
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
        if waited.is_err() {
            // A timeout, an asynchronous NCCL error or a failed stream:
            // NCCL's state is unknown, so the communicator goes.
            abort(*raw);
            *raw = std::ptr::null_mut();
        }
        waited
    }
}

impl Drop for NcclComm {
    /// Finalises the communicator (non-blocking, polled against the
    /// timeout) and destroys it; aborts it instead when finalising fails or
    /// does not finish. Never panics.
    fn drop(&mut self) {
        let raw = *self.raw.get_mut().unwrap_or_else(|p| p.into_inner());
        if raw.is_null() {
            return;
        }
        let limit = wm_topology::env::timeout().unwrap_or(wm_topology::env::DEFAULT_TIMEOUT);
        // SAFETY: the communicator is live.
        let finalized =
            guarded("ncclCommFinalize", || unsafe { nccl::ncclCommFinalize(raw) }).and_then(|r| check("ncclCommFinalize", r)).is_ok()
                && matches!(drive(limit, Duration::from_millis(1), || async_state(raw, "ncclCommFinalize")), Progress::Done);
        if finalized {
            // SAFETY: finalised, destroyed once.
            let _ = guarded("ncclCommDestroy", || unsafe { nccl::ncclCommDestroy(raw) });
        } else {
            abort(raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn rank_0s_id_or_its_error_reaches_every_rank() {
        let id: [u8; ID_BYTES] = std::array::from_fn(|i| i as u8);
        assert_eq!(decode_id(&encode_id(Ok(id)), 0).unwrap(), id);
        // A failed ncclGetUniqueId: the others get its reason, not a hang.
        let e = decode_id(&encode_id(Err("NCCL ncclGetUniqueId failed: unhandled system error".into())), 0).unwrap_err();
        assert!(e.to_string().contains("rank 0 could not make a NCCL id: NCCL ncclGetUniqueId failed: unhandled system error"), "{e}");
        // Malformed: short, empty, unknown status.
        for bad in [&[1u8, 2, 3][..], &[], &[7u8; 129][..]] {
            let e = decode_id(bad, 4).unwrap_err();
            assert!(e.to_string().contains(&format!("rank 4 sent a malformed NCCL id message ({} bytes", bad.len())), "{e}");
        }
    }

    #[test]
    fn the_config_asks_only_for_non_blocking_calls() {
        let c = nonblocking_config();
        assert_eq!((c.size, c.magic, c.version, c.blocking), (std::mem::size_of::<nccl::ncclConfig_t>(), 0xcafe_beef, 21_400, 0));
        assert_eq!(
            (c.cgaClusterSize, c.minCTAs, c.maxCTAs, c.splitShare, c.maxP2pPeers),
            (i32::MIN, i32::MIN, i32::MIN, i32::MIN, i32::MIN)
        );
        assert!(c.netName.is_null() && c.commName.is_null());
    }

    #[test]
    fn a_poll_ends_done_failed_or_pending_at_the_limit() {
        let n = Cell::new(0);
        let step = || {
            n.set(n.get() + 1);
            if n.get() < 3 { Progress::Pending } else { Progress::Done }
        };
        assert!(matches!(drive(Duration::from_secs(3600), Duration::ZERO, step), Progress::Done));
        assert_eq!(n.get(), 3);
        let failed = || Progress::Failed(Error::Nccl { op: "alltoallv", detail: "remote process exited".into() });
        match drive(Duration::from_secs(3600), Duration::ZERO, failed) {
            Progress::Failed(e) => assert_eq!(e.to_string(), "NCCL alltoallv failed: remote process exited"),
            other => panic!("{other:?}"),
        }
        // Never done: given back as pending once the limit has passed (a
        // zero limit passes at the first poll), for the caller to abort.
        assert!(matches!(drive(Duration::ZERO, Duration::ZERO, || Progress::Pending), Progress::Pending));
    }
}
