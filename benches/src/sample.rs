//! `wm-bench sample`: sampled edges per second per rank from a CSR graph in
//! wholemem tables, against plain single-threaded sampling from a private
//! in-process copy of the same graph.
//!
//! The graph: `--nodes` nodes and `--edges` directed edges, edge `i` a pure
//! function of `i` and `--seed` (sources uniform, so degrees are Poisson),
//! rank `r` passing the edges `i` with `i % ranks == r` to
//! [`wm_graph::build`]. Every rank also builds the same graph as plain
//! vectors (the baseline's CSR and the verifier's).
//!
//! One batch: `--batch` random centers of the whole graph per rank, then one
//! sampling call per entry of `--fanouts`, each hop's centers being the
//! previous hop's sampled neighbours (repeats kept). Per batch every rank
//! times its sampling calls (collective for distributed and hierarchy
//! graphs), then, after a barrier, the same hops with
//! [`wm_graph::sample_in_memory`] on its private CSR in one thread — the
//! baseline, all ranks at once as the wholemem runs were. Every sample of
//! every batch is verified against the private CSR: as many as
//! `min(degree, fanout)`, each edge id in its center's range and holding the
//! sampled neighbour, no edge twice, and equal to the baseline's sample
//! (the same seed gives the same sample).
//!
//! Figures: sampled edges per second per rank (min/median/max), all ranks
//! together, the baseline's per-rank median, and `ratio = median /
//! baseline`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use wholemem::{Location, MemoryType};
use wm_comm::{CommExt, Communicator};
use wm_graph::{BuildOptions, CsrGraph, EdgeList, IdType, Sample, SampleRequest};

use crate::ranks::{RankArgs, Started};
use crate::report::{Spread, json_line};

/// The options of `wm-bench sample`.
#[derive(Debug, Clone, clap::Args)]
pub struct SampleArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "chunked")]
    pub ty: MemoryType,
    /// Location of the graph's tables.
    #[arg(long, default_value = "host")]
    pub location: Location,
    /// The local ranks to start without a launcher.
    #[command(flatten)]
    pub ranks: RankArgs,
    /// Nodes in the graph.
    #[arg(long, default_value_t = 1_000_000)]
    pub nodes: usize,
    /// Directed edges in the graph.
    #[arg(long, default_value_t = 10_000_000)]
    pub edges: usize,
    /// Neighbours per center for each hop, comma-separated (`all` for every neighbour).
    #[arg(long, value_delimiter = ',', default_value = "10,10", value_parser = parse_fanout)]
    pub fanouts: Vec<usize>,
    /// Centers per batch and rank (the first hop's).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Untimed batches first.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Weighted sampling (the graph gets weights).
    #[arg(long)]
    pub weighted: bool,
    /// The element type of the neighbour ids.
    #[arg(long, default_value = "i32")]
    pub ids: IdType,
    /// Seed of the graph and the batches.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_fanout(s: &str) -> Result<usize, String> {
    if s == "all" {
        return Ok(wm_graph::ALL);
    }
    s.parse().map_err(|e| format!("fanout {s:?}: {e}"))
}

