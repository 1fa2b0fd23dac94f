//! `Table`: one row-partitioned table of any of the four memory types.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator};
use wm_gather::RowLayout;

use crate::buffers::{Elem, IdArray, array_elem, as_array, elem_of, numpy, with_bytes, with_bytes_mut, writable};
use crate::comm::Comm;
use crate::errors::{IntoPy, Kind, raise, value};

/// A table of `rows × cols` elements shared by every rank of a job,
/// partitioned by rows. Created collectively; every rank passes the same
/// arguments.
#[pyclass(module = "wholemem._wholemem", name = "Table", frozen)]
pub struct Table {
    mem: RwLock<Option<WholeMemory>>,
    /// Live [`LocalView`]s of this table in this process.
    ///
    /// **Local views and `free`.** [`Table::local_view`] hands numpy a pointer
    /// into this rank's rows, which stays valid only while the memory is
    /// mapped. Each view's base object ([`LocalView`]) holds a reference to
    /// the table (so dropping the table cannot unmap under it) and counts
    /// itself in `views` until numpy drops it (the last array made from the
    /// view gone). `free` refuses while any rank counts a live view: the
    /// ranks agree on it first (an allgather of their counts), so every rank
    /// raises the same `ValueError`, nothing is freed, and the table stays
    /// usable; `del` the views (and arrays made from them) and call `free`
    /// again. While `free` agrees, `closing` refuses new views, so a count of
    /// zero cannot grow before the memory goes. Refusing rather than
    /// deferring keeps `free` what it is everywhere else: collective, done
    /// when it returns.
    views: AtomicUsize,
    /// Set while `free` agrees with the other ranks: no new views.
    closing: AtomicBool,
    pub(crate) elem: Elem,
    pub(crate) cols: usize,
    rows: usize,
    ty: MemoryType,
    loc: Location,
    comm: Arc<dyn Communicator>,
}

