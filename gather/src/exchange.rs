//! The collective paths: distributed and hierarchy memory, where a rank maps
//! only its own rows and other rows travel through the communicator.

use std::sync::Arc;

use wholemem::WholeMemory;
use wm_comm::{CommExt, Communicator};

use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::{Error, Ids, Result, RowLayout, threads};

/// Fails on every rank if any rank's checks failed: the first failing rank's
/// error, with an out-of-range id kept as such (it names the id and rank).
pub(crate) fn agree<T>(comm: &dyn Communicator, mine: Result<T>) -> Result<T> {
    let msg: Vec<u8> = match &mine {
        Ok(_) => Vec::new(),
        Err(Error::IndexOutOfRange { index, position, rows, .. }) => {
            let mut m = vec![1u8];
            for v in [*index as u64, *position as u64, *rows as u64] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            m
        }
        Err(e) => [&[2u8][..], e.to_string().as_bytes()].concat(),
    };
    let all = comm.allgatherv(&msg)?;
    let Some((r, m)) = all.iter().enumerate().find(|(_, m)| !m.is_empty()) else { return mine };
    if r == comm.rank() {
        return mine;
    }
    let rank = comm.world_ranks()[r];
    if m[0] == 1 && m.len() == 25 {
        let field = |i: usize| u64::from_le_bytes(m[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        return Err(Error::IndexOutOfRange { index: field(0) as i64, position: field(1) as usize, rank, rows: field(2) as usize });
    }
    Err(Error::PeerFailed { rank, detail: String::from_utf8_lossy(&m[1..]).into_owned() })
}

/// This rank's own rows.
struct LocalRows {
    base: SendPtr,
    granularity: usize,
    skip: usize,
}

impl LocalRows {
    fn new(mem: &WholeMemory, layout: &RowLayout) -> Self {
        let base = mem.rank_ptr(mem.comm().rank()).expect("a rank maps its own rows");
        Self { base: SendPtr(base), granularity: mem.granularity(), skip: layout.offset * layout.dtype.size() }
    }
}

impl RowAddr for LocalRows {
    #[inline]
    fn addr(&self, local_row: usize) -> *mut u8 {
        self.base.0.wrapping_add(local_row * self.granularity + self.skip)
    }
}

/// Rows of a caller's buffer.
struct BufferRows(SendPtr, usize);

impl RowAddr for BufferRows {
    #[inline]
    fn addr(&self, i: usize) -> *mut u8 {
        self.0.0.wrapping_add(i * self.1)
    }
}

/// Positions of `keys` grouped by key (a counting sort): `order[starts[k]..
/// starts[k + 1]]` are the positions with key `k`, in input order.
fn bucket(keys: &[usize], buckets: usize) -> (Vec<usize>, Vec<usize>) {
    let mut starts = vec![0usize; buckets + 1];
    for &k in keys {
        starts[k + 1] += 1;
    }
    for k in 0..buckets {
        starts[k + 1] += starts[k];
    }
    let mut fill = starts.clone();
    let mut order = vec![0usize; keys.len()];
    for (i, &k) in keys.iter().enumerate() {
        order[fill[k]] = i;
        fill[k] += 1;
    }
    (order, starts)
}

thread_local! {
    /// Reply buffers of earlier calls, reused so that large exchanges do not
    /// fault in fresh pages every time.
    static SCRATCH: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes, reused when one is at hand.
fn scratch(len: usize) -> Vec<u8> {
    let reused = SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        let best = s.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity()).map(|(i, _)| i);
        best.map(|i| s.swap_remove(i))
    });
    match reused {
        Some(mut b) => {
            b.resize(len, 0);
            b.truncate(len);
            b
        }
        None => vec![0u8; len],
    }
}

/// Keeps large buffers for [`scratch`].
fn give_back(bufs: Vec<Vec<u8>>) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        for b in bufs {
            if b.capacity() >= 64 << 10 && s.len() < 16 {
                s.push(b);
            }
        }
    });
}

