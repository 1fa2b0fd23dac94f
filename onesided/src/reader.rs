//! The reading side: a [`Reader`] of a published table, in the job
//! ([`Table::reader`](crate::Table::reader)) or outside it
//! ([`Reader::join`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use wholemem::CommonError;
use wholemem::{Location, MappedPortion, MemoryType};
use wm_comm::Rendezvous;
use wm_comm::auth::ReaderId;
use wm_gather::{DType, Element, Ids, Index, RowLayout};
use wm_topology::NodeIdentity;

use crate::catalog::{self, Found};
use crate::client::{self, Addr, Conn, Identity, Probe};
use crate::profile::Counters;
use crate::record::{Checked, TableRecord, check_name};
use crate::shm::{OwnerRows, ShmTransport};
use crate::socket::{SocketTransport, Target};
use crate::transport::{ReadRequest, Transport};
use crate::{Error, Method, Options, Profile, Result};

/// What a reader knows of its table (DDStore's `info`, and more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// The table's name.
    pub name: String,
    /// Rows in the table.
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// The element type.
    pub dtype: DType,
    /// Bytes per row.
    pub row_bytes: usize,
    /// Ranks that own rows (zero-row ranks included).
    pub ranks: usize,
    /// The table's memory type and location in its job.
    pub memory_type: MemoryType,
    /// Where its rows live in the job.
    pub location: Location,
    /// Rows per rank.
    pub counts: Vec<usize>,
}

/// Reads rows of a published table without their owners taking part.
///
/// Cheap to clone; clones share connections, mappings and the profile,
/// and any number of threads may read at once (each read takes its own
/// connections or endpoints). After the job frees the table or ends, every
/// read fails with [`Error::Gone`] — never a hang (reads wait at most
/// `WM_TIMEOUT_S`), never a crash (mapped portions stay mapped until the
/// last clone is dropped).
///
/// A reader belongs to the process that opened it. A process that `fork`s
/// (a loader worker) opens its own connections with
/// [`reopen`](Self::reopen) in the child, or, after `exec`,
/// [`join`](Self::join)s again; the parent's reader used in the child
/// fails with [`Error::Forked`] and touches nothing of the parent's.
#[derive(Debug, Clone)]
pub struct Reader {
    inner: Arc<Inner>,
}

/// What reopening a reader needs again.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub id: Identity,
    pub method: Option<Method>,
    pub profile: bool,
    pub threads: usize,
    /// Set when the job's own table is freed (readers in the job).
    pub closed: Option<Arc<AtomicBool>>,
    /// The MPI transport (readers in an MPI job that opened windows).
    pub mpi: Option<Arc<dyn Transport>>,
}

#[derive(Debug)]
struct Inner {
    record: TableRecord,
    c: Checked,
    /// Each owner's method.
    methods: Vec<Method>,
    /// Each owner's transport: an index into `transports`.
    route: Vec<usize>,
    transports: Vec<Arc<dyn Transport>>,
    /// Owners whose rows come without their server's connection in the
    /// way: a connection kept open only to notice when they go.
    probes: Vec<Option<Probe>>,
    /// Owner 0's server, for `epoch`.
    ping: Mutex<Option<Conn>>,
    gone: OnceLock<String>,
    profile: Option<Counters>,
    origin: Origin,
    /// The process that opened the reader: a forked child has another.
    pid: u32,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy. Its libfabric and MPI objects are the
            // parent's: closing them here could end the parent's endpoints,
            // or wait on locks of threads the child does not have. They go
            // with the child's memory when it exits. (Sockets and mappings
            // are the child's copies: closing them touches nothing of the
            // parent's.)
            for t in self.transports.drain(..) {
                if matches!(t.method(), Method::Fabric | Method::Mpi) {
                    std::mem::forget(t);
                }
            }
        }
    }
}

/// Threads for local copies: `WM_THREADS`, else the cores divided by the
/// `ranks` on this node.
pub(crate) fn copy_threads(ranks: usize) -> usize {
    if let Ok(Some(n)) = wm_topology::env::WM_THREADS.parse::<usize>() {
        return n.max(1);
    }
    (std::thread::available_parallelism().map_or(1, |n| n.get()) / ranks.max(1)).max(1)
}

