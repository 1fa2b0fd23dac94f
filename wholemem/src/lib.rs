//! One huge row-partitioned table shared by many processes.
//!
//! A [`WholeMemory`] is allocated collectively over a communicator, as one of
//! four [`MemoryType`]s at a [`Location`]. Before allocating, [`query`] says
//! whether the combination can work here and, when not, why. A
//! [`WholeTensor`] gives the bytes a shape and an element type. [`files`]
//! loads a table from sharded NPY or raw files and stores it back.
//!
//! ```no_run
//! use wholemem::{Location, MemoryType, WholeTensor};
//! let world = wm_comm::init()?;
//! let mut t = WholeTensor::<f32>::matrix(&world, MemoryType::Chunked, Location::Host, 1000, 128, None)?;
//! let mine = t.local_rows();
//! let rows: Vec<f32> = mine.clone().flat_map(|r| [r as f32; 128]).collect();
//! t.write_local(&rows)?; // this rank's rows, copied in
//! world.barrier()?;
//! let mut row = vec![0f32; 128];
//! t.read_row(999, &mut row)?; // any row: chunked memory maps them all
//! t.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]

pub mod agree;
mod capability;
pub mod cores;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod device;
mod dtype;
mod error;
pub mod files;
#[allow(unsafe_code)]
mod handle;
#[allow(unsafe_code)]
mod host;
mod partition;
mod size;
#[allow(unsafe_code)]
mod tensor;
mod types;

pub use capability::{Capabilities, NO_CUDA, Support, query};
pub use dtype::{ConversionError, DType, Element};
pub use error::{CommonError, Error, Result, ShardProblem};
pub use handle::{AllocRequest, MappedPortion, Portion, WholeMemory};
pub use host::locks::{RowGuard, RowLocks};
pub use partition::Partition;
pub use size::checked_size;

/// Bytes of `memory` this process maps with huge pages now (whole mappings
/// inside it only; from `/proc/self/smaps`, 0 where that cannot be read).
/// A diagnostic: [`WholeMemory::huge_page_bytes`] is this for a table.
pub fn huge_page_bytes(memory: &[u8]) -> usize {
    host::map::huge_bytes_in(memory.as_ptr() as usize, memory.len())
}

/// Asks the kernel to back the whole pages of `memory` that are not touched
/// yet with transparent huge pages (`madvise(MADV_HUGEPAGE)`), for a large
/// private buffer read at random. A hint: contents do not change, and where
/// the kernel declines nothing does.
pub fn advise_huge_pages(memory: &mut [u8]) {
    host::map::advise_huge_pages(memory);
}
pub use tensor::{MAX_DIMS, TensorDesc, WholeTensor};
pub use types::{Location, MemoryType};
