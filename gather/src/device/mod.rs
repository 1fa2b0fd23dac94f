//! Gather and scatter on the GPU: the kernels of [`crate::cuda`] over device
//! memory, and over host memory registered with CUDA.
//!
//! | memory | [`gather`](crate::gather) / [`scatter`](crate::scatter), host buffers | [`gather_device`] / [`scatter_device`], device buffers |
//! |---|---|---|
//! | device Continuous, Chunked | ids up (page-locked), check, one kernel over the mapping, rows down | check, one kernel over the mapping: one wait per call |
//! | device Distributed, Hierarchy, ranks of one node that map each other's GPU memory | ids (and rows) up, then as with device buffers | the peer exchange (`peers.rs`): ids and rows move between the ranks' shared device buffers (CUDA IPC), own rows included, never through the host |
//! | device Distributed, Hierarchy, otherwise | the host exchange; each owner's rows read by a kernel | NCCL where every rank has its own GPU, else the host exchange, staged through page-locked memory |
//! | host (registered) Continuous, Chunked | the CPU path | rows copied by the CPU into page-locked buffers, each sent up while the next is filled (`WM_HOST_GATHER=mapped`: one kernel reading host memory over the bus) |
//!
//! Ids are checked on the device, in the call: a check kernel records the
//! first bad position in a status word that stops the row kernels before
//! any row moves (`checks.rs`), read when the call waits for the stream; a
//! scatter resolves repeated ids on the device (`cuda::repeats`). The
//! buffers a call needs are kept between calls (`staging.rs`), and with
//! `wm_gather::profile` recording, the device phases are timed with CUDA
//! events (`timing.rs`): they are named `gpu …`, and lie inside the host
//! phases of the same call.
//!
//! The files import downwards only: this one (the entry points, the host
//! route, the device cache's slots) over `host_table.rs`, `peers.rs` and
//! `mapping.rs` (the routes), over `launch.rs` (ids, owner tables and row
//! launches on a lease, and this rank's own rows, which the host exchange
//! reads and writes), over `staging.rs`, `checks.rs`, `plan.rs` and
//! `timing.rs`.

mod checks;
mod host_table;
pub(crate) mod launch;
mod mapping;
mod peers;
mod plan;
mod staging;
mod timing;

use wholemem::CommonError;
use wholemem::device::DeviceBuffer;
use wholemem::{Location, WholeMemory};

use crate::cuda::StreamCopy;
use crate::kernel::RowConv;
use crate::profile::Clock;
use crate::{DType, Error, Ids, Result, RowLayout};
pub use launch::DeviceIds;
use launch::{IdsAt, OutAt, Owners, Rows, SrcAt, dense, gather_rows, ids_down, local_ids, rows_down, scatter_rows, src_on_device};
use mapping::{mapped_gather, mapped_scatter};
use staging::{Dev, Host, Lease};

/// The checks every path makes of a call's shape: the layout fits a row,
/// the conversion is allowed, and a buffer of `buf_len` bytes holds `n`
/// rows (`exact`: exactly, for host buffers; at least, for device ones).
fn shape(mem: &WholeMemory, layout: &RowLayout, n: usize, buf_len: usize, buf_dtype: DType, exact: bool, what: &str) -> Result<RowConv> {
    layout.check_fits(mem.granularity())?;
    let conv = RowConv::new(layout.dtype(), buf_dtype, layout.cols())?;
    let Some(want) = layout.cols().checked_mul(buf_dtype.size()).and_then(|row| n.checked_mul(row)) else {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{n} rows of {} {buf_dtype} elements are more than usize::MAX bytes",
            layout.cols()
        ))));
    };
    if buf_len < want || (exact && buf_len != want) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "the {what} buffer has {buf_len} bytes; {n} ids of {} {buf_dtype} elements need {want}",
            layout.cols()
        ))));
    }
    Ok(conv)
}