impl Reader {
    /// Joins a table that a running job published as `name`, through the
    /// job's rendezvous `at`, read-only. Waits for the table to be
    /// published, up to [`Options::join_timeout`] (default `WM_TIMEOUT_S`).
    /// The job's key comes from `WM_JOB_KEY` or `WM_JOB_KEY_FILE` (for
    /// `dir:`, also the directory's `job.key`).
    ///
    /// # Errors
    /// [`Error::NotPublished`] when no table of that name appeared in time;
    /// [`Error::Refused`] when this process does not hold the job's key;
    /// [`Error::Gone`] when the job that published it is gone;
    /// [`Error::Malformed`] for a record or server that breaks the protocol.
    pub fn join(at: &Rendezvous, name: &str, opts: &Options) -> Result<Self> {
        check_name(name)?;
        let key = match &opts.key {
            Some(k) => k.clone(),
            None => at.reader_key()?,
        };
        let timeout = wm_topology::env::timeout().map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
        let wait = opts.join_timeout.unwrap_or(timeout);
        let deadline = Instant::now() + wait;
        let from = format!("the catalogue at {}", catalog::describe(at));
        let mut closed_since: Option<Instant> = None;
        loop {
            match catalog::lookup(at, name, &key, timeout)? {
                Found::Closed(e) => {
                    let since = *closed_since.get_or_insert_with(Instant::now);
                    if Instant::now() >= deadline || since.elapsed() >= crate::client::RETRY_CLOSED {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Found::Record(bytes) => {
                    let (record, c) = TableRecord::parse(&bytes, &from)?;
                    if record.name != name {
                        return Err(Error::Malformed { from, detail: format!("the record for {name:?} is table {:?}'s", record.name) });
                    }
                    let origin = Origin {
                        id: Identity { key, who: ReaderId::Outside, timeout },
                        method: opts.method()?,
                        profile: opts.profile(),
                        threads: copy_threads(1),
                        closed: None,
                        mpi: None,
                    };
                    return Self::open(record, c, origin);
                }
                Found::Nothing(why) if Instant::now() >= deadline => {
                    return Err(Error::NotPublished {
                        name: name.to_owned(),
                        at: catalog::describe(at),
                        detail: format!("{why} after {:.1} s", wait.as_secs_f64()),
                    });
                }
                Found::Nothing(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A reader with connections, mappings and endpoints of its own, for
    /// the same table: what a process calls after `fork` (the parent's
    /// connections are not the child's to use: the parent's reader fails
    /// there with [`Error::Forked`]). Works in the process that opened the
    /// reader too.
    ///
    /// # Errors
    /// As [`join`](Self::join), once the record is known.
    pub fn reopen(&self) -> Result<Self> {
        let i = &self.inner;
        let mut origin = i.origin.clone();
        // A forked child is not the rank it was forked from.
        origin.mpi = None;
        Self::open(i.record.clone(), i.c.clone(), origin)
    }

    /// Opens a reader of `record`: chooses each owner's method, maps the
    /// portions of this node's owners (asking their servers for them), and
    /// sets up the transports.
    pub(crate) fn open(record: TableRecord, c: Checked, origin: Origin) -> Result<Self> {
        let me = NodeIdentity::discover();
        let table = record.name.clone();
        let n = record.owners.len();
        let first: Vec<usize> = (0..n).map(|r| c.partition.offset(r)).collect();
        let mut methods = Vec::with_capacity(n);
        for (r, o) in record.owners.iter().enumerate() {
            methods.push(choose(&origin, o, r, o.node() == me, c.partition.count(r), &table)?);
        }
        let mut shm_parts: Vec<Option<Arc<OwnerRows>>> = vec![None; n];
        let mut targets: Vec<Option<Target>> = (0..n).map(|_| None).collect();
        let mut probes: Vec<Option<Probe>> = (0..n).map(|_| None).collect();
        let addr_of = |o: &crate::record::OwnerRecord, same: bool| -> Result<Addr> {
            if same {
                Ok(Addr::Unix(o.unix_name.clone()))
            } else {
                o.tcp_addr
                    .parse()
                    .map(Addr::Tcp)
                    .map_err(|_| Error::Malformed { from: table.clone(), detail: format!("TCP address {:?}", o.tcp_addr) })
            }
        };
        for (r, o) in record.owners.iter().enumerate() {
            let same = o.node() == me;
            let at = addr_of(o, same)?;
            match methods[r] {
                Method::Shm if c.partition.count(r) > 0 => {
                    let mut conn = client::connect(&table, o.rank, &at, o.nonce, &origin.id)?;
                    let fds = conn.portion(&table, o.rank, &at, o.pieces.len(), origin.id.timeout)?;
                    let pieces: Vec<_> = fds.iter().zip(&o.pieces).map(|(fd, &b)| (std::os::fd::AsFd::as_fd(fd), b as usize)).collect();
                    let map = MappedPortion::open(&pieces, o.rank)?;
                    shm_parts[r] = Some(Arc::new(OwnerRows::new(map, o.offset as usize, c.partition.count(r), c.row_bytes, o.rank)?));
                    probes[r] = Some(conn.into_probe()?);
                }
                Method::Shm => {}
                Method::Socket => targets[r] = Some(Target::new(o.rank, at, o.nonce)),
                Method::Fabric | Method::Mpi if c.partition.count(r) > 0 => {
                    probes[r] = Some(client::connect(&table, o.rank, &at, o.nonce, &origin.id)?.into_probe()?);
                }
                Method::Fabric | Method::Mpi => {}
            }
        }
        let mut transports: Vec<Arc<dyn Transport>> = Vec::new();
        let mut slot_of = |m: Method, make: &mut dyn FnMut() -> Result<Arc<dyn Transport>>| -> Result<usize> {
            if let Some(i) = transports.iter().position(|t| t.method() == m) {
                return Ok(i);
            }
            transports.push(make()?);
            Ok(transports.len() - 1)
        };
        let mut route = Vec::with_capacity(n);
        let mut shm_parts = Some(shm_parts);
        let mut targets = Some(targets);
        for &m in &methods {
            let i = match m {
                Method::Shm => slot_of(m, &mut || {
                    let parts = shm_parts.take().unwrap_or_default();
                    // Owners reached otherwise stay unmapped; so do owners without rows.
                    Ok(Arc::new(ShmTransport::new(parts, first.clone(), c.row_bytes, origin.threads)))
                })?,
                Method::Socket => slot_of(m, &mut || {
                    let t = targets.take().unwrap_or_default();
                    Ok(Arc::new(SocketTransport::new(&table, t, first.clone(), origin.id.clone())))
                })?,
                Method::Mpi => slot_of(m, &mut || {
                    origin.mpi.clone().ok_or_else(|| Error::Unsupported {
                        what: "MPI RMA reads".into(),
                        reason: "this reader is not a rank of an MPI job that opened windows".into(),
                    })
                })?,
                Method::Fabric => slot_of(m, &mut || fabric_transport(&record, &c, &first, &methods, &origin))?,
            };
            route.push(i);
        }
        let profile = origin.profile.then(Counters::default);
        Ok(Self {
            inner: Arc::new(Inner {
                record,
                c,
                methods,
                route,
                transports,
                probes,
                ping: Mutex::new(None),
                gone: OnceLock::new(),
                profile,
                origin,
                pid: std::process::id(),
            }),
        })
    }

    /// The table: rows, row shape, element type (DDStore's `info`).
    pub fn info(&self) -> Info {
        let (r, c) = (&self.inner.record, &self.inner.c);
        Info {
            name: r.name.clone(),
            rows: c.rows,
            cols: c.cols,
            dtype: c.dtype,
            row_bytes: c.row_bytes,
            ranks: r.owners.len(),
            memory_type: c.ty,
            location: c.loc,
            counts: c.partition.counts(),
        }
    }

    /// The method each owner's rows come by, indexed by owner (its rank in
    /// the table's communicator).
    pub fn methods(&self) -> &[Method] {
        &self.inner.methods
    }

    /// The methods in use, each once, in owner order (what a report names).
    pub fn method_names(&self) -> String {
        let mut seen: Vec<Method> = Vec::new();
        for (r, &m) in self.inner.methods.iter().enumerate() {
            if self.inner.c.partition.count(r) > 0 && !seen.contains(&m) {
                seen.push(m);
            }
        }
        seen.iter().map(|m| m.name()).collect::<Vec<_>>().join("+")
    }

    /// The profile since this reader was opened, when profiling is on
    /// (`WM_PROFILE=1` or the `profile` field of [`Options`](crate::Options)).
    pub fn profile(&self) -> Option<Profile> {
        self.inner.profile.as_ref().map(Counters::snapshot)
    }

    /// The table's epoch as its first owner's server says now: how many
    /// times the job has published it.
    ///
    /// # Errors
    /// [`Error::Gone`] when the job freed the table or ended;
    /// [`Error::Forked`] in a process forked from the one that opened the
    /// reader.
    pub fn epoch(&self) -> Result<u64> {
        self.live()?;
        let i = &self.inner;
        let o = &i.record.owners[0];
        let at = if o.node() == NodeIdentity::discover() {
            Addr::Unix(o.unix_name.clone())
        } else {
            Addr::Tcp(o.tcp_addr.parse().map_err(|_| Error::Malformed { from: i.record.name.clone(), detail: "TCP address".into() })?)
        };
        let mut slot = i.ping.lock().unwrap_or_else(|p| p.into_inner());
        let mut conn = match slot.take() {
            Some(c) => c,
            None => client::connect(&i.record.name, o.rank, &at, o.nonce, &i.origin.id).map_err(|e| self.note(e))?,
        };
        let e = conn.ping(&i.record.name, o.rank, &at).map_err(|e| self.note(e))?;
        *slot = Some(conn);
        Ok(e)
    }

    /// A destination buffer of `bytes`, registered once with the reader's
    /// transports (libfabric memory registration), so reads into it — or
    /// any part of it — register nothing; unregistered when dropped.
    /// Transports that register nothing hand out a plain buffer.
    ///
    /// # Errors
    /// When the memory cannot be registered; [`Error::Forked`] in a process
    /// forked from the one that opened the reader.
    // Registers the buffer through the unsafe `Transport::register`.
    #[allow(unsafe_code)]
    pub fn register_recv(&self, bytes: usize) -> Result<RecvBuffer> {
        self.own()?;
        let mut buf = RecvBuffer { buf: vec![0u8; bytes], regs: Vec::new(), pid: std::process::id() };
        for t in &self.inner.transports {
            // SAFETY: the registration goes into `buf.regs`, which
            // `RecvBuffer` drops before `buf.buf` (its `Drop` clears it, and
            // field order does too); `buf.buf` is never resized (RecvBuffer
            // hands out slices only), so its allocation stays where it is.
            if let Some(reg) = unsafe { t.register(&mut buf.buf) }? {
                buf.regs.push(reg);
            }
        }
        Ok(buf)
    }

    /// Reads rows `start..start + n` into `out` (`n` rows of the table's
    /// `cols` elements of `out_dtype`).
    ///
    /// # Errors
    /// As [`get_batch`](Self::get_batch).
    pub fn get(&self, start: usize, n: usize, out: &mut [u8], out_dtype: DType) -> Result<()> {
        let rows = self.inner.c.rows;
        if start.checked_add(n).is_none_or(|end| end > rows) {
            let bad = if start >= rows { start } else { rows };
            return Err(Error::IndexOutOfRange {
                table: self.inner.record.name.clone(),
                index: i64::try_from(bad).unwrap_or(i64::MAX),
                position: bad - start,
                rows,
            });
        }
        self.read((start..start + n).collect(), out, out_dtype)
    }

    /// Reads rows `ids` (any order, repeats allowed) into `out`: output row
    /// `i` is row `ids[i]`, as `cols` elements of `out_dtype` (converted as
    /// gather converts: float ↔ float, int ↔ int). Every id is checked
    /// first; a bad one is an error naming it, and nothing is read.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`]; [`wholemem::CommonError::InvalidArgument`] for a wrongly
    /// sized `out`; a conversion between float and int; [`Error::Gone`]
    /// after the job freed the table or ended; [`wholemem::CommonError::Timeout`];
    /// [`Error::Forked`] in a process forked from the one that opened the
    /// reader; [`Error::Malformed`] for a server whose answer does not
    /// answer the request (its connection is closed; the next call opens
    /// another).
    pub fn get_batch(&self, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
        if let Some((position, index)) = ids.first_out_of_range(self.inner.c.rows) {
            return Err(Error::IndexOutOfRange { table: self.inner.record.name.clone(), index, position, rows: self.inner.c.rows });
        }
        let rows: Vec<usize> = match ids {
            Ids::I32(v) => v.iter().map(|&x| x as usize).collect(),
            Ids::I64(v) => v.iter().map(|&x| x as usize).collect(),
        };
        self.read(rows, out, out_dtype)
    }

    /// [`get_batch`](Self::get_batch) into a typed buffer.
    ///
    /// # Errors
    /// As [`get_batch`](Self::get_batch).
    pub fn get_batch_into<I: Index, O: Element>(&self, ids: &[I], out: &mut [O]) -> Result<()> {
        self.get_batch(I::ids(ids), bytemuck::cast_slice_mut(out), O::DTYPE)
    }

    /// Fails in a process forked from the one that opened the reader.
    fn own(&self) -> Result<()> {
        let (opened_by, this) = (self.inner.pid, std::process::id());
        if opened_by != this {
            return Err(Error::Forked { table: self.inner.record.name.clone(), opened_by, this });
        }
        Ok(())
    }

    /// Fails if the reader is not this process's, or the table is known
    /// to be gone.
    fn live(&self) -> Result<()> {
        self.own()?;
        let i = &self.inner;
        if let Some(d) = i.gone.get() {
            return Err(Error::Gone { table: i.record.name.clone(), detail: d.clone() });
        }
        if i.origin.closed.as_ref().is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(Error::Gone { table: i.record.name.clone(), detail: "this process's job freed it".into() });
        }
        Ok(())
    }

    /// Remembers a "gone" error, so later calls fail at once.
    fn note(&self, e: Error) -> Error {
        if let Error::Gone { detail, .. } = &e {
            let _ = self.inner.gone.set(detail.clone());
        }
        e
    }

    fn read(&self, rows: Vec<usize>, out: &mut [u8], out_dtype: DType) -> Result<()> {
        self.live()?;
        let i = &self.inner;
        let c = &i.c;
        c.dtype.check_conversion(out_dtype).map_err(wm_gather::Error::from)?;
        // `cols × out_dtype.size()` fits: the record's check bounds a row
        // in the widest element type.
        let want = rows.len().checked_mul(c.cols * out_dtype.size());
        if want != Some(out.len()) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "the output has {} bytes; {} rows of {} {out_dtype} elements need {}",
                out.len(),
                rows.len(),
                c.cols,
                want.map_or("more than usize::MAX".into(), |w| w.to_string())
            ))));
        }
        let layout = RowLayout::new(c.dtype, c.cols, 0)?;
        let owners: Vec<usize> = rows.iter().map(|&r| c.partition.owner(r)).collect();
        let mut touched = vec![false; i.methods.len()];
        for &o in &owners {
            touched[o] = true;
        }
        let used: Vec<usize> = {
            let mut u: Vec<usize> = (0..i.methods.len()).filter(|&o| touched[o]).map(|o| i.route[o]).collect();
            u.sort_unstable();
            u.dedup();
            u
        };
        let profile = i.profile.as_ref();
        let result = if let [t] = used[..] {
            let mut req = ReadRequest { rows: &rows, owners: &owners, slots: None, layout: &layout, out, out_dtype };
            i.transports[t].read(&mut req, profile)
        } else {
            // Each transport's rows, with where they go; remote ones first
            // would not overlap with the local copies, so order is free.
            let mut r = Ok(());
            for &t in &used {
                let pick: Vec<usize> = (0..rows.len()).filter(|&k| i.route[owners[k]] == t).collect();
                let (rs, os): (Vec<usize>, Vec<usize>) = pick.iter().map(|&k| (rows[k], owners[k])).unzip();
                let mut req = ReadRequest { rows: &rs, owners: &os, slots: Some(&pick), layout: &layout, out, out_dtype };
                r = i.transports[t].read(&mut req, profile);
                if r.is_err() {
                    break;
                }
            }
            r
        };
        // Rows that came through a mapping or RMA may be a freed table's:
        // the owners must still be there after the copy. A failed read of
        // an owner that is gone is that, whatever the transport said.
        for (o, p) in i.probes.iter().enumerate() {
            if let Some(p) = p
                && touched[o]
                && !p.alive()
            {
                let rank = i.record.owners[o].rank;
                let detail = match &result {
                    Err(e) => format!("rank {rank}'s read server closed its connection: the job freed the table or ended ({e})"),
                    Ok(()) => format!("rank {rank}'s read server closed its connection: the job freed the table or ended"),
                };
                return Err(self.note(Error::Gone { table: i.record.name.clone(), detail }));
            }
        }
        result.map_err(|e| self.note(e))?;
        if let Some(p) = profile {
            p.call(rows.len(), out.len());
        }
        Ok(())
    }
}

