//! The CSR graph: three wholemem tables partitioned by node.

use std::sync::Arc;

use wholemem::CommonError;
use wholemem::{Location, MemoryType, Partition, TensorDesc, WholeTensor};
use wm_comm::Communicator;

use crate::{Error, Result};

/// The element type of the column (neighbour id) table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdType {
    /// 32-bit node ids (graphs of fewer than 2^31 nodes).
    I32,
    /// 64-bit node ids.
    I64,
}

impl IdType {
    /// Bytes per id.
    pub fn size(self) -> usize {
        match self {
            Self::I32 => 4,
            Self::I64 => 8,
        }
    }

    /// The lower-case name (`i32`, `i64`).
    pub fn name(self) -> &'static str {
        match self {
            Self::I32 => "i32",
            Self::I64 => "i64",
        }
    }
}

impl std::str::FromStr for IdType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "i32" => Ok(Self::I32),
            "i64" => Ok(Self::I64),
            other => Err(format!("unknown id type {other:?}; expected i32 or i64")),
        }
    }
}

/// The column table, of either id type.
#[derive(Debug)]
pub enum ColIndex {
    /// 32-bit neighbour ids.
    I32(WholeTensor<i32>),
    /// 64-bit neighbour ids.
    I64(WholeTensor<i64>),
}

impl ColIndex {
    /// The table's memory.
    pub fn memory(&self) -> &wholemem::WholeMemory {
        match self {
            Self::I32(t) => t.memory(),
            Self::I64(t) => t.memory(),
        }
    }

    /// The id type.
    pub fn id_type(&self) -> IdType {
        match self {
            Self::I32(_) => IdType::I32,
            Self::I64(_) => IdType::I64,
        }
    }

    pub(crate) fn allocate(comm: &Arc<dyn Communicator>, ty: MemoryType, loc: Location, ids: IdType, counts: &[usize]) -> Result<Self> {
        let rows = counts.iter().sum();
        Ok(match ids {
            IdType::I32 => Self::I32(vector(comm, ty, loc, rows, counts)?),
            IdType::I64 => Self::I64(vector(comm, ty, loc, rows, counts)?),
        })
    }

    /// Writes `ids` (already checked to fit the id type) at global row `first`.
    pub(crate) fn write(&mut self, first: usize, ids: &[i64]) -> Result<()> {
        match self {
            Self::I32(t) => {
                let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                t.memory_mut().write_rows(first, bytemuck::cast_slice(&v))?
            }
            Self::I64(t) => t.memory_mut().write_rows(first, bytemuck::cast_slice(ids))?,
        }
        Ok(())
    }

    /// Reads rows `first..first + out.len()` into `out`.
    pub(crate) fn read(&self, first: usize, out: &mut [i64]) -> Result<()> {
        match self {
            Self::I32(t) => {
                let mut v = vec![0i32; out.len()];
                t.memory().read_rows(first, bytemuck::cast_slice_mut(&mut v))?;
                for (o, x) in out.iter_mut().zip(v) {
                    *o = i64::from(x);
                }
            }
            Self::I64(t) => t.memory().read_rows(first, bytemuck::cast_slice_mut(out))?,
        }
        Ok(())
    }

    fn free(self) -> Result<()> {
        match self {
            Self::I32(t) => t.free()?,
            Self::I64(t) => t.free()?,
        }
        Ok(())
    }
}

/// A one-dimensional table of `rows` values with `counts` rows per rank.
pub(crate) fn vector<T: bytemuck::Pod>(
    comm: &Arc<dyn Communicator>,
    ty: MemoryType,
    loc: Location,
    rows: usize,
    counts: &[usize],
) -> Result<WholeTensor<T>> {
    let desc = TensorDesc::new(&[rows], &[1], 0)?;
    Ok(WholeTensor::allocate(comm, ty, loc, desc, Some(counts))?)
}

/// A directed graph in compressed sparse row form, held in wholemem tables
/// partitioned by node across the ranks of a communicator.
///
/// - `row_ptr`: `nodes + 1` values of `i64`, global edge offsets: node
///   `v`'s edges are `row_ptr[v]..row_ptr[v + 1]`. Rank `r` holds the
///   entries of its own nodes; the last rank also holds `row_ptr[nodes]`,
///   the edge count.
/// - `col_ind`: one neighbour id per edge (`i32` or `i64`), partitioned so
///   that each rank holds exactly the edges of its own nodes, sorted by
///   neighbour within a node.
/// - `weights` (optional): one `f32` per edge, partitioned like `col_ind`.
///
/// An edge's id is its position in `col_ind`. Every table has the graph's
/// memory type and location. Built by [`build`](crate::build), loaded by
/// [`load`](crate::load); freed collectively by [`free`](Self::free).
#[derive(Debug)]
pub struct CsrGraph {
    pub(crate) comm: Arc<dyn Communicator>,
    pub(crate) nodes: Partition,
    pub(crate) edges: Partition,
    pub(crate) row_ptr: WholeTensor<i64>,
    pub(crate) col_ind: ColIndex,
    pub(crate) weights: Option<WholeTensor<f32>>,
}

