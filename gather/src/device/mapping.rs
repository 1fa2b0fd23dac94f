//! Gather and scatter through the mapping of continuous and chunked
//! tables: ids up, one check and one row kernel, one wait.

use wholemem::WholeMemory;

use super::checks;
use super::launch::{
    IdsAt, OutAt, Reach, Rows, SrcAt, check_ids, gather_rows, ids_on_device, name_bad_id, out_on_device, owners, reset_status,
    resolve_repeats, rows_down, scatter_rows, src_on_device, wait_for_status,
};
use super::staging::Lease;
use super::timing::Marks;
use crate::profile::Clock;
use crate::{DType, Result, RowLayout};

/// A mapped gather: ids up (host ids), the check and the gather kernel
/// (which moves nothing if the check failed), the status word down, one
/// wait; then the rows down for a host output.
pub(super) fn mapped_gather(
    mem: &WholeMemory,
    layout: &RowLayout,
    ids: IdsAt<'_>,
    out: OutAt<'_>,
    out_dtype: DType,
    clock: &mut Clock,
) -> Result<()> {
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
pub(super) fn mapped_scatter(
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
