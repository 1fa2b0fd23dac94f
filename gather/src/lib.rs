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
//! [`Column`] reads single elements of one-column host tables through the
//! mapping (not collective), for callers that walk a table element by
//! element.
//!
//! Conversion: floating types convert among themselves, integer types among
//! themselves (as `as` casts do), and floating ↔ integer is refused. A
//! negative or out-of-range id is an error naming it, raised before any
//! data moves — on every rank for collective calls — and the next call
//! works. Within one call, the last occurrence of a repeated id wins a
//! scatter (for collective types: the highest rank's last occurrence).
#![deny(unsafe_code)]

use wholemem::CommonError;

pub mod cache;
#[allow(unsafe_code)]
mod column;
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
pub mod parallel;
pub mod profile;
#[allow(unsafe_code)]
pub mod rows;
pub mod sort;

pub use column::{Column, Run};
pub use kernel::{MIN_ROWS_PER_THREAD, PREFETCH_DISTANCE, prefetch_slice};
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
    /// An unusable argument, a peer that failed or sent malformed data, a
    /// wait that timed out: the kinds every layer shares.
    #[error(transparent)]
    Common(#[from] wholemem::CommonError),
    /// Floating ↔ integer.
    #[error(transparent)]
    Conversion(#[from] ConversionError),
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

const OUT_OF_RANGE: u8 = 1;

impl wholemem::agree::PeerError for Error {
    wholemem::peer_error_variants!();

    /// An out-of-range id keeps its type: every rank names the id, its
    /// position and the rank that passed it.
    fn encode(&self) -> Option<Vec<u8>> {
        let Self::IndexOutOfRange { index, position, rows, .. } = self else { return None };
        Some(wholemem::agree::encode_words(OUT_OF_RANGE, &[*index as u64, *position as u64, *rows as u64]))
    }

    fn decode(rank: usize, bytes: &[u8]) -> Option<Self> {
        let [index, position, rows] = wholemem::agree::decode_words(bytes, OUT_OF_RANGE)?;
        Some(Self::IndexOutOfRange {
            index: index as i64,
            position: usize::try_from(position).ok()?,
            rank,
            rows: usize::try_from(rows).ok()?,
        })
    }
}

/// Global row ids, 32- or 64-bit.
#[derive(Debug, Clone, Copy)]
pub enum Ids<'a> {
    /// 32-bit ids.
    I32(&'a [i32]),
    /// 64-bit ids.
    I64(&'a [i64]),
}

impl<'a> Ids<'a> {
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

    /// `count` ids from position `first`.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn slice(self, first: usize, count: usize) -> Ids<'a> {
        match self {
            Ids::I32(v) => Ids::I32(&v[first..first + count]),
            Ids::I64(v) => Ids::I64(&v[first..first + count]),
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
///
/// Built only by [`RowLayout::new`] (or [`RowLayout::of`]), which checks
/// that the byte offsets it implies fit in a `usize`; every gather and
/// scatter then checks that they fit in the table's rows. The byte
/// arithmetic of a row lives here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLayout {
    dtype: DType,
    cols: usize,
    offset: usize,
}

impl RowLayout {
    /// `cols` elements of `dtype` from element `offset` of each row.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the values for `cols == 0`, or
    /// when the end of the elements moved, `(offset + cols) × size` bytes,
    /// is past `usize::MAX`.
    pub fn new(dtype: DType, cols: usize, offset: usize) -> Result<Self> {
        if cols == 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a row layout of 0 {dtype} elements (from element {offset}) moves nothing"
            ))));
        }
        if offset.checked_add(cols).and_then(|end| end.checked_mul(dtype.size())).is_none() {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{cols} {dtype} elements from element {offset} end past usize::MAX bytes"
            ))));
        }
        Ok(Self { dtype, cols, offset })
    }

    /// The layout of a whole 1-D or 2-D tensor with contiguous rows.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for more than 2 dimensions or a column
    /// stride other than 1.
    pub fn of<T: Element>(t: &wholemem::WholeTensor<T>) -> Result<Self> {
        let d = t.desc();
        let cols = match d.dims() {
            1 => 1,
            2 if d.strides()[1] == 1 => d.sizes()[1],
            _ => {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "gather and scatter take 1-D or 2-D tensors with contiguous rows, not sizes {:?} strides {:?}",
                    d.sizes(),
                    d.strides()
                ))));
            }
        };
        Self::new(T::DTYPE, cols, d.storage_offset())
    }

    /// The table's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Elements per row moved.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements from the row's start to the first one moved.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes from a row's start to the first byte moved.
    pub fn skip_bytes(&self) -> usize {
        // Checked in `new`: (offset + cols) × size fits.
        self.offset * self.dtype.size()
    }

    /// Bytes moved per row, in the table's element type.
    pub fn bytes(&self) -> usize {
        self.cols * self.dtype.size()
    }

    /// Checks that the elements moved lie inside rows of `row_bytes` bytes.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the layout and the row size.
    pub fn check_fits(&self, row_bytes: usize) -> Result<()> {
        if self.skip_bytes() + self.bytes() > row_bytes {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{} {} elements from element {} do not fit in a row of {row_bytes} bytes",
                self.cols, self.dtype, self.offset
            ))));
        }
        Ok(())
    }
}