/// Gathers rows `ids` of a table into `out`, all in device memory: `ids.len()`
/// rows of `layout.cols` elements of `out_dtype`.
///
/// Continuous and chunked device memory: one check and one gather kernel
/// through the mapping, one wait; not collective. Continuous and chunked
/// host memory registered with CUDA: the rows are copied by the CPU into
/// page-locked buffers and sent up while the next is filled. Distributed
/// and hierarchy memory: collective — the peer exchange between the
/// node's ranks' GPUs, NCCL, or the host exchange (see the module's table).
///
/// # Errors
/// [`Error::IndexOutOfRange`] naming the first bad id (on every rank for
/// a collective call); [`wholemem::CommonError::InvalidArgument`] for a buffer too small;
/// [`Error::Conversion`]; [`Error::Cuda`] when the GPU cannot reach the rows
/// or a launch fails; the exchange's errors.
pub fn gather_device(mem: &WholeMemory, layout: &RowLayout, ids: &DeviceIds, out: &mut DeviceBuffer, out_dtype: DType) -> Result<()> {
    let mut clock = Clock::start();
    let checked = shape(mem, layout, ids.len, out.len(), out_dtype, false, "device output");
    clock.lap("checks");
    if mem.memory_type().is_mapped() {
        checked?;
        if mem.location() == Location::Host {
            return host_table::gather(mem, layout, ids, out, out_dtype, &mut clock);
        }
        return mapped_gather(mem, layout, IdsAt::Device(ids), OutAt::Device(out.addr()), out_dtype, &mut clock);
    }
    if peer_route(mem)? {
        return peers::gather(mem, layout, checked, IdsAt::Device(ids), OutAt::Device(out.addr()), out_dtype, &mut clock);
    }
    if let Ok(nccl) = mem.device_comm() {
        return peers::gather_nccl(mem, nccl, layout, checked, ids, out, out_dtype);
    }
    gather_through_host(mem, layout, checked, ids, out, out_dtype)
}

/// Scatters the dense rows `src` (`ids.len()` rows of `layout.cols`
/// elements of `src_dtype`, in device memory) into table rows `ids`;
/// within the call the last occurrence of an id wins (for collective
/// types: the highest rank's last occurrence), resolved on the device.
///
/// Continuous and chunked device memory: not collective, one wait.
/// Distributed and hierarchy memory: collective, as [`gather_device`].
///
/// # Errors
/// As [`gather_device`]; [`wholemem::CommonError::InvalidArgument`] for a table in host
/// memory (scatter into it from host buffers with [`crate::scatter`]).
pub fn scatter_device(mem: &mut WholeMemory, layout: &RowLayout, ids: &DeviceIds, src: &DeviceBuffer, src_dtype: DType) -> Result<()> {
    let mut clock = Clock::start();
    let checked = shape(mem, layout, ids.len, src.len(), src_dtype, false, "device input").map(RowConv::reversed);
    let checked = checked.and_then(|c| {
        if mem.location() == Location::Device {
            Ok(c)
        } else {
            Err(Error::Common(CommonError::InvalidArgument(
                "scatter_device writes device tables; this one is in host memory (use scatter)".into(),
            )))
        }
    });
    clock.lap("checks");
    if mem.memory_type().is_mapped() {
        checked?;
        return mapped_scatter(mem, layout, IdsAt::Device(ids), SrcAt::Device(src.addr()), src_dtype, &mut clock);
    }
    if peer_route(mem)? {
        return peers::scatter(mem, layout, checked, IdsAt::Device(ids), SrcAt::Device(src.addr()), src_dtype, &mut clock);
    }
    scatter_through_host(mem, layout, checked, ids, src, src_dtype)
}

/// Device-memory gather with host ids and output (the path of
/// [`crate::gather`] for mapped device memory); `conv` was checked.
pub(crate) fn gather_mapped(
    mem: &WholeMemory,
    layout: &RowLayout,
    conv: RowConv,
    ids: Ids<'_>,
    out: &mut [u8],
    clock: &mut Clock,
) -> Result<()> {
    mapped_gather(mem, layout, IdsAt::Host(ids), OutAt::Host(out), conv.to(), clock)
}

/// Device-memory scatter with host ids and input (mapped device memory).
pub(crate) fn scatter_mapped(
    mem: &WholeMemory,
    layout: &RowLayout,
    conv: RowConv,
    ids: Ids<'_>,
    src: &[u8],
    clock: &mut Clock,
) -> Result<()> {
    mapped_scatter(mem, layout, IdsAt::Host(ids), SrcAt::Host(src), conv.from(), clock)
}

/// Whether the collective calls on `mem` take the peer exchange (device
/// memory whose ranks map each other's GPU memory). Collective the first
/// time it is asked of a table.
///
/// # Errors
/// A lost peer while asking.
pub(crate) fn peer_route(mem: &WholeMemory) -> Result<bool> {
    if mem.location() != Location::Device || mem.memory_type().is_mapped() {
        return Ok(false);
    }
    peers::route(mem)
}

/// [`crate::gather`] of distributed and hierarchy device memory through the
/// peer exchange ([`peer_route`]); `checked` is this rank's shape check
/// (the ids are checked on the device).
pub(crate) fn gather_collective(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    out_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    peers::gather(mem, layout, checked, IdsAt::Host(ids), OutAt::Host(out), out_dtype, clock)
}

