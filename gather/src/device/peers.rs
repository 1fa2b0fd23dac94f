//! The device exchange of distributed and hierarchy memory between ranks
//! that map each other's GPU memory (one node; the same GPU, or GPUs with
//! P2P access): every rank holds a device buffer its peers map through
//! CUDA IPC ([`wholemem::device::PeerBuffers`]), and each rank *pushes* the
//! ids (and a scatter's rows) it has for an owner straight into that
//! owner's buffer, in rank order. Nothing passes through the host but the
//! counts and the outcomes; a rank's own rows move on its GPU like any
//! other's. NCCL (one GPU per rank, any nodes) follows the same plan over
//! its send/recv ([`gather_nccl`]).
//!
//! A gather, on every rank:
//!
//! 1. its ids checked and bucketed by owner on its GPU; the counts and
//!    the check's status word come down (one wait);
//! 2. every rank's outcome and counts allgathered ([`Plan`]): a bad id
//!    anywhere fails every rank, naming it;
//! 3. the shared buffers grown if the plan needs it (collective, rare);
//! 4. each bucket copied into its owner's buffer (device to device), one
//!    wait, and 5. every rank meets;
//! 6. each owner checks the ids it received (a peer's are input), gathers
//!    them from its rows into its buffer, and 7. the owners' verdicts are
//!    agreed;
//! 8. each rank scatters the rows its owners gathered, read from their
//!    buffers, into its output (one wait).
//!
//! A scatter pushes its rows (converted to the table's type, in bucket
//! order) with its ids; each owner checks them, resolves repeats over what
//! it received — in rank order, so the highest rank's last occurrence wins,
//! as on the host — and writes its rows; then the verdicts are agreed.
//!
//! No rank passes step 2's collective before every rank has finished the
//! call before (its last wait included), so nothing a call pushes or
//! gathers into a buffer can meet a peer still reading the last call's
//! rows there, and a buffer regrown in step 3 is no longer read by anyone.
//! Within a call, step 5's meeting orders the pushes before the owners'
//! reads, and step 7's collective the owners' rows before the reads of
//! step 8.

use wholemem::CommonError;
use wholemem::WholeMemory;
use wholemem::agree::{Rule, agree};
use wholemem::device::DeviceBuffer;
use wm_comm::nccl::DeviceCommunicator;

use super::checks;
use super::launch::{
    DevIds, DeviceIds, IdsAt, OutAt, Reach, Rows, SrcAt, check_ids, dense, gather_rows, ids_on_device, name_bad_id, out_on_device, owners,
    read_id, reset_status, resolve_repeats, rows_down, scatter_rows, src_on_device, wait_for_status,
};
use super::plan::Plan;
use super::staging::{Dev, Host, Lease, cuda};
use super::timing::Marks;
use crate::cuda::{BucketArgs, IdType, StreamCopy};
use crate::kernel::RowConv;
use crate::profile::Clock;
use crate::{DType, Error, Result, RowLayout};

/// The most ids one rank sends or one owner receives in a call: positions
/// travel as `i32` ids.
const MAX_IDS: usize = i32::MAX as usize - 1;

/// Whether the ranks of `mem` (device memory) map each other's buffers.
/// Collective the first time.
pub(crate) fn route(mem: &WholeMemory) -> Result<bool> {
    Ok(mem.peer_buffers().route(mem)?.is_ok())
}

/// What step 1 leaves: the ids on the device (bucketed in `Dev::Bucketed`,
/// their positions in `Dev::Positions`) and the counts per owner.
struct Bucketed {
    ids: DevIds,
    counts: Vec<u32>,
}