/// Copies this rank's own rows `rows` (converted) into `out`: row `k` to
/// output row `positions[k]`, or to row `k` without positions. Through the
/// CPU for host memory, by a kernel for device memory.
fn read_local(
    mem: &WholeMemory,
    layout: &RowLayout,
    conv: RowConv,
    rows: &[usize],
    positions: Option<&[usize]>,
    out: &mut [u8],
) -> Result<()> {
    let n = mem.local_rows().len();
    assert!(rows.iter().all(|&r| r < n), "a row this rank does not own");
    #[cfg(feature = "cuda")]
    if mem.location() == wholemem::Location::Device {
        let Some(positions) = positions else { return crate::device::gather_local(mem, layout, conv, rows, out) };
        let mut dense = scratch(rows.len() * conv.dst_bytes());
        crate::device::gather_local(mem, layout, conv, rows, &mut dense)?;
        place(out, &dense, positions, conv.dst_bytes());
        give_back(vec![dense]);
        return Ok(());
    }
    debug_assert!(out.len() >= positions.map_or(rows.len(), |p| p.iter().max().map_or(0, |m| m + 1)) * conv.dst_bytes());
    // SAFETY: every row is below this rank's row count (asserted: a peer's
    // request is not trusted blindly); positions are distinct and `out` is
    // sized for them (callers' invariant, checked in debug builds).
    unsafe { kernel::gather_rows(&LocalRows::new(mem, layout), rows, positions, conv, out, threads(mem)) };
    Ok(())
}

/// Copies this rank's rows `local` (converted) into a buffer.
fn serve(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, local: &[u64]) -> Result<Vec<u8>> {
    let rows: Vec<usize> = local.iter().map(|&r| r as usize).collect();
    let mut buf = scratch(rows.len() * conv.dst_bytes());
    read_local(mem, layout, conv, &rows, None, &mut buf)?;
    Ok(buf)
}

/// Copies row `k` of `rows` into output row `positions[k]`.
fn place(out: &mut [u8], rows: &[u8], positions: &[usize], row_bytes: usize) {
    for (k, &p) in positions.iter().enumerate() {
        out[p * row_bytes..][..row_bytes].copy_from_slice(&rows[k * row_bytes..][..row_bytes]);
    }
}

/// Tells each owner which of its rows this rank names: to rank `r` the
/// local row numbers of `rows[i]` for every `i` in `positions(r)`, written
/// straight into the exchange. Returns the rows every rank named here, and
/// a malformed part's error — kept for after the caller's next exchange,
/// so every rank stays in step.
fn exchange_row_ids<'a>(
    comm: &dyn Communicator,
    p: &wholemem::Partition,
    rows: &[usize],
    positions: impl Fn(usize) -> &'a [usize],
) -> Result<(Vec<Vec<usize>>, Option<Error>)> {
    let n = comm.size();
    let sizes: Vec<usize> = (0..n).map(|r| positions(r).len() * 8).collect();
    let mut named: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut problem = None;
    comm.alltoallv_in_place(
        &sizes,
        &mut |r, buf| {
            for (slot, &i) in buf.chunks_exact_mut(8).zip(positions(r)) {
                slot.copy_from_slice(&((rows[i] - p.offset(r)) as u64).to_le_bytes());
            }
        },
        &mut |r, bytes| {
            if bytes.len() % 8 != 0 {
                problem.get_or_insert(Error::PeerFailed {
                    rank: comm.world_ranks()[r],
                    detail: format!("it sent {} bytes of row ids", bytes.len()),
                });
            }
            named[r] = bytes.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize).collect();
        },
    )?;
    Ok((named, problem))
}

pub(crate) fn gather_distributed(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, out: &mut [u8]) -> Result<()> {
    let comm = mem.comm();
    let (n, me) = (comm.size(), comm.rank());
    let p = mem.partition();
    let rows = ids.to_rows();
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let (order, starts) = bucket(&owners, n);
    let wanted = |r: usize| &order[starts[r]..starts[r + 1]];
    let db = conv.dst_bytes();

    // 1. Each owner learns which of its rows each rank wants (own rows are
    //    not sent).
    let (asked, problem) = exchange_row_ids(comm.as_ref(), p, &rows, |r| if r == me { &[] } else { wanted(r) })?;

    // 2. Owners copy the rows asked of them straight into the exchange;
    //    each arriving part goes to its places in `out`, and this rank's
    //    own rows are copied straight into place.
    let sizes: Vec<usize> = asked.iter().map(|a| a.len() * db).collect();
    let mut failed: Option<Error> = None;
    let mut misfit: Option<Error> = None;
    comm.alltoallv_in_place(
        &sizes,
        &mut |r, buf| {
            if r != me
                && let Err(e) = read_local(mem, layout, conv, &asked[r], None, buf)
            {
                failed.get_or_insert(e);
            }
        },
        &mut |r, bytes| {
            if r == me {
                let local: Vec<usize> = wanted(me).iter().map(|&i| rows[i] - p.offset(me)).collect();
                if let Err(e) = read_local(mem, layout, conv, &local, Some(wanted(me)), out) {
                    misfit.get_or_insert(e);
                }
            } else if bytes.len() == wanted(r).len() * db {
                place(out, bytes, wanted(r), db);
            } else {
                misfit.get_or_insert(Error::PeerFailed {
                    rank: comm.world_ranks()[r],
                    detail: format!("it sent {} bytes for {} rows of {db} bytes", bytes.len(), wanted(r).len()),
                });
            }
        },
    )?;
    // Host copies cannot fail; a device copy can, on one rank only, and
    // then the rows it sent are not to be trusted by anyone.
    let served = failed.map_or(Ok(()), Err);
    if mem.location() == wholemem::Location::Device {
        agree(comm.as_ref(), served)?;
    } else {
        served?;
    }
    problem.or(misfit).map_or(Ok(()), Err)
}