/// Runs `wm-bench sample`: starts `--ranks` local ranks when no launcher
/// did, then benchmarks. Returns the exit code (3 when verification failed).
///
/// # Errors
/// Bad options, a failed build or sampling call, a lost peer.
pub fn start(a: &SampleArgs) -> Result<i32> {
    ensure!(a.nodes > 0 && a.edges > 0 && a.batch > 0 && a.iters > 0, "--nodes, --edges, --batch and --iters must be positive");
    ensure!(!a.fanouts.is_empty(), "--fanouts needs at least one hop");
    match a.ranks.start()? {
        Started::Launched(code) => Ok(code),
        Started::Rank(world) => bench(&world, a),
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Edge `i`: source, destination, weight.
fn edge(seed: u64, i: usize, nodes: usize) -> (i64, i64, f32) {
    let h = mix(seed ^ mix(i as u64 + 1));
    let g = mix(h ^ 0x5851_F42D_4C95_7F2D);
    ((h % nodes as u64) as i64, (g % nodes as u64) as i64, 0.25 + (g >> 60) as f32)
}

/// The graph as plain vectors: offsets, neighbours sorted within a node,
/// weights.
struct Private {
    row_ptr: Vec<i64>,
    col: Vec<i64>,
    weights: Vec<f32>,
}

impl Private {
    fn build(a: &SampleArgs) -> Self {
        let n = a.nodes;
        let mut row_ptr = vec![0i64; n + 1];
        for i in 0..a.edges {
            row_ptr[edge(a.seed, i, n).0 as usize + 1] += 1;
        }
        for v in 0..n {
            row_ptr[v + 1] += row_ptr[v];
        }
        let mut fill: Vec<i64> = row_ptr[..n].to_vec();
        let mut pairs = vec![(0i64, 0f32); a.edges];
        for i in 0..a.edges {
            let (s, d, w) = edge(a.seed, i, n);
            pairs[fill[s as usize] as usize] = (d, w);
            fill[s as usize] += 1;
        }
        for v in 0..n {
            // The library's order: by neighbour, then weight.
            pairs[row_ptr[v] as usize..row_ptr[v + 1] as usize].sort_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)));
        }
        let (col, weights) = pairs.into_iter().unzip();
        Self { row_ptr, col, weights }
    }

    /// Every hop of a batch from `centers`, in this thread from the private
    /// CSR: each hop's sample.
    fn sample_hops(&self, mut centers: Vec<i64>, a: &SampleArgs) -> Result<Vec<Sample>> {
        let mut base = Vec::with_capacity(a.fanouts.len());
        for (h, &k) in a.fanouts.iter().enumerate() {
            let hop = wm_graph::sample_in_memory(&self.row_ptr, &self.col, Some(&self.weights), &centers, &hop_request(a, h, k))?;
            centers = hop.neighbors.clone();
            base.push(hop);
        }
        Ok(base)
    }

    /// Wrong samples in `s` (centers `c`, fanout `k`) by the rules, and
    /// whether it differs from the baseline's `base`.
    fn wrong(&self, c: &[i64], k: usize, s: &Sample, base: &Sample) -> u64 {
        let mut wrong = 0;
        if s.offsets.len() != c.len() + 1 {
            return c.len().max(1) as u64;
        }
        for (i, &v) in c.iter().enumerate() {
            let (lo, hi) = (self.row_ptr[v as usize], self.row_ptr[v as usize + 1]);
            let (drawn, eids) = (s.of(i), &s.edge_ids[s.offsets[i]..s.offsets[i + 1]]);
            let ok = drawn.len() == ((hi - lo) as usize).min(k)
                && eids.windows(2).all(|w| w[0] < w[1])
                && eids.iter().zip(drawn).all(|(&e, &x)| e >= lo && e < hi && self.col[e as usize] == x);
            wrong += u64::from(!ok);
        }
        wrong + u64::from(s != base)
    }
}

/// The request of hop `h`, taking `k` neighbours of each center.
fn hop_request(a: &SampleArgs, h: usize, k: usize) -> SampleRequest {
    SampleRequest::new(k, wm_graph::hop_seed(a.seed, h)).weighted(a.weighted).edge_ids(true)
}

/// Every hop of a batch from `centers`, through wholemem: each hop's centers
/// and its sample.
fn sample_hops(graph: &CsrGraph, mut centers: Vec<i64>, a: &SampleArgs) -> Result<Vec<(Vec<i64>, Sample)>> {
    let mut hops = Vec::with_capacity(a.fanouts.len());
    for (h, &k) in a.fanouts.iter().enumerate() {
        let hop = wm_graph::sample(graph, &centers, &hop_request(a, h, k))?;
        let next = hop.neighbors.clone();
        hops.push((std::mem::replace(&mut centers, next), hop));
    }
    Ok(hops)
}

/// The graph in wholemem tables, built from this rank's share of the
/// edges (edge i is rank i % ranks'). Collective.
fn build_graph(world: &Arc<dyn Communicator>, a: &SampleArgs) -> Result<CsrGraph> {
    let (me, n) = (world.rank(), world.size());
    let (mut src, mut dst, mut w) = (Vec::new(), Vec::new(), Vec::new());
    for i in (me..a.edges).step_by(n) {
        let (s, d, x) = edge(a.seed, i, a.nodes);
        src.push(s);
        dst.push(d);
        w.push(x);
    }
    let opts = BuildOptions::new(a.nodes, a.ty, a.location).id_type(a.ids);
    let list = if a.weighted { EdgeList::weighted(&src, &dst, &w) } else { EdgeList::new(&src, &dst) };
    Ok(wm_graph::build(world, &opts, list)?)
}