impl Table {
    pub(crate) fn read(&self) -> PyResult<RwLockReadGuard<'_, Option<WholeMemory>>> {
        let g = self.mem.read().map_err(|_| raise(Kind::Other, "a call on this table panicked; the table is unusable"))?;
        if g.is_none() {
            return Err(value("the table has been freed"));
        }
        Ok(g)
    }

    fn write(&self) -> PyResult<RwLockWriteGuard<'_, Option<WholeMemory>>> {
        let g = self.mem.write().map_err(|_| raise(Kind::Other, "a call on this table panicked; the table is unusable"))?;
        if g.is_none() {
            return Err(value("the table has been freed"));
        }
        Ok(g)
    }

    /// A collective gather whose arguments failed this rank's checks still
    /// takes part (with no rows), so the other ranks' call completes and
    /// every rank stays usable; then the error is raised here.
    fn in_step<T>(&self, py: Python<'_>, mem: &WholeMemory, layout: &RowLayout, prepared: PyResult<T>) -> PyResult<T> {
        match prepared {
            Err(e) if self.collective() => {
                let _ = py.detach(|| wm_gather::gather(mem, layout, wm_gather::Ids::I64(&[]), &mut [], self.elem.core()));
                Err(e)
            }
            other => other,
        }
    }

    /// As [`Table::in_step`], for scatter.
    fn in_step_mut<T>(&self, py: Python<'_>, mem: &mut WholeMemory, layout: &RowLayout, prepared: PyResult<T>) -> PyResult<T> {
        match prepared {
            Err(e) if self.collective() => {
                let _ = py.detach(|| wm_gather::scatter(mem, layout, wm_gather::Ids::I64(&[]), &[], self.elem.core()));
                Err(e)
            }
            other => other,
        }
    }

    /// One row in files: `cols` elements of the stored type.
    fn row_format(&self) -> PyResult<wholemem::files::RowFormat> {
        Ok(wholemem::files::RowFormat::vector(self.elem.core(), self.cols))
    }

    fn collective(&self) -> bool {
        matches!(self.ty, MemoryType::Distributed | MemoryType::Hierarchy)
    }

    pub(crate) fn row_bytes(&self) -> usize {
        self.cols * self.elem.size()
    }

    fn layout(&self) -> PyResult<RowLayout> {
        RowLayout::new(self.elem.core(), self.cols, 0).py()
    }

    fn new_rows<'py>(&self, py: Python<'py>, n: usize, elem: Elem) -> PyResult<Bound<'py, PyUntypedArray>> {
        Ok(numpy(py)?.getattr("empty")?.call1(((n, self.cols), elem.name()))?.cast_into::<PyUntypedArray>()?)
    }

    /// Checks that `a` holds `n` rows of this table's width, whatever its shape.
    fn check_rows(&self, a: &Bound<'_, PyUntypedArray>, n: usize, what: &str, elem: Elem) -> PyResult<()> {
        let shape = a.shape();
        let fits = match shape.len() {
            0 => false,
            1 => shape[0] == n && self.cols == 1,
            _ => shape[0] == n && shape[1..].iter().product::<usize>() == self.cols,
        };
        if !fits {
            return Err(value(format!(
                "{what} has shape {shape:?}; {n} rows of {} {} elements need shape ({n}, {})",
                self.cols,
                elem.name(),
                self.cols
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl Table {
    /// Allocates a table collectively. `type` is `continuous`, `chunked`,
    /// `distributed` or `hierarchy`; `location` is `host` or `device`;
    /// `partition` gives the rows of each rank (default: equal shares).
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (comm, rows, cols, dtype, r#type="distributed", location="host", partition=None))]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        rows: usize,
        cols: usize,
        dtype: &Bound<'_, PyAny>,
        r#type: &str,
        location: &str,
        partition: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        let elem = elem_of(dtype)?;
        let ty: MemoryType = r#type.parse().map_err(|e| value(format!("type {type:?}: {e}")))?;
        let loc: Location = location.parse().map_err(|e| value(format!("location {location:?}: {e}")))?;
        if cols == 0 {
            return Err(value("cols is 0; a row needs at least one element"));
        }
        let granularity = cols.checked_mul(elem.size()).ok_or_else(|| value(format!("cols {cols} is too large")))?;
        let total = rows.checked_mul(granularity).ok_or_else(|| value(format!("rows {rows} × {granularity} bytes is too large")))?;
        let req = AllocRequest { ty, loc, total, granularity, partition };
        let c = comm.inner.clone();
        let mem = py.detach(|| WholeMemory::allocate(&c, &req)).py()?;
        Ok(Self {
            mem: RwLock::new(Some(mem)),
            views: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
            elem,
            cols,
            rows,
            ty,
            loc,
            comm: comm.inner.clone(),
        })
    }

    /// The element type, as a numpy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy(py)?.getattr("dtype")?.call1((self.elem.name(),))
    }

    /// `(rows, cols)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The memory type's name.
    #[getter]
    fn r#type(&self) -> &'static str {
        self.ty.name()
    }

    /// The location's name.
    #[getter]
    fn location(&self) -> &'static str {
        self.loc.name()
    }

    /// The communicator's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// `(start, stop)`: the global rows this rank owns.
    #[getter]
    fn local_rows(&self) -> PyResult<(usize, usize)> {
        let g = self.read()?;
        let r = g.as_ref().map(|m| m.local_rows()).unwrap_or(0..0);
        Ok((r.start, r.end))
    }

    /// The fraction of the table this process maps that is backed by huge
    /// pages (host memory; 0 for device memory): a table of random rows in
    /// 4 KiB pages misses the TLB on nearly every row. Reads
    /// `/proc/self/smaps`: a diagnostic, not for every call.
    #[getter]
    fn huge_pages(&self) -> PyResult<f64> {
        let g = self.read()?;
        let m = g.as_ref().expect("checked by read");
        Ok(m.huge_page_bytes() as f64 / m.mapped_bytes().max(1) as f64)
    }

    /// Rows of every rank, in rank order.
    #[getter]
    fn partition(&self) -> PyResult<Vec<usize>> {
        let g = self.read()?;
        let m = g.as_ref().expect("checked by read");
        Ok((0..self.comm.size()).map(|r| m.partition().range(r).len()).collect())
    }

    /// Rows `ids` into `out` (a new `(len(ids), cols)` array of the table's
    /// dtype when `None`; else C-contiguous and writable, of the table's
    /// dtype or one it converts to: float ↔ float, int ↔ int). Collective
    /// for distributed and hierarchy tables. Returns `out`.
    #[pyo3(signature = (ids, out=None))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let g = self.read()?;
        let mem = g.as_ref().expect("checked by read");
        let layout = self.layout()?;
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let out = match out {
                Some(o) => as_array(o, "out")?,
                None => self.new_rows(py, ids.len(), self.elem)?,
            };
            let out_elem = array_elem(&out, "out")?;
            writable(&out, "out")?;
            let out_dtype = self.elem.convert_to(out_elem)?;
            self.check_rows(&out, ids.len(), "out", out_elem)?;
            Ok((ids, out, out_dtype))
        })();
        let (ids, out, out_dtype) = self.in_step(py, mem, &layout, prepared)?;
        with_bytes_mut(&out, "out", |bytes| ids.with(|ids| py.detach(|| wm_gather::gather(mem, &layout, ids, bytes, out_dtype)).py()))?;
        Ok(out)
    }

    /// Like `gather`, copying raw row bytes into `out` whatever its dtype
    /// (its size must be `len(ids) × cols × itemsize` bytes). Collective
    /// for distributed and hierarchy tables.
    fn gather_bytes<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>, out: &Bound<'py, PyAny>) -> PyResult<()> {
        let g = self.read()?;
        let mem = g.as_ref().expect("checked by read");
        let layout = self.layout()?;
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let out = as_array(out, "out")?;
            writable(&out, "out")?;
            let want = ids.len() * self.row_bytes();
            if out.len() * out.dtype().itemsize() != want {
                return Err(value(format!(
                    "out holds {} bytes; {} rows of {} bytes need {want}",
                    out.len() * out.dtype().itemsize(),
                    ids.len(),
                    self.row_bytes()
                )));
            }
            Ok((ids, out))
        })();
        let (ids, out) = self.in_step(py, mem, &layout, prepared)?;
        with_bytes_mut(&out, "out", |bytes| {
            ids.with(|ids| py.detach(|| wm_gather::gather(mem, &layout, ids, bytes, self.elem.core())).py())
        })
    }

    /// Writes `rows` (one row per id, the table's dtype or one it converts
    /// from) to rows `ids`; the last write of a repeated id wins.
    /// Collective for distributed and hierarchy tables.
    fn scatter<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>, rows: &Bound<'py, PyAny>) -> PyResult<()> {
        let layout = self.layout()?;
        let mut g = self.write()?;
        let mem = g.as_mut().expect("checked by write");
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let src = as_array(rows, "rows")?;
            let src_elem = array_elem(&src, "rows")?;
            let src_dtype = self.elem.convert_to(src_elem)?;
            self.check_rows(&src, ids.len(), "rows", src_elem)?;
            Ok((ids, src, src_dtype))
        })();
        let (ids, src, src_dtype) = self.in_step_mut(py, mem, &layout, prepared)?;
        with_bytes(&src, "rows", |bytes| ids.with(|ids| py.detach(|| wm_gather::scatter(mem, &layout, ids, bytes, src_dtype)).py()))
    }

    /// A copy of this rank's rows, `(local rows, cols)`.
    fn read_local<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyUntypedArray>> {
        let g = self.read()?;
        let mem = g.as_ref().expect("checked by read");
        let out = self.new_rows(py, mem.local_rows().len(), self.elem)?;
        with_bytes_mut(&out, "out", |b| py.detach(|| mem.read_local(b)).py())?;
        Ok(out)
    }

    /// Overwrites this rank's rows with `rows` (exactly the local rows, the
    /// table's dtype). Not collective; make the writes visible to the
    /// others with a barrier.
    fn write_local(&self, py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<()> {
        let src = as_array(rows, "rows")?;
        let e = array_elem(&src, "rows")?;
        if e != self.elem {
            return Err(value(format!("rows have dtype {}; the table holds {}", e.name(), self.elem.name())));
        }
        let mut g = self.write()?;
        let mem = g.as_mut().expect("checked by write");
        with_bytes(&src, "rows", |b| py.detach(|| mem.write_local(b)).py())
    }

    /// This rank's rows, `(local rows, cols)` in the table's dtype, as a
    /// numpy array over the table's memory: no copy. Host tables only (a
    /// device table raises `UnsupportedError`: its rows have no host
    /// address; use `read_local`/`write_local`). An empty shard gives an
    /// empty `(0, cols)` array.
    ///
    /// Read-only unless `writable=True` (numpy refuses assignments, and
    /// refuses to set `flags.writeable` later). A writable view is allowed
    /// wherever `write_local` is (every host table); writing through it
    /// is like `write_local` without the copy and without row locks:
    ///
    /// - Other ranks see the writes after a barrier (continuous and
    ///   chunked tables map these rows on every rank of the node; the
    ///   other types serve them from this process). Keep other ranks'
    ///   writes to these rows (scatter, load) and their reads from
    ///   overlapping writes through the view apart with a barrier, as for
    ///   `write_local`; rows read meanwhile may be torn.
    /// - Caches of the table notice rows changing through the write
    ///   generation, which moves when a writable view is taken and again
    ///   when it is released (its last array deleted). A cache that copies
    ///   rows while a writable view is alive may keep rows written after
    ///   that copy until the view is released; release writable views (and
    ///   barrier) before relying on cached reads.
    ///
    /// The array's `base` keeps the table alive. `free()` refuses (every
    /// rank raises `ValueError`, the table stays usable) while any rank
    /// holds a view: `del` the views and arrays made from them first.
    #[pyo3(signature = (writable=false))]
    fn local_view<'py>(slf: &Bound<'py, Self>, writable: bool) -> PyResult<Bound<'py, PyUntypedArray>> {
        let py = slf.py();
        let t = slf.get();
        let g = t.read()?;
        let mem = g.as_ref().expect("checked by read");
        if t.loc != Location::Host {
            return Err(raise(
                Kind::Unsupported,
                format!(
                    "local_view: a {} table's rows live in GPU memory, which has no host address for numpy to view; use read_local() and write_local(rows), which copy",
                    t.loc.name()
                ),
            ));
        }
        let me = t.comm.rank();
        let ptr = mem.rank_ptr(me).ok_or_else(|| {
            raise(Kind::Unsupported, format!("local_view: rank {me} does not map its own rows of this {} table", t.ty.name()))
        })?;
        let typestr: String = numpy(py)?.getattr("dtype")?.call1((t.elem.name(),))?.getattr("str")?.extract()?;
        let n = mem.local_rows().len();
        // Counted first, then `closing` checked (both SeqCst), while `free`
        // sets `closing` and then reads the count: either `free` sees this
        // view, or this call sees `free` and refuses.
        t.views.fetch_add(1, Ordering::SeqCst);
        if t.closing.load(Ordering::SeqCst) {
            t.views.fetch_sub(1, Ordering::SeqCst);
            return Err(value("local_view: the table is being freed"));
        }
        if writable {
            // Before the writes, as `local_bytes_mut` counts them; again
            // when the view goes (`LocalView::drop`).
            mem.note_written(mem.local_rows());
        }
        // From here `LocalView::drop` gives the count back, also when
        // `Bound::new` fails. The address handed to numpy stays mapped,
        // `(n, cols)` elements long, as long as the view lives: the rows
        // are mapped once at allocation and unmapped only when the
        // `WholeMemory` goes, which is by `free` (refused while the count
        // is above 0) or by dropping the table (which the view holds).
        let view = LocalView { table: slf.clone().unbind(), addr: ptr as usize, shape: (n, t.cols), typestr, writable };
        drop(g);
        let holder = Bound::new(py, view)?;
        Ok(numpy(py)?.getattr("asarray")?.call1((holder,))?.cast_into::<PyUntypedArray>()?)
    }

    /// Overwrites rows `first..first + n` of this rank's reach with raw
    /// bytes of `rows` (any dtype; its size a whole number of rows). Not
    /// collective.
    fn write_rows_bytes(&self, py: Python<'_>, first: usize, rows: &Bound<'_, PyAny>) -> PyResult<()> {
        let src = as_array(rows, "rows")?;
        let rb = self.row_bytes();
        let mut g = self.write()?;
        let mem = g.as_mut().expect("checked by write");
        with_bytes(&src, "rows", |b| {
            if b.len() % rb != 0 {
                return Err(value(format!("rows hold {} bytes, not a whole number of {rb}-byte rows", b.len())));
            }
            py.detach(|| mem.write_rows(first, b)).py()
        })
    }

    /// Fills the table from files (collective; every rank passes the same
    /// arguments and reads its own rows). `source` is a directory of
    /// `shard_0000.npy, shard_0001.npy, …` (what `store` writes), or a list
    /// of `.npy` files (`kind="npy"`) or raw files (`kind="raw"`: rows of
    /// the table's dtype, little-endian, no header) stacked in order. The
    /// files' dtype and row shape must be the table's (a `uint8` or `bool`
    /// table is `int8` in files) and their rows add up to the table's.
    /// Returns this rank's `{"bytes": …, "files": …, "threads": …}`.
    #[pyo3(signature = (source, kind="npy"))]
    fn load<'py>(&self, py: Python<'py>, source: &Bound<'py, PyAny>, kind: &str) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let shards = shard_set(source, kind)?;
        let row = self.row_format()?;
        let mut g = self.write()?;
        let mem = g.as_mut().expect("checked by write");
        let done = py.detach(|| wholemem::files::load(mem, &row, &shards)).py()?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("bytes", done.bytes)?;
        d.set_item("files", done.files)?;
        d.set_item("threads", done.threads)?;
        Ok(d)
    }

    /// Writes the table to files (collective; every rank writes its own
    /// rows): `kind="npy"` makes `path` a directory of one
    /// `shard_NNNN.npy` per rank (rank order; other `shard_*.npy` files
    /// there are removed), `kind="raw"` one raw file of every row in
    /// order. `load` of the result gives the table back.
    #[pyo3(signature = (path, kind="npy"))]
    fn store(&self, py: Python<'_>, path: std::path::PathBuf, kind: &str) -> PyResult<()> {
        let target = match kind {
            "npy" => wholemem::files::StoreTarget::NpyDir(path),
            "raw" => wholemem::files::StoreTarget::RawFile(path),
            other => return Err(value(format!("kind {other:?} is not \"npy\" or \"raw\""))),
        };
        let row = self.row_format()?;
        let g = self.read()?;
        let mem = g.as_ref().expect("checked by read");
        py.detach(|| wholemem::files::store(mem, &row, &target)).py()
    }

    /// Makes this table readable one-sidedly under `name` (collective):
    /// see `OneSided`. `method` forces a transport (`shm`, `socket`,
    /// `fabric`, `mpi`); `publish_at` is a rendezvous (`dir:/path`) where
    /// outside readers find it; `profile` turns the readers' timers on.
    #[pyo3(signature = (name, method=None, publish_at=None, profile=None))]
    fn onesided(
        &self,
        py: Python<'_>,
        name: &str,
        method: Option<&str>,
        publish_at: Option<&str>,
        profile: Option<bool>,
    ) -> PyResult<crate::onesided::OneSided> {
        let g = self.read()?;
        let mem = g.as_ref().expect("checked by read");
        crate::onesided::OneSided::create(py, mem, name, self.elem, method, publish_at, profile)
    }

    /// Frees the table (collective). Idempotent. Refused on every rank,
    /// with a `ValueError` and the table left usable, while any rank holds
    /// a `local_view` (see [`Table`]).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        if self.mem.read().map_err(|_| raise(Kind::Other, "a call on this table panicked"))?.is_none() {
            return Ok(());
        }
        // No new views while the ranks agree; the count can only fall.
        self.closing.store(true, Ordering::SeqCst);
        let mine = self.views.load(Ordering::SeqCst) as u64;
        let agreed = py.detach(|| self.comm.allgather_value(mine)).py();
        let counts = match agreed {
            Ok(c) => c,
            Err(e) => {
                self.closing.store(false, Ordering::Release);
                return Err(e);
            }
        };
        if counts.iter().any(|&c| c > 0) {
            self.closing.store(false, Ordering::Release);
            let holders: Vec<String> = counts.iter().enumerate().filter(|(_, c)| **c > 0).map(|(r, c)| format!("rank {r}: {c}")).collect();
            return Err(value(format!(
                "free() refused: numpy views of the local rows (local_view) are alive ({}); del them and the arrays made from them, then free again (nothing was freed; the table is still usable)",
                holders.join(", ")
            )));
        }
        let taken = self.mem.write().map_err(|_| raise(Kind::Other, "a call on this table panicked"))?.take();
        match taken {
            Some(m) => py.detach(|| m.free()).py(),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!("Table(shape=({}, {}), dtype={}, type={}, location={})", self.rows, self.cols, self.elem.name(), self.ty, self.loc)
    }
}

