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

mod checks;
mod host_table;
mod peers;
mod plan;
mod staging;
mod timing;

use wholemem::CommonError;
use wholemem::device::DeviceBuffer;
use wholemem::{Location, MemoryType, WholeMemory};

use crate::cuda::{CheckArgs, GatherArgs, IdType, RepeatArgs, ScatterArgs, StreamCopy};
use crate::kernel::RowConv;
use crate::profile::Clock;
use crate::{DType, Error, Ids, Result, RowLayout};
use staging::{Dev, Host, Lease, cuda};
use timing::Marks;

/// Row ids in device memory, for [`gather_device`] and [`scatter_device`],
/// which check them against the table they are used with, on the device.
#[derive(Debug)]
pub struct DeviceIds {
    buf: DeviceBuffer,
    id_type: IdType,
    len: usize,
}

impl DeviceIds {
    /// Copies `ids` to the GPU of `mem`'s rank (they are checked when used,
    /// against the table they are used with).
    ///
    /// # Errors
    /// [`Error::Memory`] when the rank has no GPU or the copy fails.
    pub fn upload(mem: &WholeMemory, ids: Ids<'_>) -> Result<Self> {
        let (bytes, id_type): (&[u8], IdType) = match ids {
            Ids::I32(v) => (bytemuck::cast_slice(v), IdType::I32),
            Ids::I64(v) => (bytemuck::cast_slice(v), IdType::I64),
        };
        let mut buf = DeviceBuffer::new(mem, bytes.len())?;
        buf.upload(bytes)?;
        Ok(Self { buf, id_type, len: ids.len() })
    }

    /// Ids already on the GPU: the first `len` ids of `id_type` in `buf`.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] when `buf` holds fewer bytes than that.
    pub fn from_buffer(buf: DeviceBuffer, id_type: IdType, len: usize) -> Result<Self> {
        if len.checked_mul(id_type.size()).is_none_or(|b| b > buf.len()) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{len} {} ids do not fit a device buffer of {} bytes",
                id_type.name(),
                buf.len()
            ))));
        }
        Ok(Self { buf, id_type, len })
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Their type.
    pub fn id_type(&self) -> IdType {
        self.id_type
    }

    fn at(&self) -> DevIds {
        DevIds { addr: self.buf.addr(), ty: self.id_type, n: self.len }
    }
}

/// Ids on the device, as a launch names them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevIds {
    addr: u64,
    ty: IdType,
    n: usize,
}

/// A call's ids: the caller's on the device, or on the host.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IdsAt<'a> {
    Device(&'a DeviceIds),
    Host(Ids<'a>),
}

impl IdsAt<'_> {
    fn len(&self) -> usize {
        match self {
            IdsAt::Device(d) => d.len,
            IdsAt::Host(h) => h.len(),
        }
    }
}

/// The ids on the device: the caller's, or host ids copied up through
/// page-locked memory into `Dev::Ids` (enqueued, not waited for).
fn ids_on_device(l: &mut Lease<'_>, ids: IdsAt<'_>) -> Result<DevIds> {
    let host = match ids {
        IdsAt::Device(d) => return Ok(d.at()),
        IdsAt::Host(h) => h,
    };
    let (bytes, ty): (&[u8], IdType) = match host {
        Ids::I32(v) => (bytemuck::cast_slice(v), IdType::I32),
        Ids::I64(v) => (bytemuck::cast_slice(v), IdType::I64),
    };
    let addr = l.dev(Dev::Ids, bytes.len())?;
    let pinned = l.host(Host::Ids, bytes.len())?;
    pinned.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
    let src = pinned.as_ptr();
    // SAFETY: `addr` holds `bytes.len()` bytes (just sized); `src` is
    // page-locked and not rewritten before the stream has passed the copy
    // (every call waits before it ends, and the lease before it is reused).
    unsafe { l.copy(StreamCopy::ToDevice { dst: addr, src, len: bytes.len() }) }?;
    Ok(DevIds { addr, ty, n: host.len() })
}

