//! Gather and scatter on the GPU: the kernels of [`crate::cuda`] over device
//! memory, and over host memory registered with CUDA.
//!
//! | memory | [`gather`](crate::gather) with host buffers | [`gather_device`] with device buffers |
//! |---|---|---|
//! | device Continuous, Chunked | ids up, one kernel over the mapping, rows down | one kernel over the mapping |
//! | device Distributed, Hierarchy | the host exchange (ids and rows travel through the communicator); each owner's rows are read by a kernel | the same, staged through the host |
//! | host (registered) Continuous, Chunked | the CPU path | one kernel reading host memory over the bus |
//!
//! Device ids are validated once, on the host, when they are uploaded
//! ([`DeviceIds::upload`]), so a kernel never sees an id out of range.

use std::sync::{Arc, OnceLock};

use wholemem::device::{DeviceBuffer, raw};
use wholemem::{Location, MemoryType, WholeMemory};

use crate::cuda::{GatherArgs, IdType, Kernels, ScatterArgs};
use crate::kernel::RowConv;
use crate::{DType, Error, Ids, Result, RowLayout};

/// The kernels, loaded once into this process's context (a process uses one
/// GPU).
fn kernels(mem: &WholeMemory) -> Result<Arc<Kernels>> {
    static KERNELS: OnceLock<std::result::Result<Arc<Kernels>, String>> = OnceLock::new();
    let ctx = raw::context(mem).ok_or_else(|| Error::Cuda(format!("rank {} has no GPU for this table", mem.comm().world_rank())))?;
    KERNELS.get_or_init(|| Kernels::load(&ctx).map(Arc::new).map_err(|e| e.to_string())).clone().map_err(Error::Cuda)
}

fn stream(mem: &WholeMemory) -> Result<Arc<raw::cudarc::driver::CudaStream>> {
    raw::stream(mem).ok_or_else(|| Error::Cuda(format!("rank {} has no GPU for this table", mem.comm().world_rank())))
}

fn sync(mem: &WholeMemory) -> Result<()> {
    stream(mem)?.synchronize().map_err(|e| Error::Cuda(format!("waiting for the GPU: {e:?}")))
}

/// Row ids in device memory, checked against a table's row count when they
/// were uploaded.
#[derive(Debug)]
pub struct DeviceIds {
    buf: DeviceBuffer,
    id_type: IdType,
    len: usize,
    rows: usize,
}

impl DeviceIds {
    /// Checks `ids` against `mem`'s rows and copies them to its rank's GPU.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] naming the first bad id; [`Error::Memory`]
    /// when the rank has no GPU or the copy fails.
    pub fn upload(mem: &WholeMemory, ids: Ids<'_>) -> Result<Self> {
        if let Some((position, index)) = ids.first_out_of_range(mem.rows()) {
            return Err(Error::IndexOutOfRange { index, position, rank: mem.comm().world_rank(), rows: mem.rows() });
        }
        let (bytes, id_type): (&[u8], IdType) = match ids {
            Ids::I32(v) => (bytemuck::cast_slice(v), IdType::I32),
            Ids::I64(v) => (bytemuck::cast_slice(v), IdType::I64),
        };
        let mut buf = DeviceBuffer::new(mem, bytes.len())?;
        buf.upload(bytes)?;
        Ok(Self { buf, id_type, len: ids.len(), rows: mem.rows() })
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, mem: &WholeMemory) -> Result<()> {
        if self.rows != mem.rows() {
            return Err(Error::InvalidArgument(format!(
                "these device ids were checked for a table of {} rows, not {}",
                self.rows,
                mem.rows()
            )));
        }
        Ok(())
    }
}

/// Where each owner's rows start, as the rank's GPU addresses them.
struct OwnerTable {
    bases: DeviceBuffer,
    first_rows: DeviceBuffer,
    ranks: u32,
}

/// Which rows a kernel reaches, and how they are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Every row of a mapped table, by global id.
    Mapped,
    /// This rank's own rows, numbered from 0.
    Own,
    /// This rank's own rows, by global id.
    OwnGlobal,
}