/// Where the elements a layout moves sit in a run of rows: rows `stride`
/// bytes apart, the elements `skip` bytes into each. The one place a row's
/// address is computed for the CPU paths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowSpan {
    stride: usize,
    skip: usize,
}

impl RowSpan {
    /// The rows of `mem` under `layout` (checked to fit by the caller).
    pub(crate) fn new(mem: &wholemem::WholeMemory, layout: &RowLayout) -> Self {
        Self { stride: mem.granularity(), skip: layout.skip_bytes() }
    }

    /// Bytes from the first row's start to the elements of row `index`
    /// (an index checked against the rows, so the product fits: it is
    /// below the table's size).
    #[inline(always)]
    pub(crate) fn at(&self, index: usize) -> usize {
        index * self.stride + self.skip
    }
}

/// Threads a rank uses for local row copies: the table's
/// [`WholeMemory::compute_threads`](wholemem::WholeMemory::compute_threads).
pub fn threads(mem: &wholemem::WholeMemory) -> usize {
    mem.compute_threads()
}

/// Gathers table rows `ids` into `out` (`ids.len()` rows of `layout.cols`
/// elements of `out_dtype`, as bytes). Collective for distributed and
/// hierarchy memory.
///
/// # Errors
/// [`Error::IndexOutOfRange`] naming the first bad id (on every rank of a
/// collective call); [`wholemem::CommonError::InvalidArgument`] for a wrongly sized buffer;
/// [`Error::Conversion`]; [`Error::Comm`] for a lost peer or a timeout.
pub fn gather(mem: &wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
    let mut clock = profile::Clock::start();
    // Device tables check their ids on the device.
    let problem = if on_device(mem) {
        check_shape(mem, layout, ids.len(), out.len(), out_dtype, "output")
    } else {
        check_call(mem, layout, ids, out.len(), out_dtype, "output")
    };
    clock.lap("checks");
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => {
            let conv = problem?;
            #[cfg(feature = "cuda")]
            if on_device(mem) {
                return device::gather_mapped(mem, layout, conv, ids, out, &mut clock);
            }
            let done = mapped::gather(mem, layout, conv, ids, out);
            clock.lap("copy");
            done
        }
        wholemem::MemoryType::Distributed | wholemem::MemoryType::Hierarchy => {
            #[cfg(feature = "cuda")]
            if device::peer_route(mem)? {
                return device::gather_collective(mem, layout, problem, ids, out, out_dtype, &mut clock);
            }
            // The host exchange: the ids are checked here, and their
            // outcome travels with the first exchange.
            let problem = problem.and_then(|c| check_ids(mem, ids).map(|()| c));
            if mem.memory_type() == wholemem::MemoryType::Distributed {
                exchange::gather_distributed(mem, layout, problem, ids, out, clock, &mut || false)
            } else {
                exchange::gather_hierarchy(mem, layout, problem, ids, out, clock, &mut || false)
            }
        }
    }
}

/// Whether `mem` is device memory (whose gathers and scatters check their
/// ids on the device).
fn on_device(mem: &wholemem::WholeMemory) -> bool {
    cfg!(feature = "cuda") && mem.location() == wholemem::Location::Device
}

