//! The hierarchy gather: ids routed within the node, de-duplicated, sent
//! across nodes once per node, and the rows fanned out within the node.

use super::dedup::dedup;
use super::distributed::gather_distributed;
use super::ids::checked_rows;
use super::local::{give_back, place, read_local, scratch, step_rows};
use super::wire::{
    Arrived, FAILED, IDS, Reply, decode_ids, drop_oversized, fill_reply, finding_bytes, malformed, read_arrival, read_reply, reply_sizes,
    verdict_error,
};
use crate::kernel::RowConv;
use crate::profile::{Clock, timed};
use crate::sort::bucket;
use crate::{Error, Ids, Result, RowLayout, agree};
use std::sync::Arc;
use std::time::Duration;
use wholemem::WholeMemory;
use wm_comm::{Communicator, ExchangePlan};

/// A communicator of a table.
pub(super) type Comm = Arc<dyn Communicator>;

/// The local and cross communicators of a hierarchy table.
pub(super) fn hierarchy_comms(mem: &WholeMemory) -> Result<(&Comm, &Comm)> {
    match (mem.local_comm(), mem.cross_comm()) {
        (Some(l), Some(c)) => Ok((l, c)),
        _ => Err(Error::InvalidArgument(format!("a {} table has no local and cross communicators", mem.memory_type()))),
    }
}

