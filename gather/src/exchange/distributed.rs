//! The distributed gather: row ids to their owners, rows back, landing in
//! their places.

use super::dedup::{FirstSights, first_sights, repeats_likely};
use super::ids::{checked_rows, exchange_row_ids};
use super::local::{read_local, step_rows};
use super::wire::{Arrived, call_shape, drop_oversized, fill_reply, finding_bytes, read_arrival, reply_sizes, verdict_error};
use crate::kernel::RowConv;
use crate::profile::{Clock, timed};
use crate::sort::Buckets;
use crate::{Error, Ids, Result, RowLayout};
use std::time::Duration;
use wholemem::WholeMemory;
use wholemem::agree::{Rule, agree};
use wm_comm::ExchangePlan;

/// `while_rows_travel` does a piece of the caller's work at each step while
/// the rows travel, after this rank's own rows are in place, until it says
/// no pieces are left (work that needs nothing from the exchange, and not
/// `out`); a call that fails may end with pieces left, and one that moves
/// nothing may end before the first.
pub(crate) fn gather_distributed(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    mut clock: Clock,
    while_rows_travel: &mut dyn FnMut() -> bool,
) -> Result<()> {
    let comm = mem.comm();
    let (n, me) = (comm.size(), comm.rank());
    let p = mem.partition();
    let rows = checked_rows(&checked, ids);
    let owners: Vec<usize> = rows.iter().map(|&r| p.owner(r)).collect();
    let by_owner = Buckets::of(&owners, n);
    let wanted = |r: usize| by_owner.get(r);
    // Each other owner is asked for each distinct row once (where a sample
    // of the call's ids shows repeats); a row asked again is copied from
    // its first place once the rows have landed.
    let repeats = repeats_likely(&rows);
    let sights: Vec<Option<FirstSights>> =
        (0..n).map(|r| if r == me || !repeats { None } else { first_sights(&rows, wanted(r)) }).collect();
    let sent = |r: usize| match &sights[r] {
        _ if r == me => &[][..],
        Some(s) => &s.first[..],
        None => wanted(r),
    };

    // 1. Each owner learns which of its rows each rank wants (own rows are
    //    not sent), and every rank whether every rank passed its checks.
    let count = mem.local_rows().len();
    let shape = call_shape("gather", layout, &checked);
    let (mut asked, mut problem, conv) = exchange_row_ids(comm.as_ref(), p, &rows, sent, count, checked, &shape)?;
    clock.lap("ids");
    let conv = conv?;
    let db = conv.dst_bytes();

    // 2. Owners copy the rows asked of them straight into the exchange,
    //    each part behind a kind byte: rows follow, or the owner found a
    //    request malformed (its error follows, so every rank learns it with
    //    the rows), or the copy failed. Each part lands in its places in
    //    `out` (straight from the socket, from other nodes), and this
    //    rank's own rows are copied straight into place while the others
    //    travel.
    drop_oversized(comm.as_ref(), &mut asked, me, db, &mut problem);
    let verdict = finding_bytes(&mut problem);
    let sizes = reply_sizes(n, me, db, verdict.as_deref(), |r| asked[r].len());
    let mut failed: Option<Error> = None;
    let mut misfit: Option<Error> = None;
    let mut verdicts: Vec<Option<Vec<u8>>> = vec![None; n];
    let (on, mut copying, mut own, mut placing) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut own_failed: Option<Error> = None;
    let local: Vec<usize> = wanted(me).iter().map(|&i| rows[i] - p.offset(me)).collect();
    let (mut next, chunk) = (0, step_rows(mem, db, local.len()));
    let mut caller_busy = true;
    // A reply of rows lands in the rows of `out` asked of its owner; a
    // verdict of that very length lands there too, and is read back.
    let landings: Vec<&[usize]> = (0..n).map(sent).collect();
    let mut landed_verdict = vec![false; n];
    comm.exchange(
        ExchangePlan::new(&sizes, &mut |r, buf| {
            if r == me {
                return;
            }
            let copy = |body: &mut [u8]| timed(on, &mut copying, || read_local(mem, layout, conv, &asked[r], None, body));
            if let Some(e) = fill_reply(buf, verdict.as_deref(), copy) {
                failed.get_or_insert(e);
            }
        })
        .land_rows(out, 1, db, &landings)
        .between_steps(
            // This rank's own rows go straight to their places while the
            // others' travel, a piece per step; then the caller's work.
            &mut |out| {
                if next < local.len() {
                    let end = (next + chunk).min(local.len());
                    timed(on, &mut own, || {
                        if let Err(e) = read_local(mem, layout, conv, &local[next..end], Some(&wanted(me)[next..end]), out) {
                            own_failed.get_or_insert(e);
                        }
                    });
                    next = if own_failed.is_some() { local.len() } else { end };
                    return true;
                }
                caller_busy = caller_busy && while_rows_travel();
                caller_busy
            },
        )
        .receive_parts(
            // Parts that arrived through the socket landed as they came in;
            // the others are copied to their places before this is called.
            &mut |r, part| {
                if r == me {
                    // Its part is empty: own rows are not sent.
                    return;
                }
                timed(on, &mut placing, || match read_arrival(comm.as_ref(), r, &part, landings[r].len(), db) {
                    Arrived::Rows => {}
                    Arrived::VerdictInRows => landed_verdict[r] = true,
                    Arrived::Verdict(v) => verdicts[r] = Some(v),
                    Arrived::Failed(e) => {
                        misfit.get_or_insert(e);
                    }
                })
            },
        ),
    )?;
    for (r, _) in landed_verdict.iter().enumerate().filter(|(_, l)| **l) {
        verdicts[r] = Some(wm_comm::plan::read_back(out, landings[r], db));
    }
    // A verdict stands where rows belong only when its owner found a
    // failure: one that says all is well breaks the protocol, and would
    // leave its rows (and their repeats) unwritten in a call that succeeds.
    for (r, v) in verdicts.iter().enumerate().filter_map(|(r, v)| Some((r, v.as_deref()?))) {
        misfit.get_or_insert_with(|| verdict_error(comm.as_ref(), r, v));
    }
    // Repeated rows from their first places (rows that landed, not a verdict).
    timed(on, &mut placing, || {
        for (r, s) in sights.iter().enumerate().filter_map(|(r, s)| Some((r, s.as_ref()?))) {
            if !landed_verdict[r] {
                for &(at, from) in &s.repeats {
                    out.copy_within(from * db..(from + 1) * db, at * db);
                }
            }
        }
    });
    clock.lap_split("rows", &[("owner copy", copying), ("own rows", own), ("place", placing)]);
    // Every rank holds every owner's verdict on the requests it got: the
    // lowest owner's error is every rank's.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let parts: Vec<&[u8]> = verdicts.iter().map(|v| v.as_deref().unwrap_or(&ok)).collect();
    let decided = wholemem::agree::decide(comm.as_ref(), problem.map_or(Ok(()), Err), wholemem::agree::Rule::Lowest, &parts);
    // What only this rank can know — a part it received malformed, a copy
    // of its own that failed — is its own error: on the host a copy cannot
    // fail once the ids are checked, and a malformed part fails the rank
    // that would otherwise return wrong rows. A device copy can fail on one
    // rank, so device tables agree on the outcome once more.
    let local = decided.and(failed.or(own_failed).or(misfit).map_or(Ok(()), Err));
    let done = if mem.location() == wholemem::Location::Host { local } else { agree(comm.as_ref(), local, Rule::Lowest) };
    clock.lap("agree");
    done
}
