//! The row kernels launched on a lease: the ids of a call on the device,
//! the owner tables of a table's rows, the check, repeat and row launches,
//! and this rank's own rows read and written (the exchange's local step).
//! Below every route of the module: it imports none of them, nor the
//! exchange.

use wholemem::CommonError;
use wholemem::device::DeviceBuffer;
use wholemem::{Location, MemoryType, WholeMemory};

use super::checks;
use super::staging::{Dev, Host, Lease, cuda};
use crate::cuda::{CheckArgs, GatherArgs, IdType, RepeatArgs, ScatterArgs, StreamCopy};
use crate::kernel::RowConv;
use crate::{DType, Error, Ids, Result, RowLayout};

/// Row ids in device memory, for [`gather_device`](super::gather_device) and [`scatter_device`](super::scatter_device),
/// which check them against the table they are used with, on the device.
#[derive(Debug)]
pub struct DeviceIds {
    pub(super) buf: DeviceBuffer,
    pub(super) id_type: IdType,
    pub(super) len: usize,
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

    pub(super) fn at(&self) -> DevIds {
        DevIds { addr: self.buf.addr(), ty: self.id_type, n: self.len }
    }
}

/// Ids on the device, as a launch names them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DevIds {
    pub(super) addr: u64,
    pub(super) ty: IdType,
    pub(super) n: usize,
}

/// A call's ids: the caller's on the device, or on the host.
#[derive(Debug, Clone, Copy)]
pub(crate) enum IdsAt<'a> {
    Device(&'a DeviceIds),
    Host(Ids<'a>),
}

impl IdsAt<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            IdsAt::Device(d) => d.len,
            IdsAt::Host(h) => h.len(),
        }
    }
}

/// The ids on the device: the caller's, or host ids copied up through
/// page-locked memory into `Dev::Ids` (enqueued, not waited for).
pub(super) fn ids_on_device(l: &mut Lease<'_>, ids: IdsAt<'_>) -> Result<DevIds> {
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
pub(super) fn name_bad_id(l: &mut Lease<'_>, mem: &WholeMemory, ids: IdsAt<'_>, at: DevIds, position: usize) -> Error {
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
pub(super) fn read_id(l: &mut Lease<'_>, at: DevIds, position: usize) -> Result<i64> {
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
pub(super) fn wait_for_status(l: &mut Lease<'_>, status: u64, words: usize) -> Result<Vec<u64>> {
    let dst = l.host(Host::Control, words * 8)?.as_mut_ptr();
    // SAFETY: `status` holds `words` u64 (sized by the caller); `dst` is
    // page-locked, long enough, and read only after the wait.
    unsafe { l.copy(StreamCopy::ToHost { dst, src: status, len: words * 8 }) }?;
    l.wait()?;
    Ok(bytemuck::pod_collect_to_vec(&l.host(Host::Control, words * 8)?.as_slice()[..words * 8]))
}

/// Enqueues a reset of `words` status words (to "no bad id").
pub(super) fn reset_status(l: &mut Lease<'_>, words: usize) -> Result<u64> {
    let status = l.dev(Dev::Status, words * 8)?;
    // SAFETY: `status` holds `words` u64 (just sized).
    unsafe { l.k.reset_status(&l.stream, status, words) }.map_err(cuda)?;
    l.enqueued();
    Ok(status)
}

/// Enqueues the check of `ids` against `lo..hi` into the status word.
pub(super) fn check_ids(l: &mut Lease<'_>, ids: DevIds, lo: i64, hi: i64, status: u64) -> Result<()> {
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
    pub(super) bases: u64,
    pub(super) first_rows: u64,
    pub(super) ranks: u32,
    /// Bytes from one row to the next.
    pub(super) stride: u64,
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
pub(super) fn owners(l: &mut Lease<'_>, mem: &WholeMemory, layout: &RowLayout, reach: Reach) -> Result<Owners> {
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
pub(super) fn dense(l: &mut Lease<'_>, addr: u64, rows: usize, stride: usize) -> Result<Owners> {
    let content: Vec<u8> = [addr.to_le_bytes(), 0i64.to_le_bytes(), (rows as i64).to_le_bytes()].concat();
    let at = l.table(Dev::BufTable, &content)?;
    Ok(Owners { bases: at, first_rows: at + 8, ranks: 1, stride: stride as u64 })
}

/// The rows a row kernel moves: `dim` elements, table and dense types.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows {
    pub(super) table_dtype: DType,
    pub(super) dim: u32,
    /// The dense side's type.
    pub(super) buf_dtype: DType,
}

impl Rows {
    pub(super) fn of(layout: &RowLayout, buf_dtype: DType) -> Self {
        Self { table_dtype: layout.dtype(), dim: layout.cols() as u32, buf_dtype }
    }

    /// Bytes of one dense row.
    pub(super) fn buf_bytes(&self) -> usize {
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
pub(super) unsafe fn gather_rows(l: &mut Lease<'_>, o: Owners, rows: Rows, ids: DevIds, out: u64, status: u64) -> Result<()> {
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
pub(super) unsafe fn scatter_rows(l: &mut Lease<'_>, o: Owners, rows: Rows, ids: DevIds, src: u64, keep: u64, status: u64) -> Result<()> {
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
pub(super) fn resolve_repeats(l: &mut Lease<'_>, ids: DevIds, lo: i64, hi: i64) -> Result<u64> {
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
pub(super) fn out_on_device(l: &mut Lease<'_>, out: &OutAt<'_>) -> Result<u64> {
    match out {
        OutAt::Device(a) => Ok(*a),
        OutAt::Host(buf) => l.dev(Dev::Rows, buf.len()),
    }
}

/// Brings the rows of a host output down (after the call's checks passed).
pub(super) fn rows_down(l: &mut Lease<'_>, from: u64, out: OutAt<'_>) -> Result<()> {
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
pub(super) fn src_on_device(l: &mut Lease<'_>, src: SrcAt<'_>) -> Result<u64> {
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

/// Ids copied down from the device.
pub(super) enum HostIds {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl HostIds {
    pub(super) fn ids(&self) -> Ids<'_> {
        match self {
            HostIds::I32(v) => Ids::I32(v),
            HostIds::I64(v) => Ids::I64(v),
        }
    }
}

/// The device ids, copied down through page-locked memory.
pub(super) fn ids_down(l: &mut Lease<'_>, ids: &DeviceIds) -> Result<HostIds> {
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
pub(super) fn local_ids(l: &mut Lease<'_>, rows: &[usize]) -> Result<DevIds> {
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
