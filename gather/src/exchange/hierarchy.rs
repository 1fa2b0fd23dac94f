//! The hierarchy gather: ids routed within the node, de-duplicated, sent
//! across nodes once per node, and the rows fanned out within the node.

use super::dedup::dedup;
use super::distributed::gather_distributed;
use super::ids::checked_rows;
use super::local::{give_back, place, read_local, scratch, step_rows};
use super::wire::{
    Arrived, FAILED, IDS, Refused, Reply, call_shape, drop_oversized, fill_ids, fill_reply, finding_bytes, ids_part_size, malformed,
    read_arrival, read_ids, read_reply, reply_sizes, verdict_error,
};
use crate::kernel::RowConv;
use crate::profile::{Clock, timed};
use crate::sort::Buckets;
use crate::{Error, Ids, Result, RowLayout};
use std::sync::Arc;
use std::time::Duration;
use wholemem::CommonError;
use wholemem::WholeMemory;
use wholemem::agree::{Rule, agree};
use wm_comm::{Communicator, ExchangePlan, KeptPart};

/// A communicator of a table.
pub(super) type Comm = Arc<dyn Communicator>;

/// The local and cross communicators of a hierarchy table.
pub(super) fn hierarchy_comms(mem: &WholeMemory) -> Result<(&Comm, &Comm)> {
    match (mem.local_comm(), mem.cross_comm()) {
        (Some(l), Some(c)) => Ok((l, c)),
        _ => {
            Err(Error::Common(CommonError::InvalidArgument(format!("a {} table has no local and cross communicators", mem.memory_type()))))
        }
    }
}

/// `while_rows_travel` as in [`gather_distributed`], while the rows cross nodes.
///
/// The phases: ids routed within the node ([`route_in_node`]),
/// de-duplicated ([`dedup`]), sent across nodes once per node
/// ([`route_across_nodes`]), every rank's checks decided; rows back across
/// nodes ([`cross_rows`]), then fanned out within the node ([`fan_out`]).
pub(crate) fn gather_hierarchy(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    mut clock: Clock,
    while_rows_travel: &mut dyn FnMut() -> bool,
) -> Result<()> {
    // Every rank of a hierarchy table has both communicators (from
    // allocation), so this fails everywhere or nowhere.
    let (local, cross) = hierarchy_comms(mem)?;
    if cross.size() == 1 {
        // One node: nothing crosses nodes, so there is nothing to de-duplicate.
        return gather_distributed(mem, layout, checked, ids, out, clock, while_rows_travel);
    }
    let shape = call_shape("gather", layout, &checked);
    let x = Ctx { mem, layout, local, cross, placement: wm_topology::NodeLayout::of(mem.comm().nodes()), on: clock.on(), shape };
    let rows = checked_rows(&checked, ids);
    let mut problem: Option<Error> = None;
    let mine = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
    let node = route_in_node(&x, &rows, mine.as_deref(), &mut problem)?;
    clock.lap("node ids");
    // De-duplicate what the node asked of this rank, remembering for each
    // request which unique id answers it (so the fan-out needs no search).
    let (unique, answer) = dedup(&node.from_local, local.rank());
    let unique = Unique { ids: unique, answer };
    clock.lap("dedup");
    let mut routed = route_across_nodes(&x, &unique.ids, node.verdict.clone(), &mut problem)?;
    clock.lap("cross ids");
    let conv = decide_checks(&x, checked, &routed.verdicts)?;
    let db = conv.dst_bytes();
    let places = Places::of(&x, &node, &unique, &routed);
    // What this rank found wrong so far travels instead of rows (and on
    // from the receivers to their nodes in the fan-out, so every rank
    // learns it).
    drop_oversized(cross.as_ref(), &mut routed.asked, cross.rank(), db, &mut problem);
    let verdict = finding_bytes(&mut problem);
    let c = Crossing { x: &x, conv, db, routed: &routed, places: &places, verdict };
    let mut across = Across::new(problem, cross.size(), if places.lands() { 0 } else { unique.ids.len() * db });
    let [copying, own_time] = cross_rows(&c, out, while_rows_travel, &mut across)?;
    clock.lap_split("cross rows", &[("owner copy", copying), ("own rows", own_time), ("place", across.placing)]);
    let [fan_copy, fan_place] = fan_out(&c, &node, &unique, &mut across, out)?;
    clock.lap_split("fan out", &[("fan copy", fan_copy), ("fan place", fan_place)]);
    // This rank's own finding first, else the first verdict it heard: every
    // rank has heard of every finding made before the rows crossed nodes
    // (a malformed part found later fails the ranks its finder reaches).
    // Device copies can fail on one rank alone: device tables agree once
    // more.
    let local_outcome = match across.problem.or_else(|| across.heard.into_iter().next()) {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let done =
        if mem.location() == wholemem::Location::Host { local_outcome } else { agree(mem.comm().as_ref(), local_outcome, Rule::Lowest) };
    clock.lap("agree");
    done
}

/// What every phase of one hierarchy gather reads.
struct Ctx<'a> {
    mem: &'a WholeMemory,
    layout: &'a RowLayout,
    /// The ranks of this node.
    local: &'a Comm,
    /// The ranks with this rank's local rank, one per node.
    cross: &'a Comm,
    /// Each world rank's node and local rank.
    placement: wm_topology::NodeLayout,
    /// Whether phases are timed.
    on: bool,
    /// The call's shape, which leads each part of ids
    /// ([`super::wire::call_shape`]).
    shape: Vec<u8>,
}

