//! One-sided reads from Python: `OneSided` (the job's side) and `Reader`
//! (any rank, or a process outside the job).

use std::sync::Mutex;
use std::time::Duration;

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use wholemem::WholeMemory;
use wm_onesided::{Method, Options, Rendezvous};

use crate::buffers::{Elem, IdArray, array_elem, as_array, numpy, with_bytes_mut};
use crate::errors::{IntoPy, Kind, raise, value};

fn options(method: Option<&str>, publish_at: Option<&str>, profile: Option<bool>) -> PyResult<Options> {
    let method = match method {
        None | Some("auto") => None,
        Some(m) => Some(
            Method::ALL
                .into_iter()
                .find(|x| x.name() == m)
                .ok_or_else(|| value(format!("method {m:?} is not one of auto, shm, socket, fabric, mpi")))?,
        ),
    };
    let publish_at = publish_at.map(Rendezvous::parse).transpose().py()?;
    Ok(Options { method, publish_at, profile, ..Options::default() })
}

fn rendezvous_text(r: &Rendezvous) -> String {
    #[allow(unreachable_patterns)]
    match r {
        Rendezvous::Dir(p) => format!("dir:{}", p.display()),
        Rendezvous::Tcp(a) => a.clone(),
        other => format!("{other:?}"),
    }
}

/// A table readable one-sidedly: every rank runs a read server for its
/// rows. Collective to create, publish and free.
#[pyclass(module = "wholemem._wholemem", name = "OneSided", frozen)]
pub struct OneSided {
    table: Mutex<Option<wm_onesided::Table>>,
    elem: Elem,
}

impl OneSided {
    pub(crate) fn create(
        py: Python<'_>,
        mem: &WholeMemory,
        name: &str,
        elem: Elem,
        method: Option<&str>,
        publish_at: Option<&str>,
        profile: Option<bool>,
    ) -> PyResult<Self> {
        let opts = options(method, publish_at, profile)?;
        let t = py.detach(|| wm_onesided::Table::new(mem, name, elem.core(), &opts)).py()?;
        Ok(Self { table: Mutex::new(Some(t)), elem })
    }

    fn with<R>(&self, f: impl FnOnce(&wm_onesided::Table) -> PyResult<R>) -> PyResult<R> {
        let g = self.table.lock().map_err(|_| raise(Kind::Other, "a call on this table panicked"))?;
        match g.as_ref() {
            Some(t) => f(t),
            None => Err(value("the one-sided table has been freed")),
        }
    }
}

#[pymethods]
impl OneSided {
    /// Makes every write so far visible to reads that start after it
    /// returns, and (the first time) the table joinable from outside.
    /// Collective.
    fn publish(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|t| py.detach(|| t.publish()).py())
    }

    /// This rank's reader (not collective).
    fn reader(&self, py: Python<'_>) -> PyResult<Reader> {
        let elem = self.elem;
        self.with(|t| Ok(Reader { inner: py.detach(|| t.reader()).py()?, elem }))
    }

    /// The table's name.
    #[getter]
    fn name(&self) -> PyResult<String> {
        self.with(|t| Ok(t.name().to_owned()))
    }

    /// Where outside readers find the table (`None`: only the job's ranks).
    #[getter]
    fn published_at(&self) -> PyResult<Option<String>> {
        self.with(|t| Ok(t.published_at().map(rendezvous_text)))
    }

    /// Stops serving (collective); every reader fails from then on. Idempotent.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.table.lock().map_err(|_| raise(Kind::Other, "a call on this table panicked"))?.take();
        match taken {
            Some(t) => py.detach(|| t.free()).py(),
            None => Ok(()),
        }
    }
}

/// Reads rows of a one-sided table, alone: no other rank calls anything.
/// Cheap to copy between threads; after `os.fork`, call `reopen()` in the
/// child.
#[pyclass(module = "wholemem._wholemem", name = "Reader", frozen)]
pub struct Reader {
    inner: wm_onesided::Reader,
    elem: Elem,
}

impl Reader {
    fn rows_out<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyUntypedArray>, wholemem::DType)> {
        let cols = self.inner.info().cols;
        let out = match out {
            Some(o) => as_array(o, "out")?,
            None => numpy(py)?.getattr("empty")?.call1(((n, cols), self.elem.name()))?.cast_into::<PyUntypedArray>()?,
        };
        let e = array_elem(&out, "out")?;
        let d = self.elem.convert_to(e)?;
        let shape = out.shape();
        let fits = match shape.len() {
            0 => false,
            1 => shape[0] == n && cols == 1,
            _ => shape[0] == n && shape[1..].iter().product::<usize>() == cols,
        };
        if !fits {
            return Err(value(format!("out has shape {shape:?}; {n} rows need shape ({n}, {cols})")));
        }
        Ok((out, d))
    }
}