/// The error naming the bad id at `position`: read from the host ids, or
/// (a second, rare copy) from the device.
fn name_bad_id(l: &mut Lease<'_>, mem: &WholeMemory, ids: IdsAt<'_>, at: DevIds, position: usize) -> Error {
    if position >= at.n {
        return Error::Cuda(format!("the id check reported position {position} of {} ids", at.n));
    }
    let index = match ids {
        IdsAt::Host(Ids::I32(v)) => i64::from(v[position]),
        IdsAt::Host(Ids::I64(v)) => v[position],
        IdsAt::Device(_) => match read_id(l, at, position) {
            Ok(v) => v,
            Err(e) => return e,
        },
    };
    checks::out_of_range(mem, position, index)
}

/// Id `position` of `at`, copied down.
fn read_id(l: &mut Lease<'_>, at: DevIds, position: usize) -> Result<i64> {
    let size = at.ty.size();
    let dst = l.host(Host::Control, 8)?.as_mut_ptr();
    // SAFETY: `position < at.n`, so the id lies inside the ids; `dst` is
    // page-locked, 8 bytes at least, and read only after the wait below.
    unsafe { l.copy(StreamCopy::ToHost { dst, src: at.addr + (position * size) as u64, len: size }) }?;
    l.wait()?;
    let b = &l.host(Host::Control, 8)?.as_slice()[..size];
    Ok(match at.ty {
        IdType::I32 => i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes"))),
        IdType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")),
    })
}

/// Enqueues status words `words` at `status` coming down into page-locked
/// memory, waits for the stream, and returns them.
fn wait_for_status(l: &mut Lease<'_>, status: u64, words: usize) -> Result<Vec<u64>> {
    let dst = l.host(Host::Control, words * 8)?.as_mut_ptr();
    // SAFETY: `status` holds `words` u64 (sized by the caller); `dst` is
    // page-locked, long enough, and read only after the wait.
    unsafe { l.copy(StreamCopy::ToHost { dst, src: status, len: words * 8 }) }?;
    l.wait()?;
    Ok(bytemuck::pod_collect_to_vec(&l.host(Host::Control, words * 8)?.as_slice()[..words * 8]))
}

/// Enqueues a reset of `words` status words (to "no bad id").
fn reset_status(l: &mut Lease<'_>, words: usize) -> Result<u64> {
    let status = l.dev(Dev::Status, words * 8)?;
    // SAFETY: `status` holds `words` u64 (just sized).
    unsafe { l.k.reset_status(&l.stream, status, words) }.map_err(cuda)?;
    l.enqueued();
    Ok(status)
}

/// Enqueues the check of `ids` against `lo..hi` into the status word.
fn check_ids(l: &mut Lease<'_>, ids: DevIds, lo: i64, hi: i64, status: u64) -> Result<()> {
    let args = CheckArgs { ids: ids.addr, id_type: ids.ty, n_ids: ids.n as u64, lo, hi, status };
    // SAFETY: `ids` names `n` ids of its type on this GPU (the caller's
    // DeviceIds, or uploaded into scratch); `status` is a status word of
    // the lease's scratch.
    unsafe { l.k.check_ids(&l.stream, &args) }.map_err(cuda)?;
    l.enqueued();
    Ok(())
}

/// Where each owner's rows start, as the rank's GPU addresses them, in
/// device memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owners {
    bases: u64,
    first_rows: u64,
    ranks: u32,
    /// Bytes from one row to the next.
    stride: u64,
}

/// Which rows a kernel reaches, and how they are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Every row of a mapped table, by global id.
    Mapped,
    /// This rank's own rows, numbered from 0.
    Own,
    /// This rank's own rows, by global id.
    OwnGlobal,
}

