//! GraphSAGE node classification on a synthetic community graph, trained
//! with candle on every rank, the graph and the features in wholemem tables.
//!
//! ```sh
//! cargo build --release -p wm-bench --bin wm-run
//! cargo build --release -p wm-graph --features candle --example graphsage
//! target/release/wm-run -n 2 -- target/release/examples/graphsage --epochs 3   # last line: acc=…
//! ```
//!
//! The graph is a stochastic block model: `--nodes` nodes in `--classes`
//! communities (node `v` is in class `v % classes`); each rank draws
//! `--edges / ranks` edges from its own nodes, a fraction `--p-in` of them
//! to a node of the same class and the rest to any node, and the graph is
//! built collectively and made undirected. A node's features are its class
//! as a one-hot vector times `--signal` plus Gaussian noise of standard
//! deviation 1, so its own features say little and its neighbours' say
//! much more. With `--degree-skew s` the far end of each edge is drawn
//! from a Zipf law of exponent s (within the class, or over all nodes), so
//! a few nodes become hubs and sampling meets them again and again.
//!
//! `--cache-ratio R` gathers the features through a node cache of `R` of
//! the rows (`wm_gather::cache::NodeCache`): across nodes the rows other
//! nodes own are served from this node's memory once they were read. The
//! values are the same, so is the training; rank 0 prints the cache's hit
//! rate after each epoch. Before the first batch the cache is filled with
//! the nodes of the highest degree, which sampling meets most
//! (`--cache-preload none`: it starts empty).
//!
//! The model is a 2-layer GraphSAGE-mean (`h' = W_self·h + W_neigh·mean of
//! sampled neighbours`, ReLU between). One mini-batch: `--batch` training
//! seeds of this rank, multi-hop sampling with `--fanouts`, one gather of
//! the input nodes' features, forward, backward, gradients averaged across
//! the ranks (an allgather), and Adam. An epoch is `--batches` mini-batches
//! of seeds drawn from this rank's training nodes (80 % of its nodes), not
//! a full pass, so the run fits a few minutes on two cores; it prints the
//! loss, train and validation accuracy, the epoch's wall time and the time
//! spent sampling, gathering and computing. First the same model is trained
//! with fanout 0 (no neighbours) as a baseline; the last line is the test
//! accuracy of the GraphSAGE model, `acc=…`.
//!
//! Threads: a rank has `WM_THREADS` of them (default: its share of the
//! cores). With two or more, a prefetch thread samples and gathers the next
//! mini-batch while the current one computes (one batch ahead), its own
//! calls capped at one thread (`wholemem::cores::cap_this_thread`), and
//! candle's matmuls keep to one thread unless three or more are left for
//! them: the matmuls here are a few million multiply-adds, which two
//! threads of gemm finish no sooner than one while the prefetch thread
//! needs the other core. With one thread everything runs in turn.
//! `--prefetch off` turns the prefetch thread off. The batches, and so the
//! loss and the accuracy, are the same either way.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Module, Tensor};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use clap::Parser;
use wholemem::{Location, MemoryType, WholeTensor};
use wm_comm::{CommExt, Communicator};
use wm_gather::cache::{Bypass, NodeCache};
use wm_gather::{Ids, RowLayout};
use wm_graph::candle_bridge::{gather_tensor, gather_tensor_cached, mean_aggregate};
use wm_graph::{BuildOptions, CsrGraph, EdgeList, MiniBatch, build, sample_blocks};

