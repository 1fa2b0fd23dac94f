//! The owning side: a job makes a table readable one-sidedly, publishes
//! its writes, and frees it — all collectively.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wholemem::{Element, Location, MappedPortion, WholeMemory, WholeTensor};
use wm_comm::auth::ReaderId;
use wm_comm::{CommExt, Communicator, JobKey, Rendezvous};
use wm_gather::DType;

use crate::client::Identity;
use crate::reader::{Origin, Reader, copy_threads};
use crate::record::{self, Checked, OwnerRecord, TableRecord, check_name};
use crate::server::{Serve, Server};
use crate::shm::{Mapped, OwnerRows};
use crate::{Error, Method, Options, Result};
use crate::{catalog, mirror};

/// A table made readable one-sidedly: every rank serves its rows, and any
/// rank — or a process outside the job, once the table is
/// [published](Self::publish) — reads any rows without the owners taking
/// part.
///
/// Created, published and freed collectively. The table reads the
/// memory's rows through a mapping of its own, so it does not borrow the
/// [`WholeMemory`]: free the `Table` before the memory (a table outliving
/// its memory serves the freed rows' last contents, safely).
///
/// A table of device memory is served through a host copy of its rows
/// (its *mirror*), which [`publish_from`](Self::publish_from) refreshes.
#[derive(Debug)]
pub struct Table {
    name: String,
    comm: Arc<dyn Communicator>,
    /// The host copy served in place of device rows (`None`: the rows are
    /// served where they are).
    mirror: Option<Mutex<WholeMemory>>,
    record: Mutex<TableRecord>,
    checked: Checked,
    server: Server,
    epoch: AtomicU64,
    closed: Arc<AtomicBool>,
    key: JobKey,
    method: Option<Method>,
    profile: bool,
    publish_at: Option<Rendezvous>,
    published: AtomicBool,
    reader: Mutex<Option<Reader>>,
    #[cfg(feature = "fabric")]
    fabric: Option<crate::fabric::Owner>,
    #[cfg(feature = "mpi")]
    mpi: Option<Arc<crate::mpi_rma::Window>>,
}

// Tables are shared between threads (readers, publishes).
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Table>();
};

/// What a rank set up for a table, before every rank knows every record.
struct Started {
    server: Server,
    bytes: Vec<u8>,
    own: Arc<OwnerRows>,
    #[cfg(feature = "fabric")]
    fabric: Option<crate::fabric::Owner>,
}

/// [`Table::new`]'s first phase: the name, the row width and the method
/// checked on every rank, then agreed, and every rank asking for the same
/// table. The columns, the method and where to publish.
fn check_arguments(mem: &WholeMemory, name: &str, dtype: DType, opts: &Options) -> Result<(usize, Option<Method>, Option<Rendezvous>)> {
    let comm = mem.comm();
    let method = opts.method();
    let publish_at = match &opts.publish_at {
        Some(a) => Ok(Some(a.clone())),
        None => Rendezvous::from_env().map_err(Error::from),
    };
    let args = (|| {
        check_name(name)?;
        let cols = columns(mem.granularity(), dtype)?;
        let method = method?;
        if let Some(m) = method
            && let Err(why) = crate::available(m)
        {
            return Err(Error::Unsupported { what: format!("one-sided {m} reads"), reason: why.into() });
        }
        Ok((cols, method, publish_at?))
    })();
    let (cols, method, publish_at) = agree(comm.as_ref(), args, Rule::Lowest)?;
    // Every rank must ask for the same table.
    let mirrored = mem.location() == Location::Device || opts.force_mirror;
    let mine = format!("{name}|{dtype}|{}|{}", method.map_or("auto", Method::name), if mirrored { "mirror" } else { "in place" });
    let all = comm.allgatherv(mine.as_bytes())?;
    if let Some(r) = all.iter().position(|a| a != &all[0]) {
        let w = comm.world_ranks();
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "ranks passed different tables: rank {} {:?} and rank {} {:?} (name|type|method|served)",
            w[0],
            String::from_utf8_lossy(&all[0]),
            w[r],
            String::from_utf8_lossy(&all[r])
        ))));
    }
    Ok((cols, method, publish_at))
}

