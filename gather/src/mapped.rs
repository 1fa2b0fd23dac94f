//! Gather and scatter through the mapping (continuous and chunked memory):
//! not collective, each rank copies rows itself.

use wholemem::CommonError;
use wholemem::WholeMemory;

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::{Error, Ids, Result, RowLayout, RowSpan, threads};

/// Addresses of table rows through the mapping.
pub(crate) struct MappedRows {
    continuous: Option<SendPtr>,
    bases: Vec<SendPtr>,
    offsets: Vec<usize>,
    span: RowSpan,
}

impl MappedRows {
    pub(crate) fn new(mem: &WholeMemory, layout: &RowLayout) -> Result<Self> {
        let p = mem.partition();
        let world = p.world();
        let bases = (0..world)
            .map(|r| {
                mem.rank_ptr(r).map(SendPtr).ok_or_else(|| {
                    Error::Common(CommonError::InvalidArgument(format!(
                        "rank {} does not map rank {}'s rows",
                        mem.comm().world_rank(),
                        mem.comm().world_ranks()[r]
                    )))
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            continuous: mem.continuous_base().map(SendPtr),
            bases,
            offsets: (0..=world).map(|r| p.offset(r)).collect(),
            span: RowSpan::new(mem, layout),
        })
    }
}

impl RowAddr for MappedRows {
    #[inline]
    fn addr(&self, row: usize) -> *mut u8 {
        if let Some(base) = self.continuous {
            return base.0.wrapping_add(self.span.at(row));
        }
        let owner = self.offsets.partition_point(|&o| o <= row) - 1;
        self.bases[owner].0.wrapping_add(self.span.at(row - self.offsets[owner]))
    }
}

pub(crate) fn gather(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, out: &mut [u8]) -> Result<()> {
    let rows = ids.to_rows();
    let src = MappedRows::new(mem, layout)?;
    // In huge pages the TLB covers the table (1024 entries for 2 GiB):
    // nothing to reuse, and the sort only costs.
    let small_pages = mem.huge_page_bytes() < mem.mapped_bytes() / 2;
    if let Some((sorted, to)) = in_table_order(&rows, mem.total_bytes()).filter(|_| small_pages) {
        // SAFETY: as below; `to` is a permutation of 0..rows.len(), so the
        // output rows written are distinct and all below rows.len().
        unsafe { kernel::gather_rows(&src, &sorted, Some(&to), conv, out, threads(mem)) };
        return Ok(());
    }
    // SAFETY: every id was checked against the row count, the layout against
    // the row size, and `out` against the id count; mapped memory is
    // readable for every row.
    unsafe { kernel::gather_rows(&src, &rows, None, conv, out, threads(mem)) };
    Ok(())
}

/// Where the rows of a [`PlacedCopy`] come from.
enum Source {
    /// Table rows, through the mapping.
    Table(MappedRows),
    /// This rank's own host rows, numbered from 0 within them.
    Own(OwnRows),
}

impl RowAddr for Source {
    #[inline]
    fn addr(&self, row: usize) -> *mut u8 {
        match self {
            Self::Table(t) => t.addr(row),
            Self::Own(o) => o.addr(row),
        }
    }
}

/// A copy of rows (converted) into output rows given one each, checked
/// once for the whole list: the safe entry for a caller that places rows
/// itself (the node cache's hits and own rows), and one that copies the
/// list in pieces between the steps of an exchange pays the checks, the
/// thread count and the rows' addresses once rather than per piece.
pub(crate) struct PlacedCopy<'a> {
    src: Source,
    rows: &'a [usize],
    positions: &'a [usize],
    conv: RowConv,
    out_len: usize,
    threads: usize,
    /// The table the addresses point into.
    _table: std::marker::PhantomData<&'a WholeMemory>,
}

/// Which rows a [`PlacedCopy`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsOf {
    /// Table rows, through the mapping.
    Table,
    /// This rank's own host rows, numbered from 0 within them: for any
    /// memory type, a rank maps its own host rows.
    Own,
}

