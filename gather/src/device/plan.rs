//! The plan of a device exchange: who sends how many ids to whom, where
//! each part lies in the sender's bucketed ids and in the owner's buffer,
//! and how large every rank's shared buffer must be. Built on every rank
//! from the same counts (every rank's, allgathered), so every rank computes
//! every rank's layout alike. Pure host code.
//!
//! An owner's shared buffer holds the parts sent to it, in rank order:
//! first the ids (8 bytes each), then — from a 256-byte boundary — one row
//! per id: the rows it gathered for the senders (a gather), or the rows the
//! senders wrote (a scatter). Rank order is what makes a scatter's outcome
//! the host's: the last occurrence of the highest rank wins.

/// Alignment of the rows within a shared buffer.
const ALIGN: usize = 256;

/// The counts of an exchange: `count(s, r)` ids from rank `s` to owner `r`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    n: usize,
    /// Row-major: `counts[s * n + r]`.
    counts: Vec<usize>,
}

impl Plan {
    /// The plan from every rank's counts (`counts[s]`: what rank `s` sends
    /// each owner), each checked: `n` of them, and at most `max_ids` ids in
    /// all to or from any rank (what the kernels' `i32`/`u32` positions
    /// hold). The error names the rank whose counts do not fit.
    pub(crate) fn new(counts: &[Vec<u64>], max_ids: usize) -> std::result::Result<Self, (usize, String)> {
        let n = counts.len();
        let mut flat = Vec::with_capacity(n * n);
        for (s, row) in counts.iter().enumerate() {
            if row.len() != n {
                return Err((s, format!("{} counts for {n} ranks", row.len())));
            }
            let mut sum = 0usize;
            for &c in row {
                let c = usize::try_from(c).ok().filter(|&c| c <= max_ids);
                match c.and_then(|c| sum.checked_add(c)).filter(|&t| t <= max_ids) {
                    Some(t) => sum = t,
                    None => return Err((s, format!("counts {row:?} are more than {max_ids} ids"))),
                }
                flat.push(c.unwrap_or(0));
            }
        }
        let plan = Self { n, counts: flat };
        if let Some(r) = (0..n).find(|&r| plan.try_asked(r).is_none_or(|t| t > max_ids)) {
            // Whose counts tipped it over is not one rank's fault: name the owner.
            return Err((r, format!("more than {max_ids} ids asked of one owner")));
        }
        Ok(plan)
    }

    /// Ranks.
    pub(crate) fn ranks(&self) -> usize {
        self.n
    }

    /// Ids rank `s` sends owner `r`.
    pub(crate) fn count(&self, s: usize, r: usize) -> usize {
        self.counts[s * self.n + r]
    }

    /// Ids rank `s` sends in all (its call's ids).
    pub(crate) fn sent(&self, s: usize) -> usize {
        (0..self.n).map(|r| self.count(s, r)).sum()
    }

    fn try_asked(&self, r: usize) -> Option<usize> {
        (0..self.n).try_fold(0usize, |t, s| t.checked_add(self.count(s, r)))
    }

    /// Ids owner `r` receives in all.
    pub(crate) fn asked(&self, r: usize) -> usize {
        (0..self.n).map(|s| self.count(s, r)).sum()
    }

    /// Where rank `s`'s bucket for owner `r` starts among its ids grouped
    /// by owner (owners in rank order).
    pub(crate) fn bucket_start(&self, s: usize, r: usize) -> usize {
        (0..r).map(|q| self.count(s, q)).sum()
    }

    /// Where sender `s`'s part starts among owner `r`'s received ids (and
    /// rows): senders in rank order.
    pub(crate) fn part_start(&self, r: usize, s: usize) -> usize {
        (0..s).map(|q| self.count(q, r)).sum()
    }

    /// The sender of owner `r`'s received id at `position`.
    pub(crate) fn sender_of(&self, r: usize, position: usize) -> Option<usize> {
        let mut end = 0;
        (0..self.n).find(|&s| {
            end += self.count(s, r);
            position < end
        })
    }

    /// Owner `r`'s shared buffer for rows of `row_bytes` bytes.
    pub(crate) fn layout(&self, r: usize, row_bytes: usize) -> Option<Layout> {
        let ids = self.asked(r);
        let ids_bytes = ids.checked_mul(8)?;
        let rows_at = ids_bytes.checked_next_multiple_of(ALIGN)?;
        let rows_bytes = ids.checked_mul(row_bytes)?;
        Some(Layout { ids_at: 0, ids_bytes, rows_at, rows_bytes, total: rows_at.checked_add(rows_bytes)? })
    }
}