fn hierarchy_comms(mem: &WholeMemory) -> (&Arc<dyn Communicator>, &Arc<dyn Communicator>) {
    (mem.local_comm().expect("hierarchy memory has a local communicator"), mem.cross_comm().expect("and a cross communicator"))
}

pub(crate) fn gather_hierarchy(mem: &WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, out: &mut [u8]) -> Result<()> {
    let comm = mem.comm();
    let (local, cross) = hierarchy_comms(mem);
    if cross.size() == 1 {
        // One node: nothing crosses nodes, so there is nothing to de-duplicate.
        return gather_distributed(mem, layout, conv, ids, out);
    }
    let p = mem.partition();
    let placement = wm_topology::NodeLayout::of(comm.nodes());
    let (node_of, local_rank_of) = (&placement.node, &placement.local);
    let db = conv.dst_bytes();
    let rows = ids.to_rows();

    // 1. Within the node: each id goes to the local rank with its owner's
    //    local rank (that rank's cross communicator reaches the owner).
    let via: Vec<usize> = rows.iter().map(|&r| local_rank_of[p.owner(r)]).collect();
    let (order, starts) = bucket(&via, local.size());
    let to_local: Vec<Vec<u64>> =
        (0..local.size()).map(|q| order[starts[q]..starts[q + 1]].iter().map(|&i| rows[i] as u64).collect()).collect();
    let refs: Vec<&[u64]> = to_local.iter().map(Vec::as_slice).collect();
    let from_local = local.alltoallv_pod(&refs)?;

    // 2. De-duplicate what the node asked of this rank.
    let mut unique: Vec<u64> = from_local.concat();
    unique.sort_unstable();
    unique.dedup();

    // 3. Across nodes, unique ids only: the owner is this cross
    //    communicator's member on the owner's node.
    let owner_node: Vec<usize> = unique.iter().map(|&id| node_of[p.owner(id as usize)]).collect();
    let (uorder, ustarts) = bucket(&owner_node, cross.size());
    let mut to_cross: Vec<Vec<u64>> = (0..cross.size())
        .map(|c| {
            uorder[ustarts[c]..ustarts[c + 1]]
                .iter()
                .map(|&k| {
                    let id = unique[k] as usize;
                    let o = p.owner(id);
                    debug_assert_eq!(cross.world_ranks()[c], comm.world_ranks()[o]);
                    (id - p.offset(o)) as u64
                })
                .collect()
        })
        .collect();
    // This rank's own unique ids stay out of the exchange.
    let cme = cross.rank();
    let own = std::mem::take(&mut to_cross[cme]);
    let refs: Vec<&[u64]> = to_cross.iter().map(Vec::as_slice).collect();
    let asked = cross.alltoallv_pod(&refs)?;
    let replies: Vec<Vec<u8>> = asked.iter().map(|want| serve(mem, layout, conv, want)).collect::<Result<_>>()?;
    let refs: Vec<&[u8]> = replies.iter().map(Vec::as_slice).collect();
    let got = cross.alltoallv(&refs)?;
    give_back(replies);
    let mut unique_rows = scratch(unique.len() * db);
    let own_rows: Vec<usize> = own.iter().map(|&r| r as usize).collect();
    assert!(own_rows.iter().all(|&r| r < mem.local_rows().len()), "unique ids bucketed to this rank are its own");
    read_local(mem, layout, conv, &own_rows, Some(&uorder[ustarts[cme]..ustarts[cme + 1]]), &mut unique_rows)?;
    for c in (0..cross.size()).filter(|&c| c != cme) {
        place(&mut unique_rows, &got[c], &uorder[ustarts[c]..ustarts[c + 1]], db);
    }
    cross.recycle(got);

    // 4. Back within the node: each local rank gets its rows in the order it
    //    asked for them; this rank's own requests go straight to `out`.
    let lme = local.rank();
    let answers: Vec<Vec<u8>> = from_local
        .iter()
        .enumerate()
        .map(|(q, asked)| {
            if q == lme {
                return Vec::new();
            }
            let mut buf = scratch(asked.len() * db);
            for (k, id) in asked.iter().enumerate() {
                let u = unique.binary_search(id).expect("every asked id is in the unique set");
                buf[k * db..][..db].copy_from_slice(&unique_rows[u * db..][..db]);
            }
            buf
        })
        .collect();
    for (k, id) in from_local[lme].iter().enumerate() {
        let u = unique.binary_search(id).expect("every asked id is in the unique set");
        let p = order[starts[lme] + k];
        out[p * db..][..db].copy_from_slice(&unique_rows[u * db..][..db]);
    }
    let refs: Vec<&[u8]> = answers.iter().map(Vec::as_slice).collect();
    let back = local.alltoallv(&refs)?;
    give_back(answers);
    for q in (0..local.size()).filter(|&q| q != lme) {
        place(out, &back[q], &order[starts[q]..starts[q + 1]], db);
    }
    local.recycle(back);
    give_back(vec![unique_rows]);
    Ok(())
}

