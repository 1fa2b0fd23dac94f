//! Multi-hop sampling into the blocks of a GraphSAGE-style model.

use crate::Result;
use crate::collective::agree_same_header;
use crate::csr::CsrGraph;
use crate::neighbors::sample;
use crate::rng::hop_seed;
use crate::sample::SampleRequest;
use crate::unique::append_unique;

/// One layer's bipartite block: its outputs are the first `targets` of its
/// `inputs`; output `i` aggregates inputs `neighbors[offsets[i]..offsets[i +
/// 1]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Outputs of the layer (a prefix of its inputs).
    pub targets: usize,
    /// Inputs of the layer.
    pub inputs: usize,
    /// `targets + 1` offsets into `neighbors`.
    pub offsets: Vec<usize>,
    /// Sampled neighbours, as indices into the layer's inputs.
    pub neighbors: Vec<usize>,
}

impl Block {
    /// The output each sampled edge feeds (one per entry of `neighbors`).
    pub fn target_index(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.neighbors.len());
        for (i, w) in self.offsets.windows(2).enumerate() {
            out.extend(std::iter::repeat_n(i, w[1] - w[0]));
        }
        out
    }
}

/// The sampled neighbourhood of a batch of seed nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiniBatch {
    /// Every node whose features the first layer reads; the seeds come
    /// first, then the nodes each hop added.
    pub nodes: Vec<i64>,
    /// The seeds.
    pub seeds: usize,
    /// One block per layer, the first layer (farthest hop) first: block
    /// `l`'s inputs are `nodes[..blocks[l].inputs]`, its outputs the first
    /// `blocks[l].targets` of them, which are block `l + 1`'s inputs.
    pub blocks: Vec<Block>,
}

/// Samples `fanouts.len()` hops out from `seeds`: hop `h` samples
/// `fanouts[h]` neighbours of every node reached so far (so `[25, 10]`
/// takes 25 neighbours of each seed, then 10 of each of those), each hop
/// with its own seed derived from `seed`. Collective for distributed and
/// hierarchy graphs, as [`sample`].
///
/// # Errors
/// As [`sample`] and [`append_unique`](crate::append_unique) (seeds must be
/// distinct); for distributed and hierarchy graphs,
/// [`wholemem::CommonError::InvalidArgument`] on every rank when ranks pass
/// different fanouts.
pub fn sample_blocks(graph: &CsrGraph, seeds: &[i64], fanouts: &[usize], seed: u64, weighted: bool) -> Result<MiniBatch> {
    let distinct = append_unique(seeds, &[]).map(|_| ());
    if graph.memory_type().is_mapped() {
        distinct?;
    } else {
        // Each hop's sampling agrees on its fanout; the number of hops must
        // agree here, or a rank with fewer would leave the others waiting
        // in a hop it never joins.
        let hops: Vec<u64> = fanouts.iter().map(|&f| f as u64).collect();
        agree_same_header(graph.comm().as_ref(), distinct, &hops, |h| format!("fanouts {h:?}"))?;
    }
    let mut nodes = seeds.to_vec();
    let mut targets = seeds.len();
    let mut blocks = Vec::with_capacity(fanouts.len());
    for (h, &fanout) in fanouts.iter().enumerate() {
        let req = SampleRequest::new(fanout, hop_seed(seed, h)).weighted(weighted);
        let s = sample(graph, &nodes[..targets], &req)?;
        let u = append_unique(&nodes[..targets], &s.neighbors)?;
        blocks.push(Block { targets, inputs: u.nodes.len(), offsets: s.offsets, neighbors: u.neighbor_index });
        targets = u.nodes.len();
        nodes = u.nodes;
    }
    blocks.reverse();
    Ok(MiniBatch { nodes, seeds: seeds.len(), blocks })
}
