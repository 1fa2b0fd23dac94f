//! Caches of table rows: keep hot rows close so that a skewed id stream
//! stops paying for the same far rows again.
//!
//! - [`NodeCache`]: a **node cache of remote rows** for distributed and
//!   hierarchy tables that span several nodes — host memory shared by the
//!   ranks of a node, holding rows other nodes own. Read-only: a rank's
//!   rows leave it when that rank's write generation moves, whatever wrote
//!   them, so a cached gather returns exactly what
//!   [`gather`](crate::gather) returns.
//! - `DeviceCache` (feature `cuda`): a **device cache of host rows** — this
//!   rank's own rows of a host table in its GPU's memory, read-write,
//!   written back on `writeback()` and before the rows are read through
//!   another path; it forgets its rows when another path writes them.
//!
//! Both know their table by its allocation number
//! ([`WholeMemory::serial`](wholemem::WholeMemory::serial)), never by an
//! address a later table may get.
//!
//! Both size themselves by a **cache ratio**, the fraction of the table's
//! rows they may hold (greater than 0, at most 1; anything else is refused
//! on every rank with the value named), place rows in sets of [`WAYS`]
//! slots with access counts (the hottest rows of each set stay), and count
//! what they do in [`CacheStats`]. `docs/cache.md` has the design, the
//! coherence rules and the figures.

mod bypass;
#[cfg(feature = "cuda")]
mod device;
mod node;
mod policy;

pub use bypass::Bypass;
#[cfg(feature = "cuda")]
pub use device::DeviceCache;
pub use node::{NodeCache, WriteMark};
pub use policy::{AGEING_PER_SLOT, WAYS};

use wholemem::CommonError;

use crate::{Error, Result};

/// What a cache did since it was created.
///
/// For a [`NodeCache`], `lookups` and `hits` count this rank's ids (those
/// of rows other nodes own: the rows the cache can hold), while `fills`
/// and `evictions` count the node's cache, the same on every rank of the
/// node. `writebacks` counts dirty rows written back to the table (a
/// read-only cache has none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Ids looked up in the cache.
    pub lookups: u64,
    /// Of those, the ones served from the cache.
    pub hits: u64,
    /// Rows copied into the cache.
    pub fills: u64,
    /// Rows dropped from the cache to make room for others.
    pub evictions: u64,
    /// Dirty rows written back to the table.
    pub writebacks: u64,
}

impl CacheStats {
    /// Hits over lookups (0 without lookups).
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 { 0.0 } else { self.hits as f64 / self.lookups as f64 }
    }

    /// What happened between `earlier` and `self` (both of one cache).
    pub fn since(&self, earlier: &CacheStats) -> CacheStats {
        CacheStats {
            lookups: self.lookups.saturating_sub(earlier.lookups),
            hits: self.hits.saturating_sub(earlier.hits),
            fills: self.fills.saturating_sub(earlier.fills),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            writebacks: self.writebacks.saturating_sub(earlier.writebacks),
        }
    }
}

/// Checks a cache ratio: finite, greater than 0, at most 1.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the ratio.
pub fn check_ratio(ratio: f64) -> Result<()> {
    if ratio.is_finite() && ratio > 0.0 && ratio <= 1.0 {
        return Ok(());
    }
    Err(Error::Common(CommonError::InvalidArgument(format!(
        "cache ratio {ratio}: a cache holds a fraction of the table's rows, greater than 0 and at most 1"
    ))))
}

/// Slots for `ratio` of `rows` rows, rounded up (`ratio` checked).
pub(crate) fn ratio_slots(ratio: f64, rows: usize) -> usize {
    // Exact for every table below 2^53 rows; a ratio of 1 is every row.
    ((ratio * rows as f64).ceil() as usize).min(rows)
}

/// The rows a node cache may hold — those ranks of other nodes own —
/// numbered from 0 in table order.
#[derive(Debug, Clone)]
pub(crate) struct RowSpace {
    /// The table's partition offsets (ranks + 1 entries).
    offsets: Vec<usize>,
    /// For each rank, the number of its first row among the cacheable ones,
    /// or `None` for ranks of this node.
    first: Vec<Option<usize>>,
    rows: usize,
}

impl RowSpace {
    /// The rows owned by the ranks for which `remote(rank)` holds.
    pub(crate) fn new(p: &wholemem::Partition, remote: impl Fn(usize) -> bool) -> Self {
        let world = p.world();
        let mut first = Vec::with_capacity(world);
        let mut rows = 0;
        for r in 0..world {
            if remote(r) {
                first.push(Some(rows));
                rows += p.count(r);
            } else {
                first.push(None);
            }
        }
        Self { offsets: (0..=world).map(|r| p.offset(r)).collect(), first, rows }
    }