/// Step 1: `ids` up (host ids), checked against the table's rows and
/// bucketed by owner, on the device; the counts and the status word come
/// down (one wait). A bad id is named.
fn bucket(l: &mut Lease<'_>, mem: &WholeMemory, ids: IdsAt<'_>) -> Result<Bucketed> {
    if ids.len() > MAX_IDS {
        return Err(Error::Common(CommonError::InvalidArgument(format!("{} ids in one device exchange; at most {MAX_IDS}", ids.len()))));
    }
    let p = mem.partition();
    let n = p.world();
    let at = ids_on_device(l, ids)?;
    let first: Vec<i64> = (0..=n).map(|r| p.offset(r) as i64).collect();
    let first_rows = l.table(Dev::Partition, bytemuck::cast_slice(&first))?;
    let status = reset_status(l, 1)?;
    check_ids(l, at, 0, mem.rows() as i64, status)?;
    let len = at.n.max(1);
    let args = BucketArgs {
        first_rows,
        ranks: n as u32,
        ids: at.addr,
        id_type: at.ty,
        n_ids: at.n as u64,
        owner: l.dev(Dev::Owner, len * 4)?,
        counts: l.dev(Dev::Counts, n * 4)?,
        cursors: l.dev(Dev::Cursors, n * 4)?,
        out_ids: l.dev(Dev::Bucketed, len * 8)?,
        positions: l.dev(Dev::Positions, len * 4)?,
    };
    // SAFETY: every buffer is the lease's scratch, sized as BucketArgs
    // documents; `first_rows` holds the partition's n + 1 ascending first
    // rows. An id out of range (found by the check) is still bucketed
    // safely: the owner search never leaves its arrays, and the slots come
    // from the counts of the same owners.
    unsafe { l.k.bucket_on_device(&l.stream, &args) }.map_err(cuda)?;
    l.enqueued();
    let ctl = l.host(Host::Control, 8 + 4 * n)?.as_mut_ptr();
    // SAFETY: `ctl` is page-locked, 8 + 4n bytes at least, read after the
    // wait; the status word and the counts are scratch of those sizes.
    unsafe {
        l.copy(StreamCopy::ToHost { dst: ctl, src: status, len: 8 })?;
        l.copy(StreamCopy::ToHost { dst: ctl.add(8), src: args.counts, len: 4 * n })?;
    }
    l.wait()?;
    let c = &l.host(Host::Control, 8 + 4 * n)?.as_slice()[..8 + 4 * n];
    let word = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
    let counts: Vec<u32> = bytemuck::pod_collect_to_vec(&c[8..]);
    if let Some(position) = checks::first_bad(word, at.n) {
        return Err(name_bad_id(l, mem, ids, at, position));
    }
    Ok(Bucketed { ids: at, counts })
}

/// Step 2: every rank's outcome of step 1 and its counts: the plan, or
/// the lowest failing rank's error on every rank.
fn agree_plan(mem: &WholeMemory, mine: Result<Bucketed>) -> Result<(Bucketed, Plan)> {
    let comm = mem.comm();
    let extra: Vec<u8> = match &mine {
        Ok(b) => b.counts.iter().flat_map(|&c| u64::from(c).to_le_bytes()).collect(),
        Err(_) => Vec::new(),
    };
    let (b, parts) = wholemem::agree::agree_sharing(comm.as_ref(), mine, Rule::Lowest, &extra)?;
    let n = comm.size();
    let mut counts = Vec::with_capacity(n);
    for (r, part) in parts.iter().enumerate() {
        if part.len() != 8 * n {
            return Err(Error::Common(CommonError::Malformed {
                rank: comm.world_ranks()[r],
                detail: format!("{} bytes of counts for {n} ranks", part.len()),
            }));
        }
        counts.push(part.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect::<Vec<u64>>());
    }
    let plan =
        Plan::new(&counts, MAX_IDS).map_err(|(r, detail)| Error::Common(CommonError::Malformed { rank: comm.world_ranks()[r], detail }))?;
    Ok((b, plan))
}