/// Where the parts lie in one owner's shared buffer (byte offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) ids_at: usize,
    pub(crate) ids_bytes: usize,
    pub(crate) rows_at: usize,
    pub(crate) rows_bytes: usize,
    pub(crate) total: usize,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn plan(rows: &[&[u64]]) -> Plan {
        Plan::new(&rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>(), 1 << 30).unwrap()
    }

    #[test]
    fn offsets_of_a_three_rank_exchange() {
        // Rank 0 sends 2 ids to 0, 3 to 1, 0 to 2; rank 1: 1, 0, 4; rank 2: 5, 6, 7.
        let p = plan(&[&[2, 3, 0], &[1, 0, 4], &[5, 6, 7]]);
        assert_eq!((p.sent(0), p.sent(1), p.sent(2)), (5, 5, 18));
        assert_eq!((p.asked(0), p.asked(1), p.asked(2)), (8, 9, 11));
        // Rank 2's buckets: owner 0 from 0, owner 1 from 5, owner 2 from 11.
        assert_eq!((p.bucket_start(2, 0), p.bucket_start(2, 1), p.bucket_start(2, 2)), (0, 5, 11));
        // Owner 1 receives rank 0's 3, rank 1's 0, rank 2's 6, in rank order.
        assert_eq!((p.part_start(1, 0), p.part_start(1, 1), p.part_start(1, 2)), (0, 3, 3));
        assert_eq!(
            (p.sender_of(1, 0), p.sender_of(1, 2), p.sender_of(1, 3), p.sender_of(1, 8), p.sender_of(1, 9)),
            (Some(0), Some(0), Some(2), Some(2), None)
        );
        let l = p.layout(2, 512).unwrap();
        assert_eq!(l, Layout { ids_at: 0, ids_bytes: 88, rows_at: 256, rows_bytes: 11 * 512, total: 256 + 11 * 512 });
    }

    #[test]
    fn counts_that_do_not_fit_name_the_rank() {
        let e = Plan::new(&[vec![1, 2], vec![3]], 100).unwrap_err();
        assert_eq!(e.0, 1);
        assert!(e.1.contains("1 counts for 2 ranks"), "{}", e.1);
        let e = Plan::new(&[vec![1, 2], vec![60, 41]], 100).unwrap_err();
        assert_eq!(e.0, 1);
        assert!(e.1.contains("more than 100 ids"), "{}", e.1);
        let e = Plan::new(&[vec![u64::MAX, 0], vec![0, 0]], 100).unwrap_err();
        assert_eq!(e.0, 0);
        // Every sender within the limit, but one owner asked too much.
        let e = Plan::new(&[vec![60, 0], vec![60, 0]], 100).unwrap_err();
        assert_eq!(e.0, 0);
        assert!(e.1.contains("asked of one owner"), "{}", e.1);
        assert!(Plan::new(&[], 100).unwrap().ranks() == 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Every sender's buckets tile its ids, every owner's parts tile
        /// what it receives, in rank order, and each part is as long in
        /// both places; the layouts hold them without overlap.
        #[test]
        fn buckets_and_parts_tile_without_gaps_or_overlaps(n in 1usize..7, raw in prop::collection::vec(0u64..50, 36), rb in 1usize..1000) {
            let counts: Vec<Vec<u64>> = (0..n).map(|s| raw[s * 6..s * 6 + n].to_vec()).collect();
            let p = Plan::new(&counts, 1 << 20).unwrap();
            for s in 0..n {
                let mut at = 0;
                for r in 0..n {
                    prop_assert_eq!(p.bucket_start(s, r), at);
                    at += p.count(s, r);
                }
                prop_assert_eq!(at, p.sent(s));
            }
            for r in 0..n {
                let mut at = 0;
                for s in 0..n {
                    prop_assert_eq!(p.part_start(r, s), at);
                    for k in 0..p.count(s, r) {
                        prop_assert_eq!(p.sender_of(r, at + k), Some(s));
                    }
                    at += p.count(s, r);
                }
                prop_assert_eq!(at, p.asked(r));
                prop_assert_eq!(p.sender_of(r, at), None);
                let l = p.layout(r, rb).unwrap();
                prop_assert!(l.ids_at + l.ids_bytes <= l.rows_at && l.rows_at % 256 == 0);
                prop_assert_eq!(l.total, l.rows_at + at * rb);
            }
            let total_sent: usize = (0..n).map(|s| p.sent(s)).sum();
            let total_asked: usize = (0..n).map(|r| p.asked(r)).sum();
            prop_assert_eq!(total_sent, total_asked);
        }
    }
}