/// The owner table of `mem`'s rows under `layout`, uploaded unless the
/// lease's table buffer holds it already.
fn owners(l: &mut Lease<'_>, mem: &WholeMemory, layout: &RowLayout, reach: Reach) -> Result<Owners> {
    let p = mem.partition();
    let skip = layout.skip_bytes() as u64;
    let unreachable = |r: usize| {
        Error::Cuda(format!(
            "rank {}'s rows are not reachable from rank {}'s GPU ({} {} memory{})",
            mem.comm().world_ranks()[r],
            mem.comm().world_rank(),
            mem.location(),
            mem.memory_type(),
            if mem.location() == Location::Host { ", not registered with CUDA" } else { "" }
        ))
    };
    let me = mem.comm().rank();
    let (bases, first): (Vec<u64>, Vec<i64>) = match reach {
        Reach::Own => (vec![mem.device_ptr(me).ok_or_else(|| unreachable(me))? + skip], vec![0, p.count(me) as i64]),
        Reach::OwnGlobal => {
            (vec![mem.device_ptr(me).ok_or_else(|| unreachable(me))? + skip], vec![p.offset(me) as i64, p.offset(me + 1) as i64])
        }
        Reach::Mapped if mem.memory_type() == MemoryType::Continuous => {
            (vec![mem.device_ptr(0).ok_or_else(|| unreachable(0))? + skip], vec![0, mem.rows() as i64])
        }
        Reach::Mapped => {
            let b = (0..p.world()).map(|r| mem.device_ptr(r).map(|a| a + skip).ok_or_else(|| unreachable(r))).collect::<Result<_>>()?;
            (b, (0..=p.world()).map(|r| p.offset(r) as i64).collect())
        }
    };
    let mut content: Vec<u8> = bytemuck::cast_slice(&bases).to_vec();
    content.extend_from_slice(bytemuck::cast_slice(&first));
    let addr = l.table(Dev::Table, &content)?;
    Ok(Owners { bases: addr, first_rows: addr + 8 * bases.len() as u64, ranks: bases.len() as u32, stride: mem.granularity() as u64 })
}

/// A dense device buffer at `addr` of `rows` rows of `stride` bytes as a
/// one-owner table (an output that rows are scattered into).
fn dense(l: &mut Lease<'_>, addr: u64, rows: usize, stride: usize) -> Result<Owners> {
    let content: Vec<u8> = [addr.to_le_bytes(), 0i64.to_le_bytes(), (rows as i64).to_le_bytes()].concat();
    let at = l.table(Dev::BufTable, &content)?;
    Ok(Owners { bases: at, first_rows: at + 8, ranks: 1, stride: stride as u64 })
}

/// The rows a row kernel moves: `dim` elements, table and dense types.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    table_dtype: DType,
    dim: u32,
    /// The dense side's type.
    buf_dtype: DType,
}

impl Rows {
    fn of(layout: &RowLayout, buf_dtype: DType) -> Self {
        Self { table_dtype: layout.dtype(), dim: layout.cols() as u32, buf_dtype }
    }

    /// Bytes of one dense row.
    fn buf_bytes(&self) -> usize {
        self.dim as usize * self.buf_dtype.size()
    }
}

/// Enqueues a gather of `ids` from `o` into the dense rows at `out`,
/// stopped by `status` (0: none) when set.
///
/// # Safety
/// `o` describes rows this GPU may read, ascending first rows; every id is
/// in range, or `status` is set by a check of them that runs first on the
/// stream; `out` holds `ids.n` dense rows and overlaps neither; all of it
/// stays valid until the lease waits.
unsafe fn gather_rows(l: &mut Lease<'_>, o: Owners, rows: Rows, ids: DevIds, out: u64, status: u64) -> Result<()> {
    let args = GatherArgs {
        bases: o.bases,
        first_rows: o.first_rows,
        ranks: o.ranks,
        row_stride_bytes: o.stride,
        table_dtype: rows.table_dtype,
        dim: rows.dim,
        ids: ids.addr,
        id_type: ids.ty,
        n_ids: ids.n as u64,
        out,
        out_stride_bytes: rows.buf_bytes() as u64,
        out_dtype: rows.buf_dtype,
        status,
    };
    // SAFETY: the caller's contract.
    unsafe { l.k.gather(&l.stream, &args) }.map_err(cuda)?;
    l.enqueued();
    Ok(())
}

