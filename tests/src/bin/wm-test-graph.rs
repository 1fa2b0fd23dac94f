//! One rank of a multi-process graph scenario: `wm-test-graph SCENARIO
//! [DIR]`. Started by `tests/tests/graph.rs` through the harness (or by
//! hand under `wm-run`). Every check runs on every rank; the first wrong
//! result exits non-zero naming the rank, the case and what differed.
//!
//! The reference adjacency is computed here from the edge lists (every rank
//! can regenerate every rank's share from the seed), sorted and merged with
//! plain code that shares nothing with `wm_graph`'s builder.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use proptest::test_runner::{Config as PropConfig, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use wholemem::{Location, MemoryType, query};
use wm_comm::{CommExt, Communicator};
use wm_graph::{
    ALL, BuildOptions, CsrGraph, EdgeList, Error as GErr, IdType, SampleRequest, append_unique, build, sample, sample_blocks,
    sample_in_memory, sample_neighbors, sample_weighted_neighbors,
};
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| {
        let loc = match rest.iter().find(|a| *a == "device") {
            Some(_) => Location::Device,
            None => Location::Host,
        };
        match scenario {
            "build" => {
                let dir = PathBuf::from(rest.first().context("usage: wm-test-graph build DIR [device]")?);
                build_and_files(world, &dir, loc)
            }
            "uniform" => uniform(world, loc),
            "weighted" => weighted(world, loc),
            "digest" => digest(world, loc),
            "blocks" => blocks(world, loc),
            "degree" => highest_degree(world, loc),
            "bad-input" => bad_input(world),
            "fanout-property" => fanout_property(world, loc),
            "load-partition" => {
                let dir = PathBuf::from(rest.first().context("usage: wm-test-graph load-partition DIR")?);
                load_partition(world, &dir)
            }
            "negative-offsets" => {
                let dir = PathBuf::from(rest.first().context("usage: wm-test-graph negative-offsets DIR")?);
                negative_offsets(world, &dir)
            }
            other => bail!("unknown scenario {other:?}"),
        }
    });
}

/// The memory types `world` can hold at `loc`, printing why for the others.
fn types_at(world: &Comm, loc: Location) -> Vec<MemoryType> {
    MemoryType::ALL
        .into_iter()
        .filter(|&ty| match query(world.as_ref(), ty, loc).reason() {
            Some(reason) => {
                println!("skip {loc} {ty}: {reason}");
                false
            }
            None => true,
        })
        .collect()
}

/// A global edge list from a seed; rank `r` of `w` holds edges `i` with
/// `i % w == r`, so the graph does not depend on the rank count.
struct Edges {
    src: Vec<i64>,
    dst: Vec<i64>,
    w: Vec<f32>,
}

impl Edges {
    fn random(seed: u64, nodes: usize, edges: usize) -> Self {
        let mut rng = Rng::new(&[seed, 0xed6e]);
        let mut e = Edges { src: Vec::new(), dst: Vec::new(), w: Vec::new() };
        for _ in 0..edges {
            // Half the edges among the first tenth of the nodes: repeats,
            // high degrees; the last nodes get none.
            let span = if rng.below(2) == 0 { nodes / 10 } else { nodes * 9 / 10 };
            e.src.push(rng.below(span.max(1) as u64) as i64);
            e.dst.push(rng.below(span.max(1) as u64) as i64);
            e.w.push((1 + rng.below(8)) as f32 * 0.25);
        }
        e
    }

    fn share(&self, world: &Comm) -> Edges {
        let (r, w) = (world.rank(), world.size());
        let pick = |v: &[i64]| v.iter().enumerate().filter(|(i, _)| i % w == r).map(|(_, &x)| x).collect();
        Edges {
            src: pick(&self.src),
            dst: pick(&self.dst),
            w: self.w.iter().enumerate().filter(|(i, _)| i % w == r).map(|(_, &x)| x).collect(),
        }
    }

    fn list(&self, weighted: bool) -> EdgeList<'_> {
        if weighted { EdgeList::weighted(&self.src, &self.dst, &self.w) } else { EdgeList::new(&self.src, &self.dst) }
    }

    /// The reference: per node, sorted (neighbour, weight) pairs.
    fn reference(&self, nodes: usize, undirected: bool, dedup: bool, self_loops: bool) -> Vec<Vec<(i64, f32)>> {
        let mut adj: Vec<Vec<(i64, f32)>> = vec![Vec::new(); nodes];
        for i in 0..self.src.len() {
            let (s, d, w) = (self.src[i], self.dst[i], self.w[i]);
            adj[s as usize].push((d, w));
            if undirected {
                adj[d as usize].push((s, w));
            }
        }
        for (v, list) in adj.iter_mut().enumerate() {
            list.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            if dedup {
                let mut merged: BTreeMap<i64, f32> = BTreeMap::new();
                for &(d, w) in list.iter() {
                    *merged.entry(d).or_insert(0.0) += w;
                }
                *list = merged.into_iter().collect();
            }
            if self_loops && !list.iter().any(|&(d, _)| d == v as i64) {
                let at = list.iter().position(|&(d, _)| d > v as i64).unwrap_or(list.len());
                list.insert(at, (v as i64, 1.0));
            }
        }
        adj
    }
}

