//! Link prediction on a synthetic graph with node embeddings in a wholemem
//! table shared by every rank.
//!
//! ```sh
//! cargo build --release -p wm-embedding --examples
//! target/release/wm-run -n 2 -- target/release/examples/link_prediction --epochs 5
//! # 2 simulated nodes of 2 ranks, rows of the other node cached (10 % of the table):
//! target/release/wm-run -n 4 --node-size 2 -- target/release/examples/link_prediction --epochs 5 --cache-ratio 0.1
//! ```
//!
//! The graph is a stochastic block model: node `u` is in block `u mod
//! blocks`, and each edge joins two nodes of one block with probability
//! `--p-in`, else two random nodes. Edges are a pure function of the seed
//! and their number, so every rank generates only its own share (edge `e`
//! belongs to rank `e mod world`), and a fixed tenth of them is held out.
//!
//! Each node has a learnable embedding row; the score of an edge is the dot
//! product of its ends, trained with the logistic loss on the positive
//! edges and `--negatives` random corruptions of each (`(u, random w)`).
//! Rows are read with `Embedding::gather` and updated with lazy Adam
//! through `Embedding::apply_gradients`, so the rows a rank touches are
//! updated by the ranks that own them.
//!
//! With `--cache-ratio R` (distributed or hierarchy tables across nodes)
//! the embedding keeps up to `R` of the rows, of those other nodes own, in
//! a node cache (`Embedding::enable_node_cache`), and rank 0 prints its
//! statistics after training. Here every step updates every row it read,
//! and the cache stays coherent by dropping updated rows, so it cannot hit
//! (the statistics say 0): the run shows that training through a cache
//! gives the same model. The cache pays off for rows read more often than
//! they are trained (`docs/cache.md`).
//!
//! Rank 0 prints the loss of each epoch and, last, the AUC on the held-out
//! edges against as many corrupted ones (exact: the Mann–Whitney statistic
//! over every rank's scores) as the line `auc=<value>` — printed untagged,
//! so it is the last line of `wm-run`'s output too.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use wholemem::{Location, MemoryType};
use wm_comm::{CommExt, Communicator};
use wm_embedding::{Embedding, Init, Optimizer};

#[derive(Debug, Parser)]
#[command(about = "Link prediction with node embeddings in a wholemem table (run under wm-run)")]
struct Args {
    /// Nodes in the graph.
    #[arg(long, default_value_t = 200_000)]
    nodes: u64,
    /// Blocks (communities) of the stochastic block model.
    #[arg(long, default_value_t = 2000)]
    blocks: u64,
    /// Average degree (edges = nodes × degree / 2).
    #[arg(long, default_value_t = 20)]
    degree: u64,
    /// Probability that an edge joins two nodes of one block.
    #[arg(long, default_value_t = 0.9)]
    p_in: f64,
    /// Embedding dimension.
    #[arg(long, default_value_t = 32)]
    dim: usize,
    /// Passes over the training edges.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Positive edges per rank per step.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Random corruptions per positive edge.
    #[arg(long, default_value_t = 2)]
    negatives: usize,
    /// Adam's learning rate in the first epoch; it falls linearly, to
    /// `lr / epochs` in the last.
    #[arg(long, default_value_t = 0.03)]
    lr: f32,
    /// Adam's weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// Memory type of the embedding table.
    #[arg(long = "type", default_value = "distributed")]
    ty: MemoryType,
    /// Where the table lives.
    #[arg(long, default_value = "host")]
    location: Location,
    /// Seed of the graph, the initial weights and the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep this fraction of the table's rows (of those other nodes own) in a node cache shared by the ranks of
    /// each node (distributed or hierarchy tables across nodes).
    #[arg(long, allow_negative_numbers = true)]
    cache_ratio: Option<f64>,
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stream of random numbers.
struct Rng(u64);
impl Rng {
    fn new(parts: &[u64]) -> Self {
        Self(parts.iter().fold(0x1234_5678, |h, &p| mix(h ^ p)))
    }
    fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The graph: edge `e` is a pure function of the seed and `e`.
struct Graph {
    nodes: u64,
    blocks: u64,
    edges: u64,
    p_in: f64,
    seed: u64,
}

impl Graph {
    fn edge(&self, e: u64) -> (u64, u64) {
        let mut r = Rng::new(&[self.seed, 1, e]);
        let u = r.below(self.nodes);
        let mut v = if r.unit() < self.p_in {
            // Same block: u mod blocks.
            let b = u % self.blocks;
            let members = (self.nodes - b).div_ceil(self.blocks);
            b + self.blocks * r.below(members)
        } else {
            r.below(self.nodes)
        };
        if v == u {
            v = (v + self.blocks) % self.nodes;
        }
        (u, v)
    }