/// The benchmark proper, on every rank.
///
/// # Errors
/// A failed build or sampling call, a lost peer.
pub fn bench(world: &Arc<dyn Communicator>, a: &SampleArgs) -> Result<i32> {
    let (me, n) = (world.rank(), world.size());
    let t = Instant::now();
    let graph = build_graph(world, a)?;
    let private = Private::build(a);
    ensure!(private.col.len() == graph.edges(), "the private graph has {} edges, wholemem's {}", private.col.len(), graph.edges());
    let built = t.elapsed().as_secs_f64();

    let mut rng = mix(a.seed ^ 0xbe4c ^ (me as u64) << 40);
    let (mut seconds, mut base_seconds, mut edges, mut base_edges, mut wrong) = (0f64, 0f64, 0u64, 0u64, 0u64);
    for b in 0..a.warmup + a.iters {
        let centers: Vec<i64> = (0..a.batch)
            .map(|_| {
                rng = mix(rng.wrapping_add(0x9E37_79B9_7F4A_7C15));
                (rng % a.nodes as u64) as i64
            })
            .collect();
        let timed = b >= a.warmup;
        // wholemem.
        world.barrier()?;
        let s = Instant::now();
        let hops = sample_hops(&graph, centers.clone(), a)?;
        let dt = s.elapsed().as_secs_f64();
        // The baseline: the same hops in one thread from the private CSR.
        world.barrier()?;
        let s = Instant::now();
        let base = private.sample_hops(centers, a)?;
        let bt = s.elapsed().as_secs_f64();
        for (((c, drawn), want), &k) in hops.iter().zip(&base).zip(&a.fanouts) {
            wrong += private.wrong(c, k, drawn, want);
        }
        if timed {
            seconds += dt;
            base_seconds += bt;
            edges += hops.iter().map(|(_, s)| s.neighbors.len() as u64).sum::<u64>();
            base_edges += base.iter().map(|s| s.neighbors.len() as u64).sum::<u64>();
        }
    }
    let stats =
        world.allgather_pod(&[edges as f64 / seconds.max(1e-12), base_edges as f64 / base_seconds.max(1e-12), seconds, wrong as f64])?;
    let machines = wm_topology::NodeLayout::of(world.nodes()).nodes;
    let (nodes, all_edges) = (graph.nodes(), graph.edges());
    graph.free()?;
    let per_rank: Vec<f64> = stats.chunks(4).map(|s| s[0]).collect();
    let base_rank: Vec<f64> = stats.chunks(4).map(|s| s[1]).collect();
    let slowest = stats.chunks(4).map(|s| s[2]).fold(0.0f64, f64::max);
    let wrong_total: f64 = stats.chunks(4).map(|s| s[3]).sum();
    let verified = wrong_total == 0.0;
    if me == 0 {
        let s = Spread::of(&per_rank);
        let baseline = Spread::of(&base_rank).median;
        let total = edges as f64 * n as f64 / slowest.max(1e-12);
        let ratio = s.median / baseline;
        let fanouts: Vec<String> = a.fanouts.iter().map(|&k| if k == wm_graph::ALL { "all".into() } else { k.to_string() }).collect();
        if a.json {
            let j = serde_json::json!({
                "op": "sample", "type": a.ty.name(), "location": a.location.name(), "ranks": n, "nodes": machines,
                "graph_nodes": nodes, "graph_edges": all_edges, "ids": a.ids.name(), "weighted": a.weighted,
                "fanouts": fanouts, "batch": a.batch, "iters": a.iters, "threads": wholemem_threads(n),
                "edges_per_s": s, "edges_per_s_total": total, "baseline_edges_per_s": baseline, "baseline_edges_per_s_per_rank": Spread::of(&base_rank),
                "ratio": ratio, "verified": verified, "build_s": built,
            });
            json_line(&j);
        } else {
            println!(
                "sample {} {}: {n} ranks on {machines} node(s), a graph of {nodes} nodes and {all_edges} edges ({} ids{}), batches of {} centers, fanouts {}, {} timed (built in {built:.1} s)",
                a.location,
                a.ty,
                a.ids.name(),
                if a.weighted { ", weighted" } else { "" },
                a.batch,
                fanouts.join(","),
                a.iters
            );
            println!("  per rank edges/s   min {:.3e}   median {:.3e}   max {:.3e}", s.min, s.median, s.max);
            println!("  all ranks edges/s  {total:.3e}");
            println!("  baseline edges/s   {baseline:.3e}   (per-rank median: one thread, private CSR, same batches)");
            println!("  ratio              {ratio:.2}   (per-rank median / baseline)");
            println!("  verified           {verified}{}", if verified { String::new() } else { format!(" ({wrong_total} wrong)") });
        }
    }
    Ok(if verified { 0 } else { 3 })
}

/// Threads a rank samples with (as the graph's tables would choose).
fn wholemem_threads(ranks_here: usize) -> usize {
    if let Ok(Some(n)) = wm_topology::env::WM_THREADS.parse::<usize>() {
        return n.max(1);
    }
    (std::thread::available_parallelism().map_or(1, |c| c.get()) / ranks_here.max(1)).max(1)
}