/// Enqueues a scatter of the dense rows at `src` into `o`'s rows `ids`,
/// where `keep` (0: every row) is set, stopped by `status` when set.
///
/// # Safety
/// As [`gather_rows`], the table rows writable; no two kept ids name the
/// same row.
unsafe fn scatter_rows(l: &mut Lease<'_>, o: Owners, rows: Rows, ids: DevIds, src: u64, keep: u64, status: u64) -> Result<()> {
    let args = ScatterArgs {
        bases: o.bases,
        first_rows: o.first_rows,
        ranks: o.ranks,
        row_stride_bytes: o.stride,
        table_dtype: rows.table_dtype,
        dim: rows.dim,
        ids: ids.addr,
        id_type: ids.ty,
        n_ids: ids.n as u64,
        src,
        src_stride_bytes: rows.buf_bytes() as u64,
        src_dtype: rows.buf_dtype,
        keep,
        status,
    };
    // SAFETY: the caller's contract.
    unsafe { l.k.scatter(&l.stream, &args) }.map_err(cuda)?;
    l.enqueued();
    Ok(())
}

/// Enqueues the resolution of repeated `ids` (those in `lo..hi`) into a
/// keep mask in scratch; its address.
fn resolve_repeats(l: &mut Lease<'_>, ids: DevIds, lo: i64, hi: i64) -> Result<u64> {
    let cap = crate::cuda::repeats::capacity(ids.n);
    let keys = l.dev(Dev::Keys, cap * 8)?;
    let vals = l.dev(Dev::Vals, cap * 4)?;
    let keep = l.dev(Dev::Keep, ids.n.max(1))?;
    let args = RepeatArgs { ids: ids.addr, id_type: ids.ty, n_ids: ids.n as u64, lo, hi, keys, vals, capacity: cap as u64, keep };
    // SAFETY: the table and the mask are the lease's scratch, sized above;
    // the ids are on this GPU.
    unsafe { l.k.resolve_repeats(&l.stream, &args) }.map_err(cuda)?;
    l.enqueued();
    Ok(keep)
}

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

/// Where a gather's rows go.
pub(crate) enum OutAt<'a> {
    /// A device address, sized by the caller.
    Device(u64),
    /// A host buffer: the rows come down into it.
    Host(&'a mut [u8]),
}

/// Where a scatter's rows come from.
#[derive(Clone, Copy)]
pub(crate) enum SrcAt<'a> {
    /// A device address, sized by the caller.
    Device(u64),
    /// A host buffer: the rows go up from it.
    Host(&'a [u8]),
}

/// The device address of a gather's rows: the caller's, or scratch that
/// comes down into its host buffer at the end.
fn out_on_device(l: &mut Lease<'_>, out: &OutAt<'_>) -> Result<u64> {
    match out {
        OutAt::Device(a) => Ok(*a),
        OutAt::Host(buf) => l.dev(Dev::Rows, buf.len()),
    }
}

/// Brings the rows of a host output down (after the call's checks passed).
fn rows_down(l: &mut Lease<'_>, from: u64, out: OutAt<'_>) -> Result<()> {
    if let OutAt::Host(buf) = out {
        let len = buf.len();
        // SAFETY: `from` is the lease's `Dev::Rows`, sized for `len` bytes;
        // `buf` is the caller's pageable buffer, which the driver copies
        // into before the call returns; the wait follows.
        unsafe { l.copy(StreamCopy::ToHost { dst: buf.as_mut_ptr(), src: from, len }) }?;
        l.wait()?;
    }
    Ok(())
}

