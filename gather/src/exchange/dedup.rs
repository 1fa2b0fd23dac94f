//! De-duplicating ids: the ids a node asks for (the hierarchy's exchange),
//! each unique id once with, for every request, the unique id that answers
//! it; and a distributed gather's or scatter's ids, each distinct row once
//! per owner ([`first_sights`], [`last_sights`], after one sampled check
//! per call, [`repeats_likely`]).

/// The distinct ids of every rank's list in the order they first appear —
/// list `first` read first, then the others in order — and for each list
/// the index into them of each of its ids. With `first` this rank's own
/// requests in the order of its output, rows fetched in this order land in
/// ascending places of the output (writes that stream rather than scatter).
///
/// By a hash table (one pass); where the ids defeat the hash — more probes
/// than a few per id, as ids chosen against it would cause — by sorting.
pub(super) fn dedup(lists: &[Vec<u64>], first: usize) -> (Vec<u64>, Vec<Vec<usize>>) {
    let order: Vec<usize> = std::iter::once(first).chain((0..lists.len()).filter(|&l| l != first)).filter(|&l| l < lists.len()).collect();
    dedup_hashed(lists, &order, PROBES_PER_ID).unwrap_or_else(|| in_first_appearance(dedup_sorted(lists), &order))
}

/// One owner's share of a gather's requests, `positions` into `rows`, with
/// each row asked once: the positions of each distinct row's first sight,
/// in order, and every later position with the first one of its row (whose
/// landed row is copied there). `None` when no row repeats. A caller asks
/// only where [`repeats_likely`] said so for the call's rows.
pub(super) fn first_sights(rows: &[usize], positions: &[usize]) -> Option<FirstSights> {
    let (distinct, numbers) = numbered_if_repeated(rows, positions)?;
    // Numbered in order of first sight: a row's number is new exactly when
    // it equals the count of rows seen.
    let mut first = Vec::with_capacity(distinct);
    let mut repeats = Vec::with_capacity(positions.len() - distinct);
    for (&p, &u) in positions.iter().zip(&numbers) {
        if u == first.len() {
            first.push(p);
        } else {
            repeats.push((p, first[u]));
        }
    }
    Some(FirstSights { first, repeats })
}

/// One owner's share of a scatter's rows, `positions` into `rows`, with
/// each row sent once: the position of each distinct row's last sight (the
/// one a scatter writes last, so the one that wins), in input order.
/// `None` when no row repeats. A caller asks only where [`repeats_likely`]
/// said so for the call's rows.
pub(super) fn last_sights(rows: &[usize], positions: &[usize]) -> Option<Vec<usize>> {
    let (distinct, numbers) = numbered_if_repeated(rows, positions)?;
    let mut last = vec![0; distinct];
    for (k, &u) in numbers.iter().enumerate() {
        last[u] = k;
    }
    Some(numbers.iter().enumerate().filter(|&(k, &u)| last[u] == k).map(|(k, _)| positions[k]).collect())
}

/// How many distinct rows `positions` name in `rows`, and each position's
/// row numbered in order of first sight; `None` when no row repeats (at
/// once where the rows ascend strictly, as a caller's sorted distinct ids
/// do).
fn numbered_if_repeated(rows: &[usize], positions: &[usize]) -> Option<(usize, Vec<usize>)> {
    if positions.windows(2).all(|w| rows[w[0]] < rows[w[1]]) {
        return None;
    }
    let lists = [positions.iter().map(|&i| rows[i] as u64).collect::<Vec<u64>>()];
    let (unique, mut numbers) = dedup(&lists, 0);
    (unique.len() < positions.len()).then(|| (unique.len(), numbers.swap_remove(0)))
}

/// Calls of up to this many ids are de-duplicated without a sample first.
pub(super) const SAMPLED_ABOVE: usize = 1024;

/// Whether enough of a call's `rows` repeat to be worth de-duplicating
/// each owner's share: a sample of the n rows holds at least two repeats.
/// The sample is about 8·√n rows: a pair of neighbours at a random place
/// in each of n / stride equal strata. The pairs see runs of one row, as
/// sorted lists with repeats have; the random places see repeats at any
/// fixed distance, as a list twice over has, where evenly spaced places
/// could miss them all. A share of 5 % repeated rows gives about 3 pairs
/// in the sample, seen 4 times in 5. Uniform ids over a large table and
/// distinct ids give almost none, and skip the full passes (about 14 ns an
/// id: 0.45 ms of a 65 536-id call of 8-wide rows). Missing some repeats
/// costs only speed. Calls of [`SAMPLED_ABOVE`] ids or fewer are always
/// de-duplicated.
pub(super) fn repeats_likely(rows: &[usize]) -> bool {
    sample_repeats(rows, hash_seed())
}

