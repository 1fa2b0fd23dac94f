//! The distributed scatter: rows to their owners, written into the table.

use super::dedup::{last_sights, repeats_likely};
use super::ids::{checked_rows, exchange_row_ids};
use super::local::{BufferRows, LocalRows, rows_bytes, step_rows};
use super::wire::{call_shape, malformed};
use crate::kernel::{self, RowAddr, RowConv, SendPtr};
use crate::profile::{Clock, timed};
use crate::sort::Buckets;
use crate::{Error, Ids, Result, RowLayout};
use std::time::Duration;
use wholemem::WholeMemory;
use wholemem::agree::{Rule, agree};
use wm_comm::ExchangePlan;

/// Scatter for distributed and hierarchy memory: ids and rows (converted to
/// the table's type by the sender) travel to their owners, which write them
/// in rank order, each rank's in its order — so the last occurrence of the
/// highest rank wins.
pub(crate) fn scatter_distributed(
    mem: &mut WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    src: &[u8],
    mut clock: Clock,
) -> Result<()> {
    let comm = mem.comm().clone();
    let n = comm.size();
    let p = mem.partition().clone();
    let rows = checked_rows(&checked, ids);
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let by_owner = Buckets::of(&owners, n);
    let positions = |r: usize| by_owner.get(r);
    // Each other owner gets each distinct row once (where a sample of the
    // call's ids shows repeats): the last occurrence, the one that would be
    // written last. This rank's own rows go unchanged, in order.
    let me = comm.rank();
    let repeats = repeats_likely(&rows);
    let lasts: Vec<Option<Vec<usize>>> =
        (0..n).map(|r| if r == me || !repeats { None } else { last_sights(&rows, positions(r)) }).collect();
    let sent = |r: usize| lasts[r].as_deref().unwrap_or(positions(r));

    // 1. Owners learn which of their rows arrive (each checked to be one
    //    of theirs), and every rank whether every rank passed its checks.
    let count = mem.local_rows().len();
    let shape = call_shape("scatter", layout, &checked);
    let (incoming, mut problem, conv) = exchange_row_ids(comm.as_ref(), &p, &rows, sent, count, checked, &shape)?;
    clock.lap("ids");
    let conv = conv?;
    // Every rank's checks passed: rows of this rank are about to change
    // (private rows, so counting the write before it is as good as after,
    // and no early return below can skip it).
    if incoming.iter().any(|part| !part.is_empty()) {
        mem.note_written(mem.local_rows());
    }
    let (sb, tb) = (conv.src_bytes(), conv.dst_bytes());

    // 2. The rows, converted to the table's type by their senders straight
    //    into the exchange; owners write each part as it is handed over, in
    //    rank order. A host table's own rows skip the exchange: they are
    //    written from `src` a piece at a time while the others travel, and
    //    the parts of lower ranks, written after them, leave those rows
    //    alone — so the highest rank's rows still win, as in rank order.
    let device = mem.location() == wholemem::Location::Device;
    let direct = !device;
    let sizes: Vec<usize> = (0..n).map(|r| if r == me && direct { 0 } else { sent(r).len() * tb }).collect();
    let input = BufferRows(SendPtr(src.as_ptr().cast_mut()), sb);
    let (mut device_rows, mut device_data) = (Vec::new(), Vec::new());
    let table = if device {
        None
    } else {
        LocalRows::new(mem, layout).map(Some).unwrap_or_else(|e| {
            problem.get_or_insert(e);
            None
        })
    };
    let own = &incoming[me];
    let written = if direct && table.is_some() { own_rows_bitmap(&incoming, me, count) } else { Vec::new() };
    let is_own = |row: usize| written.get(row / 64).is_some_and(|w| w & (1 << (row % 64)) != 0);
    let mut misfit: Option<Error> = None;
    let (on, mut packing, mut writing, mut own_time) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut next, chunk) = (0, step_rows(mem, tb, own.len()));
    comm.exchange(
        ExchangePlan::new(&sizes, &mut |r, buf| {
            if r == me && direct {
                return;
            }
            // SAFETY: every position is below ids.len(), and `src` holds
            // that many rows of `sb` bytes (checked); `buf` is sized for
            // them by `sizes`.
            timed(on, &mut packing, || unsafe { kernel::gather_rows(&input, sent(r), None, conv, buf, 1) });
        })
        .between_steps(&mut |_| {
            let Some(table) = table.as_ref().filter(|_| direct && next < own.len()) else { return false };
            let end = (next + chunk).min(own.len());
            timed(on, &mut own_time, || {
                for (k, (&i, &row)) in positions(me)[next..end].iter().zip(&own[next..end]).enumerate() {
                    // Random rows of the table: ask for their lines early.
                    if let Some(&ahead) = own.get(next + k + kernel::PREFETCH_DISTANCE) {
                        kernel::prefetch(table.addr(ahead), tb);
                    }
                    // SAFETY: `i` is below ids.len() and `src` holds that
                    // many rows of `sb` bytes (checked); `row` is below this
                    // rank's row count (checked on receipt) and the layout
                    // fits in a row (checked at the call's entry). Private
                    // rows, kept from other users by `&mut WholeMemory`.
                    unsafe { conv.row(input.addr(i), table.addr(row)) };
                }
            });
            next = end;
            next < own.len()
        })
        .receive(&mut |r, bytes| {
            if r == me && direct {
                return;
            }
            let t = on.then(std::time::Instant::now);
            let idx = &incoming[r];
            if Some(bytes.len()) != rows_bytes(idx.len(), tb) {
                misfit.get_or_insert_with(|| {
                    malformed(comm.as_ref(), r, format!("{} bytes for {} rows of {tb} bytes", bytes.len(), idx.len()))
                });
            } else if device {
                device_rows.extend_from_slice(idx);
                device_data.extend_from_slice(bytes);
            } else if let Some(table) = &table {
                // A lower rank's rows give way to this rank's own.
                let yields = r < me && !written.is_empty();
                for (k, &row) in idx.iter().enumerate() {
                    if yields && is_own(row) {
                        continue;
                    }
                    // SAFETY: `row` is below this rank's row count (checked
                    // on receipt) and the layout fits in a row (checked at
                    // the call's entry), so `tb` bytes at its address lie in
                    // this rank's rows; `bytes` holds `idx.len()` rows of
                    // `tb` bytes (checked above). Distributed and hierarchy
                    // host rows are this process's private memory, and
                    // `&mut WholeMemory` keeps its other users away.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().add(k * tb), table.addr(row), tb) };
                }
            }
            if let Some(t) = t {
                writing += t.elapsed();
            }
        }),
    )?;
    clock.lap_split("rows", &[("pack", packing), ("own rows", own_time), ("write", writing)]);
    let outcome = problem.or(misfit).map_or(Ok(()), Err);
    let outcome = outcome.and_then(|()| if device { write_device_rows(mem, layout, &device_rows, &device_data) } else { Ok(()) });
    let done = agree(comm.as_ref(), outcome, Rule::Lowest);
    clock.lap("agree");
    done
}