/// `also` as in [`gather_distributed`], while the rows cross nodes.
pub(crate) fn gather_hierarchy(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    mut clock: Clock,
    also: &mut dyn FnMut(),
) -> Result<()> {
    let comm = mem.comm();
    // Every rank of a hierarchy table has both communicators (from
    // allocation), so this fails everywhere or nowhere.
    let (local, cross) = hierarchy_comms(mem)?;
    if cross.size() == 1 {
        // One node: nothing crosses nodes, so there is nothing to de-duplicate.
        return gather_distributed(mem, layout, checked, ids, out, clock, also);
    }
    let p = mem.partition();
    let placement = wm_topology::NodeLayout::of(comm.nodes());
    let (node_of, local_rank_of) = (&placement.node, &placement.local);
    let rows = checked_rows(&checked, ids);
    let lme = local.rank();
    let mut problem: Option<Error> = None;

    // 1. Within the node: each id goes to the local rank with its owner's
    //    local rank (that rank's cross communicator reaches the owner). The
    //    parts also carry each rank's check outcome: after this exchange a
    //    rank knows its node's, after the next one every node's.
    let via: Vec<usize> = rows.iter().map(|&r| local_rank_of[p.owner(r)]).collect();
    let (order, starts) = bucket(&via, local.size());
    let wanted = |q: usize| &order[starts[q]..starts[q + 1]];
    let mine = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
    // This rank's own part is only its kind byte: its ids stay here.
    let sizes: Vec<usize> =
        (0..local.size()).map(|q| 1 + mine.as_ref().map_or(if q == lme { 0 } else { wanted(q).len() * 8 }, Vec::len)).collect();
    let mut from_local: Vec<Vec<u64>> = vec![Vec::new(); local.size()];
    // The node's failures: (world rank, outcome), this rank's own included.
    let mut failures: Vec<(usize, Vec<u8>)> = mine.iter().map(|m| (comm.world_rank(), m.clone())).collect();
    local.exchange(
        ExchangePlan::new(&sizes, &mut |q, buf| match &mine {
            Some(m) => {
                buf[0] = FAILED;
                buf[1..].copy_from_slice(m);
            }
            None => {
                buf[0] = IDS;
                if q != lme {
                    for (slot, &i) in buf[1..].chunks_exact_mut(8).zip(wanted(q)) {
                        slot.copy_from_slice(&(rows[i] as u64).to_le_bytes());
                    }
                }
            }
        })
        .receive(&mut |q, bytes| {
            if q == lme {
                from_local[q] = wanted(q).iter().map(|&i| rows[i] as u64).collect();
                return;
            }
            let detail = match bytes.split_first() {
                // Rows of the table routed here (the owner's local rank is
                // this rank's); a bad part is dropped.
                Some((&IDS, ids)) => match decode_ids(ids, p.rows()) {
                    Ok(ids) => match ids.iter().position(|&id| local_rank_of[p.owner(id)] != lme) {
                        Some(i) => format!("row id {} at position {i}, which another local rank serves", ids[i]),
                        None => {
                            from_local[q] = ids.into_iter().map(|id| id as u64).collect();
                            return;
                        }
                    },
                    Err(detail) => detail,
                },
                Some((&FAILED, outcome)) => {
                    failures.push((local.world_ranks()[q], outcome.to_vec()));
                    return;
                }
                Some((kind, _)) => format!("a part of the node's id exchange of unknown kind {kind}"),
                None => "an empty part of the node's id exchange".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(local.as_ref(), q, format!("in the node's exchange, {detail}")));
        }),
    )?;
    clock.lap("node ids");
    // The node's verdict: its lowest failing rank, if any.
    failures.sort_by_key(|(r, _)| *r);
    let node_verdict = failures.first().cloned();

    // 2. De-duplicate what the node asked of this rank, remembering for each
    //    request which unique id answers it (so the fan-out needs no search).
    let (unique, answer) = dedup(&from_local, lme);
    clock.lap("dedup");

    // 3. Across nodes, unique ids only (the owner is this cross
    //    communicator's member on the owner's node), with the node's verdict.
    //    Each node's ids keep the de-duplication's order (this rank's
    //    requests first), so that its rows come back — and this rank's own
    //    are copied — in the order of `out`.
    let owner_node: Vec<usize> = unique.iter().map(|&id| node_of[p.owner(id as usize)]).collect();
    let (uorder, ustarts) = bucket(&owner_node, cross.size());
    let uwanted = |c: usize| &uorder[ustarts[c]..ustarts[c + 1]];
    let cme = cross.rank();
    let verdict_bytes = node_verdict.as_ref().map(|(r, o)| [&(*r as u64).to_le_bytes()[..], o].concat());
    let sizes: Vec<usize> = (0..cross.size())
        .map(|c| {
            1 + match &verdict_bytes {
                Some(v) => v.len(),
                // This rank's own unique ids stay out of the exchange.
                None if c == cme => 0,
                None => uwanted(c).len() * 8,
            }
        })
        .collect();
    let count = mem.local_rows().len();
    let mut asked: Vec<Vec<usize>> = vec![Vec::new(); cross.size()];
    let mut verdicts: Vec<(usize, Vec<u8>)> = node_verdict.into_iter().collect();
    cross.exchange(
        ExchangePlan::new(&sizes, &mut |c, buf| match &verdict_bytes {
            Some(v) => {
                buf[0] = FAILED;
                buf[1..].copy_from_slice(v);
            }
            None => {
                buf[0] = IDS;
                for (slot, &k) in buf[1..].chunks_exact_mut(8).zip(if c == cme { &[][..] } else { uwanted(c) }) {
                    let id = unique[k] as usize;
                    slot.copy_from_slice(&((id - p.offset(p.owner(id))) as u64).to_le_bytes());
                }
            }
        })
        .receive(&mut |c, bytes| {
            if c == cme {
                return;
            }
            let detail = match bytes.split_first() {
                Some((&IDS, ids)) => match decode_ids(ids, count) {
                    Ok(ids) => {
                        asked[c] = ids;
                        return;
                    }
                    Err(detail) => detail,
                },
                Some((&FAILED, v)) => match v.split_first_chunk::<8>() {
                    Some((r, outcome)) => match usize::try_from(u64::from_le_bytes(*r)) {
                        Ok(r) if r < comm.size() && node_of[r] == node_of[cross.world_ranks()[c]] => {
                            verdicts.push((r, outcome.to_vec()));
                            return;
                        }
                        _ => format!("a verdict naming rank {} of another node", u64::from_le_bytes(*r)),
                    },
                    None => "a verdict without a rank".to_owned(),
                },
                Some((kind, _)) => format!("a part of the id exchange across nodes of unknown kind {kind}"),
                None => "an empty part of the id exchange across nodes".to_owned(),
            };
            problem.get_or_insert_with(|| malformed(cross.as_ref(), c, detail));
        }),
    )?;
    clock.lap("cross ids");
    // Every rank now holds every node's verdict: the same decision
    // everywhere, without an agreement of its own.
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let mut parts: Vec<&[u8]> = vec![&ok; comm.size()];
    for (r, outcome) in &verdicts {
        if *r != comm.rank() {
            parts[*r] = outcome;
        }
    }
    let conv = wholemem::agree::decide(comm.as_ref(), checked, wholemem::agree::Rule::Lowest, &parts)?;
    let db = conv.dst_bytes();

    // 4. Owners copy the rows asked of them straight into the exchange;
    //    this rank's own unique rows are copied while the others travel.
    //    Each unique row goes straight to this rank's requests for it in
    //    `out`; a row from another node is also kept for the fan-out when
    //    another local rank asked for it — its whole part, where the backend
    //    hands it over without a copy, else the row — and this rank's own
    //    rows go to the fan-out straight from the table.
    let mut for_others = vec![false; unique.len()];
    for (q, a) in answer.iter().enumerate() {
        if q != lme {
            for &u in a {
                for_others[u] = owner_node[u] != cme;
            }
        }
    }
    // When no row from another node is for another local rank (one rank
    // per node, say), every unique row has a place in `out` here: the
    // parts land there straight from the exchange, each row at its first
    // place, and nothing is kept for the fan-out.
    let lands = !for_others.contains(&true);
    let mut unique_rows = scratch(if lands { 0 } else { unique.len() * db });
    // This rank's requests by unique row: positions in `out` of unique row
    // `u` are `mine[mine_at[u]..mine_at[u + 1]]`.
    let mut mine_at = vec![0usize; unique.len() + 1];
    for &u in &answer[lme] {
        mine_at[u + 1] += 1;
    }
    for u in 0..unique.len() {
        mine_at[u + 1] += mine_at[u];
    }
    let mut mine = vec![0usize; answer[lme].len()];
    {
        let mut next = mine_at.clone();
        for (&u, &pos) in answer[lme].iter().zip(wanted(lme)) {
            mine[next[u]] = pos;
            next[u] += 1;
        }
    }
    // Each part behind a kind byte: rows follow, or what this rank found
    // wrong so far (its verdict travels instead of rows, and on from the
    // receivers to their nodes in the fan-out, so every rank learns it).
    drop_oversized(cross.as_ref(), &mut asked, cme, db, &mut problem);
    let verdict = finding_bytes(&mut problem);
    let sizes = reply_sizes(cross.size(), cme, db, verdict.as_deref(), |c| asked[c].len());
    // Verdicts heard from other ranks: their bytes (to pass on) and error.
    let mut heard: Vec<(Vec<u8>, Error)> = Vec::new();
    let (on, mut copying, mut own_time, mut placing) = (clock.on(), Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut failed, mut own_failed): (Option<Error>, Option<Error>) = (None, None);
    // Unique row `u` (`row`): to each of this rank's places for it, and to
    // the fan-out's kept rows when another local rank wants it and its part
    // is not kept whole (`to_kept`).
    let deliver = |kept: &mut [u8], out: &mut [u8], u: usize, row: &[u8], to_kept: bool| {
        if to_kept && for_others[u] {
            kept[u * db..][..db].copy_from_slice(row);
        }
        for &pos in &mine[mine_at[u]..mine_at[u + 1]] {
            out[pos * db..][..db].copy_from_slice(row);
        }
    };
    // Parts from other nodes kept whole for the fan-out (where the backend
    // lets them be kept without a copy), with each unique row's place in
    // its part.
    let mut frames: Vec<Option<wm_comm::KeptPart>> = (0..cross.size()).map(|_| None).collect();
    // (Only where some row is for another local rank: with a rank per
    // node nothing is kept.)
    let mut in_part = Vec::new();
    if for_others.contains(&true) {
        in_part.resize(unique.len(), 0);
        for c in 0..cross.size() {
            for (k, &u) in uwanted(c).iter().enumerate() {
                in_part[u] = k;
            }
        }
    }
    let first = p.offset(comm.rank());
    let (mut to_out, mut out_at) = (Vec::new(), Vec::new());
    for &u in uwanted(cme) {
        if mine_at[u] < mine_at[u + 1] {
            to_out.push(unique[u] as usize - first);
            out_at.push(mine[mine_at[u]]);
        }
    }
    let (mut next, chunk) = (0, step_rows(mem, db, to_out.len()));
    let mut also = Some(also);
    // Copies each row of the part from cross rank `c`, in `out` at the
    // first of its places, on to the others.
    let spread = |out: &mut [u8], c: usize| {
        for &u in uwanted(c) {
            let places = &mine[mine_at[u]..mine_at[u + 1]];
            let Some((&at, more)) = places.split_first() else { continue };
            for &pos in more {
                out.copy_within(at * db..(at + 1) * db, pos * db);
            }
        }
    };
    let mut fill = |c: usize, buf: &mut [u8]| {
        if c == cme {
            return;
        }
        let copy = |body: &mut [u8]| timed(on, &mut copying, || read_local(mem, layout, conv, &asked[c], None, body));
        if let Some(e) = fill_reply(buf, verdict.as_deref(), copy) {
            failed.get_or_insert(e);
        }
    };
    // Rows this rank asked for go straight to the first of their places in
    // `out`, a piece per step, then on to their further places; then the
    // caller's work.
    let mut own_step = |out: &mut [u8]| {
        if next < to_out.len() {
            let end = (next + chunk).min(to_out.len());
            timed(on, &mut own_time, || {
                if let Err(e) = read_local(mem, layout, conv, &to_out[next..end], Some(&out_at[next..end]), out) {
                    own_failed.get_or_insert(e);
                }
            });
            next = if own_failed.is_some() { to_out.len() } else { end };
            return true;
        }
        if let Some(a) = also.take() {
            if own_failed.is_none() {
                timed(on, &mut own_time, || spread(out, cme));
            }
            a();
        }
        false
    };
    if lands {
        let firsts: Vec<Vec<usize>> =
            (0..cross.size()).map(|c| if c == cme { Vec::new() } else { uwanted(c).iter().map(|&u| mine[mine_at[u]]).collect() }).collect();
        let landings: Vec<&[usize]> = firsts.iter().map(Vec::as_slice).collect();
        let (mut landed, mut verdicts): (Vec<bool>, Vec<Option<Vec<u8>>>) = (vec![false; cross.size()], vec![None; cross.size()]);
        let mut landed_verdict = vec![false; cross.size()];
        cross.exchange(
            ExchangePlan::new(&sizes, &mut fill).land_rows(out, 1, db, &landings).between_steps(&mut own_step).receive_parts(
                &mut |c, part| {
                    if c == cme {
                        return;
                    }
                    timed(on, &mut placing, || match read_arrival(cross.as_ref(), c, &part, uwanted(c).len(), db) {
                        Arrived::Rows => landed[c] = true,
                        Arrived::VerdictInRows => landed_verdict[c] = true,
                        Arrived::Verdict(v) => verdicts[c] = Some(v),
                        Arrived::Failed(e) => {
                            problem.get_or_insert(e);
                        }
                    });
                },
            ),
        )?;
        // Rows that landed at their first place go on to the others, and
        // verdicts of the rows' very length are read back; heard in rank
        // order, as they arrive in the other branch.
        timed(on, &mut placing, || {
            for c in (0..cross.size()).filter(|&c| landed[c]) {
                spread(out, c);
            }
        });
        for c in 0..cross.size() {
            let v = if landed_verdict[c] { Some(wm_comm::plan::read_back(out, landings[c], db)) } else { verdicts[c].take() };
            if let Some(v) = v {
                let e = verdict_error(cross.as_ref(), c, &v);
                heard.push((v, e));
            }
        }
    } else {
        let cells = std::cell::RefCell::new((&mut unique_rows, &mut *out));
        cross.exchange(ExchangePlan::new(&sizes, &mut fill).between_steps(&mut |_| own_step(cells.borrow_mut().1)).receive_parts(
            &mut |c, part| {
                if c == cme {
                    return;
                }
                let whole = part.keeps_without_copy() && uwanted(c).iter().any(|&u| for_others[u]);
                let rows_arrived = timed(on, &mut placing, || match read_reply(cross.as_ref(), c, part.bytes(), uwanted(c).len(), db) {
                    Reply::Rows(body) => {
                        let mut cells = cells.borrow_mut();
                        let (kept, out) = &mut *cells;
                        for (row, &u) in body.chunks_exact(db).zip(uwanted(c)) {
                            deliver(kept, out, u, row, !whole);
                        }
                        true
                    }
                    Reply::Verdict(v) => {
                        heard.push((v.to_vec(), verdict_error(cross.as_ref(), c, v)));
                        false
                    }
                    Reply::Failed(e) => {
                        problem.get_or_insert(e);
                        false
                    }
                });
                if rows_arrived && whole {
                    frames[c] = Some(part.keep());
                }
            },
        ))?;
    }
    clock.lap_split("cross rows", &[("owner copy", copying), ("own rows", own_time), ("place", placing)]);

    // 5. Back within the node: each local rank gets its rows in the order it
    //    asked for them, written straight into the exchange (this rank's own
    //    requests are in `out` already).
    //    Behind a kind byte again: rows, or the verdict this rank found or
    //    heard across nodes.
    let mut problem = failed.or(own_failed).or(problem);
    let verdict = finding_bytes(&mut problem).or_else(|| heard.first().map(|(v, _)| v.clone()));
    let unique_row = |u: usize| &unique_rows[u * db..][..db];
    let sizes = reply_sizes(local.size(), lme, db, verdict.as_deref(), |q| from_local[q].len());
    let out = std::cell::RefCell::new(out);
    let first = p.offset(comm.rank());
    let mut fan_failed: Option<Error> = None;
    let (mut fan_copy, mut fan_place) = (Duration::ZERO, Duration::ZERO);
    local.exchange(
        ExchangePlan::new(&sizes, &mut |q, buf| {
            if q == lme {
                return;
            }
            // Rows from other nodes from where they were kept, this rank's
            // own from the table.
            let copy = |body: &mut [u8]| {
                let (mut own, mut own_at) = (Vec::new(), Vec::new());
                for (k, (slot, &u)) in body.chunks_exact_mut(db).zip(&answer[q]).enumerate() {
                    if owner_node[u] == cme {
                        own.push(unique[u] as usize - first);
                        own_at.push(k);
                    } else if let Some(f) = &frames[owner_node[u]] {
                        // The part this row crossed in: kind byte, rows.
                        slot.copy_from_slice(&f[1 + in_part[u] * db..][..db]);
                    } else {
                        slot.copy_from_slice(unique_row(u));
                    }
                }
                read_local(mem, layout, conv, &own, Some(&own_at), body)
            };
            if let Some(e) = timed(on, &mut fan_copy, || fill_reply(buf, verdict.as_deref(), copy)) {
                fan_failed.get_or_insert(e);
            }
        })
        .receive(&mut |q, bytes| {
            if q == lme {
                return;
            }
            match read_reply(local.as_ref(), q, bytes, wanted(q).len(), db) {
                Reply::Rows(body) => timed(on, &mut fan_place, || place(&mut out.borrow_mut(), body, wanted(q), db)),
                Reply::Verdict(v) => heard.push((v.to_vec(), verdict_error(local.as_ref(), q, v))),
                Reply::Failed(e) => {
                    problem.get_or_insert(e);
                }
            }
        }),
    )?;
    if let Some(e) = fan_failed {
        problem.get_or_insert(e);
    }
    give_back(vec![unique_rows]);
    cross.recycle(frames.into_iter().flatten().map(wm_comm::KeptPart::into_vec).collect());
    clock.lap_split("fan out", &[("fan copy", fan_copy), ("fan place", fan_place)]);
    // This rank's own finding first, else the first verdict it heard: every
    // rank has heard of every finding made before the rows crossed nodes
    // (a malformed part found later fails the ranks its finder reaches).
    // Device copies can fail on one rank alone: device tables agree once
    // more.
    let local_outcome = match problem.or_else(|| heard.into_iter().next().map(|(_, e)| e)) {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let done = if mem.location() == wholemem::Location::Host { local_outcome } else { agree(comm.as_ref(), local_outcome) };
    clock.lap("agree");
    done
}