/// Step 3: the shared buffers, grown so that every owner's holds what the
/// plan sends it (rows of `row_bytes`).
fn reserve(mem: &WholeMemory, bufs: &mut wholemem::device::PeerBuffers, plan: &Plan, row_bytes: usize) -> Result<()> {
    let need = (0..plan.ranks()).map(|r| plan.layout(r, row_bytes).map(|l| l.total)).collect::<Option<Vec<usize>>>().ok_or_else(|| {
        Error::Common(CommonError::InvalidArgument(format!("an exchange of rows of {row_bytes} bytes past usize::MAX bytes")))
    })?;
    bufs.reserve(mem, &need).map_err(Error::from)
}

/// Step 4: copies this rank's bucket for every owner into that owner's
/// buffer — ids, and rows of `row_bytes` from `rows` (a scatter) — then
/// waits: the parts have landed when it returns.
fn push(l: &mut Lease<'_>, me: usize, bufs: &wholemem::device::PeerBuffers, plan: &Plan, rows: Option<(u64, usize)>) -> Result<()> {
    let bucketed = l.dev(Dev::Bucketed, 8)?;
    let row_bytes = rows.map_or(0, |(_, rb)| rb);
    for r in 0..plan.ranks() {
        let count = plan.count(me, r);
        if count == 0 {
            continue;
        }
        let lay = plan.layout(r, row_bytes).expect("sized in reserve");
        let (from, at) = (plan.bucket_start(me, r), plan.part_start(r, me));
        let dst = bufs.addr(r) + (lay.ids_at + at * 8) as u64;
        // SAFETY: the bucket lies inside this rank's bucketed ids (the plan
        // is this rank's counts); the part lies inside owner r's buffer,
        // which `reserve` sized for the plan's layout; nobody else writes
        // that part in this call.
        unsafe { l.copy(StreamCopy::OnDevice { dst, src: bucketed + (from * 8) as u64, len: count * 8 }) }?;
        if let Some((src, rb)) = rows {
            let dst = bufs.addr(r) + (lay.rows_at + at * rb) as u64;
            // SAFETY: as above, for the rows (in bucket order, `rb` each).
            unsafe { l.copy(StreamCopy::OnDevice { dst, src: src + (from * rb) as u64, len: count * rb }) }?;
        }
    }
    l.wait()
}

/// The ids this rank received, at the start of its shared buffer `base`.
fn received_ids(mem: &WholeMemory, plan: &Plan, base: u64) -> DevIds {
    let me = mem.comm().rank();
    let lay = plan.layout(me, 0).expect("sized in reserve");
    DevIds { addr: base + lay.ids_at as u64, ty: IdType::I64, n: plan.asked(me) }
}

/// The verdict on the ids this rank received, from its status word: the
/// error names the sender of the first bad one (its part is input) and
/// the bad id.
fn verdict(l: &mut Lease<'_>, mem: &WholeMemory, plan: &Plan, received: DevIds, word: u64) -> Result<()> {
    let Some(position) = checks::first_bad(word, received.n) else { return Ok(()) };
    let comm = mem.comm();
    let me = comm.rank();
    let own = mem.local_rows();
    let sender = plan.sender_of(me, position).unwrap_or(me);
    let value = read_id(l, received, position.min(received.n.saturating_sub(1)));
    let detail = match value {
        Ok(v) => format!(
            "id {v} at position {} of its part, not one of rank {}'s rows {}..{}",
            position - plan.part_start(me, sender),
            comm.world_rank(),
            own.start,
            own.end
        ),
        Err(e) => format!("an id not one of rank {}'s rows (reading it back failed: {e})", comm.world_rank()),
    };
    Err(Error::Common(CommonError::Malformed {
        rank: comm.world_ranks()[sender],
        detail: format!("{detail} (to rank {})", comm.world_rank()),
    }))
}

