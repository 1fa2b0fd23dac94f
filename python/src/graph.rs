//! `Graph`: a CSR graph built collectively from edge lists, and neighbour
//! sampling into numpy arrays, over `wm_graph`.

use std::sync::RwLock;

use numpy::{PyArray1, PyUntypedArray};
use pyo3::prelude::*;
use wholemem::{Location, MemoryType};
use wm_gather::Ids;
use wm_graph::{BuildOptions, CsrGraph, EdgeList, IdType, SampleRequest};

use crate::buffers::{Elem, IdArray, array_elem, as_array, with_bytes};
use crate::comm::Comm;
use crate::errors::{IntoPy, Kind, raise, value};

impl crate::errors::Classify for wm_graph::Error {
    fn kind(&self) -> Kind {
        use wm_graph::Error as E;
        match self {
            E::NodeOutOfRange { .. } => Kind::Index,
            E::BadEdge { .. } | E::BadGraph(_) => Kind::Value,
            E::Common(e) => e.kind(),
            E::Memory(e) => e.kind(),
            E::Gather(e) => e.kind(),
            E::Comm(e) => e.kind(),
            _ => Kind::Other,
        }
    }
}

/// Calls `f` with the ids as 64-bit integers (32-bit ones converted).
fn with_i64<R>(ids: &IdArray<'_>, f: impl FnOnce(&[i64]) -> PyResult<R>) -> PyResult<R> {
    ids.with(|ids| match ids {
        Ids::I64(v) => f(v),
        Ids::I32(v) => f(&v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>()),
    })
}

/// A graph of `nodes` nodes in CSR form (row offsets, neighbour ids and
/// optional float32 edge weights), partitioned by source node among the
/// ranks. Built collectively from every rank's share of the edges.
#[pyclass(module = "wholemem._wholemem", name = "Graph", frozen)]
pub struct Graph {
    inner: RwLock<Option<CsrGraph>>,
    collective: bool,
}

impl Graph {
    fn read(&self) -> PyResult<std::sync::RwLockReadGuard<'_, Option<CsrGraph>>> {
        let g = self.inner.read().map_err(|_| raise(Kind::Other, "a call on this graph panicked; it is unusable"))?;
        if g.is_none() {
            return Err(value("the graph has been freed"));
        }
        Ok(g)
    }
}

