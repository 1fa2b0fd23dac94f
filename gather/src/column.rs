//! Element-by-element reads of one-column host tables, straight through the
//! mapping: for callers that walk a table a few elements at a time, each
//! read deciding the next (the graph samplers read a node's two offsets,
//! then some of its edges), where a gather per step — an ids array, its
//! checks, a conversion per row, threads — costs more than the reads.
//!
//! A [`Column`] borrows its table, so the mapping outlives every read. Reads
//! copy one element out with a volatile load and never hand out a reference
//! into table memory: another process may write a row meanwhile (the value
//! read is then the old or the new one for an aligned element, never
//! assumed stable across two reads), as with [`gather`](crate::gather).

use std::marker::PhantomData;
use std::ops::Range;

use wholemem::CommonError;
use wholemem::{Element, Location, MemoryType, WholeTensor};

use crate::kernel;
use crate::{Error, Result, RowLayout, RowSpan};

/// One rank's rows as this rank maps them: global rows `start..end` from
/// `first` (the element of row `start`).
#[derive(Debug, Clone, Copy)]
struct Portion {
    start: usize,
    end: usize,
    first: *const u8,
}

/// Read access to the elements of a one-column host table that this rank
/// maps: every row of a continuous or chunked table, this rank's own rows
/// of a distributed or hierarchy one. Not collective.
///
/// ```no_run
/// use wholemem::{MemoryType, Location, TensorDesc, WholeTensor};
/// let world = wm_comm::init()?;
/// let desc = TensorDesc::new(&[1000], &[1], 0)?;
/// let t = WholeTensor::<i64>::allocate(&world, MemoryType::Chunked, Location::Host, desc, None)?;
/// let col = wm_gather::Column::new(&t)?;
/// let v: Option<i64> = col.get(999); // any row of a chunked table
/// if let Some(run) = col.run(10..20) {
///     let _third = run.get(2); // row 12
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Column<'a, T> {
    /// The mapped portions with rows, by ascending `start`.
    portions: Vec<Portion>,
    /// Row 0's element, when one pointer reaches every row (continuous).
    continuous: Option<*const u8>,
    rows: usize,
    stride: usize,
    _table: PhantomData<&'a [T]>,
}

// SAFETY: a Column only reads, through pointers into a mapping that the
// borrow of its table keeps alive for 'a; any thread may do that.
unsafe impl<T: Sync> Send for Column<'_, T> {}
// SAFETY: as above: shared use performs only reads.
unsafe impl<T: Sync> Sync for Column<'_, T> {}