/// The collective gather of distributed and hierarchy device memory
/// through the ranks' shared buffers (the module's steps). `checked` is
/// this rank's shape check; `out` holds `ids.len()` rows of `out_dtype`.
pub(crate) fn gather(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: IdsAt<'_>,
    out: OutAt<'_>,
    out_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    let comm = mem.comm().clone();
    let me = comm.rank();
    let rows = Rows::of(layout, out_dtype);
    let rb = rows.buf_bytes();
    // 1. Every failure before the first collective travels with it.
    let (mut lease, local) = match Lease::take(mem) {
        Ok(l) => (Some(l), checked.map(drop)),
        Err(e) => (None, Err(e)),
    };
    let mut marks = lease.as_ref().map(|l| Marks::start(clock, &l.stream));
    let local = local.and_then(|()| bucket(lease.as_mut().expect("taken"), mem, ids));
    clock.lap("bucket");
    // 2.
    let (mine, plan) = agree_plan(mem, local)?;
    clock.lap("agree counts");
    let l = lease.as_mut().expect("every rank passed step 1");
    let mut marks = marks.take().expect("with the lease");
    marks.mark("gpu ids", &l.stream);
    // 3.
    let mut bufs = mem.peer_buffers();
    reserve(mem, &mut bufs, &plan, rb)?;
    clock.lap("reserve");
    // 4, 5.
    push(l, me, &bufs, &plan, None)?;
    marks.mark("gpu push", &l.stream);
    comm.barrier()?;
    clock.lap("push");
    // 6.
    let base = bufs.addr(me);
    let received = received_ids(mem, &plan, base);
    let lay = plan.layout(me, rb).expect("sized in reserve");
    let owned = (|| {
        let status = reset_status(l, 1)?;
        let own = mem.local_rows();
        check_ids(l, received, own.start as i64, own.end as i64, status)?;
        let o = owners(l, mem, layout, Reach::OwnGlobal)?;
        // SAFETY: the owner table is this rank's rows by global id; ids
        // outside them stop the kernel through `status`, checked first on
        // the stream; the replies go to this rank's shared buffer, which
        // `reserve` sized for them, after the ids.
        unsafe { gather_rows(l, o, rows, received, base + lay.rows_at as u64, status) }?;
        let word = wait_for_status(l, status, 1)?[0];
        verdict(l, mem, &plan, received, word)
    })();
    marks.mark("gpu owner rows", &l.stream);
    clock.lap("owner rows");
    // 7.
    agree(comm.as_ref(), owned, Rule::Lowest)?;
    clock.lap("agree");
    // 8.
    debug_assert_eq!(plan.sent(me), mine.ids.n, "the plan holds this rank's counts");
    if mine.ids.n > 0 {
        let dst = out_on_device(l, &out)?;
        let d = dense(l, dst, mine.ids.n, rb)?;
        let positions = l.dev(Dev::Positions, 4)?;
        let same = Rows { table_dtype: out_dtype, dim: rows.dim, buf_dtype: out_dtype };
        for r in 0..plan.ranks() {
            let count = plan.count(me, r);
            if count == 0 {
                continue;
            }
            let at = DevIds { addr: positions + (plan.bucket_start(me, r) * 4) as u64, ty: IdType::I32, n: count };
            let src = bufs.addr(r) + (plan.layout(r, rb).expect("sized").rows_at + plan.part_start(r, me) * rb) as u64;
            // SAFETY: the positions are a permutation of 0..n (below
            // i32::MAX, checked), so every output row is written once; the
            // source rows are owner r's replies for this rank, in its
            // buffer, written before step 7's collective; `dst` holds n rows.
            unsafe { scatter_rows(l, d, same, at, src, 0, 0) }?;
        }
        marks.mark("gpu rows", &l.stream);
        l.wait()?;
        rows_down(l, dst, out)?;
    }
    drop(bufs);
    clock.lap("rows");
    marks.finish(clock);
    Ok(())
}

