//! One-sided reads of wholemem tables: `get` and `get_batch` of any rows,
//! by any rank at any time and alone, or by a process outside the job —
//! without the ranks that own the rows taking part.
//!
//! A job makes a table readable with [`Table::new`] (collective: every
//! rank starts a read server for its rows, registers them where a
//! transport needs it, and learns every rank's record), then
//! [`Table::publish`]es it (collective): writes made before a publish are
//! seen by every read that starts after it returns. A rank reads with
//! [`Table::reader`]; a process outside the job [`Reader::join`]s the
//! published table by name through the job's rendezvous (`dir:` or
//! `host:port`), proving it holds the job's key. Device tables are served
//! through a host copy of each rank's rows, refreshed and published by
//! [`Table::publish_from`].
//!
//! Transports, one per owner, chosen automatically ([`Method`]; override
//! with `WM_ONE_SIDED` or the `method` field of [`Options`]):
//!
//! - **shm** — an owner on the reader's node: its portion (a sealed memfd)
//!   mapped read-only, rows copied straight from it;
//! - **fabric** (feature `fabric`) — libfabric RMA reads from memory the
//!   owner registered once, several rows per operation;
//! - **mpi** (feature `mpi`, ranks of an MPI job only) — passive-target
//!   `MPI_Get` from windows over the owners' portions;
//! - **socket** — always there: the owner's read server answers over TCP
//!   (or a Unix socket), from a thread of its own.
//!
//! ```no_run
//! use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
//! use wm_gather::{DType, Ids};
//! let world = wm_comm::init()?;
//! let req = AllocRequest { ty: MemoryType::Distributed, loc: Location::Host, total: 1000 * 512, granularity: 512, partition: None };
//! let mem = WholeMemory::allocate(&world, &req)?;
//! let table = wm_onesided::Table::new(&mem, "features", DType::F32, &Default::default())?;
//! table.publish()?; // collective: writes so far are visible
//! let reader = table.reader()?; // cheap to clone, usable from many threads
//! let mut rows = vec![0u8; 3 * 512];
//! reader.get_batch(Ids::I64(&[7, 999, 7]), &mut rows, DType::F32)?; // no other rank takes part
//! table.free()?;
//! mem.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `docs/one-sided.md` has the transports, the visibility rule, joining,
//! the profile and what each libfabric provider needs on a cluster.
//!
//! Unsafe code is denied except in `shm` (row sources over read-only
//! mappings, rows sent from them), `fabric` (libfabric calls) and `mpi_rma`
//! (MPI calls), and for the `unsafe fn Transport::register` (a buffer's
//! registration must be dropped before the buffer), declared in
//! `transport` and called by `Reader::register_recv`; ARCHITECTURE.md
//! lists them.
#![deny(unsafe_code)]

mod catalog;
mod client;
mod error;
#[cfg(feature = "fabric")]
#[allow(unsafe_code)]
mod fabric;
mod mirror;
#[cfg(feature = "mpi")]
#[allow(unsafe_code)]
mod mpi_rma;
mod profile;
mod reader;
mod record;
mod server;
// Read-only mappings of owners' portions as row sources.
#[allow(unsafe_code)]
mod shm;
mod socket;
mod table;
mod transport;
mod wire;

use std::str::FromStr;
use std::time::Duration;
use wholemem::CommonError;

pub use error::{Error, Result};
pub use profile::Profile;
pub use reader::{Info, Reader, RecvBuffer};
pub use table::Table;
pub use wm_comm::Rendezvous;

/// How a reader reaches an owner's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The owner's portion mapped read-only (same node, host memory).
    Shm,
    /// libfabric RMA reads (feature `fabric`).
    Fabric,
    /// MPI RMA windows (feature `mpi`, ranks of an MPI job).
    Mpi,
    /// The owner's read server, over TCP or a Unix socket.
    Socket,
}

impl Method {
    /// Every method.
    pub const ALL: [Method; 4] = [Method::Shm, Method::Fabric, Method::Mpi, Method::Socket];

    /// Its name (`shm`, `fabric`, `mpi`, `socket`).
    pub fn name(self) -> &'static str {
        match self {
            Method::Shm => "shm",
            Method::Fabric => "fabric",
            Method::Mpi => "mpi",
            Method::Socket => "socket",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Method {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Method::ALL.into_iter().find(|m| m.name().eq_ignore_ascii_case(s.trim())).ok_or_else(|| {
            Error::Common(CommonError::InvalidArgument(format!("one-sided method {s:?}: expected auto, shm, fabric, mpi or socket")))
        })
    }
}

/// The method `WM_ONE_SIDED` names (`None` for `auto` or unset).
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the value.
pub fn method_from_env() -> Result<Option<Method>> {
    match wm_topology::env::WM_ONE_SIDED.get() {
        None => Ok(None),
        Some(v) if v.trim().eq_ignore_ascii_case("auto") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            Error::Common(CommonError::InvalidArgument(format!(
                "{}={v:?}: expected auto, shm, fabric, mpi or socket",
                wm_topology::env::WM_ONE_SIDED.name
            )))
        }),
    }
}

/// Choices for a table or a reader; every field has a default from the
/// environment.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The transport for every owner (`None`: `WM_ONE_SIDED`, else
    /// automatic). A table sets up what it names: `fabric` registers the
    /// rows with libfabric, `mpi` opens windows.
    pub method: Option<Method>,
    /// Where outside readers find the table (`None`: `WM_RENDEZVOUS`;
    /// without either, only the job's ranks can read it).
    pub publish_at: Option<Rendezvous>,
    /// Keep a profile (`None`: `WM_PROFILE=1`).
    pub profile: Option<bool>,
    /// How long [`Reader::join`] waits for the table to be published
    /// (`None`: `WM_TIMEOUT_S`).
    pub join_timeout: Option<Duration>,
    /// The job's key (`None`: `WM_JOB_KEY`, `WM_JOB_KEY_FILE`, or a `dir:`
    /// rendezvous's `job.key`; a job without any draws one for its ranks,
    /// and then no reader outside the job can join).
    pub key: Option<wm_comm::JobKey>,
    /// Serve a host table through a host mirror, as a device table is
    /// served (`Table::publish_from` then copies the rows): for testing the
    /// device path where there is no GPU. Not part of the stable API.
    #[doc(hidden)]
    pub force_mirror: bool,
}

impl Options {
    /// The method asked for: the field, else `WM_ONE_SIDED`.
    pub(crate) fn method(&self) -> Result<Option<Method>> {
        match self.method {
            Some(m) => Ok(Some(m)),
            None => method_from_env(),
        }
    }

    /// Whether to keep a profile.
    pub(crate) fn profile(&self) -> bool {
        self.profile.unwrap_or_else(|| matches!(wm_topology::env::WM_PROFILE.get().as_deref().map(str::trim), Some("1" | "true" | "yes")))
    }
}

/// The methods this build can use at all, and why not for the others.
pub fn available(m: Method) -> std::result::Result<(), &'static str> {
    match m {
        Method::Shm | Method::Socket => Ok(()),
        #[cfg(feature = "fabric")]
        Method::Fabric => Ok(()),
        #[cfg(not(feature = "fabric"))]
        Method::Fabric => Err("this build has no libfabric support (the `fabric` feature)"),
        #[cfg(feature = "mpi")]
        Method::Mpi => Ok(()),
        #[cfg(not(feature = "mpi"))]
        Method::Mpi => Err("this build has no MPI support (the `mpi` feature)"),
    }
}
