//! Which rank owns which rows.

use std::ops::Range;

/// Rows per rank: contiguous, in rank order. Rank `r` owns
/// `offset(r)..offset(r + 1)`; ranks may own zero rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    offsets: Vec<usize>,
}

impl Partition {
    /// The default split: `ceil(rows / world)` rows each; the last ranks may
    /// get fewer or none.
    pub fn even(rows: usize, world: usize) -> Self {
        assert!(world > 0, "a partition needs at least one rank");
        let per = rows.div_ceil(world);
        Self { offsets: (0..=world).map(|r| r.saturating_mul(per).min(rows)).collect() }
    }

    /// A partition from rows per rank.
    ///
    /// # Panics
    /// For no ranks, or counts that sum past `usize::MAX` (in every build:
    /// the sum is checked, never wrapped).
    pub fn from_counts(counts: &[usize]) -> Self {
        assert!(!counts.is_empty(), "a partition needs at least one rank");
        let mut offsets = Vec::with_capacity(counts.len() + 1);
        offsets.push(0);
        let mut acc = 0usize;
        for &c in counts {
            acc = acc.checked_add(c).unwrap_or_else(|| panic!("the partition {counts:?} sums past usize::MAX rows"));
            offsets.push(acc);
        }
        Self { offsets }
    }

    /// Total rows.
    pub fn rows(&self) -> usize {
        *self.offsets.last().expect("non-empty")
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The first row of rank `r` (`offset(world)` is the row count).
    pub fn offset(&self, r: usize) -> usize {
        self.offsets[r]
    }

    /// Rows of rank `r`.
    pub fn count(&self, r: usize) -> usize {
        self.offsets[r + 1] - self.offsets[r]
    }

    /// The rows rank `r` owns.
    pub fn range(&self, r: usize) -> Range<usize> {
        self.offsets[r]..self.offsets[r + 1]
    }

    /// Rows per rank.
    pub fn counts(&self) -> Vec<usize> {
        self.offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// The rank that owns `row` (`row < rows()`).
    pub fn owner(&self, row: usize) -> usize {
        debug_assert!(row < self.rows());
        self.offsets.partition_point(|&o| o <= row) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_rounds_up_and_leaves_trailing_ranks_short() {
        let p = Partition::even(10, 4);
        assert_eq!(p.counts(), vec![3, 3, 3, 1]);
        let p = Partition::even(5, 4);
        assert_eq!(p.counts(), vec![2, 2, 1, 0]);
        let p = Partition::even(1, 3);
        assert_eq!(p.counts(), vec![1, 0, 0]);
    }

    #[test]
    fn huge_row_counts_do_not_wrap() {
        let p = Partition::even(usize::MAX - 1, 3);
        assert_eq!(p.rows(), usize::MAX - 1);
        assert!((0..3).all(|r| p.offset(r) <= p.offset(r + 1)));
        assert!(std::panic::catch_unwind(|| Partition::from_counts(&[usize::MAX, 1])).is_err());
    }

    #[test]
    fn owner_skips_empty_ranks() {
        let p = Partition::from_counts(&[0, 3, 0, 0, 2, 0]);
        let owners: Vec<usize> = (0..5).map(|r| p.owner(r)).collect();
        assert_eq!(owners, vec![1, 1, 1, 4, 4]);
        for r in 0..p.world() {
            for row in p.range(r) {
                assert_eq!(p.owner(row), r);
            }
        }
    }
}