/// The collective scatter of distributed and hierarchy device memory
/// through the ranks' shared buffers. `checked` is this rank's shape check
/// (with the conversion from the input to the table).
pub(crate) fn scatter(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: IdsAt<'_>,
    src: SrcAt<'_>,
    src_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
    let comm = mem.comm().clone();
    let me = comm.rank();
    let tb = layout.bytes();
    let (mut lease, local) = match Lease::take(mem) {
        Ok(l) => (Some(l), checked.map(drop)),
        Err(e) => (None, Err(e)),
    };
    let mut marks = lease.as_ref().map(|l| Marks::start(clock, &l.stream));
    // 1. Rows up first (pageable: the driver waits for the stream before
    //    staging them), then ids, checks and buckets; the rows converted
    //    into bucket order, ready to push.
    let local = local.and_then(|()| {
        let l = lease.as_mut().expect("taken");
        let from = src_on_device(l, src)?;
        let b = bucket(l, mem, ids)?;
        if b.ids.n > 0 {
            let d = dense(l, from, b.ids.n, layout.cols() * src_dtype.size())?;
            let positions = DevIds { addr: l.dev(Dev::Positions, 4)?, ty: IdType::I32, n: b.ids.n };
            let to = l.dev(Dev::Rows, b.ids.n * tb)?;
            let conv = Rows { table_dtype: src_dtype, dim: layout.cols() as u32, buf_dtype: layout.dtype() };
            // SAFETY: the input as a one-owner table of n rows; the
            // positions are a permutation of 0..n; `to` holds n rows of the
            // table's type. Waited for in `push`.
            unsafe { gather_rows(l, d, conv, positions, to, 0) }?;
        }
        Ok(b)
    });
    clock.lap("bucket");
    // 2.
    let (_mine, plan) = agree_plan(mem, local)?;
    clock.lap("agree counts");
    let l = lease.as_mut().expect("every rank passed step 1");
    let mut marks = marks.take().expect("with the lease");
    marks.mark("gpu ids", &l.stream);
    // 3.
    let mut bufs = mem.peer_buffers();
    reserve(mem, &mut bufs, &plan, tb)?;
    clock.lap("reserve");
    // 4, 5.
    let rows_at = l.dev(Dev::Rows, tb)?;
    push(l, me, &bufs, &plan, Some((rows_at, tb)))?;
    marks.mark("gpu push", &l.stream);
    comm.barrier()?;
    clock.lap("push");
    // 6.
    let base = bufs.addr(me);
    let received = received_ids(mem, &plan, base);
    let lay = plan.layout(me, tb).expect("sized in reserve");
    let written = (|| {
        if received.n == 0 {
            return Ok(());
        }
        let status = reset_status(l, 1)?;
        let own = mem.local_rows();
        check_ids(l, received, own.start as i64, own.end as i64, status)?;
        let keep = resolve_repeats(l, received, own.start as i64, own.end as i64)?;
        let o = owners(l, mem, layout, Reach::OwnGlobal)?;
        let same = Rows { table_dtype: layout.dtype(), dim: layout.cols() as u32, buf_dtype: layout.dtype() };
        // SAFETY: this rank's rows by global id; ids outside them stop the
        // kernel through `status`; `keep` marks the last occurrence of each
        // row over the parts in rank order, so no two threads write one
        // row; the rows are the senders', pushed into this buffer in step 4.
        unsafe { scatter_rows(l, o, same, received, base + lay.rows_at as u64, keep, status) }?;
        let word = wait_for_status(l, status, 1)?[0];
        verdict(l, mem, &plan, received, word)
    })();
    marks.mark("gpu owner rows", &l.stream);
    clock.lap("owner rows");
    drop(bufs);
    // 7.
    agree(comm.as_ref(), written, Rule::Lowest)?;
    clock.lap("agree");
    marks.finish(clock);
    Ok(())
}