/// What a rank serves a table from: the table, the memory served (the
/// table itself, or its host mirror), and how.
struct Serving<'a> {
    mem: &'a WholeMemory,
    served: &'a WholeMemory,
    name: &'a str,
    key: &'a JobKey,
    timeout: std::time::Duration,
    publish_at: Option<&'a Rendezvous>,
    /// The method asked for (its libfabric endpoint, with `fabric`).
    #[cfg(feature = "fabric")]
    method: Option<Method>,
}

/// [`Table::new`]'s second phase on this rank: its portion opened again
/// read-only and mapped, its server started (and its libfabric endpoint),
/// and its owner record written.
fn start_serving(serving: &Serving<'_>) -> Result<Started> {
    let Serving { mem, served, name, key, timeout, publish_at, .. } = *serving;
    let comm = mem.comm();
    let (me, world_rank) = (comm.rank(), comm.world_rank());
    let p = mem.partition();
    let g = mem.granularity();
    let portion = served
        .portion()
        .ok_or_else(|| Error::Unsupported { what: "one-sided reads".into(), reason: "the table has no host portion".into() })?;
    // Opened again read-only (not duplicated): readers are handed
    // descriptors that can neither write nor map for writing.
    let fds = portion
        .pieces()
        .iter()
        .map(|(fd, _)| {
            std::fs::OpenOptions::new()
                .read(true)
                .open(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(fd)))
                .map(std::os::fd::OwnedFd::from)
        })
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Error::io("opening the portion's memfds again read-only", e))?;
    let sizes: Vec<usize> = portion.pieces().iter().map(|p| p.1).collect();
    let map = MappedPortion::open(&fds.iter().map(|f| f.as_fd()).zip(sizes.iter().copied()).collect::<Vec<_>>(), world_rank)?;
    let own = Arc::new(OwnerRows::new(map, portion.offset(), p.count(me), g, world_rank)?);
    let nonce = u64::from_le_bytes(*JobKey::generate()?.fingerprint().first_chunk::<8>().unwrap_or(&[0; 8]));
    let ip = Rendezvous::advertised_ip(publish_at)?;
    let server = Server::start(Serve {
        table: name.to_owned(),
        rank: world_rank,
        rows: Mapped::new(vec![own.clone()], g),
        count: p.count(me),
        row_bytes: g,
        portion: fds,
        key: key.clone(),
        nonce,
        timeout,
        ip,
    })?;
    let node = wm_topology::NodeIdentity::discover();
    #[cfg(feature = "fabric")]
    let fabric = crate::fabric::Owner::for_table(serving.method, &own, ip)?;
    let record = OwnerRecord {
        rank: world_rank,
        node_id: node.id().to_owned(),
        hostname: node.hostname().to_owned(),
        node_overridden: node.overridden(),
        unix_name: server.unix_name.clone(),
        tcp_addr: server.tcp_addr.to_string(),
        nonce,
        pieces: sizes.iter().map(|&b| b as u64).collect(),
        offset: portion.offset() as u64,
        #[cfg(feature = "fabric")]
        fabric: fabric.as_ref().map(crate::fabric::Owner::record),
        #[cfg(not(feature = "fabric"))]
        fabric: None,
    };
    let bytes = serde_json::to_vec(&record).map_err(|e| Error::Common(CommonError::InvalidArgument(e.to_string())))?;
    Ok(Started {
        server,
        bytes,
        own,
        #[cfg(feature = "fabric")]
        fabric,
    })
}

/// [`Table::new`]'s third phase: every rank's owner record (`bytes` is
/// this rank's) gathered into the table's record, checked, and agreed.
fn assemble_record(mem: &WholeMemory, name: &str, dtype: DType, cols: usize, bytes: &[u8]) -> Result<(TableRecord, Checked)> {
    let comm = mem.comm();
    let (p, g) = (mem.partition(), mem.granularity());
    let all = comm.allgatherv(bytes)?;
    let ids = comm.allgather_value(u64::from_le_bytes(*JobKey::generate()?.fingerprint().first_chunk::<8>().unwrap_or(&[0; 8])))?;
    let owners: Result<Vec<OwnerRecord>> = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(b)
                .map_err(|e| Error::Malformed { from: format!("rank {}", comm.world_ranks()[r]), detail: format!("its owner record: {e}") })
        })
        .collect();
    let assembled = owners.and_then(|owners| {
        let record = TableRecord {
            version: record::VERSION,
            name: name.to_owned(),
            id: ids[0],
            rows: mem.rows() as u64,
            row_bytes: g as u64,
            dtype: dtype.name().to_owned(),
            cols: cols as u64,
            memory_type: mem.memory_type().name().to_owned(),
            location: mem.location().name().to_owned(),
            counts: p.counts().iter().map(|&c| c as u64).collect(),
            epoch: 0,
            owners,
        };
        let checked = record.check("this job's ranks")?;
        Ok((record, checked))
    });
    agree(comm.as_ref(), assembled, Rule::Lowest)
}