/// This rank's own rows, a bit each, where a lower rank's part may name
/// them too (none otherwise): `count` is this rank's row count from the
/// agreed partition (not from a peer), so the bitmap is an eighth of a byte
/// per row the table already holds.
fn own_rows_bitmap(incoming: &[Vec<usize>], me: usize, count: usize) -> Vec<u64> {
    let own = &incoming[me];
    let mut written = Vec::new();
    if !own.is_empty() && (0..me).any(|r| !incoming[r].is_empty()) {
        written = vec![0u64; count.div_ceil(64)];
        for &row in own {
            written[row / 64] |= 1 << (row % 64);
        }
    }
    written
}

/// Writes the parts a device table received (`rows`, and their `data` as
/// the senders converted it) into its own rows: in rank order, each peer's
/// rows in its order, the same "last one wins" as the host writes.
#[cfg(feature = "cuda")]
fn write_device_rows(mem: &WholeMemory, layout: &RowLayout, rows: &[usize], data: &[u8]) -> Result<()> {
    let same = RowConv::new(layout.dtype(), layout.dtype(), layout.cols())?;
    crate::device::launch::scatter_local(mem, layout, same, rows, data)
}

/// Without CUDA no table is on a device: nothing to write.
#[cfg(not(feature = "cuda"))]
fn write_device_rows(_: &WholeMemory, _: &RowLayout, _: &[usize], _: &[u8]) -> Result<()> {
    Ok(())
}