/// GraphSAGE node classification on a synthetic community graph (see the
/// file's documentation). An epoch is `--batches` mini-batches, not a full
/// pass over the training nodes.
#[derive(Parser, Debug)]
struct Args {
    /// Nodes in the graph.
    #[arg(long, default_value_t = 1_000_000)]
    nodes: usize,
    /// Edges drawn (over all ranks); the graph holds each in both directions.
    #[arg(long, default_value_t = 5_000_000)]
    edges: usize,
    /// Communities (classes).
    #[arg(long, default_value_t = 8)]
    classes: usize,
    /// Fraction of edges within a community.
    #[arg(long, default_value_t = 0.8)]
    p_in: f64,
    /// Class signal in the features (the noise has standard deviation 1).
    #[arg(long, default_value_t = 1.0)]
    signal: f32,
    /// Feature dimension (at least `--classes`).
    #[arg(long, default_value_t = 16)]
    dim: usize,
    /// Hidden dimension.
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    /// Neighbours sampled per hop, from the seeds out.
    #[arg(long, value_delimiter = ',', default_value = "10,5")]
    fanouts: Vec<usize>,
    /// Seeds per mini-batch and rank.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Mini-batches per epoch.
    #[arg(long, default_value_t = 30)]
    batches: usize,
    /// Epochs.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f64,
    /// Test and validation nodes per rank.
    #[arg(long, default_value_t = 2048)]
    eval: usize,
    /// Memory type of the graph and feature tables.
    #[arg(long, default_value = "distributed")]
    r#type: MemoryType,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sample and gather the next mini-batch in a second thread while the
    /// current one computes: `auto` (with two threads or more), `on` or
    /// `off`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    prefetch: String,
    /// How unevenly the edges pick their far end: 0 (the default) draws it
    /// uniformly; s > 0 from a Zipf law of exponent s over the candidates
    /// (placed by a fixed shuffle, so the hubs are spread over the ranks),
    /// which gives the graph hubs of high degree, as real graphs have.
    #[arg(long, default_value_t = 0.0)]
    degree_skew: f64,
    /// Keep this fraction of the feature table's rows (of those other
    /// nodes own) in a node cache shared by the ranks of each node
    /// (distributed or hierarchy tables whose ranks span nodes): the
    /// features never change, so the rows gathered most stay there.
    #[arg(long)]
    cache_ratio: Option<f64>,
    /// Which path the cached gathers take: `auto` (measure both, take the
    /// faster), `off` (always through the cache) or `always` (never).
    #[arg(long, default_value = "auto", value_parser = ["auto", "off", "always"])]
    cache_bypass: String,
    /// What the node cache holds before the first batch: `degree` (the
    /// default) the nodes of the highest degree, which sampling meets
    /// most, read once at the start; `none` nothing (it fills as batches
    /// ask).
    #[arg(long, default_value = "degree", value_parser = ["degree", "none"])]
    cache_preload: String,
}

/// How a rank spends its threads.
#[derive(Debug, Clone, Copy)]
struct Threads {
    /// A prefetch thread samples and gathers the next mini-batch.
    prefetch: bool,
    /// Threads candle's matmuls may use.
    matmul: usize,
}

impl Threads {
    /// `budget` threads (`WM_THREADS`, else the rank's share of the cores):
    /// one for the prefetch thread when there are two or more (or `on`),
    /// the rest for the matmuls, which gemm splits only from three. With
    /// several ranks the prefetch thread's collectives run beside the
    /// steps', each thread on a communicator of its own.
    fn plan(budget: usize, prefetch: &str) -> Self {
        let prefetch = match prefetch {
            "on" => true,
            "off" => false,
            _ => budget >= 2,
        };
        Self { prefetch, matmul: budget.saturating_sub(usize::from(prefetch)).max(1) }
    }

    /// Tells gemm (candle's CPU matmuls) whether to split: below
    /// [`MIN_MATMUL_THREADS`] threads it never does.
    fn apply(&self) {
        if self.matmul < MIN_MATMUL_THREADS {
            gemm::set_threading_threshold(usize::MAX);
        }
    }
}

/// Threads the matmuls need before gemm may split them: at two, splitting
/// this model's matmuls (some 6 million multiply-adds, ~1 ms) saves less
/// than the hand-over to gemm's worker costs on a core shared with the
/// prefetch thread or with other work.
const MIN_MATMUL_THREADS: usize = 3;

type Comm = Arc<dyn Communicator>;

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        ((-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()) as f32
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("graphsage: {e:#}");
        std::process::exit(1);
    }
}

/// Which nodes are for what: 80 % train, 10 % validation, 10 % test.
fn split(v: usize) -> usize {
    let h = v.wrapping_mul(0x9E37_79B9) >> 7;
    match h % 10 {
        0 => 1, // validation
        1 => 2, // test
        _ => 0, // train
    }
}