/// The private CSR of an adjacency list: row pointers, neighbours and
/// weights, for `sample_in_memory`.
fn csr_of(adjacency: &[Vec<(i64, f32)>]) -> (Vec<i64>, Vec<i64>, Vec<f32>) {
    let mut row_ptr = vec![0i64];
    let (mut col, mut weights) = (Vec::new(), Vec::new());
    for list in adjacency {
        col.extend(list.iter().map(|p| p.0));
        weights.extend(list.iter().map(|p| p.1));
        row_ptr.push(col.len() as i64);
    }
    (row_ptr, col, weights)
}

/// Every node's neighbours (and weights) through a collective full sample,
/// compared with the reference; owners also check through `neighbors`.
fn check_graph(g: &CsrGraph, reference: &[Vec<(i64, f32)>], case: &str) -> Result<()> {
    let nodes: Vec<i64> = (0..reference.len() as i64).collect();
    let s = sample(g, &nodes, &SampleRequest::new(ALL, 1).edge_ids(true)).with_context(|| format!("{case}: full sample"))?;
    let total: usize = reference.iter().map(Vec::len).sum();
    ensure!(g.edges() == total, "{case}: {} edges, the reference has {total}", g.edges());
    for (v, want) in reference.iter().enumerate() {
        let drawn = s.of(v);
        let want_ids: Vec<i64> = want.iter().map(|p| p.0).collect();
        ensure!(drawn == want_ids.as_slice(), "{case}: node {v} has neighbours {drawn:?}, the reference {want_ids:?}");
        let eids = &s.edge_ids[s.offsets[v]..s.offsets[v + 1]];
        ensure!(eids.windows(2).all(|w| w[1] == w[0] + 1), "{case}: node {v}'s edge ids {eids:?} are not consecutive");
    }
    for v in g.local_nodes() {
        ensure!(g.neighbors(v as i64)? == s.of(v), "{case}: neighbors({v}) differs from the full sample");
        if g.is_weighted() {
            let w = g.edge_weights(v as i64)?;
            let want: Vec<f32> = reference[v].iter().map(|p| p.1).collect();
            ensure!(w == want, "{case}: node {v} has weights {w:?}, the reference {want:?}");
        }
    }
    Ok(())
}

fn build_and_files(world: &Comm, dir: &std::path::Path, loc: Location) -> Result<()> {
    let types = types_at(world, loc);
    let nodes = 300;
    let all = Edges::random(11, nodes, 2000);
    let mine = all.share(world);
    for (case, (undirected, dedup, self_loops, weighted, ids)) in [
        (false, false, false, false, IdType::I64),
        (true, true, false, true, IdType::I32),
        (false, true, true, true, IdType::I64),
        (true, false, true, false, IdType::I32),
    ]
    .into_iter()
    .enumerate()
    {
        let reference = all.reference(nodes, undirected, dedup, self_loops);
        for &ty in &types {
            let name = format!(
                "case {case} {loc} {ty} (undirected {undirected}, dedup {dedup}, loops {self_loops}, weighted {weighted}, {ids:?})"
            );
            let opts = BuildOptions::new(nodes, ty, loc).id_type(ids).undirected(undirected).dedup(dedup).self_loops(self_loops);
            let g = build(world, &opts, mine.list(weighted)).with_context(|| name.clone())?;
            ensure!(g.is_weighted() == weighted && g.id_type() == ids, "{name}: wrong kind of graph");
            check_graph(&g, &reference, &name)?;
            // Stored, then loaded into every type with a skewed partition.
            let at = dir.join(format!("case{case}-{ty}"));
            wm_graph::store(&g, &at).with_context(|| format!("{name}: store"))?;
            g.free()?;
            for &to in &types {
                let w = world.size();
                let mut counts = vec![0usize; w];
                counts[0] = nodes / 2;
                counts[w - 1] += nodes - nodes / 2;
                let loaded = wm_graph::load(world, &at, to, loc, Some(&counts)).with_context(|| format!("{name}: load as {to}"))?;
                ensure!(loaded.id_type() == ids && loaded.is_weighted() == weighted, "{name}: loaded as another kind");
                check_graph(&loaded, &reference, &format!("{name}, loaded as {to}"))?;
                loaded.free()?;
            }
        }
    }
    Ok(())
}