#[pymethods]
impl Reader {
    /// Joins the table published as `name` at `rendezvous` (`dir:/path` or
    /// `host:port`) from a process outside the job, waiting up to
    /// `timeout` seconds (default `WM_TIMEOUT_S`). The job's key comes
    /// from `WM_JOB_KEY`, `WM_JOB_KEY_FILE` or the directory's `job.key`.
    #[staticmethod]
    #[pyo3(signature = (rendezvous, name, timeout=None, method=None))]
    fn join(py: Python<'_>, rendezvous: &str, name: &str, timeout: Option<f64>, method: Option<&str>) -> PyResult<Self> {
        let at = Rendezvous::parse(rendezvous).py()?;
        let mut opts = options(method, None, None)?;
        if let Some(s) = timeout {
            if !(s.is_finite() && s >= 0.0) {
                return Err(value(format!("timeout {s} is not a non-negative number of seconds")));
            }
            opts.join_timeout = Some(Duration::from_secs_f64(s));
        }
        let inner = py.detach(|| wm_onesided::Reader::join(&at, name, &opts)).py()?;
        let d = inner.info().dtype;
        let elem = Elem::from_core(d)
            .ok_or_else(|| raise(Kind::Unsupported, format!("table {name:?} holds {d:?}, which numpy has no dtype for")))?;
        Ok(Self { inner, elem })
    }

    /// A reader of the same table for this process (after `os.fork`, the
    /// child's reader).
    fn reopen(&self, py: Python<'_>) -> PyResult<Self> {
        Ok(Self { inner: py.detach(|| self.inner.reopen()).py()?, elem: self.elem })
    }

    /// `n` rows from global row `start` into `out` (new when `None`).
    #[pyo3(signature = (start, n, out=None))]
    fn get<'py>(&self, py: Python<'py>, start: usize, n: usize, out: Option<&Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyUntypedArray>> {
        let (out, d) = self.rows_out(py, n, out)?;
        with_bytes_mut(&out, "out", |b| py.detach(|| self.inner.get(start, n, b, d)).py())?;
        Ok(out)
    }

    /// Rows `ids` (any order, repeats allowed) into `out` (new when `None`).
    #[pyo3(signature = (ids, out=None))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let ids = IdArray::new(ids)?;
        let (out, d) = self.rows_out(py, ids.len(), out)?;
        with_bytes_mut(&out, "out", |b| ids.with(|ids| py.detach(|| self.inner.get_batch(ids, b, d)).py()))?;
        Ok(out)
    }

    /// Like `get_batch`, copying raw row bytes into `out` whatever its
    /// dtype (its size must be `len(ids) × row bytes`).
    fn get_batch_bytes<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>, out: &Bound<'py, PyAny>) -> PyResult<()> {
        let ids = IdArray::new(ids)?;
        let out = as_array(out, "out")?;
        let rb = self.inner.info().row_bytes;
        let d = self.inner.info().dtype;
        with_bytes_mut(&out, "out", |b| {
            if b.len() != ids.len() * rb {
                return Err(value(format!("out holds {} bytes; {} rows of {rb} bytes need {}", b.len(), ids.len(), ids.len() * rb)));
            }
            ids.with(|ids| py.detach(|| self.inner.get_batch(ids, b, d)).py())
        })
    }

    /// Like `get`, copying raw row bytes into `out` whatever its dtype.
    fn get_bytes(&self, py: Python<'_>, start: usize, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let out = as_array(out, "out")?;
        let rb = self.inner.info().row_bytes;
        let d = self.inner.info().dtype;
        with_bytes_mut(&out, "out", |b| {
            if rb == 0 || b.len() % rb != 0 {
                return Err(value(format!("out holds {} bytes, not a whole number of {rb}-byte rows", b.len())));
            }
            py.detach(|| self.inner.get(start, b.len() / rb, b, d)).py()
        })
    }

    /// The table: name, rows, cols, dtype, row_bytes, ranks, counts,
    /// memory type and location.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.inner.info();
        let d = PyDict::new(py);
        d.set_item("name", i.name.clone())?;
        d.set_item("rows", i.rows)?;
        d.set_item("cols", i.cols)?;
        d.set_item("dtype", self.elem.name())?;
        d.set_item("row_bytes", i.row_bytes)?;
        d.set_item("ranks", i.ranks)?;
        d.set_item("counts", i.counts.clone())?;
        d.set_item("type", i.memory_type.name())?;
        d.set_item("location", i.location.name())?;
        Ok(d)
    }

    /// The transport of each owner, in rank order.
    #[getter]
    fn methods(&self) -> Vec<&'static str> {
        self.inner.methods().iter().map(|m| m.name()).collect()
    }

    /// How many times the job has published the table.
    fn epoch(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.epoch()).py()
    }

    /// Timers and counters of this reader's calls (`None` unless profiling
    /// is on: `profile=True` or `WM_PROFILE=1`).
    fn profile<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(p) = self.inner.profile() else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("calls", p.calls)?;
        d.set_item("rows", p.rows)?;
        d.set_item("bytes", p.bytes)?;
        d.set_item("lock_wait", p.lock_wait_s)?;
        d.set_item("mr", p.mr_s)?;
        d.set_item("mr_miss", p.mr_misses)?;
        d.set_item("read", p.post_s)?;
        d.set_item("cq", p.wait_s)?;
        d.set_item("copy", p.copy_s)?;
        Ok(Some(d))
    }
}