    /// How many rows are cacheable.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// The numbers among the cacheable rows of rank `r`'s rows, or `None`
    /// for a rank of this node.
    pub(crate) fn rank_rows(&self, r: usize) -> Option<std::ops::Range<usize>> {
        let first = self.first.get(r).copied().flatten()?;
        Some(first..first + self.offsets[r + 1] - self.offsets[r])
    }

    /// The number of table row `row` (below the table's rows) among the
    /// cacheable rows, or `None` when this node owns it.
    #[inline]
    pub(crate) fn index(&self, row: usize) -> Option<usize> {
        // Few ranks: count the offsets at or below the row, which has no
        // branch to mispredict on random rows (a search has one per step).
        let at_or_below = if self.offsets.len() <= 16 {
            self.offsets.iter().map(|&o| usize::from(o <= row)).sum()
        } else {
            self.offsets.partition_point(|&o| o <= row)
        };
        let owner = at_or_below.checked_sub(1)?;
        self.first.get(owner).copied().flatten().map(|f| f + row - self.offsets[owner])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_outside_0_to_1_are_refused_naming_the_value() {
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let e = check_ratio(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("cache ratio {bad}")) && e.contains("greater than 0 and at most 1"), "{e}");
        }
        for good in [1e-9, 0.01, 0.5, 1.0] {
            check_ratio(good).unwrap();
        }
        assert_eq!(ratio_slots(0.1, 1000), 100);
        assert_eq!(ratio_slots(0.001, 10), 1);
        assert_eq!(ratio_slots(1.0, 7), 7);
    }

    #[test]
    fn remote_rows_are_numbered_in_table_order_skipping_this_nodes() {
        // Ranks 0 and 2 are here; 1 and 3 elsewhere; rank 2 has no rows.
        let p = wholemem::Partition::from_counts(&[3, 4, 0, 2]);
        let s = RowSpace::new(&p, |r| r % 2 == 1);
        assert_eq!(s.rows(), 6);
        let got: Vec<Option<usize>> = (0..9).map(|row| s.index(row)).collect();
        assert_eq!(got, vec![None, None, None, Some(0), Some(1), Some(2), Some(3), Some(4), Some(5)]);
        let here = RowSpace::new(&p, |_| false);
        assert_eq!((here.rows(), here.index(5)), (0, None));
        // Each remote rank's rows as one run of numbers.
        let runs: Vec<Option<std::ops::Range<usize>>> = (0..4).map(|r| s.rank_rows(r)).collect();
        assert_eq!(runs, vec![None, Some(0..4), None, Some(4..6)]);
        assert_eq!(s.rank_rows(4), None);
    }

    #[test]
    fn few_ranks_and_many_number_rows_alike() {
        // Up to 15 ranks the owner is found by counting offsets, from 16 on
        // by a search; ranks with no rows among them. Against a walk of
        // every rank's rows.
        for world in [1, 2, 3, 15, 16, 40] {
            let counts: Vec<usize> = (0..world).map(|r| if r % 5 == 2 { 0 } else { 1 + r % 3 }).collect();
            let p = wholemem::Partition::from_counts(&counts);
            let s = RowSpace::new(&p, |r| r % 3 != 0);
            let mut want = Vec::new();
            let mut next = 0;
            for (r, &n) in counts.iter().enumerate() {
                for _ in 0..n {
                    want.push((r % 3 != 0).then(|| {
                        next += 1;
                        next - 1
                    }));
                }
            }
            let got: Vec<Option<usize>> = (0..want.len()).map(|row| s.index(row)).collect();
            assert_eq!(got, want, "{world} ranks");
            assert_eq!(s.rows(), next, "{world} ranks");
        }
    }

    #[test]
    fn stats_subtract_and_rate() {
        let a = CacheStats { lookups: 10, hits: 4, fills: 3, evictions: 1, writebacks: 0 };
        let b = CacheStats { lookups: 30, hits: 19, fills: 5, evictions: 2, writebacks: 0 };
        let d = b.since(&a);
        assert_eq!(d, CacheStats { lookups: 20, hits: 15, fills: 2, evictions: 1, writebacks: 0 });
        assert_eq!(d.hit_rate(), 0.75);
        assert_eq!(CacheStats::default().hit_rate(), 0.0);
    }
}