/// A star-ish graph for the distribution tests: node `HUB` has `DEG`
/// neighbours (weights `WEIGHTS` when weighted), node `SMALL` has 2, node
/// `LONELY` none.
const HUB: i64 = 5;
const SMALL: i64 = 9;
const LONELY: i64 = 3;
const DEG: usize = 6;
const WEIGHTS: [f32; 5] = [1.0, 2.0, 3.0, 4.0, 10.0];

fn small_graph(world: &Comm, ty: MemoryType, loc: Location, weighted: bool) -> Result<CsrGraph> {
    let (mut src, mut dst, mut w) = (Vec::new(), Vec::new(), Vec::new());
    if world.rank() == world.size() - 1 {
        let deg = if weighted { WEIGHTS.len() } else { DEG };
        for j in 0..deg {
            src.push(HUB);
            dst.push(20 + 3 * j as i64);
            w.push(if weighted { WEIGHTS.get(j).copied().unwrap_or(1.0) } else { 1.0 });
        }
        src.extend([SMALL, SMALL]);
        dst.extend([1, 2]);
        w.extend([1.0, 1.0]);
    }
    let opts = BuildOptions::new(40, ty, loc);
    let list = if weighted { EdgeList::weighted(&src, &dst, &w) } else { EdgeList::new(&src, &dst) };
    Ok(build(world, &opts, list)?)
}

/// The chi-square statistic of `counts` against probabilities `p`.
fn chi_square(counts: &HashMap<Vec<i64>, usize>, p: &HashMap<Vec<i64>, f64>, n: usize) -> Result<f64> {
    for k in counts.keys() {
        ensure!(p.contains_key(k), "sample {k:?} is not a possible subset");
    }
    Ok(p.iter()
        .map(|(k, &pk)| {
            let e = pk * n as f64;
            let o = *counts.get(k).unwrap_or(&0) as f64;
            (o - e) * (o - e) / e
        })
        .sum())
}

/// Samples a fixed node under `seeds` seeds, one call each (collective for
/// distributed types: every rank calls, rank 0 asks for the node), checking
/// each sample is `k` distinct neighbours; the subsets' counts.
fn draw(g: &CsrGraph, world: &Comm, node: i64, k: usize, seeds: u64, weighted: bool) -> Result<HashMap<Vec<i64>, usize>> {
    let neighbours =
        if g.memory_type().is_mapped() || g.local_nodes().contains(&(node as usize)) { Some(g.neighbors(node)?) } else { None };
    let mut counts = HashMap::new();
    let centers: &[i64] = if world.rank() == 0 || g.memory_type().is_mapped() { &[node] } else { &[] };
    for seed in 0..seeds {
        let req = SampleRequest::new(k, seed ^ 0xa5a5_0000).weighted(weighted).edge_ids(true);
        let s = sample(g, centers, &req)?;
        if centers.is_empty() {
            ensure!(s.neighbors.is_empty(), "samples for no centers");
            continue;
        }
        let drawn = s.of(0).to_vec();
        ensure!(drawn.len() == k, "seed {seed}: {} samples, fanout {k}", drawn.len());
        ensure!(drawn.windows(2).all(|w| w[0] < w[1]), "seed {seed}: repeats or out of order: {drawn:?}");
        if let Some(n) = &neighbours {
            ensure!(drawn.iter().all(|x| n.contains(x)), "seed {seed}: {drawn:?} are not all neighbours of {node} ({n:?})");
        }
        *counts.entry(drawn).or_insert(0) += 1;
    }
    Ok(counts)
}

/// Every k-subset of `items` (k = 2 or 3).
fn subsets(items: &[i64], k: usize) -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    let n = items.len();
    for a in 0..n {
        for b in a + 1..n {
            if k == 2 {
                out.push(vec![items[a], items[b]]);
            }
            for c in b + 1..n {
                if k == 3 {
                    out.push(vec![items[a], items[b], items[c]]);
                }
            }
        }
    }
    out
}

/// The 0.999 quantiles of chi-square: a correct sampler fails one run in a
/// thousand, and the seeds are fixed, so a pass is a pass every time.
fn critical_999(df: usize) -> f64 {
    match df {
        9 => 27.877,
        14 => 36.123,
        19 => 43.820,
        _ => unreachable!("no tabulated quantile for {df} degrees of freedom"),
    }
}