impl<'a, T: Element> Column<'a, T> {
    /// The rows of `t` this rank maps. `t` must have one element per row
    /// (a vector, or a matrix of one column) and live in host memory.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for device memory (read it with
    /// [`gather`](crate::gather)), rows of more than one element, or rows
    /// whose elements are not aligned for `T`.
    pub fn new(t: &'a WholeTensor<T>) -> Result<Self> {
        let mem = t.memory();
        if mem.location() != Location::Host {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a column reads host memory through the mapping; this {} table is in device memory (gather it instead)",
                mem.memory_type()
            ))));
        }
        let layout = RowLayout::of(t)?;
        if layout.cols() != 1 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a column has one element per row; this table has {} per row",
                layout.cols()
            ))));
        }
        layout.check_fits(mem.granularity())?;
        let span = RowSpan::new(mem, &layout);
        let align = std::mem::align_of::<T>();
        let misaligned = |p: *const u8| (p as usize) % align != 0;
        if mem.granularity() % align != 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "rows of {} bytes do not keep {} elements aligned",
                mem.granularity(),
                T::DTYPE
            ))));
        }
        let p = mem.partition();
        let mut portions = Vec::new();
        for r in 0..p.world() {
            let rows = p.range(r);
            if rows.is_empty() {
                continue;
            }
            let Some(base) = mem.rank_ptr(r) else { continue };
            let first = base.cast_const().wrapping_add(span.at(0));
            if misaligned(first) {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "rank {r}'s rows are not aligned for {} elements",
                    T::DTYPE
                ))));
            }
            portions.push(Portion { start: rows.start, end: rows.end, first });
        }
        let continuous = match (mem.memory_type(), mem.continuous_base()) {
            (MemoryType::Continuous, Some(base)) => Some(base.cast_const().wrapping_add(span.at(0))),
            _ => None,
        };
        if continuous.is_some_and(misaligned) {
            return Err(Error::Common(CommonError::InvalidArgument(format!("the table is not aligned for {} elements", T::DTYPE))));
        }
        Ok(Self { portions, continuous, rows: mem.rows(), stride: mem.granularity(), _table: PhantomData })
    }

    /// Rows in the table (not all of them need be reachable).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The portion holding `row`, if this rank maps it.
    #[inline]
    fn portion(&self, row: usize) -> Option<&Portion> {
        // Few portions (one per rank of the node at most): a scan.
        self.portions.iter().find(|p| row >= p.start && row < p.end)
    }

    /// The address of `row`'s element, if this rank maps it.
    #[inline]
    fn addr(&self, row: usize) -> Option<*const u8> {
        if row >= self.rows {
            return None;
        }
        if let Some(base) = self.continuous {
            return Some(base.wrapping_add(row * self.stride));
        }
        self.portion(row).map(|p| p.first.wrapping_add((row - p.start) * self.stride))
    }

    /// Whether this rank maps `row`.
    pub fn reaches(&self, row: usize) -> bool {
        self.addr(row).is_some()
    }

    /// The element of `row`; `None` past the end or for a row this rank
    /// does not map.
    #[inline]
    pub fn get(&self, row: usize) -> Option<T> {
        let p = self.addr(row)?;
        // SAFETY: `p` is the element of a row below `rows` in a portion this
        // rank maps (checked by `addr`), readable while the table is borrowed
        // and aligned for T (checked in `new`: portion starts, and a stride
        // that is a multiple of T's alignment); T is Pod, so any bits are a
        // value. Volatile: the memory is shared with other processes.
        Some(unsafe { p.cast::<T>().read_volatile() })
    }

    /// Asks for the cache line of `row`'s element ahead of reading it (a
    /// hint, which never faults; nothing for a row this rank does not map):
    /// random reads are latency-bound, and a few requests in flight hide
    /// most of it.
    #[inline]
    pub fn prefetch(&self, row: usize) {
        if let Some(p) = self.addr(row) {
            kernel::prefetch(p, std::mem::size_of::<T>());
        }
    }

    /// Rows `range` through one pointer: `None` when some of them are past
    /// the end, not mapped by this rank, or (chunked tables) in two ranks'
    /// portions. An empty range is always an empty run.
    #[inline]
    pub fn run(&self, range: Range<usize>) -> Option<Run<'a, T>> {
        if range.start >= range.end {
            return Some(Run {
                first: std::ptr::NonNull::<T>::dangling().as_ptr().cast_const().cast(),
                len: 0,
                stride: 0,
                _table: PhantomData,
            });
        }
        if range.end > self.rows {
            return None;
        }
        let first = match self.continuous {
            Some(base) => base.wrapping_add(range.start * self.stride),
            None => {
                let p = self.portion(range.start)?;
                if range.end > p.end {
                    return None;
                }
                p.first.wrapping_add((range.start - p.start) * self.stride)
            }
        };
        Some(Run { first, len: range.end - range.start, stride: self.stride, _table: PhantomData })
    }
}

/// Consecutive rows of a [`Column`] that one pointer reaches: index `i` is
/// the run's `i`-th row.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a, T> {
    first: *const u8,
    len: usize,
    stride: usize,
    _table: PhantomData<&'a [T]>,
}

// SAFETY: as for Column: reads only, of a mapping alive for 'a.
unsafe impl<T: Sync> Send for Run<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Run<'_, T> {}

impl<T: Element> Run<'_, T> {
    /// Rows in the run.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the run has no rows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element of the run's `i`-th row.
    ///
    /// # Panics
    /// When `i` is not below [`len`](Self::len), as slice indexing does.
    #[inline]
    pub fn get(&self, i: usize) -> T {
        assert!(i < self.len, "index {i} past a run of {} rows", self.len);
        // SAFETY: rows first..first + len were checked by `Column::run` to be
        // mapped through this pointer, readable while the table is borrowed
        // and aligned for T; i < len. Volatile: shared with other processes.
        unsafe { self.first.wrapping_add(i * self.stride).cast::<T>().read_volatile() }
    }

    /// Appends every element of the run to `out`, converted by `f`.
    #[inline]
    pub fn extend_into<U>(&self, out: &mut Vec<U>, f: impl Fn(T) -> U) {
        out.reserve(self.len);
        for i in 0..self.len {
            out.push(f(self.get(i)));
        }
    }
}