/// Rows of `granularity` bytes as elements of `dtype`.
fn columns(granularity: usize, dtype: DType) -> Result<usize> {
    if granularity % dtype.size() != 0 {
        return Err(Error::Common(CommonError::InvalidArgument(format!("rows of {granularity} bytes are not whole {dtype} elements"))));
    }
    Ok(granularity / dtype.size())
}

/// The job key every rank holds, checked equal without sending it: the
/// one given, `WM_JOB_KEY`/`WM_JOB_KEY_FILE`, the key the job's
/// communicator was started with, or a `dir:` rendezvous's `job.key`. A key
/// is never sent: a job of several ranks without one is refused, saying
/// how to set one; a single process draws its own.
fn job_key(comm: &dyn Communicator, given: Option<&JobKey>, at: Option<&Rendezvous>) -> Result<JobKey> {
    let mine = match given {
        Some(k) => Ok(Some(k.clone())),
        None => match JobKey::from_env() {
            Ok(Some(k)) => Ok(Some(k)),
            Ok(None) => Ok(wm_comm::trust::process_key().or_else(|| at.and_then(|a| a.reader_key().ok()))),
            Err(e) => Err(Error::from(e)),
        },
    };
    let mine = agree(comm, mine, Rule::Lowest)?;
    let print = mine.as_ref().map_or([0u8; 32], JobKey::fingerprint);
    let all = comm.allgather(&print)?;
    let prints: Vec<&[u8]> = all.chunks(32).collect();
    if let Some(r) = prints.iter().position(|p| *p != prints[0]) {
        let w = comm.world_ranks();
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "ranks {} and {} hold different job keys (or one holds none): set WM_JOB_KEY the same on every rank",
            w[0], w[r]
        ))));
    }
    match mine {
        Some(k) => Ok(k),
        None if comm.size() == 1 => Ok(JobKey::generate()?),
        None => Err(Error::Common(CommonError::InvalidArgument(format!(
            "a one-sided table of {} ranks needs a job key its ranks already share (a key is never sent in clear text): \
             set WM_JOB_KEY to the same 64 hexadecimal digits on every rank (`export WM_JOB_KEY=$(openssl rand -hex 32)`), \
             or pass Options::key",
            comm.size()
        )))),
    }
}

