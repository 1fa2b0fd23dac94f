//! Building a CSR graph collectively from edge lists.

use std::sync::Arc;

use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wholemem::{Location, MemoryType, Partition};
use wm_comm::{CommExt, Communicator};

use crate::collective::agree_same_header;
use crate::csr::{ColIndex, CsrGraph, IdType, vector};
use crate::{Error, Result};

/// How [`build`] makes a graph. Every rank passes the same options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Nodes in the graph: ids `0..nodes`.
    pub nodes: usize,
    /// The memory type of the tables.
    pub memory_type: MemoryType,
    /// Their location.
    pub location: Location,
    /// The element type of `col_ind`.
    pub id_type: IdType,
    /// Adds the reverse `dst -> src` of every edge.
    pub undirected: bool,
    /// Keeps one edge per (src, dst) pair; a weighted graph sums the
    /// weights of the repeats (in ascending order of weight, so the sum does
    /// not depend on the rank count).
    pub dedup: bool,
    /// Gives every node without one an edge to itself (weight 1).
    pub self_loops: bool,
    /// Nodes per rank; `None` for `ceil(nodes / ranks)` each.
    pub partition: Option<Vec<usize>>,
}

impl BuildOptions {
    /// A directed graph of `nodes` nodes kept as given: 64-bit ids, the
    /// default partition, no reverse edges, repeats or added self loops.
    pub fn new(nodes: usize, memory_type: MemoryType, location: Location) -> Self {
        Self { nodes, memory_type, location, id_type: IdType::I64, undirected: false, dedup: false, self_loops: false, partition: None }
    }

    /// With this id type.
    pub fn id_type(mut self, ids: IdType) -> Self {
        self.id_type = ids;
        self
    }

    /// With reverse edges added.
    pub fn undirected(mut self, yes: bool) -> Self {
        self.undirected = yes;
        self
    }

    /// With repeated edges merged.
    pub fn dedup(mut self, yes: bool) -> Self {
        self.dedup = yes;
        self
    }

    /// With a self loop on every node.
    pub fn self_loops(mut self, yes: bool) -> Self {
        self.self_loops = yes;
        self
    }

    /// With `counts[r]` nodes on rank `r`.
    pub fn partition(mut self, counts: Vec<usize>) -> Self {
        self.partition = Some(counts);
        self
    }

    fn header(&self, weighted: bool) -> Vec<u64> {
        let flags = u64::from(self.undirected) | u64::from(self.dedup) << 1 | u64::from(self.self_loops) << 2 | u64::from(weighted) << 3;
        let ty = MemoryType::ALL.iter().position(|&t| t == self.memory_type).unwrap_or(0) as u64;
        let loc = Location::ALL.iter().position(|&l| l == self.location).unwrap_or(0) as u64;
        let ids = match self.id_type {
            IdType::I32 => 32,
            IdType::I64 => 64,
        };
        let mut h = vec![self.nodes as u64, ty, loc, ids, flags];
        match &self.partition {
            None => h.push(u64::MAX),
            Some(p) => {
                h.push(p.len() as u64);
                h.extend(p.iter().map(|&c| c as u64));
            }
        }
        h
    }
}

fn describe_header(h: &[u64]) -> String {
    if h.len() < 6 {
        return format!("{h:?}");
    }
    let flags = h[4];
    let ty = MemoryType::ALL.get(h[1] as usize).map_or("?", |t| t.name());
    let loc = Location::ALL.get(h[2] as usize).map_or("?", |l| l.name());
    let part = if h[5] == u64::MAX { "the default partition".to_owned() } else { format!("partition {:?}", &h[6..]) };
    format!(
        "asked for {} nodes, {ty} {loc}, i{} ids, undirected {}, dedup {}, self loops {}, weighted {}, {part}",
        h[0],
        h[3],
        flags & 1 != 0,
        flags & 2 != 0,
        flags & 4 != 0,
        flags & 8 != 0
    )
}

/// One rank's share of the edges: `src[i] -> dst[i]`, with `weights[i]`
/// when the graph is weighted. Any rank may pass any edges (none included).
#[derive(Debug, Clone, Copy)]
pub struct EdgeList<'a> {
    /// Source node of each edge.
    pub src: &'a [i64],
    /// Destination node of each edge.
    pub dst: &'a [i64],
    /// Weight of each edge (finite, not negative), or `None` on every rank
    /// for an unweighted graph.
    pub weights: Option<&'a [f32]>,
}

impl<'a> EdgeList<'a> {
    /// Unweighted edges.
    pub fn new(src: &'a [i64], dst: &'a [i64]) -> Self {
        Self { src, dst, weights: None }
    }