/// The device address of a scatter's dense rows: the caller's, or the
/// host buffer copied up into scratch.
fn src_on_device(l: &mut Lease<'_>, src: SrcAt<'_>) -> Result<u64> {
    match src {
        SrcAt::Device(a) => Ok(a),
        SrcAt::Host(buf) => {
            let addr = l.dev(Dev::Src, buf.len())?;
            // SAFETY: `addr` holds `buf.len()` bytes (just sized); the
            // driver stages the pageable `buf` before the call returns.
            unsafe { l.copy(StreamCopy::ToDevice { dst: addr, src: buf.as_ptr(), len: buf.len() }) }?;
            Ok(addr)
        }
    }
}

/// A mapped gather: ids up (host ids), the check and the gather kernel
/// (which moves nothing if the check failed), the status word down, one
/// wait; then the rows down for a host output.
fn mapped_gather(mem: &WholeMemory, layout: &RowLayout, ids: IdsAt<'_>, out: OutAt<'_>, out_dtype: DType, clock: &mut Clock) -> Result<()> {
    if ids.len() == 0 {
        return Ok(());
    }
    let mut l = Lease::take(mem)?;
    let mut marks = Marks::start(clock, &l.stream);
    let at = ids_on_device(&mut l, ids)?;
    marks.mark("gpu ids up", &l.stream);
    let o = owners(&mut l, mem, layout, Reach::Mapped)?;
    let status = reset_status(&mut l, 1)?;
    check_ids(&mut l, at, 0, mem.rows() as i64, status)?;
    marks.mark("gpu check", &l.stream);
    let dst = out_on_device(&mut l, &out)?;
    // SAFETY: the owner table is the mapping's; ids out of range stop the
    // kernel through `status`, checked first on the same stream; `dst` is
    // the caller's output (sized by `shape`) or scratch sized for it.
    unsafe { gather_rows(&mut l, o, Rows::of(layout, out_dtype), at, dst, status) }?;
    marks.mark("gpu rows", &l.stream);
    let word = wait_for_status(&mut l, status, 1)?[0];
    clock.lap("enqueue and wait");
    marks.finish(clock);
    if let Some(p) = checks::first_bad(word, at.n) {
        return Err(name_bad_id(&mut l, mem, ids, at, p));
    }
    rows_down(&mut l, dst, out)?;
    clock.lap("rows down");
    Ok(())
}

/// A mapped scatter: rows and ids up (host buffers), the check, the
/// repeats resolved, the scatter kernel (which writes nothing if the check
/// failed), one wait.
fn mapped_scatter(
    mem: &WholeMemory,
    layout: &RowLayout,
    ids: IdsAt<'_>,
    src: SrcAt<'_>,
    src_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    if ids.len() == 0 {
        return Ok(());
    }
    let mut l = Lease::take(mem)?;
    let mut marks = Marks::start(clock, &l.stream);
    // Pageable rows first: the driver waits for the stream before staging them.
    let from = src_on_device(&mut l, src)?;
    let at = ids_on_device(&mut l, ids)?;
    marks.mark("gpu up", &l.stream);
    let o = owners(&mut l, mem, layout, Reach::Mapped)?;
    let status = reset_status(&mut l, 1)?;
    let rows = mem.rows() as i64;
    check_ids(&mut l, at, 0, rows, status)?;
    marks.mark("gpu check", &l.stream);
    let keep = resolve_repeats(&mut l, at, 0, rows)?;
    marks.mark("gpu repeats", &l.stream);
    // SAFETY: as in `mapped_gather`, the other way; `keep` marks one
    // position per row (the last), so no two threads write one row.
    unsafe { scatter_rows(&mut l, o, Rows::of(layout, src_dtype), at, from, keep, status) }?;
    marks.mark("gpu rows", &l.stream);
    let word = wait_for_status(&mut l, status, 1)?[0];
    clock.lap("enqueue and wait");
    marks.finish(clock);
    match checks::first_bad(word, at.n) {
        Some(p) => Err(name_bad_id(&mut l, mem, ids, at, p)),
        None => Ok(()),
    }
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
    crate::gather_collective(mem, layout, checked, host, &mut rows.as_mut_slice()[..bytes], &mut || {})?;
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
    crate::scatter_collective(mem, layout, checked, host_ids.ids(), &rows)
}