impl<'a> PlacedCopy<'a> {
    /// Rows `rows` of `mem` (`of` says which) into output rows `positions`
    /// of an output of `out_len` bytes.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the values when the rows are not
    /// mapped here (the table's, or this rank's in host memory), a row is
    /// out of range, the layout does not fit the rows, or the positions are
    /// not distinct rows of the output.
    pub(crate) fn new(
        mem: &'a WholeMemory,
        of: RowsOf,
        layout: &RowLayout,
        conv: RowConv,
        rows: &'a [usize],
        positions: &'a [usize],
        out_len: usize,
    ) -> Result<Self> {
        layout.check_fits(mem.granularity())?;
        let count = match of {
            RowsOf::Table => mem.rows(),
            RowsOf::Own => mem.local_rows().len(),
        };
        if let Some(bad) = rows.iter().find(|&&r| r >= count) {
            let detail = match of {
                RowsOf::Table => format!("row {bad} of a table of {count} rows"),
                RowsOf::Own => format!("own row {bad} of rank {}, which owns {count}", mem.comm().world_rank()),
            };
            return Err(Error::Common(CommonError::InvalidArgument(detail)));
        }
        check_placement(layout, conv, rows.len(), positions, out_len)?;
        let src = match of {
            RowsOf::Table => Source::Table(MappedRows::new(mem, layout)?),
            RowsOf::Own => match (mem.location(), mem.rank_ptr(mem.comm().rank())) {
                (wholemem::Location::Host, Some(base)) => Source::Own(OwnRows { base: SendPtr(base), span: RowSpan::new(mem, layout) }),
                _ => {
                    return Err(Error::Common(CommonError::InvalidArgument(format!(
                        "rank {} does not map its own rows of this table in host memory",
                        mem.comm().world_rank()
                    ))));
                }
            },
        };
        Ok(Self { src, rows, positions, conv, out_len, threads: threads(mem), _table: std::marker::PhantomData })
    }

    /// Rows in the list.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// Copies the rows at `range` of the list into `out`, the output the
    /// copy was checked for.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the values for another output's
    /// length or a range past the list.
    pub(crate) fn run(&self, range: std::ops::Range<usize>, out: &mut [u8]) -> Result<()> {
        if out.len() != self.out_len {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "an output of {} bytes for a copy checked for {}",
                out.len(),
                self.out_len
            ))));
        }
        let (Some(rows), Some(positions)) = (self.rows.get(range.clone()), self.positions.get(range.clone())) else {
            return Err(Error::Common(CommonError::InvalidArgument(format!("rows {range:?} of a copy of {} rows", self.rows.len()))));
        };
        // SAFETY: every row is below the table's (or this rank's) row count
        // and mapped here, the layout fits in a row and matches the
        // conversion, the positions are distinct rows of an output of
        // `out_len` bytes (all checked when the copy was made, and `out` has
        // that length); the table outlives `self`, and `out` is exclusively
        // borrowed, apart from it.
        unsafe { kernel::gather_rows(&self.src, rows, Some(positions), self.conv, out, self.threads) };
        Ok(())
    }

    /// Copies every row of the list into `out`.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    pub(crate) fn run_all(&self, out: &mut [u8]) -> Result<()> {
        self.run(0..self.rows.len(), out)
    }
}

/// That `rows` rows converted by `conv` land on `positions`, one distinct
/// row of an output of `out_len` bytes each, and that the conversion is the
/// layout's.
fn check_placement(layout: &RowLayout, conv: RowConv, rows: usize, positions: &[usize], out_len: usize) -> Result<()> {
    let db = conv.dst_bytes();
    if rows != positions.len() || db == 0 || out_len % db != 0 || !kernel::distinct_below(positions, out_len / db) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{rows} rows to {} positions of an output of {out_len} bytes in rows of {db}: not one distinct output row each",
            positions.len(),
        ))));
    }
    if conv.src_bytes() != layout.bytes() {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "a conversion of {} bytes per row for a layout of {}",
            conv.src_bytes(),
            layout.bytes()
        ))));
    }
    Ok(())
}

