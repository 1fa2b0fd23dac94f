//! Neighbour sampling without replacement, unweighted and weighted.

use std::collections::HashSet;

use wholemem::CommonError;
use wholemem::{Element, Location};
use wm_gather::Column;

use crate::collective::split_work;
use crate::csr::{ColIndex, CsrGraph};
use crate::rng::Stream;
use crate::{Error, Result};

/// A fanout that takes every neighbour.
pub const ALL: usize = usize::MAX;

/// What [`sample`](crate::sample()) draws. On distributed and hierarchy graphs every rank
/// passes the same request (its centers may differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRequest {
    /// Neighbours per center at most: every neighbour when the degree is not
    /// larger, none for 0, every one for [`ALL`].
    pub fanout: usize,
    /// The seed; a center's sample depends only on the seed, the center and
    /// the graph.
    pub seed: u64,
    /// Draws with probability proportional to the edge weights (the graph
    /// must have them).
    pub weighted: bool,
    /// Also returns each sample's edge id (its position in `col_ind`).
    pub edge_ids: bool,
    /// Threads this rank samples with; `None` for the graph's
    /// [`threads`](CsrGraph::threads).
    pub threads: Option<usize>,
}

impl SampleRequest {
    /// Unweighted, `fanout` per center, without edge ids.
    pub fn new(fanout: usize, seed: u64) -> Self {
        Self { fanout, seed, weighted: false, edge_ids: false, threads: None }
    }

    /// Weighted (or not).
    pub fn weighted(mut self, yes: bool) -> Self {
        self.weighted = yes;
        self
    }

    /// With edge ids (or without).
    pub fn edge_ids(mut self, yes: bool) -> Self {
        self.edge_ids = yes;
        self
    }

    /// With this many threads.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    pub(crate) fn header(&self) -> [u64; 4] {
        [self.fanout as u64, self.seed, u64::from(self.weighted), u64::from(self.edge_ids)]
    }
}

/// Sampled neighbours of a list of centers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// `offsets[i]..offsets[i + 1]` are center `i`'s samples (`n + 1`
    /// entries).
    pub offsets: Vec<usize>,
    /// The sampled neighbours, each center's in CSR order.
    pub neighbors: Vec<i64>,
    /// The edge id of each sample, when asked for; empty otherwise.
    pub edge_ids: Vec<i64>,
}

impl Sample {
    /// Center `i`'s sampled neighbours.
    pub fn of(&self, i: usize) -> &[i64] {
        &self.neighbors[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The index of each sample's center in the list of centers.
    pub fn center_index(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.neighbors.len());
        for (i, w) in self.offsets.windows(2).enumerate() {
            out.extend(std::iter::repeat_n(i, w[1] - w[0]));
        }
        out
    }

    pub(crate) fn from_counts(counts: &[usize], neighbors: Vec<i64>, edge_ids: Vec<i64>) -> Self {
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        offsets.push(0);
        let mut acc = 0;
        for &c in counts {
            acc += c;
            offsets.push(acc);
        }
        Self { offsets, neighbors, edge_ids }
    }
}

/// Samples of `centers` (node ids by `id`): counts per center, neighbours,
/// edge ids (empty unless asked). Not collective for host graphs: continuous
/// and chunked graphs are read through the mapping, and distributed and
/// hierarchy graphs call it with centers they own ([`serve`]), whose edges
/// they hold. Device graphs read through `wm_gather` ([`sample_gathered`]),
/// collectively for distributed and hierarchy graphs: every rank then calls
/// it once per sampling call.
pub(crate) fn sample_local<C: Copy + Sync>(
    graph: &CsrGraph,
    centers: &[C],
    id: impl Fn(C) -> u64 + Sync,
    req: &SampleRequest,
    threads: usize,
) -> Result<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    if graph.location() != Location::Host {
        let ids: Vec<u64> = centers.iter().map(|&c| id(c)).collect();
        return sample_gathered(graph, &ids, req, threads);
    }
    match &graph.col_ind {
        ColIndex::I32(t) => sample_mapped(graph, &Column::new(t)?, centers, id, req, threads),
        ColIndex::I64(t) => sample_mapped(graph, &Column::new(t)?, centers, id, req, threads),
    }
}