/// [`crate::scatter`] likewise.
pub(crate) fn scatter_collective(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    src: &[u8],
    src_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    peers::scatter(mem, layout, checked, IdsAt::Host(ids), SrcAt::Host(src), src_dtype, clock)
}

/// The host route of [`gather_device`] (no peer exchange, no NCCL): the ids
/// come down through page-locked memory, the host exchange gathers into
/// page-locked rows, which go up in one copy. Collective.
fn gather_through_host(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: &DeviceIds,
    out: &mut DeviceBuffer,
    out_dtype: DType,
) -> Result<()> {
    let mut l = Lease::take(mem)?;
    let host_ids = ids_down(&mut l, ids)?;
    let host = host_ids.ids();
    let checked = checked.and_then(|c| match host.first_out_of_range(mem.rows()) {
        Some((position, index)) => Err(checks::out_of_range(mem, position, index)),
        None => Ok(c),
    });
    let bytes = if checked.is_ok() { ids.len * layout.cols() * out_dtype.size() } else { 0 };
    let rows = l.host(Host::Rows0, bytes)?;
    crate::exchange::gather_collective(mem, layout, checked, host, &mut rows.as_mut_slice()[..bytes], &mut || false)?;
    let src = rows.as_ptr();
    // SAFETY: `out` holds `bytes` (checked by `shape`); `src` is page-locked
    // and waited for below.
    unsafe { l.copy(StreamCopy::ToDevice { dst: out.addr(), src, len: bytes }) }?;
    l.wait()
}

/// The host route of [`scatter_device`]: ids and rows come down through
/// page-locked memory into the host exchange. Collective.
fn scatter_through_host(
    mem: &mut WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: &DeviceIds,
    src: &DeviceBuffer,
    src_dtype: DType,
) -> Result<()> {
    // The lease borrows the table, which the exchange then writes: the
    // rows come down through page-locked memory into a buffer of the call's.
    let (host_ids, checked, rows) = {
        let mut l = Lease::take(mem)?;
        let host_ids = ids_down(&mut l, ids)?;
        let checked = checked.and_then(|c| match host_ids.ids().first_out_of_range(mem.rows()) {
            Some((position, index)) => Err(checks::out_of_range(mem, position, index)),
            None => Ok(c),
        });
        let bytes = if checked.is_ok() { ids.len * layout.cols() * src_dtype.size() } else { 0 };
        let dst = l.host(Host::Rows0, bytes)?.as_mut_ptr();
        // SAFETY: `src` holds `bytes` (checked by `shape`); `dst` is
        // page-locked, long enough, and read only after the wait.
        unsafe { l.copy(StreamCopy::ToHost { dst, src: src.addr(), len: bytes }) }?;
        l.wait()?;
        let rows = l.host(Host::Rows0, bytes)?.as_slice()[..bytes].to_vec();
        (host_ids, checked, rows)
    };
    crate::exchange::scatter_collective(mem, layout, checked, host_ids.ids(), &rows)
}

/// The shape of a device buffer used as a small table by the device
/// cache: `rows` rows of `stride` bytes from the buffer's start, each
/// holding a layout's elements from its first byte.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotRows {
    /// Rows it holds.
    pub(crate) rows: usize,
    /// Bytes from one row to the next.
    pub(crate) stride: usize,
}

impl SlotRows {
    /// Checks the rows against `buf` and the layout, and `slots` against
    /// the rows; the owner table of one "rank" (the buffer).
    fn table(&self, l: &mut Lease<'_>, buf: &DeviceBuffer, layout: &RowLayout, slots: &[usize]) -> Result<Owners> {
        if layout.offset() != 0 || layout.bytes() > self.stride || self.rows.checked_mul(self.stride).is_none_or(|b| b > buf.len()) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{} slot rows of {} bytes ({} used) in a device buffer of {} bytes",
                self.rows,
                self.stride,
                layout.bytes(),
                buf.len()
            ))));
        }
        if let Some(bad) = slots.iter().find(|&&s| s >= self.rows) {
            return Err(Error::Common(CommonError::InvalidArgument(format!("slot {bad} of {} slots", self.rows))));
        }
        dense(l, buf.addr(), self.rows, self.stride)
    }
}