impl Table {
    /// Makes `mem` readable one-sidedly as table `name`, of elements of
    /// `dtype` (rows of `mem.granularity()` bytes). Collective: every rank
    /// passes the same name, type and options.
    ///
    /// Every rank starts a read server for its rows (two listening
    /// sockets and a thread each), registers them with libfabric when the
    /// method is `fabric` (or automatic, with a provider named), and opens
    /// an MPI window when it is `mpi`. Readers see the rows from the
    /// first [`publish`](Self::publish) on.
    ///
    /// Device memory is served through the host: every rank allocates host
    /// memory for its rows (a table of the same type and partition, the
    /// *mirror*), copies its device rows into it, and serves the copy.
    /// Readers see that snapshot until
    /// [`publish_from`](Self::publish_from) copies the rows again.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the value (a bad name, rows that
    /// are not whole elements, ranks passing different arguments or holding
    /// different job keys); [`Error::Unsupported`] for a method this build
    /// lacks, or host memory of the table's type refused here (for a
    /// device table's mirror); a failure on any rank, on every rank.
    pub fn new(mem: &WholeMemory, name: &str, dtype: DType, opts: &Options) -> Result<Self> {
        let comm = mem.comm().clone();
        let (cols, method, publish_at) = check_arguments(mem, name, dtype, opts)?;
        let key = job_key(comm.as_ref(), opts.key.as_ref(), publish_at.as_ref())?;
        let timeout = wm_topology::env::timeout().map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
        // A device table's rows, copied to the host (collective).
        let mirrored = mem.location() == Location::Device || opts.force_mirror;
        let mirror = match mirrored {
            true => {
                let mut m = mirror::allocate(mem)?;
                agree(comm.as_ref(), mirror::copy_local(mem, &mut m), Rule::Lowest)?;
                Some(m)
            }
            false => None,
        };
        let served = mirror.as_ref().unwrap_or(mem);
        let serving = Serving {
            mem,
            served,
            name,
            key: &key,
            timeout,
            publish_at: publish_at.as_ref(),
            #[cfg(feature = "fabric")]
            method,
        };
        let started = start_serving(&serving);
        let Started {
            server,
            bytes,
            own,
            #[cfg(feature = "fabric")]
            fabric,
        } = agree(comm.as_ref(), started, Rule::Lowest)?;
        let (record, checked) = assemble_record(mem, name, dtype, cols, &bytes)?;
        #[cfg(feature = "mpi")]
        let mpi = crate::mpi_rma::Window::for_table(method, &comm, &own, name, &mem.partition().counts(), mem.granularity())?;
        #[cfg(not(feature = "mpi"))]
        drop(own);
        Ok(Self {
            name: name.to_owned(),
            comm,
            mirror: mirror.map(Mutex::new),
            record: Mutex::new(record),
            checked,
            server,
            epoch: AtomicU64::new(0),
            closed: Arc::new(AtomicBool::new(false)),
            key,
            method,
            profile: opts.profile(),
            publish_at,
            published: AtomicBool::new(false),
            reader: Mutex::new(None),
            #[cfg(feature = "fabric")]
            fabric,
            #[cfg(feature = "mpi")]
            mpi,
        })
    }

