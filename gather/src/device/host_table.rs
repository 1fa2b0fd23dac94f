//! Gathering a host table (continuous or chunked, registered with CUDA)
//! into device memory at the host link's speed: the ids come down once;
//! then the CPU copies the rows of one piece of the batch (with the table's
//! copy threads, as a host gather does) into a page-locked buffer while
//! the copy engine sends up the piece before it from the other, so the
//! link stays busy with large sequential copies rather than the scattered
//! reads over the bus a kernel would make. `WM_HOST_GATHER=mapped` takes
//! that kernel instead (one launch reading the registered rows directly).

use wholemem::CommonError;
use wholemem::WholeMemory;
use wholemem::device::DeviceBuffer;
use wholemem::device::raw::cudarc::driver::CudaEvent;

use super::checks;
use super::launch::{DeviceIds, IdsAt, OutAt, ids_down};
use super::mapping::mapped_gather;
use super::staging::{Host, Lease, cuda};
use crate::cuda::StreamCopy;
use crate::kernel::RowConv;
use crate::profile::Clock;
use crate::{DType, Error, Result, RowLayout};

/// Bytes of rows per piece: large enough for the copy engine's full speed,
/// small enough that the first piece goes up soon.
const PIECE_BYTES: usize = 8 << 20;

/// Which way host rows reach device memory (`WM_HOST_GATHER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    /// The CPU packs, the copy engine sends (the default).
    Staged,
    /// One kernel reads the registered rows over the bus.
    Mapped,
}

/// `WM_HOST_GATHER`: `staged` (or unset) or `mapped`.
pub(crate) fn way() -> Result<Way> {
    match wm_topology::env::WM_HOST_GATHER.get().as_deref() {
        None | Some("") | Some("staged") => Ok(Way::Staged),
        Some("mapped") => Ok(Way::Mapped),
        Some(other) => Err(Error::Common(CommonError::InvalidArgument(format!("WM_HOST_GATHER={other:?}; expected staged or mapped")))),
    }
}

/// The pieces of a batch of `n` rows of `row_bytes`: `(first, count)`.
pub(crate) fn pieces(n: usize, row_bytes: usize) -> impl Iterator<Item = (usize, usize)> {
    let per = (PIECE_BYTES / row_bytes.max(1)).max(1);
    (0..n.div_ceil(per)).map(move |k| (k * per, per.min(n - k * per)))
}

/// [`super::gather_device`] for a mapped host table; `out` was checked to
/// hold the rows.
pub(crate) fn gather(
    mem: &WholeMemory,
    layout: &RowLayout,
    ids: &DeviceIds,
    out: &mut DeviceBuffer,
    out_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    // The mapped way needs the rows registered with CUDA; where the driver
    // refused that (`WholeMemory::host_registration`), they are staged.
    if way()? == Way::Mapped && mem.host_registration().is_ok() {
        return mapped_gather(mem, layout, IdsAt::Device(ids), OutAt::Device(out.addr()), out_dtype, clock);
    }
    let conv = RowConv::new(layout.dtype(), out_dtype, layout.cols())?;
    let rb = conv.dst_bytes();
    let mut l = Lease::take(mem)?;
    let host_ids = ids_down(&mut l, ids)?;
    let host = host_ids.ids();
    // The CPU reads the rows: they must be checked first.
    if let Some((position, index)) = host.first_out_of_range(mem.rows()) {
        return Err(checks::out_of_range(mem, position, index));
    }
    clock.lap("ids down");
    let piece = PIECE_BYTES.max(rb);
    let bufs = [l.host(Host::Rows0, piece)?.as_mut_ptr(), l.host(Host::Rows1, piece)?.as_mut_ptr()];
    let ctx = l.stream.context().clone();
    let sent: [CudaEvent; 2] = [ctx.new_event(None).map_err(cuda)?, ctx.new_event(None).map_err(cuda)?];
    let mut used = [false; 2];
    let (mut packing, mut waiting) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    for (k, (first, count)) in pieces(ids.len(), rb).enumerate() {
        let b = k % 2;
        if used[b] {
            // The copy from this buffer two pieces ago must have left it.
            crate::profile::timed(clock.on(), &mut waiting, || sent[b].synchronize()).map_err(cuda)?;
        }
        let bytes = count * rb;
        // SAFETY: `bufs[b]` is a page-locked buffer of the lease of at
        // least PIECE_BYTES ≥ `bytes` bytes (pieces hold at most that, or
        // one row); no copy reads it now (its last one was waited for
        // above), and the lease does not grow or hand it on during the loop.
        let dst = unsafe { std::slice::from_raw_parts_mut(bufs[b], bytes) };
        let part = host.slice(first, count);
        crate::profile::timed(clock.on(), &mut packing, || crate::mapped::gather(mem, layout, conv, part, dst))?;
        // SAFETY: `out` holds `ids.len()` rows of `rb` (checked by the
        // caller), so rows `first..first + count` lie inside it; the source
        // is the page-locked piece, not touched until `sent[b]` completes.
        unsafe { l.copy(StreamCopy::ToDevice { dst: out.addr() + (first * rb) as u64, src: bufs[b], len: bytes }) }?;
        sent[b].record(&l.stream).map_err(cuda)?;
        used[b] = true;
    }
    l.wait()?;
    clock.add("cpu rows", packing);
    clock.add("wait for a buffer", waiting);
    clock.lap("rows up");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_batch_in_order_each_within_the_piece_size() {
        for (n, rb) in [(0usize, 512usize), (1, 512), (16_384, 512), (16_385, 512), (524_288, 512), (3, PIECE_BYTES * 2), (100, 1)] {
            let mut next = 0;
            for (first, count) in pieces(n, rb) {
                assert_eq!(first, next, "{n} rows of {rb}");
                assert!(count >= 1 && (count * rb <= PIECE_BYTES || count == 1), "{n} rows of {rb}: a piece of {count}");
                next += count;
            }
            assert_eq!(next, n, "{n} rows of {rb}");
        }
        assert_eq!(pieces(524_288, 512).count(), 32, "8 MiB pieces of 512-byte rows");
    }
}