/// This rank's own host rows, numbered from 0 within them.
struct OwnRows {
    base: SendPtr,
    span: RowSpan,
}

impl RowAddr for OwnRows {
    #[inline]
    fn addr(&self, local_row: usize) -> *mut u8 {
        self.base.0.wrapping_add(self.span.at(local_row))
    }
}

/// Writes dense rows `src` (of the table's element type, `layout`'s
/// elements each) into this rank's own host rows `rows` (numbered from 0
/// within them; the last occurrence of a repeated row wins), under the row
/// locks where the table has them: for any memory type, a rank maps its
/// own host rows.
///
/// # Errors
/// As [`gather_own_to`]; a row lock that could not be had.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn scatter_own(mem: &mut WholeMemory, layout: &RowLayout, rows: &[usize], src: &[u8]) -> Result<()> {
    layout.check_fits(mem.granularity())?;
    let me = mem.comm().rank();
    let count = mem.local_rows().len();
    if let Some(bad) = rows.iter().find(|&&r| r >= count) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "own row {bad} of rank {}, which owns {count}",
            mem.comm().world_rank()
        ))));
    }
    if rows.len().checked_mul(layout.bytes()) != Some(src.len()) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} bytes for {} rows of {} bytes",
            src.len(),
            rows.len(),
            layout.bytes()
        ))));
    }
    let base = match (mem.location(), mem.rank_ptr(me)) {
        (wholemem::Location::Host, Some(p)) => p,
        _ => {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "rank {} does not map its own rows of this table in host memory",
                mem.comm().world_rank()
            ))));
        }
    };
    let conv = RowConv::new(layout.dtype(), layout.dtype(), layout.cols())?;
    if mem.memory_type().is_mapped() {
        // By global row, so the row locks are the ones every writer takes.
        let first = mem.local_rows().start;
        let global: Vec<usize> = rows.iter().map(|&r| first + r).collect();
        let dst = MappedRows::new(mem, layout)?;
        // SAFETY: every row is one of this rank's, below the row count and
        // mapped here; the layout fits in a row; `src` holds one row per id
        // (all checked above) and is apart from the table; `&mut
        // WholeMemory` keeps this process's other users away, the row
        // locks other ranks.
        let written = unsafe { kernel::scatter_rows(&dst, &global, None, conv, src, threads(mem), mem.row_locks()) }.map_err(Error::from);
        if !rows.is_empty() {
            mem.note_written(mem.local_rows());
        }
        return written;
    }
    let dst = OwnRows { base: SendPtr(base), span: RowSpan::new(mem, layout) };
    // SAFETY: every row is below this rank's row count and `base` starts
    // this rank's host rows, mapped for all of them; the layout fits in a
    // row; `src` holds one row per id (all checked above) and is apart from
    // the table; distributed and hierarchy host rows are private to this
    // process, and `&mut WholeMemory` keeps its other users away.
    let written = unsafe { kernel::scatter_rows(&dst, rows, None, conv, src, threads(mem), None) }.map_err(Error::from);
    if !rows.is_empty() {
        mem.note_written(mem.local_rows());
    }
    written
}

/// Bytes of table that one 64-byte line of page-table entries maps (8
/// entries of 4 KiB pages).
const PTE_LINE_SPAN: usize = 32 << 10;

