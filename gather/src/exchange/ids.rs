//! Checking and routing ids: the first exchange of a distributed gather
//! or scatter tells each owner which of its rows each rank names, and
//! carries every rank's outcome of its checks.

use super::wire::{FAILED, IDS, Refused, fill_ids, ids_part_size, malformed, read_ids};
use crate::kernel::RowConv;
use crate::{Error, Ids, Result};
use wm_comm::{Communicator, ExchangePlan};

/// The first exchange of a distributed gather or scatter, which also
/// carries every rank's outcome of its checks (`checked`), so no separate
/// agreement is needed before it.
///
/// Tells each owner which of its rows this rank names: to rank `r` the
/// local row numbers of `rows[i]` for every `i` in `positions(r)`, written
/// straight into the exchange. Returns the rows every rank named here —
/// each checked to be below `count`, this rank's row count — and a
/// malformed part's error (the part itself is dropped), reported at the end
/// of the call so every rank stays in step; and the checks'
/// outcome decided as [`agree`] does: when any rank failed, every rank
/// returns the lowest failing rank's error right after this exchange.
/// Each part of ids leads with the call's `shape` ([`super::wire::call_shape`]);
/// a part of another shape is dropped too, its error reported alike.
#[allow(clippy::type_complexity)]
pub(super) fn exchange_row_ids<'a>(
    comm: &dyn Communicator,
    p: &wholemem::Partition,
    rows: &[usize],
    positions: impl Fn(usize) -> &'a [usize],
    count: usize,
    checked: Result<RowConv>,
    shape: &[u8],
) -> Result<(Vec<Vec<usize>>, Option<Error>, Result<RowConv>)> {
    let n = comm.size();
    let failure = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
    let sizes: Vec<usize> = (0..n).map(|r| ids_part_size(failure.as_deref(), shape, positions(r).len())).collect();
    let mut named: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut outcomes: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut problem = None;
    comm.exchange(
        ExchangePlan::new(&sizes, &mut |r, buf| {
            fill_ids(buf, failure.as_deref(), shape, positions(r).iter().map(|&i| (rows[i] - p.offset(r)) as u64));
        })
        .receive(&mut |r, bytes| {
            let detail = match bytes.split_first() {
                Some((&IDS, body)) => match read_ids(comm, r, body, shape, count) {
                    Ok(ids) => {
                        named[r] = ids;
                        return;
                    }
                    Err(Refused::Malformed(detail)) => detail,
                    Err(Refused::OtherCall(e)) => {
                        problem.get_or_insert(e);
                        return;
                    }
                },
                Some((&FAILED, outcome)) => {
                    outcomes[r] = Some(outcome.to_vec());
                    return;
                }
                Some((kind, _)) => format!("a part of the row-id exchange of unknown kind {kind}"),
                None => "an empty part of the row-id exchange".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(comm, r, detail));
        }),
    )?;
    // Every rank got every rank's part: the same decision everywhere.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let parts: Vec<&[u8]> = outcomes.iter().map(|o| o.as_deref().unwrap_or(&ok)).collect();
    let decided = wholemem::agree::decide(comm, checked, wholemem::agree::Rule::Lowest, &parts);
    Ok((named, problem, decided))
}

/// The ids as row indices when this rank's checks passed (so every id is in
/// range), none otherwise.
pub(super) fn checked_rows<T>(checked: &Result<T>, ids: Ids<'_>) -> Vec<usize> {
    if checked.is_ok() { ids.to_rows() } else { Vec::new() }
}