    /// Weighted edges.
    pub fn weighted(src: &'a [i64], dst: &'a [i64], weights: &'a [f32]) -> Self {
        Self { src, dst, weights: Some(weights) }
    }

    fn check(&self, opts: &BuildOptions, rank: usize) -> Result<()> {
        let n = opts.nodes;
        if self.src.len() != self.dst.len() || self.weights.is_some_and(|w| w.len() != self.src.len()) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{} sources, {} destinations and {} weights: one each per edge",
                self.src.len(),
                self.dst.len(),
                self.weights.map_or("no".to_owned(), |w| w.len().to_string())
            ))));
        }
        for (i, (&s, &d)) in self.src.iter().zip(self.dst).enumerate() {
            let bad = |problem: String| Error::BadEdge { position: i, src: s, dst: d, rank, problem };
            for (what, v) in [("source", s), ("destination", d)] {
                if v < 0 || v as u64 >= n as u64 {
                    return Err(bad(format!("{what} {v} is out of range for a graph of {n} nodes")));
                }
            }
            if let Some(w) = self.weights.map(|w| w[i])
                && !(w.is_finite() && w >= 0.0)
            {
                return Err(bad(format!("weight {w} is not a finite, non-negative number")));
            }
        }
        Ok(())
    }
}

/// The edge partition from every rank's edge count (`ranks`: their world
/// ranks). The counts are allgathered, the same on every rank, so every
/// rank decides alike; what a peer sends is input: a count that takes the
/// total past `i64::MAX` (the offsets' type) is an error naming its rank.
fn edge_partition(counts: &[u64], ranks: &[usize]) -> Result<Partition> {
    let mut total = 0u64;
    for (&c, &rank) in counts.iter().zip(ranks) {
        total = total.checked_add(c).filter(|&t| t <= i64::MAX as u64).ok_or_else(|| {
            Error::Common(CommonError::PeerFailed {
                rank,
                detail: format!("it has {c} edges, which take the {total} before them past 2^63 - 1"),
            })
        })?;
    }
    // Checked: the total fits an i64, so every count and sum fits a usize.
    Ok(Partition::from_counts(&counts.iter().map(|&c| c as usize).collect::<Vec<_>>()))
}

fn check_options(opts: &BuildOptions, world: usize) -> Result<Partition> {
    if opts.nodes == 0 {
        return Err(Error::Common(CommonError::InvalidArgument("a graph needs at least one node".into())));
    }
    if opts.id_type == IdType::I32 && opts.nodes > i32::MAX as usize + 1 {
        return Err(Error::Common(CommonError::InvalidArgument(format!("{} nodes do not fit 32-bit ids; use i64", opts.nodes))));
    }
    match &opts.partition {
        None => Ok(Partition::even(opts.nodes, world)),
        Some(p) if p.len() != world || p.iter().try_fold(0usize, |a, &c| a.checked_add(c)) != Some(opts.nodes) => Err(Error::Common(
            CommonError::InvalidArgument(format!("the node partition {p:?} is not {world} counts summing to {} nodes", opts.nodes)),
        )),
        Some(p) => Ok(Partition::from_counts(p)),
    }
}