impl OwnerTable {
    fn new(mem: &WholeMemory, layout: &RowLayout, reach: Reach) -> Result<Self> {
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
        let (bases, first): (Vec<u64>, Vec<i64>) = if reach == Reach::Own {
            (vec![mem.device_ptr(me).ok_or_else(|| unreachable(me))? + skip], vec![0, p.count(me) as i64])
        } else if reach == Reach::OwnGlobal {
            (vec![mem.device_ptr(me).ok_or_else(|| unreachable(me))? + skip], vec![p.offset(me) as i64, p.offset(me + 1) as i64])
        } else if mem.memory_type() == MemoryType::Continuous {
            (vec![mem.device_ptr(0).ok_or_else(|| unreachable(0))? + skip], vec![0, mem.rows() as i64])
        } else {
            let b = (0..p.world()).map(|r| mem.device_ptr(r).map(|a| a + skip).ok_or_else(|| unreachable(r))).collect::<Result<_>>()?;
            (b, (0..=p.world()).map(|r| p.offset(r) as i64).collect())
        };
        let mut b = DeviceBuffer::new(mem, bases.len() * 8)?;
        b.upload(bytemuck::cast_slice(&bases))?;
        let mut f = DeviceBuffer::new(mem, first.len() * 8)?;
        f.upload(bytemuck::cast_slice(&first))?;
        Ok(Self { bases: b, first_rows: f, ranks: bases.len() as u32 })
    }
}

