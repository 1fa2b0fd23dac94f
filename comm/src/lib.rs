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
//! ```no_run
//! use wm_comm::{CommExt, Communicator};
//! let world = wm_comm::init()?;
//! let ranks = world.allgather_value(world.rank() as u64)?;
//! assert_eq!(ranks.len(), world.size());
//! # Ok::<(), wm_comm::Error>(())
//! ```

mod communicator;
mod error;
pub mod launch;
pub mod ranks;
pub mod socket;
mod sys;

use std::sync::Arc;

pub use communicator::{CommExt, Communicator};
pub use error::{Error, Result, rank_list};
pub use ranks::{RankEnv, RankSource};
pub use socket::{Rendezvous, SocketComm};

/// The world communicator for this process, from the environment.
///
/// # Errors
/// [`Error::Bootstrap`] when the environment names a world of several ranks
/// but no way to meet; [`Error::Timeout`] naming ranks that never arrived.
pub fn init() -> Result<Arc<dyn Communicator>> {
    Ok(Arc::new(SocketComm::from_env()?))
}