/// Copies slot rows `slots` (their `layout` elements, unconverted) into the
/// dense host buffer `out`, on the GPU of `mem`'s rank.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] for a slot past the rows or a wrongly sized
/// `out`; the driver's errors.
pub(crate) fn read_slots(
    mem: &WholeMemory,
    buf: &DeviceBuffer,
    rows: SlotRows,
    layout: &RowLayout,
    slots: &[usize],
    out: &mut [u8],
) -> Result<()> {
    let rb = layout.bytes();
    if out.len() != slots.len() * rb {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} bytes for {} slot rows of {rb} bytes",
            out.len(),
            slots.len()
        ))));
    }
    if slots.is_empty() {
        return Ok(());
    }
    let mut l = Lease::take(mem)?;
    let o = rows.table(&mut l, buf, layout, slots)?;
    let at = local_ids(&mut l, slots)?;
    let dst = l.dev(Dev::Rows, out.len())?;
    // SAFETY: the owner table holds the slot buffer's address with rows
    // 0..rows, which the buffer holds (checked); every slot is below rows
    // (checked); `dst` is scratch for one row per slot.
    unsafe { gather_rows(&mut l, o, Rows::of(layout, layout.dtype()), at, dst, 0) }?;
    rows_down(&mut l, dst, OutAt::Host(out))
}

/// Writes the dense host rows `src` (`layout`'s elements, unconverted) into
/// slot rows `slots` (distinct), on the GPU of `mem`'s rank.
///
/// # Errors
/// As [`read_slots`]; [`wholemem::CommonError::InvalidArgument`] for a repeated slot.
pub(crate) fn write_slots(
    mem: &WholeMemory,
    buf: &mut DeviceBuffer,
    rows: SlotRows,
    layout: &RowLayout,
    slots: &[usize],
    src: &[u8],
) -> Result<()> {
    let rb = layout.bytes();
    if src.len() != slots.len() * rb {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} bytes for {} slot rows of {rb} bytes",
            src.len(),
            slots.len()
        ))));
    }
    if slots.is_empty() {
        return Ok(());
    }
    if !crate::kernel::distinct_below(slots, rows.rows) {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} slots that are not distinct slots of {}",
            slots.len(),
            rows.rows
        ))));
    }
    let mut l = Lease::take(mem)?;
    let from = src_on_device(&mut l, SrcAt::Host(src))?;
    let o = rows.table(&mut l, buf, layout, slots)?;
    let at = local_ids(&mut l, slots)?;
    // SAFETY: as in `read_slots`; the slots are distinct (checked), so no
    // two threads write one row.
    unsafe { scatter_rows(&mut l, o, Rows::of(layout, layout.dtype()), at, from, 0, 0) }?;
    l.wait()
}

#[cfg(test)]
mod tests {
    /// The per-call allocations and host passes this module used to make,
    /// by what they look like in its sources: device buffers allocated per
    /// call (`DeviceBuffer::new` outside `DeviceIds`), ids checked on the
    /// host before a device call (`first_out_of_range` outside the routes
    /// that hand the ids to the host exchange), repeats resolved on the
    /// host (`last_occurrences`), pageable uploads and downloads of scratch
    /// (`.upload(` / `.download(` outside `DeviceIds` and the host route).
    #[test]
    fn device_calls_allocate_nothing_and_check_and_resolve_ids_on_the_device() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let dir = src.join("device");
        // The module as a directory, or as the one file it once was.
        let files: Vec<std::path::PathBuf> = match std::fs::read_dir(&dir) {
            Ok(d) => d.flatten().map(|e| e.path()).collect(),
            Err(_) => vec![src.join("device.rs")],
        };
        assert!(!files.is_empty());
        let mut offenders = Vec::new();
        for path in files {
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            // The tests of each file are not its code.
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            let allowed: &[(&str, usize)] = match name.as_str() {
                // The host routes hand host-checked ids to the host exchange.
                "mod.rs" if dir.is_dir() => &[("first_out_of_range", 2)],
                // DeviceIds::upload allocates and fills the caller's ids (not
                // per call of a gather).
                "launch.rs" => &[("DeviceBuffer::new(", 1), (".upload(", 1)],
                // The pool grows its buffers.
                "staging.rs" => &[("DeviceBuffer::new(", 1)],
                // The CPU copies host rows into page-locked memory: it checks them first.
                "host_table.rs" => &[("first_out_of_range", 1)],
                _ => &[],
            };
            for needle in ["DeviceBuffer::new(", "first_out_of_range", "last_occurrences", ".upload(", ".download("] {
                let found = code.matches(needle).count();
                let ok: usize = allowed.iter().filter(|(n, _)| *n == needle).map(|(_, c)| *c).sum();
                if found > ok {
                    offenders.push(format!("{name}: {found} × {needle}"));
                }
            }
        }
        assert!(offenders.is_empty(), "per-call allocations, host id passes or pageable scratch copies: {offenders:?}");
    }
}