fn uniform(world: &Comm, loc: Location) -> Result<()> {
    for ty in types_at(world, loc) {
        let g = small_graph(world, ty, loc, false)?;
        let seeds = 3000;
        let neighbours: Vec<i64> = (0..DEG as i64).map(|j| 20 + 3 * j).collect();
        let counts = draw(&g, world, HUB, 2, seeds, false)?;
        if !counts.is_empty() {
            let all = subsets(&neighbours, 2);
            let p: HashMap<Vec<i64>, f64> = all.iter().map(|s| (s.clone(), 1.0 / all.len() as f64)).collect();
            let chi = chi_square(&counts, &p, seeds as usize)?;
            let crit = critical_999(all.len() - 1);
            println!("uniform {ty}: chi-square {chi:.2} over {} subsets (critical {crit})", all.len());
            ensure!(chi < crit, "{ty}: 2 of {DEG} not uniform: chi-square {chi:.2} >= {crit} ({counts:?})");
        }
        // Degree <= fanout: every neighbour, in order; a zero-degree node:
        // nothing; fanout 0: nothing.
        let centers = [SMALL, LONELY, HUB, SMALL];
        let s = sample_neighbors(&g, &centers, 2, 7)?;
        ensure!(s.of(0) == [1, 2] && s.of(3) == [1, 2], "{ty}: degree 2 with fanout 2 gave {:?}", s.of(0));
        ensure!(s.of(1).is_empty(), "{ty}: a node without edges gave {:?}", s.of(1));
        ensure!(s.center_index() == vec![0, 0, 2, 2, 3, 3], "{ty}: center index {:?}", s.center_index());
        let all = sample_neighbors(&g, &[HUB], ALL, 7)?;
        ensure!(all.of(0) == neighbours.as_slice(), "{ty}: fanout ALL gave {:?}", all.of(0));
        let none = sample_neighbors(&g, &centers, 0, 7)?;
        ensure!(none.neighbors.is_empty() && none.offsets == vec![0; 5], "{ty}: fanout 0 gave {none:?}");
        g.free()?;
    }
    Ok(())
}

/// `CsrGraph::highest_degree` against degrees counted here from the
/// reference adjacency: the same list on every rank, highest degree
/// first, ties to the lower id, for k from 0 past the node count.
fn highest_degree(world: &Comm, loc: Location) -> Result<()> {
    let nodes = 500;
    let all = Edges::random(41, nodes, 3000);
    let reference = all.reference(nodes, true, true, false);
    let mut ranked: Vec<(usize, i64)> = reference.iter().enumerate().map(|(v, list)| (list.len(), v as i64)).collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for ty in types_at(world, loc) {
        let opts = BuildOptions::new(nodes, ty, loc).undirected(true).dedup(true);
        let g = build(world, &opts, all.share(world).list(false))?;
        for k in [0, 1, 7, 100, nodes, nodes + 5] {
            let got = g.highest_degree(k)?;
            let want: Vec<i64> = ranked.iter().take(k).map(|p| p.1).collect();
            ensure!(got == want, "{ty}: the {k} nodes of highest degree are {got:?}, not {want:?}");
            let everyone = world.allgatherv_pod(&got)?;
            ensure!(everyone.iter().all(|l| *l == got), "{ty}: ranks got different rankings for k = {k}");
        }
        println!("degree {ty}: the ranking equals the reference's (top degree {})", ranked[0].0);
        g.free()?;
    }
    Ok(())
}

fn weighted(world: &Comm, loc: Location) -> Result<()> {
    for ty in types_at(world, loc) {
        let g = small_graph(world, ty, loc, true)?;
        let seeds = 3000;
        let ids: Vec<i64> = (0..WEIGHTS.len() as i64).map(|j| 20 + 3 * j).collect();
        let counts = draw(&g, world, HUB, 2, seeds, true)?;
        if !counts.is_empty() {
            // Successive draws proportional to weight: P({a, b}) =
            // w_a/W · w_b/(W − w_a) + w_b/W · w_a/(W − w_b).
            let total: f64 = WEIGHTS.iter().map(|&w| f64::from(w)).sum();
            let mut p = HashMap::new();
            for a in 0..WEIGHTS.len() {
                for b in a + 1..WEIGHTS.len() {
                    let (wa, wb) = (f64::from(WEIGHTS[a]), f64::from(WEIGHTS[b]));
                    p.insert(vec![ids[a], ids[b]], wa / total * wb / (total - wa) + wb / total * wa / (total - wb));
                }
            }
            let chi = chi_square(&counts, &p, seeds as usize)?;
            let crit = critical_999(p.len() - 1);
            println!("weighted {ty}: chi-square {chi:.2} over {} pairs (critical {crit})", p.len());
            ensure!(chi < crit, "{ty}: weighted 2 of 5 does not follow the weights: chi-square {chi:.2} >= {crit} ({counts:?})");
        }
        let s = sample_weighted_neighbors(&g, &[SMALL, LONELY], 5, 3)?;
        ensure!(s.of(0) == [1, 2] && s.of(1).is_empty(), "{ty}: small degrees gave {s:?}");
        g.free()?;
    }
    Ok(())
}