/// The collective gather over NCCL (every rank with a GPU of its own): the
/// same plan as [`gather`], with the ids and rows moving by NCCL's grouped
/// send/recv into and out of the lease's scratch.
pub(crate) fn gather_nccl(
    mem: &WholeMemory,
    nccl: &dyn DeviceCommunicator,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: &DeviceIds,
    out: &mut DeviceBuffer,
    out_dtype: DType,
) -> Result<()> {
    let comm = mem.comm().clone();
    let (n, me) = (comm.size(), comm.rank());
    let rows = Rows::of(layout, out_dtype);
    let rb = rows.buf_bytes();
    let (mut lease, local) = match Lease::take(mem) {
        Ok(l) => (Some(l), checked.map(drop)),
        Err(e) => (None, Err(e)),
    };
    let local = local.and_then(|()| bucket(lease.as_mut().expect("taken"), mem, IdsAt::Device(ids)));
    let (mine, plan) = agree_plan(mem, local)?;
    let l = lease.as_mut().expect("every rank passed step 1");
    let asked = plan.asked(me);
    let requests = l.dev(Dev::Requests, asked.max(1) * 8)?;
    let bucketed = l.dev(Dev::Bucketed, 8)?;
    // The ids travel to their owners.
    let send: Vec<(u64, usize)> = (0..n).map(|r| (bucketed + (plan.bucket_start(me, r) * 8) as u64, plan.count(me, r) * 8)).collect();
    let recv: Vec<(u64, usize)> = (0..n).map(|r| (requests + (plan.part_start(me, r) * 8) as u64, plan.count(r, me) * 8)).collect();
    // SAFETY: the ranges lie inside the lease's scratch (sized for the
    // plan), which outlives the call; each receive is as long as its peer's
    // send (the plan is every rank's counts).
    unsafe { nccl.alltoallv(&send, &recv, &l.stream) }?;
    // Each owner checks and gathers what it was asked.
    let replies = l.dev(Dev::Replies, asked.max(1) * rb)?;
    let received = DevIds { addr: requests, ty: IdType::I64, n: asked };
    let owned = (|| {
        let status = reset_status(l, 1)?;
        let own = mem.local_rows();
        check_ids(l, received, own.start as i64, own.end as i64, status)?;
        let o = owners(l, mem, layout, Reach::OwnGlobal)?;
        // SAFETY: as in `gather`'s step 6, into `replies` (sized for them).
        unsafe { gather_rows(l, o, rows, received, replies, status) }?;
        let word = wait_for_status(l, status, 1)?[0];
        verdict(l, mem, &plan, received, word)
    })();
    agree(comm.as_ref(), owned, Rule::Lowest)?;
    // The rows travel back, into bucket order.
    let staged = l.dev(Dev::Staged, mine.ids.n.max(1) * rb)?;
    let send: Vec<(u64, usize)> = (0..n).map(|r| (replies + (plan.part_start(me, r) * rb) as u64, plan.count(r, me) * rb)).collect();
    let recv: Vec<(u64, usize)> = (0..n).map(|r| (staged + (plan.bucket_start(me, r) * rb) as u64, plan.count(me, r) * rb)).collect();
    // SAFETY: as above, the other way round.
    unsafe { nccl.alltoallv(&send, &recv, &l.stream) }?;
    if mine.ids.n == 0 {
        return Ok(());
    }
    // Into output order: staged row k goes to out[positions[k]].
    let d = dense(l, out.addr(), mine.ids.n, rb)?;
    let positions = DevIds { addr: l.dev(Dev::Positions, 4)?, ty: IdType::I32, n: mine.ids.n };
    let same = Rows { table_dtype: out_dtype, dim: rows.dim, buf_dtype: out_dtype };
    // SAFETY: the positions are a permutation of 0..n (below i32::MAX), so
    // every row of `out` (sized by the caller's check) is written once;
    // `staged` holds n rows.
    unsafe { scatter_rows(l, d, same, positions, staged, 0, 0) }?;
    l.wait()
}