/// Ids copied down from the device.
enum HostIds {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl HostIds {
    fn ids(&self) -> Ids<'_> {
        match self {
            HostIds::I32(v) => Ids::I32(v),
            HostIds::I64(v) => Ids::I64(v),
        }
    }
}

/// The device ids, copied down through page-locked memory.
fn ids_down(l: &mut Lease<'_>, ids: &DeviceIds) -> Result<HostIds> {
    let bytes = ids.len * ids.id_type.size();
    let dst = l.host(Host::Ids, bytes)?.as_mut_ptr();
    // SAFETY: the ids hold `bytes` bytes; `dst` is page-locked, long enough,
    // and read only after the wait.
    unsafe { l.copy(StreamCopy::ToHost { dst, src: ids.buf.addr(), len: bytes }) }?;
    l.wait()?;
    let b = &l.host(Host::Ids, bytes)?.as_slice()[..bytes];
    Ok(match ids.id_type {
        IdType::I32 => HostIds::I32(bytemuck::pod_collect_to_vec(b)),
        IdType::I64 => HostIds::I64(bytemuck::pod_collect_to_vec(b)),
    })
}

/// Rows `rows` of this rank (local numbers, checked by the caller) as
/// device ids in scratch, uploaded through page-locked memory.
fn local_ids(l: &mut Lease<'_>, rows: &[usize]) -> Result<DevIds> {
    let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let n = ids.len();
    let at = ids_on_device(l, IdsAt::Host(Ids::I64(&ids)))?;
    debug_assert_eq!(at.n, n);
    Ok(at)
}

/// Reads this rank's own rows `rows` (numbered from 0, checked by the
/// caller), converted by `conv`, into the dense host buffer `out`.
pub(crate) fn gather_local(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], out: &mut [u8]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut l = Lease::take(mem)?;
    let at = local_ids(&mut l, rows)?;
    let o = owners(&mut l, mem, layout, Reach::Own)?;
    let dst = l.dev(Dev::Rows, out.len())?;
    // SAFETY: the rows are below this rank's row count (the caller's
    // check); `dst` is scratch sized for the output.
    unsafe { gather_rows(&mut l, o, Rows::of(layout, conv.to()), at, dst, 0) }?;
    rows_down(&mut l, dst, OutAt::Host(out))
}

/// Writes dense host rows `src` (of `conv`'s source type) into this rank's
/// own rows `rows` (numbered from 0, checked by the caller); the last
/// occurrence of a row wins, resolved on the device.
pub(crate) fn scatter_local(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], src: &[u8]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut l = Lease::take(mem)?;
    let from = src_on_device(&mut l, SrcAt::Host(src))?;
    let at = local_ids(&mut l, rows)?;
    let o = owners(&mut l, mem, layout, Reach::Own)?;
    let keep = resolve_repeats(&mut l, at, 0, mem.local_rows().len() as i64)?;
    // SAFETY: as in `gather_local`, the other way; `keep` marks one position per row.
    unsafe { scatter_rows(&mut l, o, Rows::of(layout, conv.from()), at, from, keep, 0) }?;
    l.wait()
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
                // DeviceIds::upload allocates and fills the caller's ids (not
                // per call of a gather); the host routes hand host-checked ids
                // to the host exchange.
                "mod.rs" if dir.is_dir() => &[("DeviceBuffer::new(", 1), (".upload(", 1), ("first_out_of_range", 2)],
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