    /// [`new`](Self::new) for a typed tensor (elements of `T`).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn of<T: Element>(t: &WholeTensor<T>, name: &str, opts: &Options) -> Result<Self> {
        Self::new(t.memory(), name, T::DTYPE, opts)
    }

    /// Makes every write to the table made before this call — on any rank,
    /// by scatter, `write_rows`, loading — visible to one-sided reads that
    /// start after it returns, and publishes the table by name for readers
    /// outside the job (at the job's rendezvous, or
    /// [`Options::publish_at`]). Collective (DDStore's `epoch_begin`).
    ///
    /// Reads that overlap a write may see the old row, the new one, or a
    /// mix of the two: separate writes from reads with a publish.
    ///
    /// # Errors
    /// A lost peer; rank 0 unable to publish the record (on every rank).
    /// [`Error::Unsupported`] on a table served through a host mirror (a
    /// device table), on every rank and without communicating: its writes
    /// reach readers only through [`publish_from`](Self::publish_from).
    pub fn publish(&self) -> Result<()> {
        if self.mirror.is_some() {
            return Err(Error::Unsupported {
                what: format!("publish() of table {:?}", self.name),
                reason: "it is served through a host copy of its device rows, which publish() would leave stale: \
                         call publish_from(&mem) with the table's memory, which copies the rows and then publishes"
                    .into(),
            });
        }
        self.publish_epoch()
    }

    /// Copies this rank's rows of `mem` — the memory the table was made
    /// from — into the table's host mirror, then publishes as
    /// [`publish`](Self::publish) does: every write to `mem` made before
    /// this call is seen by one-sided reads that start after it returns.
    /// Collective. The way to publish a device table; on a table served in
    /// place (host memory) it checks `mem`'s shape and is `publish`.
    ///
    /// Until it returns on every rank, readers see the previous snapshot
    /// (or, for a row being copied at that moment, a mix of the two).
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] when `mem` has other rows, row size or
    /// rows per rank than the table; a failed copy; as
    /// [`publish`](Self::publish) — each on every rank.
    pub fn publish_from(&self, mem: &WholeMemory) -> Result<()> {
        let c = &self.checked;
        let shape = mirror::check_shape(mem, &self.name, c.rows, c.row_bytes, &c.partition.counts());
        let copied = shape.and_then(|()| match &self.mirror {
            Some(m) => mirror::copy_local(mem, &mut m.lock().unwrap_or_else(|p| p.into_inner())),
            None => Ok(()),
        });
        agree(self.comm.as_ref(), copied, Rule::Lowest)?;
        self.publish_epoch()
    }

    /// Whether the table is served through a host mirror (a device table)
    /// and so published with [`publish_from`](Self::publish_from).
    pub fn is_mirrored(&self) -> bool {
        self.mirror.is_some()
    }

    /// The collective part of a publish: every rank's writes (or copies)
    /// done, the epoch bumped, the record republished.
    fn publish_epoch(&self) -> Result<()> {
        // Every rank's writes are done once every rank is here.
        self.comm.barrier()?;
        #[cfg(feature = "mpi")]
        if let Some(w) = &self.mpi {
            w.sync()?;
        }
        let e = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        self.server.set_epoch(e);
        let out = {
            let mut r = self.record.lock().unwrap_or_else(|p| p.into_inner());
            r.epoch = e;
            match (&self.publish_at, self.comm.rank()) {
                (Some(at), 0) => serde_json::to_vec(&*r)
                    .map_err(|e| Error::Common(CommonError::InvalidArgument(e.to_string())))
                    .and_then(|bytes| catalog::publish(at, &self.name, &bytes, &self.key)),
                _ => Ok(()),
            }
        };
        agree(self.comm.as_ref(), out, Rule::Lowest)?;
        self.published.store(true, Ordering::Release);
        Ok(())
    }

    /// Publishes so far.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Where readers outside the job find the table once published (`None`:
    /// only the job's ranks can read it).
    pub fn published_at(&self) -> Option<&Rendezvous> {
        self.publish_at.as_ref()
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A reader for this rank (one per table and process, shared by its
    /// clones): not collective, and usable at any time until the table is
    /// freed.
    ///
    /// # Errors
    /// As [`Reader::join`] once the record is known: a method that cannot
    /// reach some owner, a server that cannot be reached.
    pub fn reader(&self) -> Result<Reader> {
        let mut slot = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let timeout = wm_topology::env::timeout().map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
        let comm = &self.comm;
        let local = (0..comm.size()).filter(|&r| comm.same_node(r, comm.rank())).count();
        let origin = Origin {
            id: Identity { key: self.key.clone(), who: ReaderId::Rank(comm.world_rank()), timeout },
            method: self.method,
            profile: self.profile,
            threads: copy_threads(local),
            closed: Some(self.closed.clone()),
            #[cfg(feature = "mpi")]
            mpi: self.mpi.clone().map(|w| w as Arc<dyn crate::transport::Transport>),
            #[cfg(not(feature = "mpi"))]
            mpi: None,
        };
        let record = self.record.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let r = Reader::open(record, self.checked.clone(), origin)?;
        *slot = Some(r.clone());
        Ok(r)
    }

    /// Stops serving (this rank's part of free, and of drop).
    fn shut(&mut self) {
        self.closed.store(true, Ordering::Release);
        self.server.stop();
        if self.comm.rank() == 0
            && self.published.swap(false, Ordering::AcqRel)
            && let Some(at) = &self.publish_at
        {
            catalog::withdraw(at, &self.name);
        }
        self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Frees the table collectively: every rank stops serving, the record
    /// is withdrawn, and every reader — in the job or outside it — fails
    /// with [`Error::Gone`] from then on. The memory itself stays the
    /// caller's.
    ///
    /// # Errors
    /// A lost peer.
    pub fn free(mut self) -> Result<()> {
        self.shut();
        #[cfg(feature = "mpi")]
        if let Some(w) = self.mpi.take() {
            w.free(self.comm.as_ref())?;
        }
        #[cfg(feature = "fabric")]
        drop(self.fabric.take());
        if let Some(m) = self.mirror.take() {
            m.into_inner().unwrap_or_else(|p| p.into_inner()).free()?;
        }
        let comm = self.comm.clone();
        drop(self);
        comm.barrier().map_err(Error::from)
    }
}

impl Drop for Table {
    /// A table dropped without [`free`](Table::free) stops serving too
    /// (its MPI window, which only a collective call can free, is left to
    /// `MPI_Finalize`).
    fn drop(&mut self) {
        self.shut();
    }
}
