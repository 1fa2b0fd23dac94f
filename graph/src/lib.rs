//! CSR graphs in wholemem tables, and neighbour sampling.
//!
//! A [`CsrGraph`] keeps `row_ptr`, `col_ind` and optional edge weights in
//! wholemem tables of any memory type, partitioned by node: each rank holds
//! its nodes' offsets and edges. [`build`] makes one collectively from
//! edge lists any rank holds; [`store`] and [`load`] keep it in sharded
//! `.npy` files.
//!
//! Sampling follows WholeGraph's operations: [`sample_neighbors`]
//! (uniform, without replacement), [`sample_weighted_neighbors`]
//! (proportional to the weights, without replacement), [`append_unique`]
//! (the node list of a block) and [`sample_blocks`] (several hops, the
//! blocks of a GraphSAGE model). A center's sample depends only on the
//! seed, the center and the graph — never on the threads or ranks that
//! draw it. Continuous and chunked graphs are read through the mapping;
//! distributed and hierarchy graphs send each center to its owner
//! (collectively, with gather's error rules).
//!
//! With the `candle` feature, [`candle_bridge`] turns gathered feature rows
//! into candle tensors and trains `wm-embedding` tables through candle.
//!
//! ```no_run
//! use wholemem::{Location, MemoryType};
//! use wm_graph::{BuildOptions, EdgeList, build, sample_neighbors};
//! let world = wm_comm::init()?;
//! let (src, dst) = (vec![0i64, 0, 1, 2], vec![1i64, 2, 2, 0]);
//! let opts = BuildOptions::new(3, MemoryType::Distributed, Location::Host).undirected(true).dedup(true);
//! let graph = build(&world, &opts, EdgeList::new(&src, &dst))?; // every rank passes its edges
//! let s = sample_neighbors(&graph, &[0, 2], 1, 42)?; // collective for distributed graphs
//! assert_eq!(s.offsets, vec![0, 1, 2]);
//! graph.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `docs/graph.md` has the storage, the building and sampling rules and
//! the candle bridge.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod build;
#[cfg(feature = "candle")]
pub mod candle_bridge;
mod collective;
mod csr;
mod error;
mod files;
mod multihop;
mod neighbors;
mod rng;
mod route;
mod sample;
mod unique;

pub use build::{BuildOptions, EdgeList, build};
pub use csr::{ColIndex, CsrGraph, IdType};
pub use error::{Error, Result};
pub use files::{load, store};
pub use multihop::{Block, MiniBatch, sample_blocks};
pub use neighbors::{sample, sample_neighbors, sample_weighted_neighbors};
pub use rng::hop_seed;
pub use sample::{ALL, Sample, SampleRequest, sample_in_memory};
pub use unique::{Unique, append_unique};