/// The ids in table order, with the output row of each, when the batch is
/// dense enough for that to pay: on average at least one id per
/// [`PTE_LINE_SPAN`] of table, so walking the rows in address order reuses
/// the page-table lines (and DRAM pages) the previous row's translation
/// brought in. Random rows of a large table in small pages otherwise miss
/// the TLB on every row. Sparser batches keep their order (sorting them
/// measured no gain), and so does every batch of a table in huge pages
/// (sorted, a gather of 65 536 rows measured 15–25 % slower there).
fn in_table_order(rows: &[usize], table_bytes: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    let (n, max_row) = (rows.len(), rows.iter().copied().max().unwrap_or(0));
    if !(2..1 << 24).contains(&n) || max_row >= 1 << 40 || n.saturating_mul(PTE_LINE_SPAN) < table_bytes {
        return None;
    }
    let mut keys: Vec<u64> = rows.iter().enumerate().map(|(i, &r)| ((r as u64) << 24) | i as u64).collect();
    keys.sort_unstable();
    Some(keys.iter().map(|k| ((k >> 24) as usize, (k & 0xff_ffff) as usize)).unzip())
}

/// Writes rows `ids` (checked) of a mapped host table, then counts the
/// write for every rank whose rows lie between the lowest and the highest
/// id (even when a row lock could not be had part way).
pub(crate) fn scatter(mem: &mut WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, src: &[u8]) -> Result<()> {
    let rows = ids.to_rows();
    let dst = MappedRows::new(mem, layout)?;
    // SAFETY: as for gather; `&mut WholeMemory` keeps this process's other
    // users away while the rows are written, the row locks other ranks.
    let written = unsafe { kernel::scatter_rows(&dst, &rows, None, conv, src, threads(mem), mem.row_locks()) }.map_err(Error::from);
    mem.note_written(crate::span(&rows));
    written
}

/// Writes packed row `from[k]` of `src` (rows of the table's element
/// type, `layout`'s elements each) into row `rows[k]` of a mapped host
/// table, for every `k`, under the row locks where the table has them;
/// then counts the write as [`scatter`] does. For rows that arrived
/// packed (the node cache's fills): no copy into a dense buffer first.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the values for a row
/// past the table, an index past the packed rows, or lists of different
/// lengths; a row lock that could not be had.
pub(crate) fn scatter_packed(mem: &mut WholeMemory, layout: &RowLayout, rows: &[usize], from: &[usize], src: &[u8]) -> Result<()> {
    let rb = layout.bytes();
    let packed = src.len().checked_div(rb).unwrap_or(0);
    if rows.len() != from.len() || rb == 0 || src.len() % rb != 0 {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} rows from {} packed places in {} bytes of rows of {rb}",
            rows.len(),
            from.len(),
            src.len()
        ))));
    }
    if let Some(bad) = rows.iter().find(|&&r| r >= mem.rows()) {
        return Err(Error::Common(CommonError::InvalidArgument(format!("row {bad} of a table of {} rows", mem.rows()))));
    }
    if let Some(bad) = from.iter().find(|&&k| k >= packed) {
        return Err(Error::Common(CommonError::InvalidArgument(format!("packed row {bad} of {packed}"))));
    }
    let conv = RowConv::new(layout.dtype(), layout.dtype(), layout.cols())?;
    let dst = MappedRows::new(mem, layout)?;
    // SAFETY: every row is below the row count and mapped here, every
    // `from` index below the packed rows (all checked above); `src` is
    // apart from the table; `&mut WholeMemory` keeps this process's other
    // users away while the rows are written, the row locks other ranks.
    let written = unsafe { kernel::scatter_rows(&dst, rows, Some(from), conv, src, threads(mem), mem.row_locks()) }.map_err(Error::from);
    mem.note_written(crate::span(rows));
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_batches_are_walked_in_table_order_and_sparse_ones_are_not() {
        let rows = [9usize, 2, 7, 2, 0];
        let (sorted, to) = in_table_order(&rows, 5 * PTE_LINE_SPAN).expect("one id per PTE line span: sorted");
        assert_eq!(sorted, vec![0, 2, 2, 7, 9]);
        assert_eq!(to, vec![4, 1, 3, 2, 0]);
        assert!(to.iter().zip(&sorted).all(|(&i, &r)| rows[i] == r));
        assert_eq!(in_table_order(&rows, 5 * PTE_LINE_SPAN + 1), None, "sparser than one id per span");
        assert_eq!(in_table_order(&[3], 1), None);
    }
}