fn run() -> Result<()> {
    let a = Args::parse();
    ensure!(a.dim >= a.classes && a.classes >= 2, "--dim must be at least --classes, which must be at least 2");
    ensure!(a.nodes >= a.classes, "--nodes {} is fewer than --classes {}", a.nodes, a.classes);
    ensure!(a.degree_skew.is_finite() && a.degree_skew >= 0.0, "--degree-skew {} is not a number of 0 or more", a.degree_skew);
    let world = wm_comm::init().context("bootstrap")?;
    let (me, ranks) = (world.rank(), world.size());
    let say = |s: String| {
        if me == 0 {
            println!("{s}");
        }
    };

    // The graph, built collectively from every rank's edges.
    let t = Instant::now();
    let graph = community_graph(&world, &a)?;
    say(format!(
        "graph: {} nodes, {} edges ({} {}), built in {:.1} s on {ranks} ranks",
        graph.nodes(),
        graph.edges(),
        a.r#type,
        "host",
        t.elapsed().as_secs_f64()
    ));
    let features = feature_table(&world, &a, &graph)?;
    let cache = match a.cache_ratio {
        None => None,
        Some(r) => {
            let mut c = NodeCache::new(features.memory(), &RowLayout::of(&features)?, r).with_context(|| format!("--cache-ratio {r}"))?;
            c.set_bypass(match a.cache_bypass.as_str() {
                "off" => Bypass::Off,
                "always" => Bypass::Always,
                _ => Bypass::Auto,
            });
            say(format!("node cache: ratio {r}, {} slots per node for {} rows other nodes own", c.capacity(), c.remote_rows()));
            if a.cache_preload == "degree" {
                // Enough of the ranking that every node finds its slots'
                // worth of rows it does not own, in every set of slots
                // (the sets fill unevenly: twice the slots per rank).
                let t = Instant::now();
                let hot = graph
                    .highest_degree(c.capacity().saturating_mul(2 * ranks).min(graph.nodes()))
                    .context("ranking the nodes by degree")?;
                let held = c.preload(features.memory(), Ids::I64(&hot)).context("preloading the node cache")?;
                say(format!("node cache: preloaded {held} rows of the highest degree in {:.2} s", t.elapsed().as_secs_f64()));
            }
            Some(c)
        }
    };
    let cache = Mutex::new(cache);
    let data = Data { graph: &graph, features: &features, cache: &cache };

    let own = graph.local_nodes();
    let pick = |kind: usize, n: usize| -> Vec<i64> { own.clone().filter(|&v| split(v) == kind).take(n).map(|v| v as i64).collect() };
    let train: Vec<i64> = own.clone().filter(|&v| split(v) == 0).map(|v| v as i64).collect();
    let (val, test) = (pick(1, a.eval), pick(2, a.eval));

    let threads = Threads::plan(features.memory().copy_threads(), &a.prefetch);
    threads.apply();
    say(format!(
        "threads: {} per rank; prefetch thread {}, matmuls on {}",
        features.memory().copy_threads(),
        if threads.prefetch { "on" } else { "off" },
        if threads.matmul < MIN_MATMUL_THREADS { "1".to_owned() } else { threads.matmul.to_string() }
    ));
    // The main thread's own collectives (gradients, figures) go through a
    // communicator of their own while the prefetch thread's sampling and
    // gathers use the tables' — two threads never share one.
    let steps = world.split(0, me as u32).context("a communicator for the training steps")?;
    let zero = vec![0; a.fanouts.len()];
    let base = train_model(&world, &steps, &a, threads, data, &train, &val, &zero, "baseline (fanout 0)")?;
    let base_acc = accuracy(&world, &a, data, &base, &test, &zero)?;
    say(format!("baseline_acc={base_acc:.4}"));
    let sage = train_model(&world, &steps, &a, threads, data, &train, &val, &a.fanouts, "graphsage")?;
    let acc = accuracy(&world, &a, data, &sage, &test, &a.fanouts)?;
    say(format!("graphsage test accuracy {acc:.4}, baseline {base_acc:.4}, gain {:.4}", acc - base_acc));
    if let Some(c) = cache.into_inner().unwrap_or_else(|p| p.into_inner()) {
        c.free()?;
    }
    features.free()?;
    graph.free()?;
    if me == 0 {
        println!("{}", wm_comm::launch::untagged(&format!("acc={acc:.4}")));
    }
    Ok(())
}

