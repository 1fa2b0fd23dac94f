//! This rank's own rows: copied between the table and the exchange's
//! buffers (host rows by the kernels, device rows through the device
//! module), and the reply buffers reused between calls.

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::{Error, Result, RowLayout, RowSpan, threads};
use wholemem::CommonError;
use wholemem::WholeMemory;

/// This rank's own rows (host memory).
pub(super) struct LocalRows {
    base: SendPtr,
    span: RowSpan,
}

impl LocalRows {
    pub(super) fn new(mem: &WholeMemory, layout: &RowLayout) -> Result<Self> {
        let me = mem.comm().rank();
        let base = mem.rank_ptr(me).ok_or_else(|| {
            Error::Common(CommonError::InvalidArgument(format!("rank {} does not map its own rows of this table", mem.comm().world_rank())))
        })?;
        Ok(Self { base: SendPtr(base), span: RowSpan::new(mem, layout) })
    }
}

impl RowAddr for LocalRows {
    #[inline]
    fn addr(&self, local_row: usize) -> *mut u8 {
        self.base.0.wrapping_add(self.span.at(local_row))
    }
}

/// Rows of a caller's buffer.
pub(super) struct BufferRows(pub(super) SendPtr, pub(super) usize);

impl RowAddr for BufferRows {
    #[inline]
    fn addr(&self, i: usize) -> *mut u8 {
        self.0.0.wrapping_add(i * self.1)
    }
}

/// Bytes of `n` rows of `row_bytes`, or `None` past `usize::MAX`.
pub(super) fn rows_bytes(n: usize, row_bytes: usize) -> Option<usize> {
    n.checked_mul(row_bytes)
}

thread_local! {
    /// Reply buffers of earlier calls, reused so that large exchanges do not
    /// fault in fresh pages every time.
    static SCRATCH: std::cell::RefCell<wm_comm::BufferPool<u8>> = const { std::cell::RefCell::new(wm_comm::BufferPool::new(64 << 10, 16)) };
}

/// A buffer of `len` bytes, reused when one is at hand.
pub(super) fn scratch(len: usize) -> Vec<u8> {
    SCRATCH.with(|s| s.borrow_mut().get(len))
}

/// Keeps large buffers for [`scratch`].
pub(super) fn give_back(bufs: Vec<Vec<u8>>) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        for b in bufs {
            s.keep(b);
        }
    });
}

/// Copies this rank's own rows `rows` (converted) into `out`: row `k` to
/// output row `positions[k]`, or to row `k` without positions. Through the
/// CPU for host memory, by a kernel for device memory.
pub(super) fn read_local(
    mem: &WholeMemory,
    layout: &RowLayout,
    conv: RowConv,
    rows: &[usize],
    positions: Option<&[usize]>,
    out: &mut [u8],
) -> Result<()> {
    let n = mem.local_rows().len();
    if let Some(bad) = rows.iter().find(|&&r| r >= n) {
        // Every caller checked the rows it got from peers; this stays a
        // check because the copy below trusts it.
        return Err(Error::Common(CommonError::InvalidArgument(format!("row {bad} of rank {}, which owns {n}", mem.comm().world_rank()))));
    }
    #[cfg(feature = "cuda")]
    if mem.location() == wholemem::Location::Device {
        let Some(positions) = positions else { return crate::device::launch::gather_local(mem, layout, conv, rows, out) };
        let mut dense = scratch(rows.len() * conv.dst_bytes());
        crate::device::launch::gather_local(mem, layout, conv, rows, &mut dense)?;
        place(out, &dense, positions, conv.dst_bytes());
        give_back(vec![dense]);
        return Ok(());
    }
    debug_assert!(out.len() >= positions.map_or(rows.len(), |p| p.iter().max().map_or(0, |m| m + 1)) * conv.dst_bytes());
    let src = LocalRows::new(mem, layout)?;
    // SAFETY: every row is below this rank's row count (checked above), and
    // the layout fits in a row (checked at the call's entry); positions are
    // distinct and `out` is sized for them (callers' invariant, checked in
    // debug builds).
    unsafe { kernel::gather_rows(&src, rows, positions, conv, out, threads(mem)) };
    Ok(())
}

/// Bytes of own rows one step of an exchange's work copies: the socket
/// backend goes back to its sockets between steps, so a rank's own copy
/// does not keep its peers' bytes waiting.
pub(super) const STEP_BYTES: usize = 256 << 10;

/// Rows of `db` bytes one step copies: all of them for device tables (one
/// kernel launch), [`STEP_BYTES`] worth on the host.
pub(crate) fn step_rows(mem: &WholeMemory, db: usize, total: usize) -> usize {
    if mem.location() == wholemem::Location::Device { total.max(1) } else { (STEP_BYTES / db.max(1)).max(1) }
}

/// [`crate::gather_owned`] for distributed and hierarchy tables: this
/// rank's rows `rows` (local numbers, checked), straight from its memory.
pub(crate) fn gather_owned(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], out: &mut [u8]) -> Result<()> {
    read_local(mem, layout, conv, rows, None, out)
}

/// [`crate::scatter_owned`] for distributed and hierarchy tables: `src`'s
/// rows (converted) into this rank's rows `rows` (local numbers, checked),
/// the last occurrence of a row winning.
pub(crate) fn scatter_owned(mem: &mut WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], src: &[u8]) -> Result<()> {
    #[cfg(feature = "cuda")]
    if mem.location() == wholemem::Location::Device {
        return crate::device::launch::scatter_local(mem, layout, conv, rows, src);
    }
    let n = mem.local_rows().len();
    if let Some(bad) = rows.iter().find(|&&r| r >= n) {
        return Err(Error::Common(CommonError::InvalidArgument(format!("row {bad} of rank {}, which owns {n}", mem.comm().world_rank()))));
    }
    debug_assert_eq!(src.len(), rows.len() * conv.src_bytes());
    let table = LocalRows::new(mem, layout)?;
    // SAFETY: every row is below this rank's row count (checked above) and
    // the layout fits in a row (checked at the call's entry); `src` holds
    // `rows.len()` rows of the source type (checked at the call's entry).
    // Distributed and hierarchy host rows are this process's private
    // memory, and `&mut WholeMemory` keeps its other users away.
    unsafe { kernel::scatter_rows(&table, rows, None, conv, src, threads(mem), None) }?;
    Ok(())
}

/// Copies row `k` of `rows` into output row `positions[k]`.
pub(super) fn place(out: &mut [u8], rows: &[u8], positions: &[usize], row_bytes: usize) {
    for (k, &p) in positions.iter().enumerate() {
        out[p * row_bytes..][..row_bytes].copy_from_slice(&rows[k * row_bytes..][..row_bytes]);
    }
}
