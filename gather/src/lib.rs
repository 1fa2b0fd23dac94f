//! Moving rows of wholemem tables: gather (rows by global id into a local
//! buffer) and scatter (a local buffer into rows by global id), for every
//! memory type, with element conversion on the way.
//!
//! - **Continuous, Chunked**: not collective. Each rank reads or writes rows
//!   straight through the mapping, split over threads.
//! - **Distributed**: collective. Ids are bucketed by owner, exchanged,
//!   owners copy (and convert) their rows, and the rows travel back.
//! - **Hierarchy**: collective. Ids are first exchanged within the node and
//!   de-duplicated; only unique ids cross nodes, then rows fan back out.
//!
//! Conversion: floating types convert among themselves, integer types among
//! themselves (as `as` casts do), and floating ↔ integer is refused. A
//! negative or out-of-range id is an error naming it, raised before any
//! data moves — on every rank for collective calls — and the next call
//! works. Within one call, the last occurrence of a repeated id wins a
//! scatter (for collective types: the highest rank's last occurrence).
#![deny(unsafe_code)]

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod device;
#[allow(unsafe_code)]
mod exchange;
#[allow(unsafe_code)]
mod kernel;
#[allow(unsafe_code)]
mod mapped;

pub use wholemem::{ConversionError, DType, Element};

/// What can go wrong moving rows.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A negative or too large id; `rank` is the world rank that passed it.
    #[error("id {index} at position {position} on rank {rank} is out of range for a table of {rows} rows")]
    IndexOutOfRange {
        /// The bad id.
        index: i64,
        /// Where it was in that rank's ids.
        position: usize,
        /// The world rank that passed it.
        rank: usize,
        /// Rows in the table.
        rows: usize,
    },
    /// A buffer or layout that does not fit; the message names the values.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Floating ↔ integer.
    #[error(transparent)]
    Conversion(#[from] ConversionError),
    /// Another rank of a collective call failed its checks.
    #[error("rank {rank} failed: {detail}")]
    PeerFailed {
        /// The world rank.
        rank: usize,
        /// Its error.
        detail: String,
    },
    /// The memory layer refused.
    #[error(transparent)]
    Memory(#[from] wholemem::Error),
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
    /// The GPU could not do its part: no GPU for the table, rows it cannot
    /// reach, or a failed kernel launch.
    #[error("CUDA: {0}")]
    Cuda(String),
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Global row ids, 32- or 64-bit.
#[derive(Debug, Clone, Copy)]
pub enum Ids<'a> {
    /// 32-bit ids.
    I32(&'a [i32]),
    /// 64-bit ids.
    I64(&'a [i64]),
}

impl Ids<'_> {
    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            Ids::I32(v) => v.len(),
            Ids::I64(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first id that is negative or not below `rows`, with its position.
    pub fn first_out_of_range(&self, rows: usize) -> Option<(usize, i64)> {
        fn find<T: Copy + Into<i64>>(v: &[T], rows: usize) -> Option<(usize, i64)> {
            v.iter().map(|&x| x.into()).enumerate().find(|&(_, x)| x < 0 || x as u64 >= rows as u64)
        }
        match self {
            Ids::I32(v) => find(v, rows),
            Ids::I64(v) => find(v, rows),
        }
    }

    /// The ids as row indices (call after validation).
    pub(crate) fn to_rows(self) -> Vec<usize> {
        match self {
            Ids::I32(v) => v.iter().map(|&x| x as usize).collect(),
            Ids::I64(v) => v.iter().map(|&x| x as usize).collect(),
        }
    }
}

/// An id type: `i32` or `i64`.
pub trait Index: bytemuck::Pod {
    /// The ids as [`Ids`].
    fn ids(v: &[Self]) -> Ids<'_>;
}
impl Index for i32 {
    fn ids(v: &[Self]) -> Ids<'_> {
        Ids::I32(v)
    }
}
impl Index for i64 {
    fn ids(v: &[Self]) -> Ids<'_> {
        Ids::I64(v)
    }
}

/// Which part of each table row is read or written: `cols` elements of
/// `dtype` starting `offset` elements into the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    /// The table's element type.
    pub dtype: DType,
    /// Elements per row moved.
    pub cols: usize,
    /// Elements from the row's start to the first one moved.
    pub offset: usize,
}

impl RowLayout {
    /// The layout of a whole 1-D or 2-D tensor with contiguous rows.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than 2 dimensions or a column
    /// stride other than 1.
    pub fn of<T: Element>(t: &wholemem::WholeTensor<T>) -> Result<Self> {
        let d = t.desc();
        let cols = match d.dims() {
            1 => 1,
            2 if d.strides()[1] == 1 => d.sizes()[1],
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "gather and scatter take 1-D or 2-D tensors with contiguous rows, not sizes {:?} strides {:?}",
                    d.sizes(),
                    d.strides()
                )));
            }
        };
        Ok(Self { dtype: T::DTYPE, cols, offset: d.storage_offset() })
    }

    fn check(&self, mem: &wholemem::WholeMemory) -> Result<()> {
        let end = (self.offset + self.cols) * self.dtype.size();
        if self.cols == 0 || end > mem.granularity() {
            return Err(Error::InvalidArgument(format!(
                "{} {} elements from element {} do not fit in a row of {} bytes",
                self.cols,
                self.dtype,
                self.offset,
                mem.granularity()
            )));
        }
        Ok(())
    }
}