/// One gather kernel over a table: dense output rows of `out_dtype`.
fn launch_gather(mem: &WholeMemory, layout: &RowLayout, reach: Reach, ids: (u64, IdType, usize), out: u64, out_dtype: DType) -> Result<()> {
    RowConv::new(layout.dtype(), out_dtype, layout.cols())?;
    if ids.2 == 0 {
        return Ok(());
    }
    let table = OwnerTable::new(mem, layout, reach)?;
    let args = GatherArgs {
        bases: table.bases.addr(),
        first_rows: table.first_rows.addr(),
        ranks: table.ranks,
        row_stride_bytes: mem.granularity() as u64,
        table_dtype: layout.dtype(),
        dim: layout.cols() as u32,
        ids: ids.0,
        id_type: ids.1,
        n_ids: ids.2 as u64,
        out,
        out_stride_bytes: (layout.cols() * out_dtype.size()) as u64,
        out_dtype,
        status: 0,
    };
    let k = kernels(mem)?;
    // SAFETY: the owner table holds every rank's (or this rank's) base as
    // the GPU addresses it, with ascending first rows; the ids were checked
    // against the rows they index (DeviceIds::upload, or the exchange's own
    // local rows); `out` holds `n_ids` rows of the output stride and is a
    // separate buffer; the stream is synchronised before the table drops.
    unsafe { k.gather(&stream(mem)?, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;
    sync(mem)
}

/// One scatter kernel: dense rows of `src_dtype` into table rows, keeping
/// only the last occurrence of a repeated id.
fn launch_scatter(
    mem: &WholeMemory,
    layout: &RowLayout,
    reach: Reach,
    ids: (u64, IdType, usize),
    keep: &[u8],
    src: u64,
    src_dtype: DType,
) -> Result<()> {
    RowConv::new(src_dtype, layout.dtype(), layout.cols())?;
    if ids.2 == 0 {
        return Ok(());
    }
    let table = OwnerTable::new(mem, layout, reach)?;
    let mut mask = DeviceBuffer::new(mem, keep.len())?;
    mask.upload(keep)?;
    let args = ScatterArgs {
        bases: table.bases.addr(),
        first_rows: table.first_rows.addr(),
        ranks: table.ranks,
        row_stride_bytes: mem.granularity() as u64,
        table_dtype: layout.dtype(),
        dim: layout.cols() as u32,
        ids: ids.0,
        id_type: ids.1,
        n_ids: ids.2 as u64,
        src,
        src_stride_bytes: (layout.cols() * src_dtype.size()) as u64,
        src_dtype,
        keep: mask.addr(),
        status: 0,
    };
    let k = kernels(mem)?;
    // SAFETY: as for the gather; in addition `keep` marks at most one
    // occurrence of each row, so no two threads write one row.
    unsafe { k.scatter(&stream(mem)?, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;
    sync(mem)
}

/// 1 for the last occurrence of each row, 0 for earlier ones.
pub(crate) fn last_occurrences(rows: &[usize]) -> Vec<u8> {
    let mut seen = std::collections::HashSet::with_capacity(rows.len());
    let mut keep = vec![0u8; rows.len()];
    for (i, r) in rows.iter().enumerate().rev() {
        if seen.insert(*r) {
            keep[i] = 1;
        }
    }
    keep
}

/// Gathers rows `ids` of a table into `out`, all in device memory: `ids.len()`
/// rows of `layout.cols` elements of `out_dtype`.
///
/// For continuous and chunked memory (on the device, or on the host and
/// registered with CUDA) one kernel reads every row through the mapping; not
/// collective. For distributed and hierarchy memory it is collective and
/// staged through the host exchange.
///
/// # Errors
/// [`Error::InvalidArgument`] for a wrong buffer size or ids checked for
/// another table; [`Error::Conversion`]; [`Error::Cuda`] when the GPU cannot
/// reach the rows or a launch fails; the exchange's errors.
pub fn gather_device(mem: &WholeMemory, layout: &RowLayout, ids: &DeviceIds, out: &mut DeviceBuffer, out_dtype: DType) -> Result<()> {
    layout.check_fits(mem.granularity())?;
    ids.check(mem)?;
    let Some(want) = layout.cols().checked_mul(out_dtype.size()).and_then(|row| ids.len.checked_mul(row)) else {
        return Err(Error::InvalidArgument(format!(
            "{} rows of {} {out_dtype} elements are more than usize::MAX bytes",
            ids.len,
            layout.cols()
        )));
    };
    if out.len() < want {
        return Err(Error::InvalidArgument(format!("the device output has {} bytes; {} rows need {want}", out.len(), ids.len)));
    }
    if mem.memory_type().is_mapped() {
        return launch_gather(mem, layout, Reach::Mapped, (ids.buf.addr(), ids.id_type, ids.len), out.addr(), out_dtype);
    }
    if let Ok(nccl) = mem.device_comm() {
        return gather_nccl(mem, nccl, layout, ids, out, out_dtype);
    }
    let mut host_ids = vec![0u8; ids.len * ids.id_type.size()];
    ids.buf.download(&mut host_ids)?;
    let mut host_out = vec![0u8; want];
    let host = typed_ids(&host_ids, ids.id_type);
    crate::gather(mem, layout, host.ids(), &mut host_out, out_dtype)?;
    out.upload(&host_out)?;
    Ok(())
}

/// The device exchange of distributed (and hierarchy) memory over NCCL:
/// bucket the ids by owner on the GPU, send them to their owners, each owner
/// gathers the rows it was asked for, the rows come back, and a scatter
/// puts them in output order. Collective.
fn gather_nccl(
    mem: &WholeMemory,
    nccl: &dyn wm_comm::nccl::DeviceCommunicator,
    layout: &RowLayout,
    ids: &DeviceIds,
    out: &mut DeviceBuffer,
    out_dtype: DType,
) -> Result<()> {
    use wm_comm::CommExt;
    let comm = mem.comm();
    let (n, me) = (comm.size(), comm.rank());
    let p = mem.partition();
    let rb = layout.cols() * out_dtype.size();
    let fits = if ids.len >= i32::MAX as usize {
        Err(Error::InvalidArgument(format!("{} ids in one device exchange; at most {}", ids.len, i32::MAX - 1)))
    } else {
        RowConv::new(layout.dtype(), out_dtype, layout.cols()).map(drop).map_err(Error::from)
    };
    crate::agree(comm.as_ref(), fits)?;
    let k = kernels(mem)?;
    let s = stream(mem)?;

    // 1. Bucket by owner, on the GPU.
    let len = ids.len.max(1);
    let first: Vec<i64> = (0..=n).map(|r| p.offset(r) as i64).collect();
    let mut first_rows = DeviceBuffer::new(mem, first.len() * 8)?;
    first_rows.upload(bytemuck::cast_slice(&first))?;
    let owner = DeviceBuffer::new(mem, len * 4)?;
    let counts_buf = DeviceBuffer::new(mem, n * 4)?;
    let cursors = DeviceBuffer::new(mem, n * 4)?;
    let bucketed = DeviceBuffer::new(mem, len * 8)?;
    let positions = DeviceBuffer::new(mem, len * 4)?;
    let args = crate::cuda::BucketArgs {
        first_rows: first_rows.addr(),
        ranks: n as u32,
        ids: ids.buf.addr(),
        id_type: ids.id_type,
        n_ids: ids.len as u64,
        owner: owner.addr(),
        counts: counts_buf.addr(),
        cursors: cursors.addr(),
        out_ids: bucketed.addr(),
        positions: positions.addr(),
    };
    // SAFETY: every buffer is this rank's, sized as BucketArgs documents;
    // the ids were checked against the table's rows on upload.
    let counts = unsafe { k.bucket(&s, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;

    // 2. Who asks whom for how many: every rank's counts.
    let all = comm.allgather_pod(&counts.iter().map(|&c| u64::from(c)).collect::<Vec<u64>>())?;
    let asked: Vec<usize> = (0..n).map(|r| all[r * n + me] as usize).collect();
    let total_asked: usize = asked.iter().sum();
    let offsets = |v: &[usize]| -> Vec<usize> {
        v.iter()
            .scan(0usize, |acc, &c| {
                let at = *acc;
                *acc += c;
                Some(at)
            })
            .collect()
    };
    let mine: Vec<usize> = counts.iter().map(|&c| c as usize).collect();
    let (send_at, recv_at) = (offsets(&mine), offsets(&asked));

    // 3. The ids travel to their owners.
    let requests = DeviceBuffer::new(mem, total_asked.max(1) * 8)?;
    let send: Vec<(u64, usize)> = (0..n).map(|r| (bucketed.addr() + (send_at[r] * 8) as u64, mine[r] * 8)).collect();
    let recv: Vec<(u64, usize)> = (0..n).map(|r| (requests.addr() + (recv_at[r] * 8) as u64, asked[r] * 8)).collect();
    // SAFETY: the ranges lie inside `bucketed` and `requests`, which live
    // past the call; the receive lengths are what each peer sends (from the
    // allgathered counts).
    unsafe { nccl.alltoallv(&send, &recv, &s) }?;

    // 4. Each owner reads the rows it was asked for (global ids of its own rows).
    let replies = DeviceBuffer::new(mem, total_asked.max(1) * rb)?;
    launch_gather(mem, layout, Reach::OwnGlobal, (requests.addr(), IdType::I64, total_asked), replies.addr(), out_dtype)?;

    // 5. The rows travel back, into bucket order.
    let staged = DeviceBuffer::new(mem, len * rb)?;
    let send: Vec<(u64, usize)> = (0..n).map(|r| (replies.addr() + (recv_at[r] * rb) as u64, asked[r] * rb)).collect();
    let recv: Vec<(u64, usize)> = (0..n).map(|r| (staged.addr() + (send_at[r] * rb) as u64, mine[r] * rb)).collect();
    // SAFETY: as above, the other way round.
    unsafe { nccl.alltoallv(&send, &recv, &s) }?;

    // 6. Into output order: staged row k goes to out[positions[k]].
    if ids.len == 0 {
        return Ok(());
    }
    let out_first: [i64; 2] = [0, ids.len as i64];
    let mut out_rows = DeviceBuffer::new(mem, 16)?;
    out_rows.upload(bytemuck::cast_slice(&out_first))?;
    let out_base: [u64; 1] = [out.addr()];
    let mut out_bases = DeviceBuffer::new(mem, 8)?;
    out_bases.upload(bytemuck::cast_slice(&out_base))?;
    let args = ScatterArgs {
        bases: out_bases.addr(),
        first_rows: out_rows.addr(),
        ranks: 1,
        row_stride_bytes: rb as u64,
        table_dtype: out_dtype,
        dim: layout.cols() as u32,
        ids: positions.addr(),
        id_type: IdType::I32,
        n_ids: ids.len as u64,
        src: staged.addr(),
        src_stride_bytes: rb as u64,
        src_dtype: out_dtype,
        keep: 0,
        status: 0,
    };
    // SAFETY: positions are a permutation of 0..ids.len (below i32::MAX,
    // checked), so every row of `out` is written once; `staged` holds that
    // many rows; `out` holds at least as many (checked by the caller).
    unsafe { k.scatter(&s, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;
    sync(mem)
}

enum OwnedIds {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl OwnedIds {
    fn ids(&self) -> Ids<'_> {
        match self {
            Self::I32(v) => Ids::I32(v),
            Self::I64(v) => Ids::I64(v),
        }
    }
}

fn typed_ids(bytes: &[u8], t: IdType) -> OwnedIds {
    match t {
        IdType::I32 => OwnedIds::I32(bytemuck::pod_collect_to_vec(bytes)),
        IdType::I64 => OwnedIds::I64(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// Device-memory gather with host ids and output (the path of
/// [`crate::gather`] for mapped device memory).
pub(crate) fn gather_mapped(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, out: &mut [u8]) -> Result<()> {
    let d = DeviceIds::upload(mem, ids)?;
    let dev_out = DeviceBuffer::new(mem, out.len())?;
    launch_gather(mem, layout, Reach::Mapped, (d.buf.addr(), d.id_type, d.len), dev_out.addr(), conv.to())?;
    dev_out.download(out)?;
    Ok(())
}

/// Device-memory scatter with host ids and input (mapped device memory).
pub(crate) fn scatter_mapped(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, src: &[u8]) -> Result<()> {
    let keep = last_occurrences(&ids.to_rows());
    let d = DeviceIds::upload(mem, ids)?;
    let mut dev_src = DeviceBuffer::new(mem, src.len())?;
    dev_src.upload(src)?;
    launch_scatter(mem, layout, Reach::Mapped, (d.buf.addr(), d.id_type, d.len), &keep, dev_src.addr(), conv.from())
}

/// Reads this rank's own rows `rows` (numbered from 0), converted by
/// `conv`, into the dense host buffer `out`.
pub(crate) fn gather_local(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], out: &mut [u8]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let mut d = DeviceBuffer::new(mem, ids.len() * 8)?;
    d.upload(bytemuck::cast_slice(&ids))?;
    let dev_out = DeviceBuffer::new(mem, out.len())?;
    launch_gather(mem, layout, Reach::Own, (d.addr(), IdType::I64, ids.len()), dev_out.addr(), conv.to())?;
    dev_out.download(out)?;
    Ok(())
}

/// Writes dense host rows `src` (of `conv`'s source type) into this rank's
/// own rows `rows` (numbered from 0); the last occurrence of a row wins.
pub(crate) fn scatter_local(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, rows: &[usize], src: &[u8]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let keep = last_occurrences(rows);
    let ids: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let mut d = DeviceBuffer::new(mem, ids.len() * 8)?;
    d.upload(bytemuck::cast_slice(&ids))?;
    let mut dev_src = DeviceBuffer::new(mem, src.len())?;
    dev_src.upload(src)?;
    launch_scatter(mem, layout, Reach::Own, (d.addr(), IdType::I64, ids.len()), &keep, dev_src.addr(), conv.from())
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
    /// the rows; the device owner table of one "rank" (the buffer).
    fn table(&self, mem: &WholeMemory, buf: &DeviceBuffer, layout: &RowLayout, slots: &[usize]) -> Result<OwnerTable> {
        if layout.offset() != 0 || layout.bytes() > self.stride || self.rows.checked_mul(self.stride).is_none_or(|b| b > buf.len()) {
            return Err(Error::InvalidArgument(format!(
                "{} slot rows of {} bytes ({} used) in a device buffer of {} bytes",
                self.rows,
                self.stride,
                layout.bytes(),
                buf.len()
            )));
        }
        if let Some(bad) = slots.iter().find(|&&s| s >= self.rows) {
            return Err(Error::InvalidArgument(format!("slot {bad} of {} slots", self.rows)));
        }
        let mut b = DeviceBuffer::new(mem, 8)?;
        b.upload(&buf.addr().to_le_bytes())?;
        let mut f = DeviceBuffer::new(mem, 16)?;
        f.upload(bytemuck::cast_slice(&[0i64, self.rows as i64]))?;
        Ok(OwnerTable { bases: b, first_rows: f, ranks: 1 })
    }
}

/// Slot numbers as device ids.
fn slot_ids(mem: &WholeMemory, slots: &[usize]) -> Result<DeviceBuffer> {
    let ids: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
    let mut d = DeviceBuffer::new(mem, (ids.len() * 8).max(8))?;
    d.upload(bytemuck::cast_slice(&ids))?;
    Ok(d)
}

/// Copies slot rows `slots` (their `layout` elements, unconverted) into the
/// dense host buffer `out`, on the GPU of `mem`'s rank.
///
/// # Errors
/// [`Error::InvalidArgument`] for a slot past the rows or a wrongly sized
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
        return Err(Error::InvalidArgument(format!("{} bytes for {} slot rows of {rb} bytes", out.len(), slots.len())));
    }
    if slots.is_empty() {
        return Ok(());
    }
    let table = rows.table(mem, buf, layout, slots)?;
    let ids = slot_ids(mem, slots)?;
    let dense = DeviceBuffer::new(mem, out.len())?;
    let args = GatherArgs {
        bases: table.bases.addr(),
        first_rows: table.first_rows.addr(),
        ranks: 1,
        row_stride_bytes: rows.stride as u64,
        table_dtype: layout.dtype(),
        dim: layout.cols() as u32,
        ids: ids.addr(),
        id_type: IdType::I64,
        n_ids: slots.len() as u64,
        out: dense.addr(),
        out_stride_bytes: rb as u64,
        out_dtype: layout.dtype(),
        status: 0,
    };
    let k = kernels(mem)?;
    // SAFETY: the owner table holds the slot buffer's address with rows
    // 0..rows, which the buffer holds (checked); every id is below rows
    // (checked); `dense` holds one output row per id; the stream is
    // synchronised before the buffers drop.
    unsafe { k.gather(&stream(mem)?, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;
    sync(mem)?;
    dense.download(out)?;
    Ok(())
}

/// Writes the dense host rows `src` (`layout`'s elements, unconverted) into
/// slot rows `slots` (distinct), on the GPU of `mem`'s rank.
///
/// # Errors
/// As [`read_slots`]; [`Error::InvalidArgument`] for a repeated slot.
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
        return Err(Error::InvalidArgument(format!("{} bytes for {} slot rows of {rb} bytes", src.len(), slots.len())));
    }
    if slots.is_empty() {
        return Ok(());
    }
    if !crate::kernel::distinct_below(slots, rows.rows) {
        return Err(Error::InvalidArgument(format!("{} slots that are not distinct slots of {}", slots.len(), rows.rows)));
    }
    let table = rows.table(mem, buf, layout, slots)?;
    let ids = slot_ids(mem, slots)?;
    let mut dense = DeviceBuffer::new(mem, src.len())?;
    dense.upload(src)?;
    let args = ScatterArgs {
        bases: table.bases.addr(),
        first_rows: table.first_rows.addr(),
        ranks: 1,
        row_stride_bytes: rows.stride as u64,
        table_dtype: layout.dtype(),
        dim: layout.cols() as u32,
        ids: ids.addr(),
        id_type: IdType::I64,
        n_ids: slots.len() as u64,
        src: dense.addr(),
        src_stride_bytes: rb as u64,
        src_dtype: layout.dtype(),
        keep: 0,
        status: 0,
    };
    let k = kernels(mem)?;
    // SAFETY: as in `read_slots`; the slots are distinct (checked), so no
    // two threads write one row.
    unsafe { k.scatter(&stream(mem)?, &args) }.map_err(|e| Error::Cuda(e.to_string()))?;
    sync(mem)
}

#[cfg(test)]
mod tests {
    use super::last_occurrences;

    #[test]
    fn only_the_last_occurrence_of_a_row_is_kept() {
        assert_eq!(last_occurrences(&[3, 1, 3, 2, 1, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(last_occurrences(&[]), Vec::<u8>::new());
    }
}