/// [`repeats_likely`] with its sample's places and hash drawn from `seed`.
fn sample_repeats(rows: &[usize], seed: u64) -> bool {
    let n = rows.len();
    if n <= SAMPLED_ABOVE {
        return true;
    }
    let sample = (8.0 * (n as f64).sqrt()) as usize;
    // Half as many strata as rows sampled, two rows in each; at least 2
    // rows a stratum, so that its pair fits.
    let stride = (2 * n / sample.max(1)).max(2);
    let strata = n / stride;
    // At least twice as many slots as rows sampled.
    let bits = (4 * strata).max(16).next_power_of_two().trailing_zeros();
    let (mask, shift) = ((1usize << bits) - 1, u64::BITS - bits);
    // Rows are below the table's row count, never the empty mark.
    const EMPTY: u64 = u64::MAX;
    let mut slots = vec![EMPTY; 1 << bits];
    let (mut repeats, mut budget) = (0, 8 * sample);
    // The place in each stratum: a xorshift from `seed`.
    let mut next = xorshift(seed | 1);
    let places = (0..strata).map(|i| i * stride + (next() % (stride as u64 - 1)) as usize);
    for id in places.flat_map(|k| [rows[k], rows[k + 1]]).map(|r| r as u64) {
        let mut slot = slot_of(id, seed, shift);
        loop {
            match slots[slot] {
                EMPTY => {
                    slots[slot] = id;
                    break;
                }
                v if v == id => {
                    repeats += 1;
                    if repeats >= 2 {
                        return true;
                    }
                    break;
                }
                // Ids that defeat the hash: leave it to the full pass,
                // which has its own fallback.
                _ if budget == 0 => return true,
                _ => budget -= 1,
            }
            slot = (slot + 1) & mask;
        }
    }
    false
}

/// A xorshift generator from `x` (not zero): numbers that repeat run to
/// run for the same `x`.
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The first slot of `id` in a table of `2^(64 - shift)` slots: Fibonacci
/// hashing of the id mixed with this process's seed.
#[inline]
fn slot_of(id: u64, seed: u64, shift: u32) -> usize {
    ((id ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize
}

/// [`first_sights`]' answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct FirstSights {
    /// The positions asked on the wire: each distinct row's first.
    pub(super) first: Vec<usize>,
    /// (a later position, the first position of its row).
    pub(super) repeats: Vec<(usize, usize)>,
}

/// `unique` and `answer` as [`dedup_sorted`] gives them, renumbered in the
/// order of first appearance in `answer`'s lists taken in `order`.
pub(super) fn in_first_appearance((unique, mut answer): (Vec<u64>, Vec<Vec<usize>>), order: &[usize]) -> (Vec<u64>, Vec<Vec<usize>>) {
    let mut number = vec![usize::MAX; unique.len()];
    let mut renumbered = Vec::with_capacity(unique.len());
    for &l in order {
        for u in &mut answer[l] {
            if number[*u] == usize::MAX {
                number[*u] = renumbered.len();
                renumbered.push(unique[*u]);
            }
            *u = number[*u];
        }
    }
    (renumbered, answer)
}

/// The hash table's probes per id, on average over a call, past which
/// [`dedup`] gives up on it.
pub(super) const PROBES_PER_ID: usize = 4;

/// [`dedup`] by open addressing, lists read in `order`; `None` when the
/// probes past the first exceed `probes_per_id` per id (and 64 more), or an
/// id or the count of ids does not fit in 32 bits.
pub(super) fn dedup_hashed(lists: &[Vec<u64>], order: &[usize], probes_per_id: usize) -> Option<(Vec<u64>, Vec<Vec<usize>>)> {
    let total: usize = lists.iter().map(Vec::len).sum();
    if u32::try_from(total).is_err() {
        return None;
    }
    // At most half full. A slot holds an id in its high half and the id's
    // number in its low half, or is empty; one cache line per probe.
    const EMPTY: u64 = u64::MAX;
    let bits = (2 * total).max(16).next_power_of_two().trailing_zeros();
    let (mask, shift) = ((1usize << bits) - 1, u64::BITS - bits);
    let mut slots: Vec<u64> = crate::sort::KEYS.with(|k| k.borrow_mut().get(1 << bits));
    slots.fill(EMPTY);
    let seed = hash_seed();
    let mut budget = probes_per_id.saturating_mul(total).saturating_add(64);
    let mut unique = Vec::with_capacity(total);
    let mut answer: Vec<Vec<usize>> = lists.iter().map(|l| Vec::with_capacity(l.len())).collect();
    let mut fits = true;
    'lists: for &l in order {
        for &id in &lists[l] {
            // Ids of 32 bits (the empty mark's high half included) are left
            // to the sort.
            if id >= u64::from(u32::MAX) {
                fits = false;
                break 'lists;
            }
            let mut slot = slot_of(id, seed, shift);
            let u = loop {
                let s = slots[slot];
                if s == EMPTY {
                    let u = unique.len();
                    unique.push(id);
                    slots[slot] = (id << 32) | u as u64;
                    break u;
                }
                if s >> 32 == id {
                    break (s & u64::from(u32::MAX)) as usize;
                }
                match budget.checked_sub(1) {
                    Some(b) => budget = b,
                    None => {
                        fits = false;
                        break 'lists;
                    }
                }
                slot = (slot + 1) & mask;
            };
            answer[l].push(u);
        }
    }
    crate::sort::KEYS.with(|k| k.borrow_mut().keep(slots));
    fits.then_some((unique, answer))
}

