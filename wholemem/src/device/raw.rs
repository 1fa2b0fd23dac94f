//! The integration point for crates that launch kernels on wholemem's
//! memory (`wm-gather`): the cudarc context and stream a table's rank uses.
//! Everything else in wholemem's API is free of CUDA types (the seam
//! `tests/tests/invariants.rs` allows).

use std::sync::Arc;

pub use cudarc;
use cudarc::driver::{CudaContext, CudaStream};

use crate::WholeMemory;

/// The context of the GPU `mem`'s rank is bound to, if any.
pub fn context(mem: &WholeMemory) -> Option<Arc<CudaContext>> {
    mem.gpu().map(|g| g.ctx.clone())
}

/// The stream wholemem orders this rank's device work on.
pub fn stream(mem: &WholeMemory) -> Option<Arc<CudaStream>> {
    mem.gpu().map(|g| g.stream.clone())
}
