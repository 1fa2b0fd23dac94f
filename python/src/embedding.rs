//! `Embedding`: an embedding table (float32 or float16 rows) with an
//! optional sparse optimizer, over `wm_embedding`.

use std::sync::RwLock;

use numpy::PyUntypedArray;
use pyo3::prelude::*;
use wholemem::{Location, MemoryType};
use wm_embedding::{Init, Optimizer};
use wm_gather::Ids;

use crate::buffers::{Elem, IdArray, array_elem, as_array, elem_of, numpy, with_bytes, with_bytes_mut, writable};
use crate::comm::Comm;
use crate::errors::{IntoPy, Kind, raise, value};

impl crate::errors::Classify for wm_embedding::Error {
    fn kind(&self) -> Kind {
        use wm_embedding::Error as E;
        match self {
            E::IndexOutOfRange { .. } => Kind::Index,
            E::GradientLength { .. } | E::InvalidParameter { .. } | E::UnknownState { .. } => Kind::Value,
            E::Common(e) => e.kind(),
            E::NoOptimizer => Kind::Value,
            E::Gather(e) => e.kind(),
            E::Memory(e) => e.kind(),
            E::Comm(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

/// The table, by element type.
enum Inner {
    F32(wm_embedding::Embedding<f32>),
    F16(wm_embedding::Embedding<half::f16>),
}

/// Runs `$body` with `$e` bound to the embedding, whatever its element type.
macro_rules! with_emb {
    ($inner:expr, |$e:ident| $body:expr) => {
        match $inner {
            Inner::F32($e) => $body,
            Inner::F16($e) => $body,
        }
    };
}

/// Calls `$f` with the ids as the typed slice they are.
macro_rules! typed_ids {
    ($ids:expr, |$v:ident| $body:expr) => {
        match $ids {
            Ids::I32($v) => $body,
            Ids::I64($v) => $body,
        }
    };
}

/// An embedding table shared by every rank (rows × dim, float32 or
/// float16), with an optional sparse optimizer whose per-row state lives
/// beside it. Created collectively; every rank passes the same arguments.
#[pyclass(module = "wholemem._wholemem", name = "Embedding", frozen)]
pub struct Embedding {
    inner: RwLock<Option<Inner>>,
    rows: usize,
    dim: usize,
    elem: Elem,
    collective_gather: bool,
}

fn optimizer(
    name: &str,
    weight_decay: Option<f32>,
    beta1: Option<f32>,
    beta2: Option<f32>,
    epsilon: Option<f32>,
    alpha: Option<f32>,
    decoupled_weight_decay: Option<bool>,
) -> PyResult<Optimizer> {
    let mut o = match name {
        "sgd" => Optimizer::sgd(),
        "adam" => Optimizer::adam(),
        "adagrad" => Optimizer::ada_grad(),
        "rmsprop" => Optimizer::rms_prop(),
        other => return Err(value(format!("optimizer {other:?} is not one of sgd, adam, adagrad, rmsprop"))),
    };
    let unused = |what: &str| value(format!("optimizer {name} has no parameter {what}"));
    if let Some(l) = weight_decay {
        o = o.with_weight_decay(l);
    }
    match &mut o {
        Optimizer::Adam { beta1: b1, beta2: b2, epsilon: eps, decoupled_weight_decay: d, .. } => {
            if alpha.is_some() {
                return Err(unused("alpha"));
            }
            *b1 = beta1.unwrap_or(*b1);
            *b2 = beta2.unwrap_or(*b2);
            *eps = epsilon.unwrap_or(*eps);
            *d = decoupled_weight_decay.unwrap_or(*d);
        }
        Optimizer::AdaGrad { epsilon: eps, .. } | Optimizer::RmsProp { epsilon: eps, .. } => {
            for (given, what) in
                [(beta1.is_some(), "beta1"), (beta2.is_some(), "beta2"), (decoupled_weight_decay.is_some(), "decoupled_weight_decay")]
            {
                if given {
                    return Err(unused(what));
                }
            }
            *eps = epsilon.unwrap_or(*eps);
            match &mut o {
                Optimizer::RmsProp { alpha: a, .. } => *a = alpha.unwrap_or(*a),
                _ if alpha.is_some() => return Err(unused("alpha")),
                _ => {}
            }
        }
        _ => {
            for (given, what) in [
                (beta1.is_some(), "beta1"),
                (beta2.is_some(), "beta2"),
                (epsilon.is_some(), "epsilon"),
                (alpha.is_some(), "alpha"),
                (decoupled_weight_decay.is_some(), "decoupled_weight_decay"),
            ] {
                if given {
                    return Err(unused(what));
                }
            }
        }
    }
    Ok(o)
}

impl Embedding {
    fn read(&self) -> PyResult<std::sync::RwLockReadGuard<'_, Option<Inner>>> {
        let g = self.inner.read().map_err(|_| raise(Kind::Other, "a call on this embedding panicked; it is unusable"))?;
        if g.is_none() {
            return Err(value("the embedding has been freed"));
        }
        Ok(g)
    }

    fn write(&self) -> PyResult<std::sync::RwLockWriteGuard<'_, Option<Inner>>> {
        let g = self.inner.write().map_err(|_| raise(Kind::Other, "a call on this embedding panicked; it is unusable"))?;
        if g.is_none() {
            return Err(value("the embedding has been freed"));
        }
        Ok(g)
    }

    /// A float32 array `(n, cols)`: `out` checked, or a new one.
    fn out_rows<'py>(
        &self,
        py: Python<'py>,
        out: Option<&Bound<'py, PyAny>>,
        n: usize,
        cols: usize,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let out = match out {
            Some(o) => as_array(o, "out")?,
            None => return Ok(numpy(py)?.getattr("empty")?.call1(((n, cols), "float32"))?.cast_into::<PyUntypedArray>()?),
        };
        if array_elem(&out, "out")? != Elem::F32 {
            return Err(value("out must be float32"));
        }
        writable(&out, "out")?;
        f32_rows(&out, n, cols, "out")?;
        Ok(out)
    }
}

/// Checks that `a` holds `n` rows of `cols` values.
fn f32_rows(a: &Bound<'_, PyUntypedArray>, n: usize, cols: usize, what: &str) -> PyResult<()> {
    use numpy::PyUntypedArrayMethods;
    let shape = a.shape();
    let fits = shape.first() == Some(&n) && shape.iter().product::<usize>() == n * cols && (shape.len() > 1 || cols == 1);
    if !fits {
        return Err(value(format!("{what} has shape {shape:?}; {n} rows of {cols} values need shape ({n}, {cols})")));
    }
    Ok(())
}

#[pymethods]
impl Embedding {
    /// Allocates an embedding collectively: `rows × dim` values of `dtype`
    /// (float32, the default, or float16) in a table of `type` and `location`, and, with
    /// `optimizer` (`sgd`, `adam`, `adagrad`, `rmsprop`; the parameters
    /// default to WholeGraph's and PyTorch's), its per-row state.
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (comm, rows, dim, dtype=None, r#type="distributed", location="host", partition=None,
                        optimizer=None, weight_decay=None, beta1=None, beta2=None, epsilon=None, alpha=None,
                        decoupled_weight_decay=None))]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        rows: usize,
        dim: usize,
        dtype: Option<&Bound<'_, PyAny>>,
        r#type: &str,
        location: &str,
        partition: Option<Vec<usize>>,
        optimizer: Option<&str>,
        weight_decay: Option<f32>,
        beta1: Option<f32>,
        beta2: Option<f32>,
        epsilon: Option<f32>,
        alpha: Option<f32>,
        decoupled_weight_decay: Option<bool>,
    ) -> PyResult<Self> {
        let elem = dtype.map_or(Ok(Elem::F32), elem_of)?;
        let ty: MemoryType = r#type.parse().map_err(|e| value(format!("type {type:?}: {e}")))?;
        let loc: Location = location.parse().map_err(|e| value(format!("location {location:?}: {e}")))?;
        let opt = match optimizer {
            Some(name) => Some(self::optimizer(name, weight_decay, beta1, beta2, epsilon, alpha, decoupled_weight_decay)?),
            None if weight_decay.is_some() || beta1.is_some() || beta2.is_some() || epsilon.is_some() || alpha.is_some() => {
                return Err(value("optimizer parameters were given without an optimizer"));
            }
            None => None,
        };
        let c = comm.inner.clone();
        let part = partition.as_deref();
        let inner = match elem {
            Elem::F32 => Inner::F32(py.detach(|| wm_embedding::Embedding::<f32>::allocate(&c, ty, loc, rows, dim, part, opt)).py()?),
            Elem::F16 => Inner::F16(py.detach(|| wm_embedding::Embedding::<half::f16>::allocate(&c, ty, loc, rows, dim, part, opt)).py()?),
            other => return Err(value(format!("an embedding holds float32 or float16, not {}", other.name()))),
        };
        let collective_gather = matches!(ty, MemoryType::Distributed | MemoryType::Hierarchy);
        Ok(Self { inner: RwLock::new(Some(inner)), rows, dim, elem, collective_gather })
    }

    /// `(rows, dim)`.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.dim)
    }

    /// The stored element type's name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.elem.name()
    }

    /// The optimizer's name, or `None`.
    #[getter]
    fn optimizer(&self) -> PyResult<Option<&'static str>> {
        let g = self.read()?;
        Ok(with_emb!(g.as_ref().expect("checked by read"), |e| e.optimizer().map(|o| o.name())))
    }

    /// The names of the optimizer's per-row state (`gather_state`).
    #[getter]
    fn state_names(&self) -> PyResult<Vec<&'static str>> {
        let g = self.read()?;
        Ok(with_emb!(g.as_ref().expect("checked by read"), |e| e.state_names()))
    }

    /// Fills the weights collectively with a pure function of `(seed, row,
    /// column)` (the same values whatever the rank count or partition):
    /// `init` is `normal` (`mean`, `std`), `uniform` (`low`, `high`) or
    /// `constant` (`value`). The optimizer state is left as it is.
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (init="normal", seed=0, mean=0.0, std=1.0, low=0.0, high=1.0, value=0.0))]
    fn init(&self, py: Python<'_>, init: &str, seed: u64, mean: f32, std: f32, low: f32, high: f32, value: f32) -> PyResult<()> {
        let how = match init {
            "normal" => Init::Normal { mean, std },
            "uniform" => Init::Uniform { low, high },
            "constant" => Init::Constant(value),
            other => return Err(self::value(format!("init {other:?} is not normal, uniform or constant"))),
        };
        let mut g = self.write()?;
        with_emb!(g.as_mut().expect("checked by write"), |e| py.detach(|| e.init(how, seed)).py())
    }

    /// Sets every row's optimizer state back to its initial value (collective).
    fn reset_state(&self, py: Python<'_>) -> PyResult<()> {
        let mut g = self.write()?;
        with_emb!(g.as_mut().expect("checked by write"), |e| py.detach(|| e.reset_state()).py())
    }

    /// Rows `ids` as float32, into `out` or a new `(len(ids), dim)` array.
    /// Collective for distributed and hierarchy tables.
    #[pyo3(signature = (ids, out=None))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyUntypedArray>> {
        let g = self.read()?;
        let emb = g.as_ref().expect("checked by read");
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let out = self.out_rows(py, out, ids.len(), self.dim)?;
            Ok((ids, out))
        })();
        let (ids, out) = match prepared {
            Ok(p) => p,
            Err(e) => {
                if self.collective_gather {
                    let _ = with_emb!(emb, |t| py.detach(|| t.gather::<f32, i64>(&[], &mut [])));
                }
                return Err(e);
            }
        };
        with_bytes_mut(&out, "out", |bytes| {
            let rows: &mut [f32] = bytemuck::try_cast_slice_mut(bytes).map_err(|e| value(format!("out: {e}")))?;
            ids.with(|ids| with_emb!(emb, |t| typed_ids!(ids, |v| py.detach(|| t.gather(v, rows)).py())))
        })?;
        Ok(out)
    }

    /// The optimizer state `name` (see `state_names`) of rows `ids`, as a
    /// new float32 array. As collective as `gather`.
    fn gather_state<'py>(&self, py: Python<'py>, name: &str, ids: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
        let g = self.read()?;
        let emb = g.as_ref().expect("checked by read");
        let cols =
            with_emb!(emb, |t| t.optimizer().and_then(|o| o.state_slots(self.dim).into_iter().find(|s| s.name == name))).map(|s| s.cols);
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let out = self.out_rows(py, None, ids.len(), cols.unwrap_or(1))?;
            Ok((ids, out))
        })();
        let (ids, out) = match prepared {
            Ok(p) => p,
            Err(e) => {
                if self.collective_gather && cols.is_some() {
                    let _ = with_emb!(emb, |t| py.detach(|| t.gather_state::<i64>(name, &[], &mut [])));
                }
                return Err(e);
            }
        };
        with_bytes_mut(&out, "out", |bytes| {
            let rows: &mut [f32] = bytemuck::try_cast_slice_mut(bytes).map_err(|e| value(format!("out: {e}")))?;
            ids.with(|ids| with_emb!(emb, |t| typed_ids!(ids, |v| py.detach(|| t.gather_state(name, v, rows)).py())))
        })?;
        Ok(out)
    }

    /// One optimizer step: row `ids[i]` received gradient `grads[i]`
    /// (float32, `(len(ids), dim)`), at learning rate `lr`. Collective for
    /// every memory type: every rank calls it with its own ids (maybe
    /// none) and the same `lr`; repeated ids' gradients are summed; rows
    /// without a gradient (state included) do not change.
    fn apply_gradients(&self, py: Python<'_>, ids: &Bound<'_, PyAny>, grads: &Bound<'_, PyAny>, lr: f32) -> PyResult<()> {
        let mut g = self.write()?;
        let emb = g.as_mut().expect("checked by write");
        let prepared = (|| {
            let ids = IdArray::new(ids)?;
            let grads = as_array(grads, "grads")?;
            if array_elem(&grads, "grads")? != Elem::F32 {
                return Err(value("grads must be float32"));
            }
            f32_rows(&grads, ids.len(), self.dim, "grads")?;
            Ok((ids, grads))
        })();
        let (ids, grads) = match prepared {
            Ok(p) => p,
            Err(e) => {
                // Take part with no rows, so the other ranks' step completes.
                let _ = with_emb!(emb, |t| py.detach(|| t.apply_gradients::<i64>(&[], &[], lr)));
                return Err(e);
            }
        };
        with_bytes(&grads, "grads", |bytes| {
            let grads: &[f32] = bytemuck::try_cast_slice(bytes).map_err(|e| value(format!("grads: {e}")))?;
            ids.with(|ids| with_emb!(emb, |t| typed_ids!(ids, |v| py.detach(|| t.apply_gradients(v, grads, lr)).py())))
        })
    }

    /// Frees the table and its state (collective). Idempotent.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.write().map_err(|_| raise(Kind::Other, "a call on this embedding panicked"))?.take();
        match taken {
            Some(i) => with_emb!(i, |e| py.detach(|| e.free()).py()),
            None => Ok(()),
        }
    }

    fn __repr__(&self) -> String {
        format!("Embedding(shape=({}, {}), dtype={})", self.rows, self.dim, self.elem.name())
    }
}