/// Sampled edges a sampling thread gets at least (the expected count:
/// centers × the fanout or the mean degree, whichever is smaller). One
/// thread samples some 80 million edges a second, so this is some 0.4 ms
/// of work — ten times what starting and joining a thread costs — and
/// below two such shares the calling thread samples alone.
pub(crate) const MIN_EDGES_PER_THREAD: usize = 32_768;

/// Threads for sampling `centers` centers at `fanout` from a graph of
/// `nodes` nodes and `edges` edges, when allowed `threads`: one per whole
/// [`MIN_EDGES_PER_THREAD`] expected edges, at least one.
pub(crate) fn sample_threads(centers: usize, fanout: usize, nodes: usize, edges: usize, threads: usize) -> usize {
    let per_center = fanout.min(edges.div_ceil(nodes.max(1))).max(1);
    wm_gather::parallel::threads_for(centers.saturating_mul(per_center), MIN_EDGES_PER_THREAD, threads)
}

/// Centers between a prefetch and the read it prepares.
const AHEAD: usize = 8;

/// Counts, neighbours and edge ids of a run of centers.
type Picked = (Vec<usize>, Vec<i64>, Vec<i64>);

/// [`sample_local`] for host graphs, in one pass per center: its two
/// offsets, its picks, the picked neighbours — read through the mapping
/// with [`Column`]s, in `threads` threads. The same picks as
/// [`sample_in_memory`] (the same code draws them).
fn sample_mapped<T: Element + Into<i64> + Sync, C: Copy + Sync>(
    graph: &CsrGraph,
    col: &Column<'_, T>,
    centers: &[C],
    id: impl Fn(C) -> u64 + Sync,
    req: &SampleRequest,
    threads: usize,
) -> Result<Picked> {
    let row_ptr = Column::new(&graph.row_ptr)?;
    let weights = match (&graph.weights, req.weighted) {
        (Some(w), true) => Some(Column::new(w)?),
        (None, true) => {
            return Err(Error::Common(CommonError::InvalidArgument("weighted sampling of a graph without edge weights".into())));
        }
        (_, false) => None,
    };
    let edges = graph.edges();
    let me = graph.comm().world_rank();
    // Node `v`'s edges, checked to fit the table and to be mapped here.
    let bounds = |v: u64| -> Result<(usize, usize)> {
        let v = usize::try_from(v).map_err(|_| Error::Common(CommonError::InvalidArgument(format!("node {v} does not fit an index"))))?;
        let start = row_ptr
            .get(v)
            .ok_or_else(|| Error::Common(CommonError::InvalidArgument(format!("node {v}'s offsets are not on rank {me}"))))?;
        // The next node's offset, or for an owner's last node (the next one
        // is another rank's) the end of the owner's edges.
        let end = match row_ptr.get(v + 1) {
            Some(e) => e,
            None => graph.edges.offset(graph.nodes.owner(v) + 1) as i64,
        };
        if start < 0 || end < start || end as u64 > edges as u64 {
            return Err(Error::BadGraph(format!("node {v}'s offsets {start}..{end} do not fit {edges} edges")));
        }
        Ok((start as usize, end as usize))
    };
    // A thread costs tens of microseconds to start: only for enough work.
    let threads = sample_threads(centers.len(), req.fanout, graph.nodes(), edges, threads);
    let parts = split_work(centers.len(), threads, |chunk| -> Result<Picked> {
        let mut s = Scratch::default();
        let guess = chunk.len().saturating_mul(req.fanout.min(16));
        let mut counts = Vec::with_capacity(chunk.len());
        let mut neighbors = Vec::with_capacity(guess);
        let mut edge_ids = Vec::with_capacity(if req.edge_ids { guess } else { 0 });
        let mine = &centers[chunk];
        for (j, &c) in mine.iter().enumerate() {
            // Ahead of the reads: the offsets of the center 2 × AHEAD on,
            // then the first edge of the one AHEAD on (its offsets in cache
            // by now).
            if let Some(&a) = mine.get(j + 2 * AHEAD) {
                row_ptr.prefetch(id(a) as usize);
            }
            if let Some(s) = mine.get(j + AHEAD).and_then(|&b| row_ptr.get(id(b) as usize)) {
                col.prefetch(s as usize);
                if let Some(w) = &weights {
                    w.prefetch(s as usize);
                }
            }
            let v = id(c);
            let (start, end) = bounds(v)?;
            let not_here = || Error::BadGraph(format!("node {v}'s edges {start}..{end} are not among those rank {me} maps"));
            let run = col.run(start..end).ok_or_else(not_here)?;
            let d = end - start;
            let k = d.min(req.fanout);
            counts.push(k);
            if k == d {
                run.extend_into(&mut neighbors, Into::into);
                if req.edge_ids {
                    edge_ids.extend(start as i64..end as i64);
                }
                continue;
            }
            let mut stream = Stream::new(req.seed, v);
            match &weights {
                Some(w) => {
                    s.weights.clear();
                    w.run(start..end).ok_or_else(not_here)?.extend_into(&mut s.weights, |x| x);
                    weighted_picks(&mut stream, &s.weights, k, &mut s.keys, &mut s.picks);
                }
                None => floyd(&mut stream, d as u64, k as u64, &mut s.picks, &mut s.seen),
            }
            for &p in &s.picks {
                neighbors.push(run.get(p as usize).into());
            }
            if req.edge_ids {
                edge_ids.extend(s.picks.iter().map(|&p| (start + p as usize) as i64));
            }
        }
        Ok((counts, neighbors, edge_ids))
    });
    let mut parts = parts.into_iter();
    let Some(first) = parts.next() else { return Ok(Picked::default()) };
    let (mut counts, mut neighbors, mut edge_ids) = first?;
    for part in parts {
        let (c, n, e) = part?;
        counts.extend(c);
        neighbors.extend(n);
        edge_ids.extend(e);
    }
    Ok((counts, neighbors, edge_ids))
}