/// Threads a rank uses for local row copies: the table's
/// [`WholeMemory::copy_threads`](wholemem::WholeMemory::copy_threads).
pub fn threads(mem: &wholemem::WholeMemory) -> usize {
    mem.copy_threads()
}

/// Gathers table rows `ids` into `out` (`ids.len()` rows of `layout.cols`
/// elements of `out_dtype`, as bytes). Collective for distributed and
/// hierarchy memory.
///
/// # Errors
/// [`Error::IndexOutOfRange`] naming the first bad id (on every rank of a
/// collective call); [`Error::InvalidArgument`] for a wrongly sized buffer;
/// [`Error::Conversion`]; [`Error::Comm`] for a lost peer or a timeout.
pub fn gather(mem: &wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
    let problem = check_call(mem, layout, ids, out.len(), out_dtype, "output");
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => {
            let conv = problem?;
            #[cfg(feature = "cuda")]
            if mem.location() == wholemem::Location::Device {
                return device::gather_mapped(mem, layout, conv, ids, out);
            }
            mapped::gather(mem, layout, conv, ids, out)
        }
        wholemem::MemoryType::Distributed => {
            let conv = exchange::agree(mem.comm().as_ref(), problem)?;
            exchange::gather_distributed(mem, layout, conv, ids, out)
        }
        wholemem::MemoryType::Hierarchy => {
            let conv = exchange::agree(mem.comm().as_ref(), problem)?;
            exchange::gather_hierarchy(mem, layout, conv, ids, out)
        }
    }
}

/// Scatters `src` (`ids.len()` rows of `layout.cols` elements of
/// `src_dtype`, as bytes) into table rows `ids`. Collective for distributed
/// and hierarchy memory.
///
/// # Errors
/// As [`gather`].
pub fn scatter(mem: &mut wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, src: &[u8], src_dtype: DType) -> Result<()> {
    let problem = check_call(mem, layout, ids, src.len(), src_dtype, "input").map(|c| c.reversed());
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => {
            let conv = problem?;
            #[cfg(feature = "cuda")]
            if mem.location() == wholemem::Location::Device {
                return device::scatter_mapped(mem, layout, conv, ids, src);
            }
            mapped::scatter(mem, layout, conv, ids, src)
        }
        wholemem::MemoryType::Distributed | wholemem::MemoryType::Hierarchy => {
            let conv = exchange::agree(mem.comm().as_ref(), problem)?;
            exchange::scatter_distributed(mem, layout, conv, ids, src)
        }
    }
}

/// [`gather`] from a typed tensor into a typed buffer.
///
/// # Errors
/// As [`gather`].
pub fn gather_into<T: Element, O: Element, I: Index>(t: &wholemem::WholeTensor<T>, ids: &[I], out: &mut [O]) -> Result<()> {
    gather(t.memory(), &RowLayout::of(t)?, I::ids(ids), bytemuck::cast_slice_mut(out), O::DTYPE)
}

/// [`scatter`] from a typed buffer into a typed tensor.
///
/// # Errors
/// As [`gather`].
pub fn scatter_from<T: Element, S: Element, I: Index>(t: &mut wholemem::WholeTensor<T>, ids: &[I], src: &[S]) -> Result<()> {
    let layout = RowLayout::of(t)?;
    scatter(t.memory_mut(), &layout, I::ids(ids), bytemuck::cast_slice(src), S::DTYPE)
}

/// Checks one rank's arguments; the conversion from table to buffer rows.
fn check_call(
    mem: &wholemem::WholeMemory,
    layout: &RowLayout,
    ids: Ids<'_>,
    buf_len: usize,
    buf_dtype: DType,
    what: &str,
) -> Result<kernel::RowConv> {
    layout.check(mem)?;
    if let Some((position, index)) = ids.first_out_of_range(mem.rows()) {
        return Err(Error::IndexOutOfRange { index, position, rank: mem.comm().world_rank(), rows: mem.rows() });
    }
    // Scatter converts the other way; the rule is symmetric.
    let conv = kernel::RowConv::new(layout.dtype, buf_dtype, layout.cols)?;
    let want = ids.len() * conv.dst_bytes();
    if buf_len != want {
        return Err(Error::InvalidArgument(format!(
            "the {what} buffer has {buf_len} bytes; {} ids of {} {buf_dtype} elements need {want}",
            ids.len(),
            layout.cols
        )));
    }
    Ok(conv)
}