/// The base object of a [`Table::local_view`] array: numpy builds the array
/// from its `__array_interface__` and keeps it as the array's `base`, so
/// it lives as long as any array sharing the memory. It holds the table
/// (the memory stays mapped: `free` refuses while it lives, and the table
/// cannot be dropped under it) and gives back its count in `Table::views`
/// when numpy drops it.
#[pyclass(module = "wholemem._wholemem", name = "LocalView", frozen)]
pub struct LocalView {
    table: Py<Table>,
    /// This rank's first row, in this process's mapping.
    addr: usize,
    shape: (usize, usize),
    /// numpy's `dtype.str` of the table's elements.
    typestr: String,
    writable: bool,
}

#[pymethods]
impl LocalView {
    /// numpy's array interface (version 3) over this rank's rows.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", self.shape)?;
        d.set_item("typestr", &self.typestr)?;
        // (address, read-only): numpy makes the array read-only, and
        // refuses `flags.writeable = True` later, unless `writable`.
        d.set_item("data", (self.addr, !self.writable))?;
        Ok(d)
    }

    /// Whether arrays over this view may write the rows.
    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    fn __repr__(&self) -> String {
        format!("LocalView(shape={:?}, writable={})", self.shape, self.writable)
    }
}

impl Drop for LocalView {
    fn drop(&mut self) {
        Python::attach(|py| {
            let t = self.table.get();
            if self.writable {
                // The writes through the view are done: count them again,
                // so a cache that copied rows meanwhile lets them go.
                let note = |g: &Option<WholeMemory>| {
                    if let Some(m) = g {
                        m.note_written(m.local_rows());
                    }
                };
                match t.mem.try_read() {
                    Ok(g) => note(&g),
                    // A call holding the write lock may wait for the GIL
                    // to return: wait for the lock without it.
                    Err(TryLockError::WouldBlock) => py.detach(|| {
                        if let Ok(g) = t.mem.read() {
                            note(&g);
                        }
                    }),
                    Err(TryLockError::Poisoned(_)) => {}
                }
            }
            t.views.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// The files `load` reads: a directory of NPY shards, or a list of files.
fn shard_set(source: &Bound<'_, PyAny>, kind: &str) -> PyResult<wholemem::files::ShardSet> {
    use wholemem::files::ShardSet;
    let files: Option<Vec<std::path::PathBuf>> =
        if source.is_instance_of::<pyo3::types::PyList>() || source.is_instance_of::<pyo3::types::PyTuple>() {
            Some(source.extract()?)
        } else {
            None
        };
    match (kind, files) {
        ("npy", None) => Ok(ShardSet::npy_dir(source.extract::<std::path::PathBuf>()?)),
        ("npy", Some(f)) => Ok(ShardSet::npy_files(f)),
        ("raw", Some(f)) => Ok(ShardSet::raw_files(f)),
        ("raw", None) => Ok(ShardSet::raw_files([source.extract::<std::path::PathBuf>()?])),
        (other, _) => Err(value(format!("kind {other:?} is not \"npy\" or \"raw\""))),
    }
}