/// FNV-1a over words.
fn fnv(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// Samples of a fixed graph on rank 0, printed as digests: the same on any
/// rank count, thread count and memory type. Every rank also checks each
/// sample against `sample_in_memory` over the reference CSR.
fn digest(world: &Comm, loc: Location) -> Result<()> {
    let nodes = 5000;
    let all = Edges::random(5, nodes, 60_000);
    let mine = all.share(world);
    let centers: Vec<i64> = (0..nodes as i64).step_by(3).collect();
    let reference = all.reference(nodes, true, true, false);
    let (row_ptr, col, weights) = csr_of(&reference);
    for ty in types_at(world, loc) {
        let opts = BuildOptions::new(nodes, ty, loc).undirected(true).dedup(true);
        let g = build(world, &opts, mine.list(true))?;
        for (name, req) in [
            ("uniform", SampleRequest::new(4, 99).edge_ids(true)),
            ("weighted", SampleRequest::new(4, 99).weighted(true).edge_ids(true)),
            ("wide", SampleRequest::new(40, 7)),
        ] {
            let s = sample(&g, &centers, &req)?;
            let want = sample_in_memory(&row_ptr, &col, Some(&weights), &centers, &req)?;
            ensure!(s == want, "{loc} {ty} {name}: the sample differs from sample_in_memory's on the reference CSR");
            let d = fnv(s
                .offsets
                .iter()
                .map(|&o| o as u64)
                .chain(s.neighbors.iter().map(|&x| x as u64))
                .chain(s.edge_ids.iter().map(|&x| x as u64)));
            if world.rank() == 0 {
                println!("digest {name} {d:016x}");
            }
        }
        let b = sample_blocks(&g, &centers[..200], &[5, 3], 13, false)?;
        let d = fnv(b.nodes.iter().map(|&x| x as u64).chain(b.blocks.iter().flat_map(|bl| bl.neighbors.iter().map(|&x| x as u64))));
        if world.rank() == 0 {
            println!("digest blocks {d:016x}");
        }
        g.free()?;
    }
    Ok(())
}

/// Multi-hop blocks: targets first, prefixes, neighbour indices right.
fn blocks(world: &Comm, loc: Location) -> Result<()> {
    let nodes = 2000;
    let all = Edges::random(3, nodes, 20_000);
    let mine = all.share(world);
    for ty in types_at(world, loc) {
        let g = build(world, &BuildOptions::new(nodes, ty, loc).undirected(true), mine.list(false))?;
        let seeds: Vec<i64> = (0..100).map(|i| ((i * 37 + world.rank() * 11) % nodes) as i64).collect();
        let mb = sample_blocks(&g, &seeds, &[4, 3], 21, false)?;
        ensure!(mb.nodes[..seeds.len()] == seeds[..], "{ty}: the seeds are not first");
        ensure!(mb.blocks.len() == 2 && mb.blocks[1].targets == seeds.len(), "{ty}: wrong blocks");
        ensure!(mb.blocks[0].targets == mb.blocks[1].inputs && mb.blocks[0].inputs == mb.nodes.len(), "{ty}: block sizes do not chain");
        let mut sorted = mb.nodes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        ensure!(sorted.len() == mb.nodes.len(), "{ty}: repeated nodes in the block inputs");
        // Each block against a direct sample of its targets with its hop's seed.
        for (l, hop) in [(1usize, 0usize), (0, 1)] {
            let bl = &mb.blocks[l];
            let fanout = [4, 3][hop];
            let s = sample_neighbors(&g, &mb.nodes[..bl.targets], fanout, wm_graph::hop_seed(21, hop))?;
            ensure!(s.offsets == bl.offsets, "{ty}: block {l} offsets differ from a direct sample");
            let mapped: Vec<i64> = bl.neighbors.iter().map(|&i| mb.nodes[i]).collect();
            ensure!(mapped == s.neighbors, "{ty}: block {l} neighbour indices do not map to the sampled ids");
            ensure!(bl.neighbors.iter().all(|&i| i < bl.inputs), "{ty}: block {l} index past its inputs");
        }
        // append_unique on its own: targets first, every neighbour mapped.
        let targets: Vec<i64> = (0..50).map(|i| i * 3).collect();
        let neigh: Vec<i64> = (0..400).map(|i| (i * 7 % 211) as i64).collect();
        let u = append_unique(&targets, &neigh)?;
        ensure!(u.nodes[..50] == targets[..], "append_unique moved a target");
        ensure!(neigh.iter().zip(&u.neighbor_index).all(|(&v, &i)| u.nodes[i] == v), "append_unique mapped a neighbour wrong");
        g.free()?;
    }
    Ok(())
}

/// Expects `r` to fail with a message containing `want`.
fn expect_err<T: std::fmt::Debug>(r: Result<T, GErr>, want: &str, what: &str) -> Result<()> {
    match r {
        Ok(v) => bail!("{what}: succeeded ({v:?}); expected an error with {want:?}"),
        Err(e) => {
            let s = e.to_string();
            ensure!(s.contains(want), "{what}: error {s:?} does not name {want:?}");
            Ok(())
        }
    }
}

fn bad_input(world: &Comm) -> Result<()> {
    let last = world.size() - 1;
    let last_world = world.world_ranks()[last];
    for ty in types_at(world, Location::Host) {
        let g = small_graph(world, ty, Location::Host, false)?;
        let collective = !ty.is_mapped();
        // A bad center on the last rank: an error naming it on every rank of
        // a collective call (only there for mapped graphs); then a good call.
        let centers: Vec<i64> = if world.rank() == last { vec![HUB, 40] } else { vec![HUB] };
        let r = sample_neighbors(&g, &centers, 2, 1);
        if collective || world.rank() == last {
            expect_err(
                r,
                &format!("node 40 at position 1 on rank {last_world} is out of range for a graph of 40 nodes"),
                &format!("{ty}: bad center"),
            )?;
        } else {
            r?;
        }
        let centers: Vec<i64> = if world.rank() == 0 { vec![-1] } else { vec![] };
        let r = sample_neighbors(&g, &centers, 2, 1);
        if collective || world.rank() == 0 {
            expect_err(r, "node -1 at position 0", &format!("{ty}: negative center"))?;
        }
        let s = sample_neighbors(&g, &[HUB], 2, 1)?;
        ensure!(s.of(0).len() == 2, "{ty}: the call after a bad one gave {s:?}");
        expect_err(sample_weighted_neighbors(&g, &[HUB], 2, 1), "without edge weights", &format!("{ty}: weighted on unweighted"))?;
        if collective {
            let r = sample_neighbors(&g, &[HUB], 2 + world.rank() % 2, 1);
            if world.size() > 1 {
                expect_err(r, "ranks passed different arguments", &format!("{ty}: differing fanouts"))?;
            }
        }
        // Blocks from repeated seeds.
        let seeds: Vec<i64> = if world.rank() == last { vec![HUB, HUB] } else { vec![HUB] };
        let r = sample_blocks(&g, &seeds, &[2], 1, false);
        if collective || world.rank() == last {
            expect_err(r.map(|m| m.nodes), "target 5 is listed twice", &format!("{ty}: repeated seeds"))?;
        }
        ensure!(sample_blocks(&g, &[HUB, SMALL], &[2], 1, false)?.nodes.len() == 6, "{ty}: blocks after a bad call");
        if collective && world.size() > 1 {
            // Another number of hops on the last rank: every rank fails
            // (not a hop that rank never joins), and the next call works.
            let fanouts: &[usize] = if world.rank() == last { &[2] } else { &[2, 2] };
            let r = sample_blocks(&g, &[HUB, SMALL], fanouts, 1, false).map(|m| m.nodes);
            expect_err(
                r,
                "ranks passed different arguments to a collective call: rank 0 fanouts [2, 2]",
                &format!("{ty}: differing hops"),
            )?;
            // Another k for the ranking: silently shorter lists before.
            let r = g.highest_degree(if world.rank() == last { 4 } else { 1 });
            expect_err(r, "ranks passed different numbers of nodes to rank by degree: rank 0 1", &format!("{ty}: differing k"))?;
            ensure!(sample_blocks(&g, &[HUB, SMALL], &[2, 2], 1, false)?.blocks.len() == 2, "{ty}: blocks after differing hops");
        }
        g.free()?;

        // Building: a bad edge on the last rank fails everywhere, naming it;
        // then a good build works.
        let (src, dst): (Vec<i64>, Vec<i64>) = if world.rank() == last { (vec![0, 1, 2], vec![1, 99, 0]) } else { (vec![0], vec![1]) };
        let opts = BuildOptions::new(10, ty, Location::Host);
        expect_err(
            build(world, &opts, EdgeList::new(&src, &dst)),
            &format!("edge 1 (1 -> 99) on rank {last_world}: destination 99 is out of range for a graph of 10 nodes"),
            &format!("{ty}: bad edge"),
        )?;
        let w = vec![1.0f32, f32::NAN, 1.0];
        let (src, dst, w) = if world.rank() == 0 { (vec![0i64, 1, 2], vec![1i64, 2, 0], w) } else { (vec![], vec![], vec![]) };
        expect_err(build(world, &opts, EdgeList::weighted(&src, &dst, &w)), "weight NaN is not a finite", &format!("{ty}: NaN weight"))?;
        // Repeats whose weights sum past f32::MAX, with dedup: an error on
        // every rank, not a weight of inf that a load refuses.
        let (src, dst, w) = if world.rank() == last { (vec![0i64, 0], vec![1i64, 1], vec![f32::MAX; 2]) } else { (vec![], vec![], vec![]) };
        let opts_dedup = BuildOptions::new(10, ty, Location::Host).dedup(true);
        expect_err(
            build(world, &opts_dedup, EdgeList::weighted(&src, &dst, &w)),
            "the weights of the repeats of edge 0 -> 1 sum past the largest f32",
            &format!("{ty}: summed weights"),
        )?;
        if world.size() > 1 {
            let opts = BuildOptions::new(10, ty, Location::Host).undirected(world.rank() == 0);
            expect_err(
                build(world, &opts, EdgeList::new(&[0], &[1])),
                "ranks passed different arguments",
                &format!("{ty}: differing options"),
            )?;
        }
        let g = build(world, &BuildOptions::new(10, ty, Location::Host), EdgeList::new(&[0, 1], &[1, 2]))?;
        ensure!(g.edges() == 2 * world.size(), "{ty}: {} edges after the bad builds", g.edges());
        g.free()?;
    }
    Ok(())
}

/// Cases of [`fanout_property`]: proptest's default, stated.
const PROPERTY_CASES: u32 = 256;

/// Fanouts from 0 to 2 past the largest degree (issue 30, item 1: weighted
/// fanout 0 underflowed), weighted and not, on every table type this world
/// holds and both id types: each rank's sample equals `sample_in_memory`'s
/// on the reference CSR, and holds `min(degree, fanout)` distinct edges of
/// each center, in CSR order.
///
/// A proptest run inside the ranks: the runner's random stream is
/// deterministic, so every rank draws the same cases (each rank samples its
/// own share of the centers), and the ranks agree on each case's outcome
/// before returning it, so a failure shrinks in step on every rank.
fn fanout_property(world: &Comm, loc: Location) -> Result<()> {
    let nodes = 50;
    let all = Edges::random(23, nodes, 400);
    let mine = all.share(world);
    let reference = all.reference(nodes, false, false, false);
    let (row_ptr, col, weights) = csr_of(&reference);
    let most = reference.iter().map(Vec::len).max().unwrap_or(0);
    let mut graphs = Vec::new();
    for ty in types_at(world, loc) {
        for ids in [IdType::I32, IdType::I64] {
            let opts = BuildOptions::new(nodes, ty, loc).id_type(ids);
            graphs.push((format!("{loc} {ty} {ids:?}"), build(world, &opts, mine.list(true))?));
        }
    }
    let (rank, size) = (world.rank(), world.size());
    let config = PropConfig { cases: PROPERTY_CASES, failure_persistence: None, max_shrink_iters: 256, ..PropConfig::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    // Fanout 0 a quarter of the time, else any up to 2 past the largest degree.
    let fanouts = proptest::prop_oneof![1 => proptest::strategy::Just(0), 3 => 0..=most + 2];
    let cases = (fanouts, proptest::bool::ANY, proptest::collection::vec(0..nodes as i64, 0..24), proptest::num::u64::ANY);
    let check = |(fanout, weighted, centers, seed): (usize, bool, Vec<i64>, u64)| -> Result<()> {
        let centers: Vec<i64> = centers.into_iter().skip(rank).step_by(size).collect();
        let req = SampleRequest::new(fanout, seed).weighted(weighted).edge_ids(true);
        let want = sample_in_memory(&row_ptr, &col, Some(&weights), &centers, &req)?;
        for (i, &v) in centers.iter().enumerate() {
            let (start, end) = (row_ptr[v as usize], row_ptr[v as usize + 1]);
            let eids = &want.edge_ids[want.offsets[i]..want.offsets[i + 1]];
            let k = ((end - start) as usize).min(fanout);
            ensure!(eids.len() == k, "sample_in_memory: center {v} of degree {} gave {} with fanout {fanout}", end - start, eids.len());
            ensure!(eids.windows(2).all(|p| p[0] < p[1]), "sample_in_memory: edges {eids:?} of {v} repeat or are out of order");
            ensure!(eids.iter().all(|e| (start..end).contains(e)), "sample_in_memory: edges {eids:?} are not {v}'s {start}..{end}");
        }
        for (name, g) in &graphs {
            let drawn = sample(g, &centers, &req).with_context(|| format!("{name}: fanout {fanout}, weighted {weighted}"))?;
            ensure!(
                drawn == want,
                "{name}: fanout {fanout}, weighted {weighted}, centers {centers:?}: {drawn:?}, sample_in_memory {want:?}"
            );
        }
        Ok(())
    };
    let run = runner.run(&cases, |case| {
        let mine = check(case);
        let failed = world.allgather_value(u8::from(mine.is_err())).map_err(|e| TestCaseError::fail(format!("agreeing: {e}")))?;
        match (mine, failed.iter().position(|&f| f != 0)) {
            (Err(e), _) => Err(TestCaseError::fail(format!("{e:#}"))),
            (Ok(()), Some(r)) => Err(TestCaseError::fail(format!("rank {r} failed this case"))),
            (Ok(()), None) => Ok(()),
        }
    });
    let names: Vec<String> = graphs.iter().map(|(name, _)| name.clone()).collect();
    for (_, g) in graphs {
        g.free()?;
    }
    run.map_err(|e| anyhow::anyhow!("rank {rank}: {e}"))?;
    if rank == 0 {
        println!("fanout property: {PROPERTY_CASES} cases, fanouts 0..={}, on {}", most + 2, names.join(", "));
    }
    Ok(())
}

/// A stored graph loaded with node counts per rank that sum past
/// `usize::MAX` (issue 30, item 6: the sum was unchecked): an error naming
/// them on every rank, for every type; then a load with a good partition.
fn load_partition(world: &Comm, dir: &std::path::Path) -> Result<()> {
    let (nodes, w) = (40, world.size());
    let g = small_graph(world, MemoryType::Distributed, Location::Host, false)?;
    wm_graph::store(&g, dir)?;
    g.free()?;
    for ty in types_at(world, Location::Host) {
        for big in [usize::MAX, usize::MAX - 1, usize::MAX / 2 + 1] {
            let mut counts = vec![usize::MAX / 2 + 1; w];
            counts[0] = big;
            let r = wm_graph::load(world, dir, ty, Location::Host, Some(&counts)).map(|g| g.nodes());
            let want = format!("the node partition {counts:?} is not {w} counts summing to {nodes} nodes");
            ensure!(r.as_ref().is_err_and(|e| e.to_string().contains(&want)), "{ty}: load with {counts:?} gave {r:?}");
        }
        let mut counts = vec![0; w];
        counts[w - 1] = nodes;
        let g = wm_graph::load(world, dir, ty, Location::Host, Some(&counts))?;
        let s = sample_neighbors(&g, &[HUB], ALL, 1)?;
        ensure!(g.nodes() == nodes && s.of(0).len() == DEG, "{ty}: the load after a bad partition gave {s:?}");
        g.free()?;
    }
    Ok(())
}

/// A stored graph whose first rank's offsets are all -1 (its nodes have no
/// edges, so they were all 0): loading it must fail on every rank naming
/// the offset, for every type. -1 read as a `u64` had passed for "this
/// rank has no offsets", every check passed, and a neighbour list of
/// -1..-1 followed by one of -1..0 was read.
fn negative_offsets(world: &Comm, dir: &std::path::Path) -> Result<()> {
    let w = world.size();
    ensure!(w >= 2, "the first rank's offsets pass for none only beside others");
    let n = 4 * w;
    // v -> v - 4 from v = 4: the first rank's 4 nodes (of an even
    // partition) have no edges.
    let (src, dst): (Vec<i64>, Vec<i64>) =
        if world.rank() == 0 { ((4..n as i64).collect(), (0..n as i64 - 4).collect()) } else { (Vec::new(), Vec::new()) };
    let g = wm_graph::build(world, &BuildOptions::new(n, MemoryType::Distributed, Location::Host), EdgeList::new(&src, &dst))?;
    wm_graph::store(&g, dir)?;
    g.free()?;
    world.barrier()?;
    if world.rank() == 0 {
        let shards = dir.join("row_ptr");
        let mut names: Vec<PathBuf> = std::fs::read_dir(&shards)?.map(|e| e.map(|e| e.path())).collect::<std::io::Result<_>>()?;
        names.sort();
        let first = names.first().context("no offsets shard")?;
        let mut bytes = std::fs::read(first)?;
        // The .npy header: 8 bytes of magic and version, its length, itself.
        let data = 10 + usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        ensure!((bytes.len() - data) / 8 == 4, "{}: {} offsets, not the first rank's 4", first.display(), (bytes.len() - data) / 8);
        for v in bytes[data..].chunks_exact_mut(8) {
            v.copy_from_slice(&(-1i64).to_le_bytes());
        }
        std::fs::write(first, bytes)?;
    }
    world.barrier()?;
    for ty in types_at(world, Location::Host) {
        let r = wm_graph::load(world, dir, ty, Location::Host, None).map(|g| g.nodes());
        ensure!(r.as_ref().is_err_and(|e| e.to_string().contains("offset -1 of node 0 is negative")), "{ty}: load gave {r:?}");
    }
    Ok(())
}