impl CsrGraph {
    /// The communicator the graph spans.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }

    /// Nodes in the graph.
    pub fn nodes(&self) -> usize {
        self.nodes.rows()
    }

    /// Edges in the graph.
    pub fn edges(&self) -> usize {
        self.edges.rows()
    }

    /// Which rank owns which nodes.
    pub fn node_partition(&self) -> &Partition {
        &self.nodes
    }

    /// Which rank holds which edges (those of its nodes).
    pub fn edge_partition(&self) -> &Partition {
        &self.edges
    }

    /// The nodes this rank owns.
    pub fn local_nodes(&self) -> std::ops::Range<usize> {
        self.nodes.range(self.comm.rank())
    }

    /// The memory type of the tables.
    pub fn memory_type(&self) -> MemoryType {
        self.row_ptr.memory().memory_type()
    }

    /// The location of the tables.
    pub fn location(&self) -> Location {
        self.row_ptr.memory().location()
    }

    /// The element type of `col_ind`.
    pub fn id_type(&self) -> IdType {
        self.col_ind.id_type()
    }

    /// Whether the edges carry weights.
    pub fn is_weighted(&self) -> bool {
        self.weights.is_some()
    }

    /// The `row_ptr` table (`nodes + 1` rows).
    pub fn row_ptr(&self) -> &WholeTensor<i64> {
        &self.row_ptr
    }

    /// The `col_ind` table (`edges` rows).
    pub fn col_ind(&self) -> &ColIndex {
        &self.col_ind
    }

    /// The edge weights, if any (`edges` rows).
    pub fn weights(&self) -> Option<&WholeTensor<f32>> {
        self.weights.as_ref()
    }

    /// Threads this rank samples with: the tables'
    /// [`compute_threads`](wholemem::WholeMemory::compute_threads)
    /// (`WM_THREADS`, else the rank's share of the cores that are idle now).
    pub fn threads(&self) -> usize {
        self.row_ptr.memory().compute_threads()
    }

    /// The first bad id of `ids`, as an error naming it.
    pub(crate) fn check_nodes(&self, ids: &[i64]) -> Result<()> {
        match ids.iter().position(|&v| v < 0 || v as u64 >= self.nodes() as u64) {
            Some(position) => {
                Err(Error::NodeOutOfRange { node: ids[position], position, rank: self.comm.world_rank(), nodes: self.nodes() })
            }
            None => Ok(()),
        }
    }

    /// Node `v`'s edges, `start..end` (`v` must be reachable).
    #[inline]
    pub(crate) fn edge_range(&self, v: usize) -> Result<(usize, usize)> {
        let owner = self.nodes.owner(v);
        let mut b = [0i64; 2];
        if v + 1 < self.nodes.offset(owner + 1) {
            self.row_ptr.memory().read_rows(v, bytemuck::cast_slice_mut(&mut b))?;
        } else {
            self.row_ptr.memory().read_rows(v, bytemuck::cast_slice_mut(&mut b[..1]))?;
            b[1] = self.edges.offset(owner + 1) as i64;
        }
        Ok((b[0] as usize, b[1] as usize))
    }

    /// Node `v`'s neighbours, in CSR order (`v` must be reachable from this
    /// rank: any node for continuous and chunked graphs, an own node
    /// otherwise).
    ///
    /// # Errors
    /// [`Error::NodeOutOfRange`]; [`Error::Memory`] for a node this rank
    /// cannot reach.
    pub fn neighbors(&self, v: i64) -> Result<Vec<i64>> {
        self.check_nodes(&[v])?;
        let (s, e) = self.edge_range(v as usize)?;
        let mut out = vec![0i64; e - s];
        self.col_ind.read(s, &mut out)?;
        Ok(out)
    }