/// Scatters `src` (`ids.len()` rows of `layout.cols` elements of
/// `src_dtype`, as bytes) into table rows `ids`. Collective for distributed
/// and hierarchy memory.
///
/// Once the checks passed (on every rank, for a collective call), the
/// write moves the [`write_generation`](wholemem::WholeMemory::write_generation)
/// of the ranks whose rows it writes — for mapped memory, of every rank
/// between the lowest and the highest id — so caches of those rows see it.
/// A call the checks refuse writes nothing and moves nothing.
///
/// # Errors
/// As [`gather`].
pub fn scatter(mem: &mut wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, src: &[u8], src_dtype: DType) -> Result<()> {
    let mut clock = profile::Clock::start();
    let problem = if on_device(mem) {
        check_shape(mem, layout, ids.len(), src.len(), src_dtype, "input")
    } else {
        check_call(mem, layout, ids, src.len(), src_dtype, "input")
    }
    .map(|c| c.reversed());
    clock.lap("checks");
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => {
            let conv = problem?;
            #[cfg(feature = "cuda")]
            if on_device(mem) {
                let done = device::scatter_mapped(mem, layout, conv, ids, src, &mut clock);
                mem.note_written(span(&ids.to_rows()));
                return done;
            }
            let done = mapped::scatter(mem, layout, conv, ids, src);
            clock.lap("copy");
            done
        }
        wholemem::MemoryType::Distributed | wholemem::MemoryType::Hierarchy => {
            #[cfg(feature = "cuda")]
            if device::peer_route(mem)? {
                return device::scatter_collective(mem, layout, problem, ids, src, src_dtype, &mut clock);
            }
            let problem = problem.and_then(|c| check_ids(mem, ids).map(|()| c));
            exchange::scatter_distributed(mem, layout, problem, ids, src, clock)
        }
    }
}

/// [`gather`] of rows this rank owns (`mem.local_rows()`), without any
/// communication: for every memory type, not collective. A rank updating
/// its own rows (an optimizer step after the gradients reached their owners)
/// reads them this way instead of in a collective gather.
///
/// # Errors
/// As [`gather`], and [`wholemem::CommonError::InvalidArgument`] naming the first id this
/// rank does not own.
pub fn gather_owned(mem: &wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
    let conv = check_call(mem, layout, ids, out.len(), out_dtype, "output")?;
    let rows = owned_rows(mem, ids)?;
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => gather(mem, layout, ids, out, out_dtype),
        wholemem::MemoryType::Distributed | wholemem::MemoryType::Hierarchy => exchange::gather_owned(mem, layout, conv, &rows, out),
    }
}

/// [`scatter`] into rows this rank owns, without any communication: for
/// every memory type, not collective. Within the call the last occurrence
/// of a repeated id wins.
///
/// # Errors
/// As [`gather_owned`].
pub fn scatter_owned(mem: &mut wholemem::WholeMemory, layout: &RowLayout, ids: Ids<'_>, src: &[u8], src_dtype: DType) -> Result<()> {
    let conv = check_call(mem, layout, ids, src.len(), src_dtype, "input")?.reversed();
    let rows = owned_rows(mem, ids)?;
    match mem.memory_type() {
        wholemem::MemoryType::Continuous | wholemem::MemoryType::Chunked => scatter(mem, layout, ids, src, src_dtype),
        wholemem::MemoryType::Distributed | wholemem::MemoryType::Hierarchy => {
            let done = exchange::scatter_owned(mem, layout, conv, &rows, src);
            if !rows.is_empty() {
                mem.note_written(mem.local_rows());
            }
            done
        }
    }
}

/// The rows from the lowest of `rows` to the highest (empty for none): what
/// a write of them counts as written
/// ([`WholeMemory::note_written`](wholemem::WholeMemory::note_written)).
pub(crate) fn span(rows: &[usize]) -> std::ops::Range<usize> {
    match (rows.iter().min(), rows.iter().max()) {
        (Some(&lo), Some(&hi)) => lo..hi + 1,
        _ => 0..0,
    }
}

/// `ids` as row numbers within this rank's rows, or an error naming the
/// first one it does not own (ids are in range: checked first).
fn owned_rows(mem: &wholemem::WholeMemory, ids: Ids<'_>) -> Result<Vec<usize>> {
    let own = mem.local_rows();
    let rows = ids.to_rows();
    if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| !own.contains(*r)) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "id {r} at position {i} is not one of rank {}'s rows ({}..{})",
            mem.comm().world_rank(),
            own.start,
            own.end
        ))));
    }
    Ok(rows.into_iter().map(|r| r - own.start).collect())
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
    // In the order of the collective paths (which check the ids last), so
    // that a call wrong twice gets the same error on every memory type.
    let conv = check_shape(mem, layout, ids.len(), buf_len, buf_dtype, what)?;
    check_ids(mem, ids)?;
    Ok(conv)
}