/// A destination buffer registered with a reader's transports: see
/// [`Reader::register_recv`]. Dereferences to its bytes.
#[derive(Debug)]
pub struct RecvBuffer {
    // Registrations before the memory: dropped first.
    regs: Vec<Box<dyn crate::transport::Registration>>,
    buf: Vec<u8>,
    /// The process that registered it.
    pid: u32,
}

impl std::ops::Deref for RecvBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for RecvBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for RecvBuffer {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            self.regs.clear();
        } else {
            // A forked child's copy: the registrations are the parent's
            // (as `Inner`'s transports are).
            for r in self.regs.drain(..) {
                std::mem::forget(r);
            }
        }
    }
}

/// The method for owner `r` (world rank `o.rank`) of a table.
fn choose(origin: &Origin, o: &crate::record::OwnerRecord, _r: usize, same_node: bool, rows: usize, table: &str) -> Result<Method> {
    let unsupported = |reason: String| Error::Unsupported { what: format!("reading rank {}'s rows of table {table:?}", o.rank), reason };
    let m = match origin.method {
        None if same_node => Method::Shm,
        None if o.fabric.is_some() && crate::available(Method::Fabric).is_ok() => Method::Fabric,
        None => Method::Socket,
        Some(m) => m,
    };
    if rows == 0 {
        return Ok(m);
    }
    if let Err(why) = crate::available(m) {
        return Err(unsupported(format!("{m}: {why}")));
    }
    match m {
        Method::Shm if !same_node => Err(unsupported(format!(
            "shm reaches ranks of this node only, and rank {} runs on node {:?} (this reader: {:?})",
            o.rank,
            o.node_id,
            NodeIdentity::discover().id()
        ))),
        Method::Fabric if o.fabric.is_none() => Err(unsupported(
            "it registered no memory with libfabric: create the table with the `fabric` method (WM_ONE_SIDED=fabric in the job)".into(),
        )),
        Method::Mpi if origin.mpi.is_none() => Err(unsupported(
            "MPI RMA reaches ranks of the reader's own MPI job only, once the table opened windows (the `mpi` method)".into(),
        )),
        m => Ok(m),
    }
}

#[cfg(feature = "fabric")]
fn fabric_transport(record: &TableRecord, c: &Checked, first: &[usize], methods: &[Method], origin: &Origin) -> Result<Arc<dyn Transport>> {
    Ok(Arc::new(crate::fabric::FabricTransport::new(record, c, first, methods, origin.id.timeout)?))
}

#[cfg(not(feature = "fabric"))]
fn fabric_transport(_: &TableRecord, _: &Checked, _: &[usize], _: &[Method], _: &Origin) -> Result<Arc<dyn Transport>> {
    Err(Error::Unsupported { what: "libfabric reads".into(), reason: "this build has no libfabric support (the `fabric` feature)".into() })
}