    /// Node `v`'s edge weights, in CSR order (as [`neighbors`](Self::neighbors)).
    ///
    /// # Errors
    /// As [`neighbors`](Self::neighbors); [`wholemem::CommonError::InvalidArgument`] for a
    /// graph without weights.
    pub fn edge_weights(&self, v: i64) -> Result<Vec<f32>> {
        self.check_nodes(&[v])?;
        let w = self.weights.as_ref().ok_or_else(|| Error::Common(CommonError::InvalidArgument("the graph has no edge weights".into())))?;
        let (s, e) = self.edge_range(v as usize)?;
        let mut out = vec![0f32; e - s];
        w.memory().read_rows(s, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// The `k` nodes of the highest degree (edges from them), highest
    /// first, ties to the lower id; every rank gets the same list. On an
    /// undirected graph these are the nodes that sampling meets most —
    /// what a node cache of features should hold before the first batch
    /// (`wm_gather::cache::NodeCache::preload`). Collective: each rank
    /// ranks its own nodes and sends at most `k` of them (16 bytes each);
    /// every rank must pass the same `k`.
    ///
    /// # Errors
    /// [`Error::Comm`] for a lost peer; on every rank, [`Error::Memory`]
    /// when some rank's part of `row_ptr` cannot be read,
    /// [`wholemem::CommonError::InvalidArgument`] when ranks pass different
    /// `k`, and [`wholemem::CommonError::Malformed`] for a peer's garbled
    /// ranking.
    pub fn highest_degree(&self, k: usize) -> Result<Vec<i64>> {
        let me = self.comm.rank();
        let own = self.local_nodes();
        let mut starts = vec![0i64; own.len()];
        // A failed read fails the call on every rank (below), not here.
        let read: Result<()> = match own.is_empty() {
            true => Ok(()),
            false => self.row_ptr.memory().read_rows(own.start, bytemuck::cast_slice_mut(&mut starts)).map_err(Error::from),
        };
        let end = self.edges.offset(me + 1) as i64;
        // (degree, node), ordered highest degree first, then lowest node.
        let key = |&[d, v]: &[u64; 2]| (std::cmp::Reverse(d), v);
        let mut mine: Vec<[u64; 2]> = (0..own.len())
            .map(|i| {
                let next = starts.get(i + 1).copied().unwrap_or(end);
                [next.saturating_sub(starts[i]).max(0) as u64, (own.start + i) as u64]
            })
            .collect();
        if k < mine.len() {
            mine.select_nth_unstable_by_key(k, key);
            mine.truncate(k);
        }
        // `k`, then the ranking: a rank that passed another `k` would get
        // the top of too short lists, silently.
        let flat: Vec<u64> =
            std::iter::once(k as u64).chain(if read.is_ok() { mine.iter().flatten().copied().collect() } else { Vec::new() }).collect();
        let ((), parts) =
            wholemem::agree::agree_sharing(self.comm.as_ref(), read, wholemem::agree::Rule::Lowest, bytemuck::cast_slice(&flat))?;
        let ranks = self.comm.world_ranks();
        // The same check on every rank, from the same parts.
        let k_of = |b: &[u8]| b.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        if let Some(q) = parts.iter().position(|p| k_of(p) != k_of(&parts[0])) {
            let shown = |b: &[u8]| k_of(b).map_or_else(|| "nothing".to_owned(), |k| k.to_string());
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different numbers of nodes to rank by degree: rank {} {} and rank {} {}",
                ranks[0],
                shown(&parts[0]),
                ranks[q],
                shown(&parts[q])
            ))));
        }
        let mut all: Vec<[u64; 2]> = Vec::with_capacity(parts.iter().map(Vec::len).sum::<usize>() / 16);
        for (r, bytes) in parts.iter().enumerate() {
            let range = self.nodes.range(r);
            if bytes.len() < 8 || (bytes.len() - 8) % 16 != 0 {
                return Err(Error::Common(CommonError::Malformed {
                    rank: ranks[r],
                    detail: format!("a degree ranking of {} bytes, not its k and whole (degree, node) pairs", bytes.len()),
                }));
            }
            let part: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes[8..]);
            for w in part.chunks(2) {
                // A peer's list is input: nodes it owns, whole pairs.
                match *w {
                    [d, v] if range.contains(&(v as usize)) => all.push([d, v]),
                    _ => {
                        return Err(Error::Common(CommonError::Malformed {
                            rank: self.comm.world_ranks()[r],
                            detail: format!("a degree ranking entry {w:?} outside its nodes {range:?}"),
                        }));
                    }
                }
            }
        }
        all.sort_unstable_by_key(key);
        all.truncate(k);
        Ok(all.into_iter().map(|[_, v]| v as i64).collect())
    }

    /// Frees the tables collectively.
    ///
    /// # Errors
    /// When a peer is lost or times out.
    pub fn free(self) -> Result<()> {
        self.row_ptr.free()?;
        self.col_ind.free()?;
        if let Some(w) = self.weights {
            w.free()?;
        }
        Ok(())
    }
}