/// Builds a graph collectively: every rank of `comm` calls this with the
/// same options and its own share of the edges.
///
/// Each edge goes to the rank that owns its source (and, for an undirected
/// graph, its reverse to the owner of its destination); each rank sorts its
/// nodes' edges by source then destination, merges repeats and adds self
/// loops when asked, and writes its rows of `row_ptr`, `col_ind` and the
/// weights.
///
/// # Errors
/// On every rank, before anything is allocated:
/// - [`Error::BadEdge`] naming the first edge with a node id out of range
///   or a bad weight (and the rank that passed it);
/// - [`wholemem::CommonError::InvalidArgument`] for edge slices of different lengths, no
///   nodes, 32-bit ids for too many nodes, a partition that does not fit,
///   options (or weightedness) that differ between ranks, or a graph with
///   no edges at all (a table needs a row);
/// - [`Error::Memory`] when the tables cannot be allocated;
/// - [`Error::Comm`] when a peer is lost.
pub fn build(comm: &Arc<dyn Communicator>, opts: &BuildOptions, edges: EdgeList<'_>) -> Result<CsrGraph> {
    let world = comm.size();
    let weighted = edges.weights.is_some();
    let checked = check_options(opts, world).and_then(|p| edges.check(opts, comm.world_rank()).map(|()| p));
    let nodes = agree_same_header(comm.as_ref(), checked, &opts.header(weighted), describe_header)?;

    // 1. Every edge (and reverse edge) to the owner of its source.
    let stride = if weighted { 3 } else { 2 };
    let mut counts = vec![0usize; world];
    let owner = |v: i64| nodes.owner(v as usize);
    for (&s, &d) in edges.src.iter().zip(edges.dst) {
        counts[owner(s)] += stride;
        if opts.undirected {
            counts[owner(d)] += stride;
        }
    }
    let mut send: Vec<Vec<u64>> = counts.iter().map(|&c| Vec::with_capacity(c)).collect();
    for (i, (&s, &d)) in edges.src.iter().zip(edges.dst).enumerate() {
        let w = edges.weights.map(|w| u64::from(w[i].to_bits()));
        for (a, b) in std::iter::once((s, d)).chain(opts.undirected.then_some((d, s))) {
            let out = &mut send[owner(a)];
            out.extend([a as u64, b as u64]);
            out.extend(w);
        }
    }
    let refs: Vec<&[u64]> = send.iter().map(Vec::as_slice).collect();
    let got = comm.alltoallv_pod(&refs)?;
    drop(send);

    // 2. This rank's nodes' edges, checked (a peer's data is input), sorted.
    let mine = nodes.range(comm.rank());
    let local = receive(comm.as_ref(), &got, stride, &mine, opts.nodes).and_then(|e| adjacency(e, &mine, opts, weighted));
    drop(got);
    let (offsets, cols, weights) = agree(comm.as_ref(), local, Rule::Lowest)?;

    // 3. Edge partition, global offsets, tables.
    let edges_p = edge_partition(&comm.allgather_value(cols.len() as u64)?, comm.world_ranks())?;
    let total = edges_p.rows();
    if total == 0 {
        return Err(Error::Common(CommonError::InvalidArgument("the graph has no edges; a table needs at least one row".into())));
    }
    let first_edge = edges_p.offset(comm.rank());
    let mut row_ptr: Vec<i64> = offsets.iter().take(mine.len()).map(|&o| (o + first_edge) as i64).collect();
    if comm.rank() == world - 1 {
        row_ptr.push(total as i64);
    }
    let mut ptr_counts = nodes.counts();
    ptr_counts[world - 1] += 1;
    write_tables(comm, opts.memory_type, opts.location, opts.id_type, nodes, edges_p, &ptr_counts, &row_ptr, &cols, weights.as_deref())
}

/// Allocates the three tables, writes this rank's rows, and waits for every
/// rank's writes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_tables(
    comm: &Arc<dyn Communicator>,
    ty: MemoryType,
    loc: Location,
    ids: IdType,
    nodes: Partition,
    edges: Partition,
    ptr_counts: &[usize],
    row_ptr: &[i64],
    cols: &[i64],
    weights: Option<&[f32]>,
) -> Result<CsrGraph> {
    let me = comm.rank();
    let mut rp = vector::<i64>(comm, ty, loc, nodes.rows() + 1, ptr_counts)?;
    let first_ptr = nodes.offset(me);
    if !row_ptr.is_empty() {
        rp.memory_mut().write_rows(first_ptr, bytemuck::cast_slice(row_ptr))?;
    }
    let mut ci = ColIndex::allocate(comm, ty, loc, ids, &edges.counts())?;
    if !cols.is_empty() {
        ci.write(edges.offset(me), cols)?;
    }
    let w = match weights {
        Some(w) => {
            let mut t = vector::<f32>(comm, ty, loc, edges.rows(), &edges.counts())?;
            if !w.is_empty() {
                t.memory_mut().write_rows(edges.offset(me), bytemuck::cast_slice(w))?;
            }
            Some(t)
        }
        None => None,
    };
    comm.barrier()?;
    Ok(CsrGraph { comm: comm.clone(), nodes, edges, row_ptr: rp, col_ind: ci, weights: w })
}

/// One received edge: source, destination, weight bits.
type Edge = (u64, u64, u32);

