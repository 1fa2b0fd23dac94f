//! Gather and scatter through the mapping (continuous and chunked memory):
//! not collective, each rank copies rows itself.

use wholemem::WholeMemory;

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::{Ids, Result, RowLayout, threads};

/// Addresses of table rows through the mapping.
pub(crate) struct MappedRows {
    continuous: Option<SendPtr>,
    bases: Vec<SendPtr>,
    offsets: Vec<usize>,
    granularity: usize,
    skip: usize,
}

impl MappedRows {
    pub(crate) fn new(mem: &WholeMemory, layout: &RowLayout) -> Self {
        let p = mem.partition();
        let world = p.world();
        Self {
            continuous: mem.continuous_base().map(SendPtr),
            bases: (0..world).map(|r| SendPtr(mem.rank_ptr(r).expect("mapped types map every rank"))).collect(),
            offsets: (0..=world).map(|r| p.offset(r)).collect(),
            granularity: mem.granularity(),
            skip: layout.offset * layout.dtype.size(),
        }
    }
}

impl RowAddr for MappedRows {
    #[inline]
    fn addr(&self, row: usize) -> *mut u8 {
        if let Some(base) = self.continuous {
            return base.0.wrapping_add(row * self.granularity + self.skip);
        }
        let owner = self.offsets.partition_point(|&o| o <= row) - 1;
        self.bases[owner].0.wrapping_add((row - self.offsets[owner]) * self.granularity + self.skip)
    }
}

pub(crate) fn gather(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, out: &mut [u8]) -> Result<()> {
    let rows = ids.to_rows();
    let src = MappedRows::new(mem, layout);
    // SAFETY: every id was checked against the row count, the layout against
    // the row size, and `out` against the id count; mapped memory is
    // readable for every row.
    unsafe { kernel::gather_rows(&src, &rows, None, conv, out, threads(mem)) };
    Ok(())
}

pub(crate) fn scatter(mem: &mut WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, src: &[u8]) -> Result<()> {
    let rows = ids.to_rows();
    let dst = MappedRows::new(mem, layout);
    // SAFETY: as for gather; `&mut WholeMemory` keeps this process's other
    // users away while the rows are written.
    unsafe { kernel::scatter_rows(&dst, &rows, conv, src, threads(mem), mem.row_locks()) };
    Ok(())
}