/// [`sample_local`] through `wm_gather` (device graphs): not collective for
/// continuous and chunked graphs; for distributed and hierarchy graphs every
/// rank calls it once per sampling call with centers it owns (so the
/// gathers find their rows locally, yet stay collective).
///
/// 1. One gather of `row_ptr[v]` and `row_ptr[v + 1]` per center.
/// 2. For weighted centers with more neighbours than the fanout, one gather
///    of their edge weights.
/// 3. The picks, per center from its own random stream, in `threads`
///    threads.
/// 4. One gather of the picked edges' neighbour ids.
fn sample_gathered(graph: &CsrGraph, centers: &[u64], req: &SampleRequest, threads: usize) -> Result<(Vec<usize>, Vec<i64>, Vec<i64>)> {
    let n = centers.len();
    let mut ids = Vec::with_capacity(2 * n);
    for &v in centers {
        ids.extend([v as i64, v as i64 + 1]);
    }
    let mut bounds = vec![0i64; 2 * n];
    wm_gather::gather_into(&graph.row_ptr, &ids, &mut bounds)?;
    drop(ids);
    let edges = graph.edges() as i64;
    // Offsets that do not fit (a broken table) fail this call, after the
    // remaining gathers, so collective calls stay in step.
    let mut problem = None;
    if let Some(i) = (0..n).find(|&i| bounds[2 * i] < 0 || bounds[2 * i + 1] < bounds[2 * i] || bounds[2 * i + 1] > edges) {
        problem = Some(Error::BadGraph(format!(
            "node {}'s offsets {}..{} do not fit {edges} edges",
            centers[i],
            bounds[2 * i],
            bounds[2 * i + 1]
        )));
        bounds.fill(0);
    }
    let range = |i: usize| (bounds[2 * i] as usize, bounds[2 * i + 1] as usize);
    // Centers that draw: more neighbours than the fanout, and a fanout
    // above 0 (fanout 0 takes none, and reads no weights).
    let draws = |i: usize| {
        let (s, e) = range(i);
        e - s > req.fanout && req.fanout > 0
    };

    // Weights of the centers that draw by weight, one run per center.
    let mut weights = Vec::new();
    let mut weight_at = vec![0usize; if req.weighted { n + 1 } else { 0 }];
    if req.weighted {
        let mut pos: Vec<i64> = Vec::new();
        for i in 0..n {
            if draws(i) {
                let (s, e) = range(i);
                pos.extend(s as i64..e as i64);
            }
            weight_at[i + 1] = pos.len();
        }
        let table = graph
            .weights
            .as_ref()
            .ok_or_else(|| Error::Common(CommonError::InvalidArgument("weighted sampling of a graph without edge weights".into())))?;
        weights = vec![0f32; pos.len()];
        wm_gather::gather_into(table, &pos, &mut weights)?;
    }

    // The picks: edge positions per center, in parallel.
    let threads = sample_threads(n, req.fanout, graph.nodes(), graph.edges(), threads);
    let parts = split_work(n, threads, |chunk| {
        let mut s = Scratch::default();
        let (mut counts, mut positions) = (Vec::with_capacity(chunk.len()), Vec::new());
        for i in chunk {
            let (start, end) = range(i);
            let d = end - start;
            let k = d.min(req.fanout);
            counts.push(k);
            if k == d {
                positions.extend(start as i64..end as i64);
                continue;
            }
            let mut stream = Stream::new(req.seed, centers[i]);
            if req.weighted {
                weighted_picks(&mut stream, &weights[weight_at[i]..weight_at[i + 1]], k, &mut s.keys, &mut s.picks);
            } else {
                floyd(&mut stream, d as u64, k as u64, &mut s.picks, &mut s.seen);
            }
            positions.extend(s.picks.iter().map(|&p| (start + p as usize) as i64));
        }
        (counts, positions)
    });
    let mut counts = Vec::with_capacity(n);
    let mut positions = Vec::with_capacity(parts.iter().map(|p| p.1.len()).sum());
    for (c, p) in parts {
        counts.extend(c);
        positions.extend(p);
    }
    let mut neighbors = vec![0i64; positions.len()];
    match &graph.col_ind {
        ColIndex::I32(t) => wm_gather::gather_into(t, &positions, &mut neighbors)?,
        ColIndex::I64(t) => wm_gather::gather_into(t, &positions, &mut neighbors)?,
    }
    if let Some(e) = problem {
        return Err(e);
    }
    let edge_ids = if req.edge_ids { positions } else { Vec::new() };
    Ok((counts, neighbors, edge_ids))
}