    /// A tenth of the edges, fixed by the seed, is held out.
    fn held_out(&self, e: u64) -> bool {
        Rng::new(&[self.seed, 2, e]).below(10) == 0
    }
}

fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The area under the ROC curve: the probability that a random positive
/// scores above a random negative, ties counting half (Mann–Whitney U with
/// average ranks).
fn auc(pos: &[f32], neg: &[f32]) -> f64 {
    let mut all: Vec<(f32, bool)> = pos.iter().map(|&s| (s, true)).chain(neg.iter().map(|&s| (s, false))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum = 0.0f64;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        // Ranks i+1 ..= j share their average.
        let avg = (i + 1 + j) as f64 / 2.0;
        rank_sum += avg * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (p, n) = (pos.len() as f64, neg.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * n)
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("link_prediction: {e:#}");
        std::process::exit(1);
    }
}

/// The gradients of one batch's loss into `grads` (cleared first): `b`
/// edges whose sources are rows `0..b` of `rows`, destinations `b..2b`,
/// and `negatives` corruptions of each edge after them. Each term of the
/// loss is added to `loss`, and counted in `terms`.
fn batch_gradients(rows: &[f32], dim: usize, b: usize, negatives: usize, grads: &mut Vec<f32>, (loss, terms): (&mut f64, &mut u64)) {
    grads.clear();
    grads.resize(rows.len(), 0.0);
    let row = |k: usize| k * dim..(k + 1) * dim;
    for i in 0..b {
        // d/ds of softplus(-s) is sigmoid(s) - 1, of softplus(s) sigmoid(s).
        let mut pair = |other: usize, positive: bool| {
            let s = dot(&rows[row(i)], &rows[row(other)]);
            let (l, d) = if positive { (softplus(-s), sigmoid(s) - 1.0) } else { (softplus(s), sigmoid(s)) };
            *loss += f64::from(l);
            *terms += 1;
            for c in 0..dim {
                grads[i * dim + c] += d * rows[other * dim + c];
                grads[other * dim + c] += d * rows[i * dim + c];
            }
        };
        pair(b + i, true);
        for k in 0..negatives {
            pair(2 * b + i * negatives + k, false);
        }
    }
}

/// The AUC of every rank's held-out edges (u, v) against as many
/// corruptions (u, random w) drawn from `seed` (collective).
fn held_out_auc(world: &dyn Communicator, emb: &Embedding<f32>, test: &[(u64, u64)], nodes: u64, seed: &[u64]) -> Result<f64> {
    let dim = emb.dim();
    let mut rng = Rng::new(seed);
    let t = test.len();
    let mut ids: Vec<i64> = test.iter().map(|e| e.0 as i64).collect();
    ids.extend(test.iter().map(|e| e.1 as i64));
    ids.extend((0..t).map(|_| rng.below(nodes) as i64));
    let mut rows = vec![0f32; ids.len() * dim];
    emb.gather(&ids, &mut rows)?;
    let at = |k: usize| &rows[k * dim..(k + 1) * dim];
    let pos: Vec<f32> = (0..t).map(|i| dot(at(i), at(t + i))).collect();
    let neg: Vec<f32> = (0..t).map(|i| dot(at(i), at(2 * t + i))).collect();
    let pos = world.allgatherv_pod(&pos)?.concat();
    let neg = world.allgatherv_pod(&neg)?.concat();
    Ok(auc(&pos, &neg))
}

fn run(args: Args) -> Result<()> {
    ensure!(args.nodes >= 2 && args.blocks >= 1 && args.blocks <= args.nodes, "need at least 2 nodes and 1 to {} blocks", args.nodes);
    ensure!(args.batch > 0 && args.dim > 0, "--batch and --dim must be positive");
    let world: Arc<dyn Communicator> = wm_comm::init().context("joining the other ranks")?;
    let (me, n) = (world.rank(), world.size());
    let say = |s: String| {
        if me == 0 {
            println!("{s}");
        }
    };
    let graph = Graph { nodes: args.nodes, blocks: args.blocks, edges: args.nodes * args.degree / 2, p_in: args.p_in, seed: args.seed };

    // This rank's share of the edges.
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for e in (me as u64..graph.edges).step_by(n) {
        if graph.held_out(e) { test.push(graph.edge(e)) } else { train.push(graph.edge(e)) }
    }
    let counts = world.allgather_value([train.len() as u64, test.len() as u64])?;
    let (total_train, total_test) = counts.iter().fold((0, 0), |(a, b), c| (a + c[0], b + c[1]));
    // apply_gradients is collective: every rank takes as many steps.
    let steps = counts.iter().map(|c| c[0] as usize).max().unwrap_or(0).div_ceil(args.batch);
    say(format!(
        "link prediction: {} nodes in {} blocks, {} edges ({total_train} to train on, {total_test} held out), dim {}, {} {} memory on {n} ranks, adam lr {}",
        graph.nodes, graph.blocks, graph.edges, args.dim, args.location, args.ty, args.lr
    ));

    let dim = args.dim;
    let mut emb = Embedding::<f32>::allocate(
        &world,
        args.ty,
        args.location,
        graph.nodes as usize,
        dim,
        None,
        Some(Optimizer::adam().with_weight_decay(args.weight_decay)),
    )?;
    emb.init(Init::Normal { mean: 0.0, std: 0.1 }, args.seed)?;
    if let Some(r) = args.cache_ratio {
        emb.enable_node_cache(r).context("--cache-ratio")?;
        if let Some((_, slots, remote)) = emb.node_cache_rows() {
            say(format!("node cache: ratio {r}, {slots} slots per node for {remote} rows other nodes own"));
        }
    }

    let per = 2 + args.negatives;
    let mut ids: Vec<i64> = Vec::with_capacity(args.batch * per);
    let mut rows = Vec::new();
    let mut grads = Vec::new();
    for epoch in 1..=args.epochs {
        let start = Instant::now();
        let lr = args.lr * (args.epochs + 1 - epoch) as f32 / args.epochs as f32;
        let mut rng = Rng::new(&[args.seed, 3, epoch as u64, me as u64]);
        for i in (1..train.len()).rev() {
            train.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let (mut loss, mut terms) = (0f64, 0u64);
        for step in 0..steps {
            let batch = train.get(step * args.batch..((step + 1) * args.batch).min(train.len())).unwrap_or(&[]);
            // Ids: sources, destinations, then the corruptions of each edge.
            ids.clear();
            ids.extend(batch.iter().map(|e| e.0 as i64));
            ids.extend(batch.iter().map(|e| e.1 as i64));
            for _ in 0..batch.len() * args.negatives {
                ids.push(rng.below(graph.nodes) as i64);
            }
            rows.resize(ids.len() * dim, 0.0);
            emb.gather(&ids, &mut rows)?;
            batch_gradients(&rows, dim, batch.len(), args.negatives, &mut grads, (&mut loss, &mut terms));
            emb.apply_gradients(&ids, &grads, lr)?;
        }
        let sums = world.allgather_value([loss, terms as f64])?;
        let (loss, terms) = sums.iter().fold((0.0, 0.0), |(a, b), s| (a + s[0], b + s[1]));
        say(format!("epoch {epoch} loss={:.4} ({:.1} s)", loss / terms.max(1.0), start.elapsed().as_secs_f64()));
    }

    let auc = held_out_auc(world.as_ref(), &emb, &test, graph.nodes, &[args.seed, 4, me as u64])?;
    if let Some(s) = emb.node_cache_stats() {
        let all = world.allgather_value([s.lookups, s.hits])?;
        let (lookups, hits) = all.iter().fold((0, 0), |(l, h), x| (l + x[0], h + x[1]));
        say(format!(
            "node cache: lookups={lookups} hits={hits} ({:.3}) fills={} evictions={} (rank 0's node)",
            if lookups == 0 { 0.0 } else { hits as f64 / lookups as f64 },
            s.fills,
            s.evictions
        ));
    }
    emb.free()?;
    if me == 0 {
        println!("{}", wm_comm::launch::untagged(&format!("auc={auc:.4}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_counts_ties_as_half() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]), 1.0);
        assert_eq!(auc(&[1.0], &[2.0]), 0.0);
        assert_eq!(auc(&[1.0, 1.0], &[1.0]), 0.5);
        // pos {2, 5}, neg {1, 2, 3}: pairs won 1.5 + 3 of 6.
        assert_eq!(auc(&[2.0, 5.0], &[1.0, 2.0, 3.0]), 4.5 / 6.0);
    }
}
