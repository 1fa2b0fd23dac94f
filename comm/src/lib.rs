//! How wholemem ranks talk.
//!
//! One object-safe [`Communicator`] trait carries the host collectives every
//! layer above needs — barrier, broadcast, allgather(v), alltoallv, split,
//! node-local and cross-node sub-communicators, and descriptor passing
//! between ranks of a node. [`CommExt`] adds typed versions for
//! `bytemuck::Pod` data.
//!
//! The embedded [`socket`] backend is always compiled and is the reference;
//! [`init`] builds the world communicator from the environment. The
//! [`launch`] module starts local ranks (it is what `wm-run` runs).
//!
//! Unsafe code is denied except in `sys` (socket calls), `socket::shm`
//! (the mailboxes' mappings), `launch::group` (process groups and
//! signals), `nccl` and the `Send`/`Sync` wrappers of `mpi_backend`; `tests/tests/invariants.rs` keeps that list and
//! ARCHITECTURE.md in step.
//!
//! ```no_run
//! use wm_comm::{CommExt, Communicator};
//! let world = wm_comm::init()?;
//! let ranks = world.allgather_value(world.rank() as u64)?;
//! assert_eq!(ranks.len(), world.size());
//! # Ok::<(), wm_comm::Error>(())
//! ```

#![deny(unsafe_code)]

pub mod auth;
mod communicator;
mod error;
pub mod fdpass;
pub mod gate;
pub mod launch;
// `Send`/`Sync` for the MPI handles, serialised by a mutex.
#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
pub mod mpi_backend;
// NCCL calls through cudarc's raw bindings.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod nccl;
mod owned_files;
pub mod plan;
pub mod pool;
pub mod ranks;
pub mod session;
pub mod socket;
pub mod tcp;
pub mod trust;
// Socket calls std does not offer: SCM_RIGHTS, poll, SO_PEERCRED, getifaddrs.
#[allow(unsafe_code)]
mod sys;

use std::sync::Arc;

pub use auth::JobKey;
pub use communicator::{CommExt, Communicator};
pub use error::{Error, Result, rank_list};
pub use plan::{ExchangePlan, KeptPart, ReceivedPart};
pub use pool::BufferPool;
pub use ranks::{RankEnv, RankSource};
pub use socket::{Rendezvous, SocketComm};

/// Tunes glibc's allocator for the exchanges' temporary buffers, unless
/// `WM_MALLOC_TUNE=0`; once per process ([`init`] calls it). Process-wide:
/// blocks under 32 MiB come from the heap, and up to 256 MiB of freed heap
/// is kept for reuse instead of being given back to the kernel at every
/// free, so the buffers of a gather are not faulted in anew by the next.
/// Returns whether the allocator was tuned (never, away from glibc).
pub fn tune_allocator() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| wm_topology::env::WM_MALLOC_TUNE.get().as_deref().map(str::trim) != Some("0") && sys::tune_malloc())
}

/// Most reports [`warn`] prints per process; after that it counts them
/// silently.
const WARN_MAX: usize = 20;
static WARNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Reports something a user should know but that is not an error — a
/// stranger refused at a listener, a fallback taken — on standard error as
/// `wholemem: …`, at most 20 times per process.
pub fn warn(msg: &str) {
    use std::sync::atomic::Ordering;
    match WARNED.fetch_add(1, Ordering::Relaxed) {
        n if n < WARN_MAX => eprintln!("wholemem: {msg}"),
        WARN_MAX => eprintln!("wholemem: {msg} (further such messages are not shown)"),
        _ => {}
    }
}

/// The world communicator for this process, from the environment.
///
/// The backend: `WM_BACKEND` (`auto`, `socket`, `mpi`); `auto` picks MPI when
/// built with the `mpi` feature and started by an MPI launcher, else the
/// embedded sockets.
///
/// # Errors
/// [`Error::Bootstrap`] when the environment names a world of several ranks
/// but no way to meet; [`Error::Timeout`] naming ranks that never arrived.
pub fn init() -> Result<Arc<dyn Communicator>> {
    tune_allocator();
    let backend = wm_topology::env::WM_BACKEND.get();
    match backend.as_deref() {
        None | Some("auto") => {
            #[cfg(feature = "mpi")]
            if mpi_backend::launched_by_mpi() {
                return Ok(Arc::new(mpi_backend::MpiComm::from_env()?));
            }
            Ok(Arc::new(SocketComm::from_env()?))
        }
        Some("socket") => Ok(Arc::new(SocketComm::from_env()?)),
        #[cfg(feature = "mpi")]
        Some("mpi") => Ok(Arc::new(mpi_backend::MpiComm::from_env()?)),
        #[cfg(not(feature = "mpi"))]
        Some("mpi") => {
            Err(Error::Unsupported { what: "WM_BACKEND=mpi".into(), reason: "this build has no MPI support (the `mpi` feature)".into() })
        }
        Some(other) => Err(Error::Bootstrap(format!("WM_BACKEND={other:?}: expected auto, socket or mpi"))),
    }
}