#[derive(Default)]
struct Scratch {
    picks: Vec<u64>,
    seen: HashSet<u64>,
    keys: Vec<(f64, u32)>,
    weights: Vec<f32>,
}

/// Picks at most this many with a linear membership test.
const LINEAR_PICKS: usize = 32;

/// `k` distinct values of `0..d` (`k < d`), each subset equally likely
/// (Floyd's algorithm), ascending.
pub(crate) fn floyd(stream: &mut Stream, d: u64, k: u64, picks: &mut Vec<u64>, seen: &mut HashSet<u64>) {
    picks.clear();
    let small = k as usize <= LINEAR_PICKS;
    if !small {
        seen.clear();
    }
    for j in d - k..d {
        let t = stream.below(j + 1);
        let taken = if small { picks.contains(&t) } else { !seen.insert(t) };
        let pick = if taken { j } else { t };
        if taken && !small {
            seen.insert(j);
        }
        picks.push(pick);
    }
    picks.sort_unstable();
}

/// The `k` largest keys `ln(u) / w` (`u^(1/w)` in logs) of `weights`
/// (`k < weights.len()`), ties to the lower position, positions ascending;
/// none for `k = 0`.
pub(crate) fn weighted_picks(stream: &mut Stream, weights: &[f32], k: usize, keys: &mut Vec<(f64, u32)>, picks: &mut Vec<u64>) {
    picks.clear();
    // Fanout 0: no key to select (and no position `k - 1`).
    let Some(last) = k.checked_sub(1) else { return };
    keys.clear();
    for (i, &w) in weights.iter().enumerate() {
        let u = stream.open01();
        let key = if w > 0.0 { u.ln() / f64::from(w) } else { f64::NEG_INFINITY };
        keys.push((key, i as u32));
    }
    let order = |a: &(f64, u32), b: &(f64, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    keys.select_nth_unstable_by(last, order);
    picks.extend(keys[..k].iter().map(|&(_, i)| u64::from(i)));
    picks.sort_unstable();
}

/// The same sampling as [`sample`](crate::sample()), single-threaded over a CSR held in
/// plain slices of this process (`row_ptr`: `nodes + 1` offsets; `col_ind`
/// and `weights`: one per edge): the same seed gives the same sample as
/// from wholemem tables. For references and baselines (`wm-bench sample`).
///
/// # Errors
/// [`Error::NodeOutOfRange`] for a bad center; [`wholemem::CommonError::InvalidArgument`]
/// for a weighted request without weights or offsets that do not fit the
/// slices.
pub fn sample_in_memory(row_ptr: &[i64], col_ind: &[i64], weights: Option<&[f32]>, centers: &[i64], req: &SampleRequest) -> Result<Sample> {
    let nodes = row_ptr.len().saturating_sub(1);
    if let Some(position) = centers.iter().position(|&v| v < 0 || v as u64 >= nodes as u64) {
        return Err(Error::NodeOutOfRange { node: centers[position], position, rank: 0, nodes });
    }
    if req.weighted && weights.is_none_or(|w| w.len() != col_ind.len()) {
        return Err(Error::Common(CommonError::InvalidArgument("weighted sampling needs one weight per edge".into())));
    }
    let mut s = Scratch::default();
    let mut counts = Vec::with_capacity(centers.len());
    let (mut neighbors, mut edge_ids) = (Vec::new(), Vec::new());
    for &v in centers {
        let (start, end) = (row_ptr[v as usize], row_ptr[v as usize + 1]);
        if start < 0 || end < start || end as usize > col_ind.len() {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "node {v}'s offsets {start}..{end} do not fit {} edges",
                col_ind.len()
            ))));
        }
        let (start, end) = (start as usize, end as usize);
        let d = end - start;
        let k = d.min(req.fanout);
        counts.push(k);
        if k == d {
            neighbors.extend_from_slice(&col_ind[start..end]);
            if req.edge_ids {
                edge_ids.extend((start..end).map(|e| e as i64));
            }
            continue;
        }
        let mut stream = Stream::new(req.seed, v as u64);
        match weights {
            Some(w) if req.weighted => weighted_picks(&mut stream, &w[start..end], k, &mut s.keys, &mut s.picks),
            _ => floyd(&mut stream, d as u64, k as u64, &mut s.picks, &mut s.seen),
        }
        for &p in &s.picks {
            let e = start + p as usize;
            neighbors.push(col_ind[e]);
            if req.edge_ids {
                edge_ids.push(e as i64);
            }
        }
    }
    Ok(Sample::from_counts(&counts, neighbors, edge_ids))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Issue 30 item 10: the sampler started a thread per 1024 centers,
    /// whatever the fanout — 1025 centers at fanout 1 (some 1000 edges,
    /// tens of microseconds) got two threads, whose start and join cost
    /// about as much as the work. Threads now come from the expected
    /// edges: below two shares of `MIN_EDGES_PER_THREAD`, one.
    #[test]
    fn threads_slowing_things_down_small_samples_take_one_thread() {
        let m = MIN_EDGES_PER_THREAD;
        // The graph of `wm-bench sample`: 10 edges per node.
        let (nodes, edges) = (1_000_000, 10_000_000);
        assert_eq!(sample_threads(1025, 1, nodes, edges, 2), 1, "1025 centers at fanout 1");
        assert_eq!(sample_threads(4096, 2, nodes, edges, 4), 1, "4096 centers at fanout 2");
        assert_eq!(sample_threads((2 * m - 1) / 10, 10, nodes, edges, 2), 1, "just under two shares");
        assert_eq!(sample_threads(2 * m / 10 + 1, 10, nodes, edges, 2), 2, "two shares");
        assert_eq!(sample_threads(1 << 20, 10, nodes, edges, 2), 2, "never past the threads allowed");
        // The mean degree caps the work a large fanout can promise.
        assert_eq!(sample_threads(4096, ALL, nodes, edges, 2), 1, "fanout all, mean degree 10");
        assert_eq!(sample_threads(4096, ALL, 1000, 1_000_000, 2), 2, "fanout all, mean degree 1000");
        assert_eq!(sample_threads(1 << 20, 0, nodes, edges, 2), 2, "fanout 0 still reads every center's offsets");
        assert_eq!(sample_threads(0, 10, 0, 0, 2), 1, "an empty graph");
    }

    /// Issue 30, item 1: weighted sampling with fanout 0 asked
    /// `select_nth_unstable_by` for position `k - 1`, which underflowed.
    /// Every path draws through [`weighted_picks`]; here the in-memory one.
    #[test]
    fn weighted_fanout_zero_underflow() {
        let (row_ptr, col, w) = (vec![0i64, 3, 3], vec![1i64, 0, 1], vec![1.0f32, 2.0, 3.0]);
        for weighted in [false, true] {
            let req = SampleRequest::new(0, 7).weighted(weighted).edge_ids(true);
            let s = sample_in_memory(&row_ptr, &col, Some(&w), &[0, 1, 0], &req).unwrap();
            assert_eq!(s, Sample { offsets: vec![0; 4], neighbors: Vec::new(), edge_ids: Vec::new() }, "weighted {weighted}");
        }
        let mut picks = vec![9];
        weighted_picks(&mut Stream::new(1, 0), &w, 0, &mut Vec::new(), &mut picks);
        assert!(picks.is_empty(), "{picks:?}");
    }

    /// A CSR of up to 10 nodes of degree 0 to 8 (neighbours and positive
    /// weights per edge) as `(row_ptr, col_ind, weights)`.
    fn csr() -> impl Strategy<Value = (Vec<i64>, Vec<i64>, Vec<f32>)> {
        (1usize..=10).prop_flat_map(|nodes| {
            proptest::collection::vec(proptest::collection::vec((0..nodes as i64, 1u8..=16), 0..=8), nodes).prop_map(|adj| {
                let mut row_ptr = vec![0i64];
                let (mut col, mut w) = (Vec::new(), Vec::new());
                for list in adj {
                    col.extend(list.iter().map(|p| p.0));
                    w.extend(list.iter().map(|p| f32::from(p.1) * 0.25));
                    row_ptr.push(col.len() as i64);
                }
                (row_ptr, col, w)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Fanouts from 0 to 2 past the largest degree, weighted and not:
        /// `min(degree, fanout)` distinct edges of the center, in CSR order,
        /// each with its neighbour; all of them when the fanout reaches the
        /// degree; a repeated center gets the same sample.
        #[test]
        fn fanout_from_zero_past_the_degree_takes_the_smaller(
            (row_ptr, col, w, centers, fanout) in csr().prop_flat_map(|(row_ptr, col, w)| {
                let nodes = row_ptr.len() - 1;
                let most = row_ptr.windows(2).map(|p| (p[1] - p[0]) as usize).max().unwrap_or(0);
                (Just(row_ptr), Just(col), Just(w), proptest::collection::vec(0..nodes as i64, 0..12), 0..=most + 2)
            }),
            weighted in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let req = SampleRequest::new(fanout, seed).weighted(weighted).edge_ids(true);
            let s = sample_in_memory(&row_ptr, &col, Some(&w), &centers, &req).unwrap();
            prop_assert_eq!(s.offsets.len(), centers.len() + 1);
            for (i, &v) in centers.iter().enumerate() {
                let (start, end) = (row_ptr[v as usize], row_ptr[v as usize + 1]);
                let eids = &s.edge_ids[s.offsets[i]..s.offsets[i + 1]];
                prop_assert_eq!(eids.len(), ((end - start) as usize).min(fanout), "center {} of degree {}", v, end - start);
                prop_assert!(eids.windows(2).all(|p| p[0] < p[1]), "edges {:?} repeat or are out of order", eids);
                prop_assert!(eids.iter().all(|&e| (start..end).contains(&e)), "edges {:?} are not {}'s {}..{}", eids, v, start, end);
                let want: Vec<i64> = eids.iter().map(|&e| col[e as usize]).collect();
                prop_assert_eq!(s.of(i), want.as_slice());
                if let Some(j) = centers[..i].iter().position(|&u| u == v) {
                    prop_assert_eq!(s.of(i), s.of(j), "center {} twice", v);
                }
            }
        }

        /// [`weighted_picks`] for every `k` below the length, 0 included:
        /// `k` distinct positions, ascending.
        #[test]
        fn weighted_picks_for_every_k(
            (w, k) in proptest::collection::vec(0u8..=16, 1..40).prop_flat_map(|w| { let n = w.len(); (Just(w), 0..n) }),
            seed in any::<u64>(),
        ) {
            let w: Vec<f32> = w.iter().map(|&x| f32::from(x) * 0.5).collect();
            let (mut keys, mut picks) = (Vec::new(), Vec::new());
            weighted_picks(&mut Stream::new(seed, 3), &w, k, &mut keys, &mut picks);
            prop_assert_eq!(picks.len(), k);
            prop_assert!(picks.windows(2).all(|p| p[0] < p[1]) && picks.iter().all(|&p| (p as usize) < w.len()), "{:?}", picks);
        }
    }
}