/// Scatter for distributed and hierarchy memory: ids and rows (converted to
/// the table's type by the sender) travel to their owners, which write them
/// in rank order, each rank's in its order — so the last occurrence of the
/// highest rank wins.
pub(crate) fn scatter_distributed(mem: &mut WholeMemory, layout: &RowLayout, conv: RowConv, ids: Ids<'_>, src: &[u8]) -> Result<()> {
    let comm = mem.comm().clone();
    let n = comm.size();
    let p = mem.partition().clone();
    let rows = ids.to_rows();
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let (order, starts) = bucket(&owners, n);
    let positions = |r: usize| &order[starts[r]..starts[r + 1]];
    let (sb, tb) = (conv.src_bytes(), conv.dst_bytes());

    // 1. Owners learn which of their rows arrive.
    let (incoming, problem) = exchange_row_ids(comm.as_ref(), &p, &rows, positions)?;
    let count = mem.local_rows().len();
    assert!(incoming.iter().flatten().all(|&r| r < count), "a peer sent a row this rank does not own");

    // 2. The rows, converted to the table's type by their senders straight
    //    into the exchange; owners write each part as it is handed over, in
    //    rank order.
    let sizes: Vec<usize> = (0..n).map(|r| positions(r).len() * tb).collect();
    let input = BufferRows(SendPtr(src.as_ptr().cast_mut()), sb);
    let (granularity, skip) = (mem.granularity(), layout.offset * layout.dtype.size());
    let device = mem.location() == wholemem::Location::Device;
    let (mut device_rows, mut device_data) = (Vec::new(), Vec::new());
    let local = if device { &mut [][..] } else { mem.local_bytes_mut() };
    let mut misfit: Option<Error> = None;
    comm.alltoallv_in_place(
        &sizes,
        &mut |r, buf| {
            // SAFETY: every position is below ids.len(), and `src` holds
            // that many rows of `sb` bytes (checked); `buf` is sized for
            // them by `sizes`.
            unsafe { kernel::gather_rows(&input, positions(r), None, conv, buf, 1) };
        },
        &mut |r, bytes| {
            let idx = &incoming[r];
            if bytes.len() != idx.len() * tb {
                misfit.get_or_insert(Error::PeerFailed {
                    rank: comm.world_ranks()[r],
                    detail: format!("it sent {} bytes for {} rows of {tb} bytes", bytes.len(), idx.len()),
                });
            } else if device {
                device_rows.extend_from_slice(idx);
                device_data.extend_from_slice(bytes);
            } else {
                for (k, &row) in idx.iter().enumerate() {
                    local[row * granularity + skip..][..tb].copy_from_slice(&bytes[k * tb..][..tb]);
                }
            }
        },
    )?;
    if let Some(e) = problem.or(misfit) {
        return Err(e);
    }
    #[cfg(feature = "cuda")]
    if device {
        // In rank order, each peer's rows in its order: the same "last one
        // wins" as the host writes. The senders converted the rows already.
        let same = RowConv::new(layout.dtype, layout.dtype, layout.cols)?;
        return crate::device::scatter_local(mem, layout, same, &device_rows, &device_data);
    }
    let _ = (device_rows, device_data);
    Ok(())
}