#[pymethods]
impl Graph {
    /// Builds a graph collectively: every rank passes the same options and
    /// its own edges `src[i] -> dst[i]` (any edges, none included), with
    /// `weights` (float32, finite, not negative) on every rank or on none.
    /// `undirected` adds each edge's reverse, `dedup` merges repeats
    /// (summing weights), `self_loops` gives every node without one an
    /// edge to itself; `id_type` (`int32`/`int64`) is the neighbour table's.
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (comm, nodes, src, dst, weights=None, r#type="distributed", location="host", undirected=false,
                        dedup=false, self_loops=false, id_type="int64", partition=None))]
    fn new(
        py: Python<'_>,
        comm: &Comm,
        nodes: usize,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
        weights: Option<&Bound<'_, PyAny>>,
        r#type: &str,
        location: &str,
        undirected: bool,
        dedup: bool,
        self_loops: bool,
        id_type: &str,
        partition: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        let ty: MemoryType = r#type.parse().map_err(|e| value(format!("type {type:?}: {e}")))?;
        let loc: Location = location.parse().map_err(|e| value(format!("location {location:?}: {e}")))?;
        let ids = match id_type {
            "int32" => IdType::I32,
            "int64" => IdType::I64,
            other => return Err(value(format!("id_type {other:?} is not int32 or int64"))),
        };
        let mut opts = BuildOptions::new(nodes, ty, loc).id_type(ids).undirected(undirected).dedup(dedup).self_loops(self_loops);
        if let Some(p) = partition {
            opts = opts.partition(p);
        }
        let (src, dst) = (IdArray::new(src)?, IdArray::new(dst)?);
        let w = match weights {
            Some(w) => {
                let a = as_array(w, "weights")?;
                if array_elem(&a, "weights")? != Elem::F32 {
                    return Err(value("weights must be float32"));
                }
                Some(a)
            }
            None => None,
        };
        let c = comm.inner.clone();
        let graph = with_i64(&src, |s| {
            with_i64(&dst, |d| match &w {
                Some(w) => with_bytes(w, "weights", |b| {
                    let wf: &[f32] = bytemuck::try_cast_slice(b).map_err(|e| value(format!("weights: {e}")))?;
                    py.detach(|| wm_graph::build(&c, &opts, EdgeList::weighted(s, d, wf))).py()
                }),
                None => py.detach(|| wm_graph::build(&c, &opts, EdgeList::new(s, d))).py(),
            })
        })?;
        Ok(Self { inner: RwLock::new(Some(graph)), collective: matches!(ty, MemoryType::Distributed | MemoryType::Hierarchy) })
    }

    /// Number of nodes.
    #[getter]
    fn nodes(&self) -> PyResult<usize> {
        Ok(self.read()?.as_ref().expect("checked by read").nodes())
    }

    /// Number of edges (after reverses, merges and self loops).
    #[getter]
    fn edges(&self) -> PyResult<usize> {
        Ok(self.read()?.as_ref().expect("checked by read").edges())
    }

    /// Whether the edges have weights.
    #[getter]
    fn weighted(&self) -> PyResult<bool> {
        Ok(self.read()?.as_ref().expect("checked by read").is_weighted())
    }

    /// `(start, stop)`: the nodes this rank owns.
    #[getter]
    fn local_nodes(&self) -> PyResult<(usize, usize)> {
        let r = self.read()?.as_ref().expect("checked by read").local_nodes();
        Ok((r.start, r.end))
    }

    /// Samples up to `fanout` neighbours of each center without replacement
    /// (`fanout=None`: every neighbour), weighted by the edge weights when
    /// `weighted`. Returns `(offsets, neighbors)` — int64 arrays; center
    /// `i`'s samples are `neighbors[offsets[i]:offsets[i + 1]]` — and with
    /// `edge_ids` a third array, each sample's edge id. A center's sample
    /// depends only on the seed, the center and the graph. Collective for
    /// distributed and hierarchy graphs (every rank passes the same
    /// fanout, seed and flags, and its own centers).
    #[pyo3(signature = (centers, fanout, seed=0, weighted=false, edge_ids=false))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        centers: &Bound<'py, PyAny>,
        fanout: Option<usize>,
        seed: u64,
        weighted: bool,
        edge_ids: bool,
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        let g = self.read()?;
        let graph = g.as_ref().expect("checked by read");
        let req = SampleRequest::new(fanout.unwrap_or(wm_graph::ALL), seed).weighted(weighted).edge_ids(edge_ids);
        let centers = match IdArray::new(centers) {
            Ok(c) => c,
            Err(e) => {
                if self.collective {
                    // Take part with no centers, so the other ranks' call completes.
                    let _ = py.detach(|| wm_graph::sample(graph, &[], &req));
                }
                return Err(e);
            }
        };
        let s = with_i64(&centers, |c| py.detach(|| wm_graph::sample(graph, c, &req)).py())?;
        let offsets: Vec<i64> = s.offsets.iter().map(|&o| o as i64).collect();
        let mut out =
            vec![PyArray1::from_vec(py, offsets).into_any().cast_into()?, PyArray1::from_vec(py, s.neighbors).into_any().cast_into()?];
        if edge_ids {
            out.push(PyArray1::from_vec(py, s.edge_ids).into_any().cast_into()?);
        }
        Ok(out)
    }

    /// Frees the graph's tables (collective). Idempotent.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.write().map_err(|_| raise(Kind::Other, "a call on this graph panicked"))?.take();
        match taken {
            Some(g) => py.detach(|| g.free()).py(),
            None => Ok(()),
        }
    }
}