fn community_graph(world: &Comm, a: &Args) -> Result<CsrGraph> {
    let (me, ranks) = (world.rank(), world.size());
    let nodes = wholemem::Partition::even(a.nodes, ranks);
    let own = nodes.range(me);
    let count = a.edges / ranks + usize::from(me < a.edges % ranks);
    let per_class = a.nodes / a.classes;
    let (in_class, anywhere) = (Pick::new(a.degree_skew, per_class), Pick::new(a.degree_skew, a.nodes));
    let mut rng = Rng(a.seed ^ (me as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
    let (mut src, mut dst) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for _ in 0..count.min(if own.is_empty() { 0 } else { usize::MAX }) {
        let s = own.start + rng.below(own.len());
        let d = if rng.uniform() < a.p_in { in_class.pick(&mut rng) * a.classes + s % a.classes } else { anywhere.pick(&mut rng) };
        src.push(s as i64);
        dst.push(d as i64);
    }
    let opts = BuildOptions::new(a.nodes, a.r#type, Location::Host).undirected(true);
    Ok(build(world, &opts, EdgeList::new(&src, &dst))?)
}

/// Draws one of `n` candidates: uniformly, or with a skew `s` > 0 the
/// candidate of rank `k` (from 1) with a probability in proportion to
/// `k^-s`, the ranks placed on the candidates by a fixed shuffle.
struct Pick {
    n: usize,
    /// The law's cumulative weights (empty: uniform).
    cdf: Vec<f64>,
    /// The shuffle: rank `k` (from 0) is candidate `(k × step + 1) % n`,
    /// `step` coprime with `n`.
    step: usize,
}

impl Pick {
    fn new(s: f64, n: usize) -> Self {
        let cdf = if s > 0.0 {
            let mut total = 0.0;
            (1..=n)
                .map(|k| {
                    total += (k as f64).powf(-s);
                    total
                })
                .collect()
        } else {
            Vec::new()
        };
        let gcd = |mut x: usize, mut y: usize| {
            while y != 0 {
                (x, y) = (y, x % y);
            }
            x
        };
        let mut step = (0x9E37_79B9 % n.max(1)) | 1;
        while gcd(step, n) > 1 {
            step += 2;
        }
        Self { n, cdf, step }
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        let Some(&total) = self.cdf.last() else { return rng.below(self.n) };
        let u = rng.uniform() * total;
        let k = self.cdf.partition_point(|&c| c < u).min(self.n - 1);
        (k * self.step + 1) % self.n
    }
}

fn feature_table(world: &Comm, a: &Args, graph: &CsrGraph) -> Result<WholeTensor<f32>> {
    let mut t = WholeTensor::<f32>::matrix(world, a.r#type, Location::Host, a.nodes, a.dim, Some(&graph.node_partition().counts()))?;
    let own = t.local_rows();
    let mut rows = vec![0f32; own.len() * a.dim];
    for (i, row) in rows.chunks_mut(a.dim).enumerate() {
        let v = own.start + i;
        let mut rng = Rng(a.seed.wrapping_mul(31) ^ (v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for x in row.iter_mut() {
            *x = rng.normal();
        }
        row[v % a.classes] += a.signal;
    }
    if !rows.is_empty() {
        t.memory_mut().write_rows(own.start, bytemuck::cast_slice(&rows))?;
    }
    world.barrier()?;
    Ok(t)
}

/// The graph, its features, and the node cache the features are gathered
/// through, if any (one thread gathers at a time: the prefetch thread
/// during an epoch, the main thread between epochs).
#[derive(Clone, Copy)]
struct Data<'a> {
    graph: &'a CsrGraph,
    features: &'a WholeTensor<f32>,
    cache: &'a Mutex<Option<NodeCache>>,
}

impl Data<'_> {
    /// Rows `ids` of the features as a tensor, through the cache if any.
    fn gather(&self, ids: &[i64]) -> Result<Tensor> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match cache.as_mut() {
            Some(c) => gather_tensor_cached(c, self.features, ids, &Device::Cpu)?,
            None => gather_tensor(self.features, ids, &Device::Cpu)?,
        })
    }

    /// A new phase of training (other batches): the cache measures its
    /// two paths afresh (every rank calls this at the same point).
    fn new_phase(&self) {
        if let Some(c) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            c.rechoose();
        }
    }

    /// The cache's lookups and hits so far (zeros without one).
    fn cache_counts(&self) -> (u64, u64) {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.as_ref().map_or((0, 0), |c| (c.stats().lookups, c.stats().hits))
    }
}

/// Two GraphSAGE-mean layers.
struct Sage {
    varmap: VarMap,
    layers: Vec<(Linear, Linear)>,
}

impl Sage {
    fn new(world: &Comm, a: &Args) -> Result<Self> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let dims = [a.dim, a.hidden, a.classes];
        let mut layers = Vec::new();
        for l in 0..2 {
            let s = candle_nn::linear(dims[l], dims[l + 1], vb.pp(format!("l{l}.self")))?;
            let n = candle_nn::linear_no_bias(dims[l], dims[l + 1], vb.pp(format!("l{l}.neigh")))?;
            layers.push((s, n));
        }
        // The parameters come from `--seed`, not from candle's own random
        // numbers (a fresh seed each run), so a run repeats bit for bit;
        // uniform in ±1/√fan-in (the layer's input width, for its weights
        // and its bias alike, as candle draws them). Every rank starts
        // from rank 0's.
        let mut rng = Rng(a.seed ^ 0x1417_5e7d);
        for (name, var) in sorted_named_vars(&varmap) {
            // Named `l{layer}.…`.
            let layer: usize = name.trim_start_matches('l').split('.').next().and_then(|l| l.parse().ok()).unwrap_or(0);
            let bound = (1.0 / dims[layer.min(dims.len() - 1)].max(1) as f64).sqrt();
            let mut v: Vec<f32> = (0..var.as_tensor().elem_count()).map(|_| ((rng.uniform() * 2.0 - 1.0) * bound) as f32).collect();
            world.broadcast_pod(0, &mut v)?;
            var.set(&Tensor::from_vec(v, var.as_tensor().shape(), &Device::Cpu)?)?;
        }
        Ok(Self { varmap, layers })
    }

    fn forward(&self, x: &Tensor, mb: &MiniBatch) -> Result<Tensor> {
        let mut h = x.clone();
        for (l, ((s, n), block)) in self.layers.iter().zip(&mb.blocks).enumerate() {
            let dst = h.narrow(0, 0, block.targets)?;
            let agg = mean_aggregate(&h, block)?;
            h = (s.forward(&dst)? + n.forward(&agg)?)?;
            if l + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

fn sorted_named_vars(varmap: &VarMap) -> Vec<(String, candle_core::Var)> {
    let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
    let mut named: Vec<(String, candle_core::Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    named.sort_by(|x, y| x.0.cmp(&y.0));
    named
}

fn sorted_vars(varmap: &VarMap) -> Vec<candle_core::Var> {
    sorted_named_vars(varmap).into_iter().map(|(_, v)| v).collect()
}

/// Averages every parameter's gradient across the ranks.
fn allreduce(world: &Comm, varmap: &VarMap, grads: &mut GradStore) -> Result<()> {
    let vars = sorted_vars(varmap);
    let mut flat = Vec::new();
    for v in &vars {
        match grads.get(v.as_tensor()) {
            Some(g) => flat.extend(g.flatten_all()?.to_vec1::<f32>()?),
            None => flat.extend(std::iter::repeat_n(0f32, v.as_tensor().elem_count())),
        }
    }
    let all = world.allgather_pod(&flat)?;
    let n = flat.len();
    let ranks = world.size() as f32;
    let mut at = 0;
    for v in &vars {
        let len = v.as_tensor().elem_count();
        let mean: Vec<f32> = (at..at + len).map(|i| (0..world.size()).map(|r| all[r * n + i]).sum::<f32>() / ranks).collect();
        grads.insert(v.as_tensor(), Tensor::from_vec(mean, v.as_tensor().shape(), &Device::Cpu)?);
        at += len;
    }
    Ok(())
}

/// Time spent in each part of a mini-batch.
#[derive(Default)]
struct Split {
    sample: f64,
    gather: f64,
    compute: f64,
}

/// Sampled blocks and input features of `seeds`, timed.
fn prepare(data: Data<'_>, seeds: &[i64], fanouts: &[usize], seed: u64, t: &mut Split) -> Result<(MiniBatch, Tensor)> {
    let s = Instant::now();
    let mb = sample_blocks(data.graph, seeds, fanouts, seed, false)?;
    t.sample += s.elapsed().as_secs_f64();
    let s = Instant::now();
    let x = data.gather(&mb.nodes)?;
    t.gather += s.elapsed().as_secs_f64();
    Ok((mb, x))
}

/// One training step's input: the seeds, the sampled blocks, the features.
type Prepared = (Vec<i64>, MiniBatch, Tensor);

/// Runs `step` on every batch of `batches` (seeds, sampling seed), each
/// prepared first — in turn on this thread, or with `prefetch` in a second
/// thread one batch ahead, so that sampling and gathering the next batch
/// overlap the current step. The prefetch thread is the only user of the
/// tables' communicator meanwhile; `step` must use another. Returns the
/// time spent preparing (in whichever thread did it).
fn each_batch(
    data: Data<'_>,
    fanouts: &[usize],
    batches: Vec<(Vec<i64>, u64)>,
    prefetch: bool,
    mut step: impl FnMut(Prepared) -> Result<()>,
) -> Result<Split> {
    let mut t = Split::default();
    if !prefetch {
        for (seeds, seed) in batches {
            let (mb, x) = prepare(data, &seeds, fanouts, seed, &mut t)?;
            step((seeds, mb, x))?;
        }
        return Ok(t);
    }
    std::thread::scope(|s| {
        // One batch waits while the step runs: the next one is being made.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Prepared>>(1);
        let producer = s.spawn(move || {
            // This thread has one core of the rank's budget: its sampling
            // and gathers start no helpers that would wait for the step's.
            wholemem::cores::cap_this_thread(Some(1));
            let mut t = Split::default();
            for (seeds, seed) in batches {
                let made = prepare(data, &seeds, fanouts, seed, &mut t).map(|(mb, x)| (seeds, mb, x));
                let failed = made.is_err();
                // A closed channel: the step failed, and says why.
                if tx.send(made).is_err() || failed {
                    break;
                }
            }
            t
        });
        let mut outcome = Ok(());
        for made in rx.iter() {
            if let Err(e) = made.and_then(&mut step) {
                outcome = Err(e);
                break;
            }
        }
        drop(rx);
        let prepared = producer.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        outcome.map(|()| prepared)
    })
}

fn labels(ids: &[i64], classes: usize) -> Result<Tensor> {
    let v: Vec<u32> = ids.iter().map(|&v| (v as usize % classes) as u32).collect();
    Ok(Tensor::from_vec(v, ids.len(), &Device::Cpu)?)
}

fn correct(logits: &Tensor, y: &Tensor) -> Result<u64> {
    Ok(logits.argmax(D::Minus1)?.eq(y)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()? as u64)
}

/// Sums (correct, total) over the ranks.
fn global_ratio(world: &Comm, correct: u64, total: u64) -> Result<f64> {
    let all = world.allgather_pod(&[correct, total])?;
    let (c, n) = all.chunks(2).fold((0, 0), |(c, n), p| (c + p[0], n + p[1]));
    Ok(c as f64 / n.max(1) as f64)
}

#[allow(clippy::too_many_arguments)]
fn train_model(
    world: &Comm,
    steps: &Comm,
    a: &Args,
    threads: Threads,
    data: Data<'_>,
    train: &[i64],
    val: &[i64],
    fanouts: &[usize],
    name: &str,
) -> Result<Sage> {
    let me = world.rank();
    let model = Sage::new(world, a)?;
    data.new_phase();
    let mut opt = AdamW::new(model.varmap.all_vars(), ParamsAdamW { lr: a.lr, weight_decay: 0.0, ..Default::default() })?;
    let mut rng = Rng(a.seed ^ 0x5a6e ^ (me as u64) << 32);
    let loss_key = if fanouts.iter().all(|&f| f == 0) { "xent" } else { "loss" };
    for epoch in 1..=a.epochs {
        let epoch_start = Instant::now();
        let (lookups0, hits0) = data.cache_counts();
        let batches: Vec<(Vec<i64>, u64)> = (0..a.batches)
            .map(|b| {
                let mut seeds: Vec<i64> = (0..a.batch.min(train.len())).map(|_| train[rng.below(train.len().max(1))]).collect();
                seeds.sort_unstable();
                seeds.dedup();
                (seeds, a.seed.wrapping_mul(1_000_003) ^ ((epoch * 10_000 + b) as u64))
            })
            .collect();
        let (mut loss_sum, mut right, mut seen, mut compute) = (0f64, 0u64, 0u64, 0f64);
        let mut t = each_batch(data, fanouts, batches, threads.prefetch, |(seeds, mb, x)| {
            let s = Instant::now();
            let logits = model.forward(&x, &mb)?;
            let y = labels(&seeds, a.classes)?;
            let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
            let mut grads = loss.backward()?;
            allreduce(steps, &model.varmap, &mut grads)?;
            opt.step(&grads)?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?);
            right += correct(&logits, &y)?;
            seen += seeds.len() as u64;
            compute += s.elapsed().as_secs_f64();
            Ok(())
        })?;
        t.compute = compute;
        let wall = epoch_start.elapsed().as_secs_f64();
        let (lookups, hits) = data.cache_counts();
        let cached = if lookups > lookups0 {
            format!(" cache_hit_rate={:.3}", (hits - hits0) as f64 / (lookups - lookups0) as f64)
        } else {
            String::new()
        };
        let losses = world.allgather_value(loss_sum / a.batches.max(1) as f64)?;
        let loss = losses.iter().sum::<f64>() / losses.len() as f64;
        let train_acc = global_ratio(world, right, seen)?;
        let val_acc = accuracy(world, a, data, &model, val, fanouts)?;
        if me == 0 {
            println!(
                "{name} epoch {epoch}: {loss_key}={loss:.4} train_acc={train_acc:.4} val_acc={val_acc:.4} epoch_s={wall:.3}{cached} (sampling {:.3} s, gather {:.3} s, compute {:.3} s{})",
                t.sample,
                t.gather,
                t.compute,
                if threads.prefetch { "; sampling and gathering overlap the compute" } else { "" }
            );
        }
    }
    Ok(model)
}

/// Accuracy over every rank's `nodes`, in batches.
fn accuracy(world: &Comm, a: &Args, data: Data<'_>, model: &Sage, nodes: &[i64], fanouts: &[usize]) -> Result<f64> {
    // Every rank runs as many batches as the rank with the most nodes, so the
    // collective sampling and gathers stay in step.
    let batches = world.allgather_value(nodes.len().div_ceil(a.batch) as u64)?.into_iter().max().unwrap_or(0) as usize;
    let (mut right, mut total) = (0, 0);
    let mut t = Split::default();
    for b in 0..batches {
        let chunk = nodes.chunks(a.batch).nth(b).unwrap_or(&[]);
        let (mb, x) = prepare(data, chunk, fanouts, a.seed ^ 0xe7a1 ^ b as u64, &mut t)?;
        if chunk.is_empty() {
            continue;
        }
        let logits = model.forward(&x, &mb)?;
        right += correct(&logits, &labels(chunk, a.classes)?)?;
        total += chunk.len() as u64;
    }
    global_ratio(world, right, total)
}