fn receive(comm: &dyn Communicator, got: &[Vec<u64>], stride: usize, mine: &std::ops::Range<usize>, n: usize) -> Result<Vec<Edge>> {
    let total: usize = got.iter().map(|g| g.len() / stride).sum();
    let mut edges = Vec::with_capacity(total);
    for (r, words) in got.iter().enumerate() {
        let bad = |detail: String| Error::Common(CommonError::PeerFailed { rank: comm.world_ranks()[r], detail });
        if words.len() % stride != 0 {
            return Err(bad(format!("it sent {} words of edges, not a multiple of {stride}", words.len())));
        }
        for e in words.chunks_exact(stride) {
            if !mine.contains(&(e[0] as usize)) || e[1] >= n as u64 {
                return Err(bad(format!("it sent edge {} -> {}, which is not this rank's to hold", e[0], e[1])));
            }
            // Weights were checked where the edges were given: finite and
            // not negative, so that their bits order like their values.
            let w = if stride == 3 { e[2] } else { 0 };
            if u32::try_from(w).map_or(true, |b| !(f32::from_bits(b).is_finite() && f32::from_bits(b) >= 0.0)) {
                return Err(bad(format!(
                    "it sent edge {} -> {} with the weight word {w:#x}, not a finite weight of 0 or more",
                    e[0], e[1]
                )));
            }
            edges.push((e[0], e[1], w as u32));
        }
    }
    Ok(edges)
}

/// Offsets (from 0, one per node and the total), neighbours and weights of
/// a rank's nodes.
type Adjacency = (Vec<usize>, Vec<i64>, Option<Vec<f32>>);

/// The [`Adjacency`] of this rank's nodes.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] for repeated edges whose
/// summed weight is past `f32::MAX` (a graph [`load`](crate::load) would
/// refuse).
fn adjacency(mut edges: Vec<Edge>, mine: &std::ops::Range<usize>, opts: &BuildOptions, weighted: bool) -> Result<Adjacency> {
    // Weights are finite and non-negative, so their bits order like them.
    edges.sort_unstable();
    if opts.dedup {
        edges.dedup_by(|later, kept| {
            let same = later.0 == kept.0 && later.1 == kept.1;
            if same && weighted {
                kept.2 = (f32::from_bits(kept.2) + f32::from_bits(later.2)).to_bits();
            }
            same
        });
        if let Some(&(s, d, _)) = edges.iter().find(|e| weighted && !f32::from_bits(e.2).is_finite()) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "the weights of the repeats of edge {s} -> {d} sum past the largest f32"
            ))));
        }
    }
    let mut offsets = Vec::with_capacity(mine.len() + 1);
    let mut cols = Vec::with_capacity(edges.len() + if opts.self_loops { mine.len() } else { 0 });
    let mut weights = weighted.then(|| Vec::with_capacity(cols.capacity()));
    let mut i = 0;
    for v in mine.clone() {
        offsets.push(cols.len());
        let v = v as u64;
        let mut looped = !opts.self_loops;
        while i < edges.len() && edges[i].0 == v {
            let (_, d, w) = edges[i];
            if !looped && d >= v {
                looped = true;
                if d != v {
                    cols.push(v as i64);
                    if let Some(ws) = weights.as_mut() {
                        ws.push(1.0);
                    }
                }
            }
            cols.push(d as i64);
            if let Some(ws) = weights.as_mut() {
                ws.push(f32::from_bits(w));
            }
            i += 1;
        }
        if !looped {
            cols.push(v as i64);
            if let Some(ws) = weights.as_mut() {
                ws.push(1.0);
            }
        }
    }
    offsets.push(cols.len());
    Ok((offsets, cols, weights))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Issue 30, item 6: every rank's allgathered edge count was summed
        /// unchecked (and `Partition::from_counts` panics past
        /// `usize::MAX`). Counts near 2^63 and 2^64: the partition, or an
        /// error naming the rank whose count takes the total past 2^63 - 1.
        #[test]
        fn peer_edge_counts_summed_unchecked(counts in proptest::collection::vec(
            prop_oneof![0u64..1000, (1u64 << 62) - 2..=(1u64 << 62) + 2, i64::MAX as u64 - 2..=i64::MAX as u64 + 2, u64::MAX - 2..=u64::MAX],
            1..6,
        )) {
            let ranks: Vec<usize> = (0..counts.len()).map(|r| 100 + r).collect();
            let exact: u128 = counts.iter().map(|&c| u128::from(c)).sum();
            match edge_partition(&counts, &ranks) {
                Ok(p) => {
                    prop_assert!(exact <= i64::MAX as u128);
                    prop_assert_eq!(p.counts(), counts.iter().map(|&c| c as usize).collect::<Vec<_>>());
                }
                Err(Error::Common(CommonError::PeerFailed { rank, detail })) => {
                    let mut sum = 0u128;
                    let first = counts.iter().position(|&c| { sum += u128::from(c); sum > i64::MAX as u128 }).expect("a total past 2^63 - 1");
                    prop_assert_eq!(rank, ranks[first]);
                    prop_assert!(detail.contains(&format!("it has {} edges", counts[first])), "{}", detail);
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
    }
}