/// A seed for [`dedup_hashed`], fixed for the process and unknown outside
/// it (so nobody can pick ids that collide; those who try anyway only
/// cost the fallback).
pub(super) fn hash_seed() -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64))
}

/// [`dedup`]'s fallback: the distinct ids ascending, by sorting.
pub(super) fn dedup_sorted(lists: &[Vec<u64>]) -> (Vec<u64>, Vec<Vec<usize>>) {
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut flat = vec![0usize; total];
    let mut unique = Vec::with_capacity(total);
    // Requests numbered across the lists, in order.
    crate::sort::for_each_by_id(lists.iter().flatten().copied(), |id, g| {
        if unique.last() != Some(&id) {
            unique.push(id);
        }
        flat[g] = unique.len() - 1;
    });
    let mut rest = &flat[..];
    let answer = lists
        .iter()
        .map(|l| {
            let (mine, more) = rest.split_at(l.len());
            rest = more;
            mine.to_vec()
        })
        .collect();
    (unique, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_answers_every_request_with_its_unique_id() {
        // Small ids (packed keys) and ids too large to pack (pairs).
        for big in [0, u64::MAX - 20] {
            let lists: Vec<Vec<u64>> =
                vec![vec![9, 3, 9], vec![], vec![3, 7, 1, 7]].into_iter().map(|l| l.into_iter().map(|x| x + big).collect()).collect();
            let (unique, answer) = dedup_sorted(&lists);
            assert_eq!(unique, [1 + big, 3 + big, 7 + big, 9 + big]);
            for first in 0..3 {
                let (unique, answer) = dedup(&lists, first);
                let expect = [[9, 3, 7, 1], [9, 3, 7, 1], [3, 7, 1, 9]][first];
                assert_eq!(unique, expect.map(|x| x + big), "list {first} first");
                for (l, a) in lists.iter().zip(&answer) {
                    assert_eq!(l.len(), a.len());
                    for (&id, &u) in l.iter().zip(a) {
                        assert_eq!(unique[u], id);
                    }
                }
            }
            for (l, a) in lists.iter().zip(&answer) {
                for (&id, &u) in l.iter().zip(a) {
                    assert_eq!(unique[u], id);
                }
            }
        }
        assert_eq!(dedup(&[vec![], vec![]], 1), (vec![], vec![vec![], vec![]]));
    }

    #[test]
    fn first_sights_ask_each_row_once_and_name_where_repeats_come_from() {
        // Positions 1, 2, 4, 5, 7 of the rows below: rows 9, 3, 9, 3, 5.
        let rows = [0, 9, 3, 1, 9, 3, 8, 5];
        let positions = [1, 2, 4, 5, 7];
        let FirstSights { first, repeats } = first_sights(&rows, &positions).expect("rows 9 and 3 repeat");
        assert_eq!(first, [1, 2, 7]);
        assert_eq!(repeats, [(4, 1), (5, 2)]);
        for &(p, f) in &repeats {
            assert_eq!(rows[p], rows[f]);
        }
        // Nothing repeats: ascending (the cached path's sorted fetch) or not.
        assert_eq!(first_sights(&rows, &[3, 2, 1]), None);
        assert_eq!(first_sights(&rows, &[1, 6, 7]), None);
        assert_eq!(first_sights(&rows, &[]), None);
    }

    #[test]
    fn last_sights_send_the_row_that_wins_once() {
        // Positions 1, 2, 4, 5, 7: rows 9, 3, 9, 3, 5; the last 9 is at 4,
        // the last 3 at 5.
        let rows = [0, 9, 3, 1, 9, 3, 8, 5];
        assert_eq!(last_sights(&rows, &[1, 2, 4, 5, 7]), Some(vec![4, 5, 7]));
        assert_eq!(last_sights(&rows, &[4, 1, 6]), Some(vec![1, 6]));
        assert_eq!(last_sights(&rows, &[3, 2, 1]), None);
        assert_eq!(last_sights(&rows, &[1, 6, 7]), None);
    }

    #[test]
    fn a_sample_tells_repeated_rows_from_distinct_ones() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let n = 40_000;
        let positions: Vec<usize> = (0..n).collect();
        // Distinct rows, shuffled (not ascending): no pass.
        let mut distinct: Vec<usize> = (0..n).map(|i| i * 7).collect();
        for i in (1..n).rev() {
            distinct.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        // Every claim below holds for each of 20 seeds of the sample.
        let likely = |rows: &[usize]| (1..=20).map(|seed| sample_repeats(rows, seed)).collect::<Vec<bool>>();
        assert_eq!(likely(&distinct), [false; 20]);
        assert_eq!(first_sights(&distinct, &positions), None);
        // A fifth of the ids repeat an earlier one: the pass runs.
        let mut some: Vec<usize> = distinct.clone();
        for i in (0..n).step_by(5).skip(1) {
            some[i] = some[(next() % i as u64) as usize];
        }
        assert_eq!(likely(&some), [true; 20]);
        let FirstSights { first, repeats } = first_sights(&some, &positions).expect("repeats");
        assert_eq!(first.len() + repeats.len(), n);
        assert!(repeats.len() >= n / 10);
        // Every row twice, the two halves alike: seen too.
        let twice: Vec<usize> = distinct[..n / 2].iter().chain(&distinct[..n / 2]).copied().collect();
        assert_eq!(likely(&twice), [true; 20]);
        // Every row twice in a row, as a sorted list with repeats: seen,
        // at any stride.
        for len in [2 * SAMPLED_ABOVE + 2, n, 5 * n] {
            let pairs: Vec<usize> = (0..len).map(|i| i / 2).collect();
            assert_eq!(likely(&pairs), [true; 20], "{len} ids");
            // The runs starting at odd places.
            let shifted: Vec<usize> = std::iter::once(len).chain((0..len).map(|i| i / 2)).collect();
            assert_eq!(likely(&shifted), [true; 20], "{len} ids, shifted");
        }
        // Short calls always take the pass.
        assert!(repeats_likely(&distinct[..SAMPLED_ABOVE]));
        assert!(!repeats_likely(&distinct));
    }

    #[test]
    fn the_hash_and_its_fallback_agree() {
        // Three lists of 30 000 ids drawn from 50 000 random 31-bit ids, so
        // with many repeats; the sort's answer renumbered must be the hash
        // table's exactly.
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let pool: Vec<u64> = (0..50_000).map(|_| next() >> 33).collect();
        let lists: Vec<Vec<u64>> = (0..3).map(|_| (0..30_000).map(|_| pool[(next() % 50_000) as usize]).collect()).collect();
        let order = [1, 0, 2];
        let hashed = dedup_hashed(&lists, &order, PROBES_PER_ID).expect("random ids stay within the probe budget");
        assert_eq!(hashed, in_first_appearance(dedup_sorted(&lists), &order));
        assert!(hashed.0.len() < 50_000);
        // A budget that runs out (as ids chosen to collide would make it)
        // leaves the work to the sort.
        assert_eq!(dedup_hashed(&lists, &order, 0), None);
    }
}