/// The first id of `ids` out of range for `mem`, as an error.
fn check_ids(mem: &wholemem::WholeMemory, ids: Ids<'_>) -> Result<()> {
    match ids.first_out_of_range(mem.rows()) {
        Some((position, index)) => Err(Error::IndexOutOfRange { index, position, rank: mem.comm().world_rank(), rows: mem.rows() }),
        None => Ok(()),
    }
}

/// [`check_call`] but for the ids: the layout fits a row, the conversion is
/// allowed and the buffer holds exactly `n` rows.
fn check_shape(
    mem: &wholemem::WholeMemory,
    layout: &RowLayout,
    n: usize,
    buf_len: usize,
    buf_dtype: DType,
    what: &str,
) -> Result<kernel::RowConv> {
    layout.check_fits(mem.granularity())?;
    // Scatter converts the other way; the rule is symmetric.
    let conv = kernel::RowConv::new(layout.dtype(), buf_dtype, layout.cols())?;
    let Some(want) = layout.cols().checked_mul(buf_dtype.size()).and_then(|row| n.checked_mul(row)) else {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{n} ids of {} {buf_dtype} elements are more than usize::MAX bytes",
            layout.cols()
        ))));
    };
    if buf_len != want {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "the {what} buffer has {buf_len} bytes; {n} ids of {} {buf_dtype} elements need {want}",
            layout.cols()
        ))));
    }
    Ok(conv)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checks are explicit (`checked_*`), not overflow panics of a
    /// debug build: a release build refuses the same layouts.
    #[test]
    fn row_layouts_whose_bytes_do_not_fit_a_usize_are_errors() {
        let cases = [
            (DType::F32, 4, usize::MAX - 2, "offset + cols past usize::MAX"),
            (DType::F32, 4, usize::MAX / 4, "(offset + cols) × 4 past usize::MAX"),
            (DType::F64, usize::MAX / 8 + 1, 0, "cols × 8 past usize::MAX"),
            (DType::I8, usize::MAX, 1, "one byte too many"),
        ];
        for (dtype, cols, offset, why) in cases {
            let e = RowLayout::new(dtype, cols, offset).unwrap_err();
            assert!(
                matches!(&e, Error::Common(CommonError::InvalidArgument(m)) if m.contains(&offset.to_string()) && m.contains("usize::MAX")),
                "{why}: {e}"
            );
        }
        let e = RowLayout::new(DType::F32, 0, 3).unwrap_err();
        assert!(e.to_string().contains("0 f32 elements"), "{e}");
    }

    #[test]
    fn row_layouts_that_fit_a_usize_but_not_the_row_are_refused_by_the_row_check() {
        // The largest offset whose end still fits: representable, but no
        // table has rows that long.
        let l = RowLayout::new(DType::F32, 2, usize::MAX / 4 - 2).unwrap();
        assert_eq!(l.skip_bytes(), (usize::MAX / 4 - 2) * 4);
        let e = l.check_fits(4096).unwrap_err();
        assert!(e.to_string().contains("do not fit in a row of 4096 bytes"), "{e}");
        // An exact fit passes; one element more does not.
        let l = RowLayout::new(DType::F16, 3, 5).unwrap();
        assert_eq!((l.skip_bytes(), l.bytes()), (10, 6));
        l.check_fits(16).unwrap();
        assert!(l.check_fits(15).is_err());
    }

    #[test]
    fn out_of_range_ids_keep_their_type_across_ranks_and_garbage_does_not_pass_for_one() {
        use wholemem::agree::PeerError;
        let e = Error::IndexOutOfRange { index: -7, position: 3, rank: 0, rows: 10 };
        let back = Error::decode(5, &e.encode().unwrap()).unwrap();
        assert!(matches!(back, Error::IndexOutOfRange { index: -7, position: 3, rank: 5, rows: 10 }), "{back:?}");
        for bad in [&[][..], &[OUT_OF_RANGE], &[OUT_OF_RANGE, 0, 0], &[2; 25]] {
            assert!(Error::decode(1, bad).is_none(), "{bad:?}");
        }
        assert!(Error::Common(CommonError::InvalidArgument("x".into())).encode().is_none());
    }
}
