//! Trainable embedding tables over wholemem.
//!
//! An [`Embedding`] is a `rows × dim` table of `f32`, `f16` or `bf16`
//! weights in a [`wholemem::WholeTensor`] of any memory type and location,
//! partitioned by rows across the ranks, with an [`Optimizer`] (SGD, lazy
//! Adam, AdaGrad, RMSProp) whose f32 state lives in a second table
//! partitioned exactly like the first.
//!
//! - Forward: [`Embedding::gather`] reads rows by global id (`i32` or
//!   `i64`), converting to the output's float type.
//! - Backward: [`Embedding::apply_gradients`] sums the gradients of
//!   repeated ids, routes ids and gradients to the ranks that own the rows,
//!   and each owner updates its own rows. It is collective for every memory
//!   type.
//! - [`Embedding::init`] fills the weights from a seed, the same values
//!   whatever the rank count.
//! - [`Embedding::enable_node_cache`] keeps rows other nodes own in a
//!   cache shared by the ranks of each node (distributed and hierarchy
//!   tables spanning nodes); gradients, `init` and loans of the table keep
//!   it coherent. [`CacheStats`] says how well it did.
//!
//! ```no_run
//! use wholemem::{Location, MemoryType};
//! use wm_embedding::{Embedding, Init, Optimizer};
//! let world = wm_comm::init()?;
//! let mut emb = Embedding::<half::bf16>::allocate(&world, MemoryType::Chunked, Location::Host, 1 << 20, 32, None, Some(Optimizer::ada_grad()))?;
//! emb.init(Init::Uniform { low: -0.01, high: 0.01 }, 7)?;
//! let ids = [1i32, 5, 1];
//! let mut x = vec![0f32; ids.len() * 32];
//! emb.gather(&ids, &mut x)?; // bf16 rows, read as f32
//! emb.apply_gradients(&ids, &vec![1.0; ids.len() * 32], 0.1)?; // row 1 gets the sum of two rows
//! emb.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `docs/embedding.md` has the formulas, the collectivity rules and the
//! link-prediction example.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cache;
mod error;
mod init;
mod optimizer;
mod table;

pub use error::{Error, Result};
pub use init::Init;
pub use optimizer::{Optimizer, StateSlot};
pub use table::{Embedding, EmbeddingElement};
pub use wm_gather::cache::CacheStats;