/// The ids this rank asked for, routed within the node.
struct NodeIds {
    /// Positions of this rank's ids, grouped by the local rank that serves
    /// them.
    by_local: Buckets,
    /// The ids each local rank routed here (this rank's own included).
    from_local: Vec<Vec<u64>>,
    /// The node's verdict: its lowest failing rank and that rank's outcome.
    verdict: Option<(usize, Vec<u8>)>,
}

/// 1. Within the node: each id goes to the local rank with its owner's
///    local rank (that rank's cross communicator reaches the owner). The
///    parts also carry each rank's check outcome (`mine`, when it failed):
///    after this exchange a rank knows its node's, after the next one every
///    node's.
fn route_in_node(x: &Ctx<'_>, rows: &[usize], mine: Option<&[u8]>, problem: &mut Option<Error>) -> Result<NodeIds> {
    let (local, p, local_rank_of) = (x.local, x.mem.partition(), &x.placement.local);
    let lme = local.rank();
    let via: Vec<usize> = rows.iter().map(|&r| local_rank_of[p.owner(r)]).collect();
    let by_local = Buckets::of(&via, local.size());
    let wanted = |q: usize| by_local.get(q);
    // This rank's own part is only its kind byte: its ids stay here.
    let sizes: Vec<usize> = (0..local.size()).map(|q| ids_part_size(mine, &x.shape, if q == lme { 0 } else { wanted(q).len() })).collect();
    let mut from_local: Vec<Vec<u64>> = vec![Vec::new(); local.size()];
    // The node's failures: (world rank, outcome), this rank's own included.
    let mut failures: Vec<(usize, Vec<u8>)> = mine.iter().map(|m| (x.mem.comm().world_rank(), m.to_vec())).collect();
    local.exchange(
        ExchangePlan::new(&sizes, &mut |q, buf| {
            // This rank's own ids stay here.
            let ids = if q == lme { &[][..] } else { wanted(q) };
            fill_ids(buf, mine, &x.shape, ids.iter().map(|&i| rows[i] as u64));
        })
        .receive(&mut |q, bytes| {
            if q == lme {
                from_local[q] = wanted(q).iter().map(|&i| rows[i] as u64).collect();
                return;
            }
            let detail = match bytes.split_first() {
                // Rows of the table routed here (the owner's local rank is
                // this rank's); a bad part is dropped.
                Some((&IDS, body)) => match read_ids(local.as_ref(), q, body, &x.shape, p.rows()) {
                    Ok(ids) => match ids.iter().position(|&id| local_rank_of[p.owner(id)] != lme) {
                        Some(i) => format!("row id {} at position {i}, which another local rank serves", ids[i]),
                        None => {
                            from_local[q] = ids.into_iter().map(|id| id as u64).collect();
                            return;
                        }
                    },
                    Err(Refused::Malformed(detail)) => detail,
                    Err(Refused::OtherCall(e)) => {
                        problem.get_or_insert(e);
                        return;
                    }
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
    // The node's verdict: its lowest failing rank, if any.
    failures.sort_by_key(|(r, _)| *r);
    Ok(NodeIds { verdict: failures.first().cloned(), by_local, from_local })
}

/// The ids the node asked of this rank, each once.
struct Unique {
    /// The unique ids, this rank's own requests first.
    ids: Vec<u64>,
    /// For each local rank's request, the index of the unique id that
    /// answers it.
    answer: Vec<Vec<usize>>,
}

/// The unique ids routed across nodes.
struct CrossIds {
    /// The node of each unique id's owner.
    owner_node: Vec<usize>,
    /// Unique ids grouped by owner node.
    by_node: Buckets,
    /// The rows of this rank each cross rank asked for.
    asked: Vec<Vec<usize>>,
    /// Every node's verdict: (world rank, outcome).
    verdicts: Vec<(usize, Vec<u8>)>,
}

/// 3. Across nodes, unique ids only (the owner is this cross
///    communicator's member on the owner's node), with the node's verdict.
///    Each node's ids keep the de-duplication's order (this rank's
///    requests first), so that its rows come back — and this rank's own
///    are copied — in the order of `out`.
fn route_across_nodes(
    x: &Ctx<'_>,
    unique: &[u64],
    node_verdict: Option<(usize, Vec<u8>)>,
    problem: &mut Option<Error>,
) -> Result<CrossIds> {
    let (comm, cross, p, node_of) = (x.mem.comm(), x.cross, x.mem.partition(), &x.placement.node);
    let owner_node: Vec<usize> = unique.iter().map(|&id| node_of[p.owner(id as usize)]).collect();
    let by_node = Buckets::of(&owner_node, cross.size());
    let uwanted = |c: usize| by_node.get(c);
    let cme = cross.rank();
    let verdict_bytes = node_verdict.as_ref().map(|(r, o)| [&(*r as u64).to_le_bytes()[..], o].concat());
    // This rank's own unique ids stay out of the exchange.
    let sizes: Vec<usize> =
        (0..cross.size()).map(|c| ids_part_size(verdict_bytes.as_deref(), &x.shape, if c == cme { 0 } else { uwanted(c).len() })).collect();
    let count = x.mem.local_rows().len();
    let mut asked: Vec<Vec<usize>> = vec![Vec::new(); cross.size()];
    let mut verdicts: Vec<(usize, Vec<u8>)> = node_verdict.into_iter().collect();
    cross.exchange(
        ExchangePlan::new(&sizes, &mut |c, buf| {
            let ids = if c == cme { &[][..] } else { uwanted(c) };
            let local_row = |k: usize| {
                let id = unique[k] as usize;
                (id - p.offset(p.owner(id))) as u64
            };
            fill_ids(buf, verdict_bytes.as_deref(), &x.shape, ids.iter().map(|&k| local_row(k)));
        })
        .receive(&mut |c, bytes| {
            if c == cme {
                return;
            }
            let detail = match bytes.split_first() {
                Some((&IDS, body)) => match read_ids(cross.as_ref(), c, body, &x.shape, count) {
                    Ok(ids) => {
                        asked[c] = ids;
                        return;
                    }
                    Err(Refused::Malformed(detail)) => detail,
                    Err(Refused::OtherCall(e)) => {
                        problem.get_or_insert(e);
                        return;
                    }
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
    Ok(CrossIds { owner_node, by_node, asked, verdicts })
}

/// Every rank now holds every node's verdict: the same decision
/// everywhere, without an agreement of its own.
fn decide_checks(x: &Ctx<'_>, checked: Result<RowConv>, verdicts: &[(usize, Vec<u8>)]) -> Result<RowConv> {
    let comm = x.mem.comm();
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let mut parts: Vec<&[u8]> = vec![&ok; comm.size()];
    for (r, outcome) in verdicts {
        if *r != comm.rank() {
            parts[*r] = outcome;
        }
    }
    wholemem::agree::decide(comm.as_ref(), checked, wholemem::agree::Rule::Lowest, &parts)
}

/// Where the unique rows go on this rank.
struct Places {
    /// Whether another local rank wants each unique row from another node.
    for_others: Vec<bool>,
    /// This rank's requests by unique row: positions in `out` of unique row
    /// `u` are `mine[mine_at[u]..mine_at[u + 1]]`.
    mine_at: Vec<usize>,
    mine: Vec<usize>,
    /// Each unique row's place in its part (only where some row is for
    /// another local rank: with a rank per node nothing is kept).
    in_part: Vec<usize>,
    /// This rank's own rows it asked for (numbered from its first row), and
    /// the first of their places in `out`.
    to_out: Vec<usize>,
    out_at: Vec<usize>,
}

impl Places {
    fn of(x: &Ctx<'_>, node: &NodeIds, unique: &Unique, routed: &CrossIds) -> Self {
        let (lme, cme, answer) = (x.local.rank(), x.cross.rank(), &unique.answer);
        let mut for_others = vec![false; unique.ids.len()];
        for (q, a) in answer.iter().enumerate() {
            if q != lme {
                for &u in a {
                    for_others[u] = routed.owner_node[u] != cme;
                }
            }
        }
        let mut mine_at = vec![0usize; unique.ids.len() + 1];
        for &u in &answer[lme] {
            mine_at[u + 1] += 1;
        }
        for u in 0..unique.ids.len() {
            mine_at[u + 1] += mine_at[u];
        }
        let mut mine = vec![0usize; answer[lme].len()];
        let mut next = mine_at.clone();
        for (&u, &pos) in answer[lme].iter().zip(node.by_local.get(lme)) {
            mine[next[u]] = pos;
            next[u] += 1;
        }
        let mut in_part = Vec::new();
        if for_others.contains(&true) {
            in_part.resize(unique.ids.len(), 0);
            for c in 0..x.cross.size() {
                for (k, &u) in routed.by_node.get(c).iter().enumerate() {
                    in_part[u] = k;
                }
            }
        }
        let first = x.mem.partition().offset(x.mem.comm().rank());
        let (mut to_out, mut out_at) = (Vec::new(), Vec::new());
        for &u in routed.by_node.get(cme) {
            if mine_at[u] < mine_at[u + 1] {
                to_out.push(unique.ids[u] as usize - first);
                out_at.push(mine[mine_at[u]]);
            }
        }
        Self { for_others, mine_at, mine, in_part, to_out, out_at }
    }

    /// When no row from another node is for another local rank (one rank
    /// per node, say), every unique row has a place in `out` here: the
    /// parts land there straight from the exchange, each row at its first
    /// place, and nothing is kept for the fan-out.
    fn lands(&self) -> bool {
        !self.for_others.contains(&true)
    }

    /// This rank's places in `out` for unique row `u`.
    fn of_unique(&self, u: usize) -> &[usize] {
        &self.mine[self.mine_at[u]..self.mine_at[u + 1]]
    }

    /// Copies each of the unique rows `rows`, in `out` at the first of its
    /// places, on to the others.
    fn spread(&self, out: &mut [u8], rows: &[usize], db: usize) {
        for &u in rows {
            let Some((&at, more)) = self.of_unique(u).split_first() else { continue };
            for &pos in more {
                out.copy_within(at * db..(at + 1) * db, pos * db);
            }
        }
    }
}

/// What the rows' exchange across nodes reads, its checks decided.
struct Crossing<'a> {
    x: &'a Ctx<'a>,
    conv: RowConv,
    /// Bytes per row of the output.
    db: usize,
    routed: &'a CrossIds,
    places: &'a Places,
    /// What this rank found wrong, sent instead of rows.
    verdict: Option<Vec<u8>>,
}

/// What the rows' exchange across nodes leaves for the fan-out.
struct Across {
    /// What this rank found wrong.
    problem: Option<Error>,
    /// The errors of the verdicts heard from other ranks, naming whom
    /// they blame (passed on with [`wholemem::agree::relayed_bytes`]).
    heard: Vec<Error>,
    /// Rows from other nodes kept, by unique row, where their part is not
    /// kept whole.
    unique_rows: Vec<u8>,
    /// Parts from other nodes kept whole for the fan-out (where the backend
    /// lets them be kept without a copy).
    frames: Vec<Option<KeptPart>>,
    /// Time spent placing rows that arrived.
    placing: Duration,
}

impl Across {
    fn new(problem: Option<Error>, nodes: usize, kept_bytes: usize) -> Self {
        let frames = (0..nodes).map(|_| None).collect();
        Self { problem, heard: Vec::new(), unique_rows: scratch(kept_bytes), frames, placing: Duration::ZERO }
    }
}

/// 4. Owners copy the rows asked of them straight into the exchange; this
///    rank's own unique rows are copied while the others travel. Each
///    unique row goes straight to this rank's requests for it in `out`; a
///    row from another node is also kept for the fan-out when another local
///    rank asked for it — its whole part, where the backend hands it over
///    without a copy, else the row — and this rank's own rows go to the
///    fan-out straight from the table. Returns the time spent copying for
///    others and copying this rank's own rows.
fn cross_rows(c: &Crossing<'_>, out: &mut [u8], while_rows_travel: &mut dyn FnMut() -> bool, across: &mut Across) -> Result<[Duration; 2]> {
    let (x, db, places) = (c.x, c.db, c.places);
    let (cross, cme, on) = (x.cross, x.cross.rank(), x.on);
    let sizes = reply_sizes(cross.size(), cme, db, c.verdict.as_deref(), |r| c.routed.asked[r].len());
    let (mut copying, mut own_time) = (Duration::ZERO, Duration::ZERO);
    let (mut failed, mut own_failed): (Option<Error>, Option<Error>) = (None, None);
    let (mut next, chunk) = (0, step_rows(x.mem, db, places.to_out.len()));
    let (mut spread, mut caller_busy) = (false, true);
    let mut fill = |r: usize, buf: &mut [u8]| {
        if r == cme {
            return;
        }
        let copy = |body: &mut [u8]| timed(on, &mut copying, || read_local(x.mem, x.layout, c.conv, &c.routed.asked[r], None, body));
        if let Some(e) = fill_reply(buf, c.verdict.as_deref(), copy) {
            failed.get_or_insert(e);
        }
    };
    // Rows this rank asked for go straight to the first of their places in
    // `out`, a piece per step, then on to their further places; then the
    // caller's work.
    let mut own_step = |out: &mut [u8]| {
        if next < places.to_out.len() {
            let end = (next + chunk).min(places.to_out.len());
            timed(on, &mut own_time, || {
                if let Err(e) = read_local(x.mem, x.layout, c.conv, &places.to_out[next..end], Some(&places.out_at[next..end]), out) {
                    own_failed.get_or_insert(e);
                }
            });
            next = if own_failed.is_some() { places.to_out.len() } else { end };
            return true;
        }
        if !spread {
            spread = true;
            if own_failed.is_none() {
                timed(on, &mut own_time, || places.spread(out, c.routed.by_node.get(cme), db));
            }
        }
        caller_busy = caller_busy && while_rows_travel();
        caller_busy
    };
    if places.lands() {
        land_across(c, &sizes, &mut fill, &mut own_step, out, across)?;
    } else {
        keep_across(c, &sizes, &mut fill, &mut own_step, out, across)?;
    }
    across.problem = failed.or(own_failed).or(across.problem.take());
    Ok([copying, own_time])
}

/// [`cross_rows`]'s exchange where every row lands in `out`: each part at
/// the first places of its rows, which then go on to the others; verdicts
/// of the rows' very length are read back.
fn land_across(
    c: &Crossing<'_>,
    sizes: &[usize],
    fill: &mut dyn FnMut(usize, &mut [u8]),
    own_step: &mut dyn FnMut(&mut [u8]) -> bool,
    out: &mut [u8],
    across: &mut Across,
) -> Result<()> {
    let (cross, cme, db, on, routed, places) = (c.x.cross, c.x.cross.rank(), c.db, c.x.on, c.routed, c.places);
    let firsts: Vec<Vec<usize>> = (0..cross.size())
        .map(|r| if r == cme { Vec::new() } else { routed.by_node.get(r).iter().map(|&u| places.mine[places.mine_at[u]]).collect() })
        .collect();
    let landings: Vec<&[usize]> = firsts.iter().map(Vec::as_slice).collect();
    let (mut landed, mut verdicts): (Vec<bool>, Vec<Option<Vec<u8>>>) = (vec![false; cross.size()], vec![None; cross.size()]);
    let mut landed_verdict = vec![false; cross.size()];
    let Across { problem, heard, placing, .. } = across;
    cross.exchange(ExchangePlan::new(sizes, fill).land_rows(out, 1, db, &landings).between_steps(own_step).receive_parts(
        &mut |r, part| {
            if r == cme {
                return;
            }
            timed(on, placing, || match read_arrival(cross.as_ref(), r, &part, routed.by_node.get(r).len(), db) {
                Arrived::Rows => landed[r] = true,
                Arrived::VerdictInRows => landed_verdict[r] = true,
                Arrived::Verdict(v) => verdicts[r] = Some(v),
                Arrived::Failed(e) => {
                    problem.get_or_insert(e);
                }
            });
        },
    ))?;
    // Rows that landed at their first place go on to the others, and
    // verdicts of the rows' very length are read back; heard in rank
    // order, as they arrive in the other branch.
    timed(on, placing, || {
        for r in (0..cross.size()).filter(|&r| landed[r]) {
            places.spread(out, routed.by_node.get(r), db);
        }
    });
    for r in 0..cross.size() {
        let v = if landed_verdict[r] { Some(wm_comm::plan::read_back(out, landings[r], db)) } else { verdicts[r].take() };
        if let Some(v) = v {
            heard.push(verdict_error(cross.as_ref(), r, &v));
        }
    }
    Ok(())
}

/// [`cross_rows`]'s exchange where rows from other nodes are also kept for
/// the fan-out: parts whole where that costs no copy, else row by row.
fn keep_across(
    c: &Crossing<'_>,
    sizes: &[usize],
    fill: &mut dyn FnMut(usize, &mut [u8]),
    own_step: &mut dyn FnMut(&mut [u8]) -> bool,
    out: &mut [u8],
    across: &mut Across,
) -> Result<()> {
    let (cross, cme, db, on, routed, places) = (c.x.cross, c.x.cross.rank(), c.db, c.x.on, c.routed, c.places);
    let Across { problem, heard, placing, unique_rows, frames } = across;
    // Unique row `u` (`row`): to each of this rank's places for it, and to
    // the fan-out's kept rows when another local rank wants it and its part
    // is not kept whole (`to_kept`).
    let deliver = |kept: &mut [u8], out: &mut [u8], u: usize, row: &[u8], to_kept: bool| {
        if to_kept && places.for_others[u] {
            kept[u * db..][..db].copy_from_slice(row);
        }
        for &pos in places.of_unique(u) {
            out[pos * db..][..db].copy_from_slice(row);
        }
    };
    let cells = std::cell::RefCell::new((&mut *unique_rows, &mut *out));
    cross.exchange(ExchangePlan::new(sizes, fill).between_steps(&mut |_| own_step(cells.borrow_mut().1)).receive_parts(
        &mut |r, part| {
            if r == cme {
                return;
            }
            let whole = part.keeps_without_copy() && routed.by_node.get(r).iter().any(|&u| places.for_others[u]);
            let rows_arrived = timed(on, placing, || match read_reply(cross.as_ref(), r, part.bytes(), routed.by_node.get(r).len(), db) {
                Reply::Rows(body) => {
                    let mut cells = cells.borrow_mut();
                    let (kept, out) = &mut *cells;
                    for (row, &u) in body.chunks_exact(db).zip(routed.by_node.get(r)) {
                        deliver(kept, out, u, row, !whole);
                    }
                    true
                }
                Reply::Verdict(v) => {
                    heard.push(verdict_error(cross.as_ref(), r, v));
                    false
                }
                Reply::Failed(e) => {
                    problem.get_or_insert(e);
                    false
                }
            });
            if rows_arrived && whole {
                frames[r] = Some(part.keep());
            }
        },
    ))?;
    Ok(())
}

/// 5. Back within the node: each local rank gets its rows in the order it
///    asked for them, written straight into the exchange (this rank's own
///    requests are in `out` already). Behind a kind byte again: rows, or
///    the verdict this rank found or heard across nodes. Returns the time
///    spent copying and placing.
fn fan_out(c: &Crossing<'_>, node: &NodeIds, unique: &Unique, across: &mut Across, out: &mut [u8]) -> Result<[Duration; 2]> {
    let (x, db, conv, places) = (c.x, c.db, c.conv, c.places);
    let (local, lme, cme, on) = (x.local, x.local.rank(), x.cross.rank(), x.on);
    let owner_node = &c.routed.owner_node;
    let Across { problem, heard, unique_rows, frames, .. } = across;
    // A verdict heard across nodes goes on as what it said, not as this
    // rank's: the ranks of this node decode it as from this rank, and must
    // still name the rank it blames (a verdict of success where rows
    // belong blames the node that sent it, not this one).
    let verdict = finding_bytes(problem).or_else(|| heard.first().map(wholemem::agree::relayed_bytes));
    let unique_row = |u: usize| &unique_rows[u * db..][..db];
    let sizes = reply_sizes(local.size(), lme, db, verdict.as_deref(), |q| node.from_local[q].len());
    let out = std::cell::RefCell::new(out);
    let first = x.mem.partition().offset(x.mem.comm().rank());
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
                for (k, (slot, &u)) in body.chunks_exact_mut(db).zip(&unique.answer[q]).enumerate() {
                    if owner_node[u] == cme {
                        own.push(unique.ids[u] as usize - first);
                        own_at.push(k);
                    } else if let Some(f) = &frames[owner_node[u]] {
                        // The part this row crossed in: kind byte, rows.
                        slot.copy_from_slice(&f[1 + places.in_part[u] * db..][..db]);
                    } else {
                        slot.copy_from_slice(unique_row(u));
                    }
                }
                read_local(x.mem, x.layout, conv, &own, Some(&own_at), body)
            };
            if let Some(e) = timed(on, &mut fan_copy, || fill_reply(buf, verdict.as_deref(), copy)) {
                fan_failed.get_or_insert(e);
            }
        })
        .receive(&mut |q, bytes| {
            if q == lme {
                return;
            }
            match read_reply(local.as_ref(), q, bytes, node.by_local.get(q).len(), db) {
                Reply::Rows(body) => timed(on, &mut fan_place, || place(&mut out.borrow_mut(), body, node.by_local.get(q), db)),
                Reply::Verdict(v) => heard.push(verdict_error(local.as_ref(), q, v)),
                Reply::Failed(e) => {
                    problem.get_or_insert(e);
                }
            }
        }),
    )?;
    if let Some(e) = fan_failed {
        problem.get_or_insert(e);
    }
    give_back(vec![std::mem::take(unique_rows)]);
    x.cross.recycle(std::mem::take(frames).into_iter().flatten().map(KeptPart::into_vec).collect());
    Ok([fan_copy, fan_place])
}
