//! The resolution of repeated scatter ids on the device, as host code: the
//! same hash table, probe and rule as `repeats.cuh` (its `mark` and `keep`
//! kernels), run one id at a time. The device runs the inserts in any
//! order; the tests run them in several orders and check the outcome
//! against the rule "within one call the last occurrence of an id wins"
//! (`cuda/host_check.rs` also runs the C++ of `repeats.cuh` itself against
//! this reference).
//!
//! The table needs `capacity(n)` slots of 12 bytes (a `u64` key and a `u32`
//! position) for `n` ids: 24–48 bytes per id, bounded by the batch rather
//! than by the table's rows.

#[cfg(test)]
/// A slot no key has claimed (`WM_EMPTY_KEY`).
pub(crate) const EMPTY_KEY: u64 = u64::MAX;

/// Slots of the table for `n` ids: a power of two of at least `2 n` (so a
/// probe ends within a few slots on average, and always ends), 16 at least.
/// (Past `usize::MAX / 4` ids the largest power of two: no such batch fits
/// in memory anyway, and the launch refuses a table that is too small.)
pub(crate) fn capacity(n: usize) -> usize {
    n.saturating_mul(2).max(16).checked_next_power_of_two().unwrap_or(1 << (usize::BITS - 1))
}

#[cfg(test)]
/// `wm_repeat_hash`: the murmur3 64-bit finaliser.
pub(crate) fn hash(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

#[cfg(test)]
/// The table: keys and positions, as the device holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) keys: Vec<u64>,
    pub(crate) vals: Vec<u32>,
}

#[cfg(test)]
impl Table {
    /// An empty table of `capacity` slots (a power of two), as the device
    /// path fills it before `mark`.
    pub(crate) fn new(capacity: usize) -> Self {
        debug_assert!(capacity.is_power_of_two());
        Self { keys: vec![EMPTY_KEY; capacity], vals: vec![0; capacity] }
    }

    fn mask(&self) -> u64 {
        self.keys.len() as u64 - 1
    }

    /// `wm_repeat_insert`.
    pub(crate) fn insert(&mut self, key: u64, i: u32) {
        let mask = self.mask();
        let mut s = hash(key) & mask;
        loop {
            let prev = self.keys[s as usize];
            if prev == EMPTY_KEY {
                self.keys[s as usize] = key;
            }
            if prev == EMPTY_KEY || prev == key {
                self.vals[s as usize] = self.vals[s as usize].max(i);
                return;
            }
            s = (s + 1) & mask;
        }
    }

    /// `wm_repeat_is_last`.
    pub(crate) fn is_last(&self, key: u64, i: u32) -> bool {
        let mask = self.mask();
        let mut s = hash(key) & mask;
        for _ in 0..=mask {
            match self.keys[s as usize] {
                k if k == key => return self.vals[s as usize] == i,
                EMPTY_KEY => return false,
                _ => s = (s + 1) & mask,
            }
        }
        false
    }
}

#[cfg(test)]
/// What `mark` then `keep` leave in the keep mask for `ids` (ids outside
/// `lo..hi` skipped), inserting in the order `order` gives (a permutation
/// of the positions: the device's threads run in any order).
pub(crate) fn keep_mask_in_order(ids: &[i64], lo: i64, hi: i64, order: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let mut t = Table::new(capacity(ids.len()));
    let inside = |id: i64| id >= lo && id < hi;
    for i in order {
        if inside(ids[i]) {
            t.insert(ids[i] as u64, i as u32);
        }
    }
    ids.iter().enumerate().map(|(i, &id)| u8::from(inside(id) && t.is_last(id as u64, i as u32))).collect()
}

#[cfg(test)]
/// [`keep_mask_in_order`] with the inserts in position order.
pub(crate) fn keep_mask(ids: &[i64], lo: i64, hi: i64) -> Vec<u8> {
    keep_mask_in_order(ids, lo, hi, 0..ids.len())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The rule itself, written the obvious way: 1 for the last occurrence
    /// of each id in range.
    fn last_occurrences(ids: &[i64], lo: i64, hi: i64) -> Vec<u8> {
        let mut seen = std::collections::HashSet::new();
        let mut keep = vec![0u8; ids.len()];
        for (i, &id) in ids.iter().enumerate().rev() {
            if id >= lo && id < hi && seen.insert(id) {
                keep[i] = 1;
            }
        }
        keep
    }

    #[test]
    fn the_last_occurrence_of_each_id_is_kept() {
        assert_eq!(keep_mask(&[3, 1, 3, 2, 1, 3], 0, 10), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(keep_mask(&[], 0, 10), Vec::<u8>::new());
        // Out of range: skipped, kept nowhere, and they do not disturb the others.
        assert_eq!(keep_mask(&[5, -1, 5, 10, 9], 0, 10), vec![0, 0, 1, 0, 1]);
    }

    #[test]
    fn one_id_repeated_many_times_keeps_only_its_last_position() {
        let ids = vec![7i64; 100_000];
        let keep = keep_mask(&ids, 0, 8);
        assert_eq!(keep.iter().map(|&k| usize::from(k)).sum::<usize>(), 1);
        assert_eq!(keep[99_999], 1);
        // Inserted backwards (the last position first), the same.
        assert_eq!(keep_mask_in_order(&ids, 0, 8, (0..ids.len()).rev()), keep);
    }

    #[test]
    fn ids_whose_hashes_collide_probe_to_distinct_slots() {
        // Ids that start their probes in the same slot of a 16-slot table.
        let cap = capacity(4);
        let first = hash(0) & (cap as u64 - 1);
        let colliding: Vec<i64> = (0..10_000i64).filter(|&k| hash(k as u64) & (cap as u64 - 1) == first).take(4).collect();
        assert_eq!(colliding.len(), 4);
        let ids: Vec<i64> = colliding.iter().chain(colliding.iter().rev()).copied().collect();
        assert_eq!(keep_mask(&ids, 0, i64::MAX), last_occurrences(&ids, 0, i64::MAX));
    }

    #[test]
    fn the_capacity_is_a_power_of_two_above_twice_the_ids() {
        for n in [0usize, 1, 7, 8, 9, 1000, 524_288, 524_289] {
            let c = capacity(n);
            assert!(c.is_power_of_two() && c >= 2 * n && c >= 16 && c > n, "{n} -> {c}");
        }
        assert_eq!(capacity(usize::MAX / 2 + 1), 1 << (usize::BITS - 1), "saturates instead of overflowing");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Any ids, any insert order: the mask is the rule's, whether ids
        /// repeat a lot (a small range) or barely (a large one).
        #[test]
        fn the_device_algorithm_keeps_exactly_the_last_occurrences(
            small in any::<bool>(),
            raw in prop::collection::vec(any::<u32>(), 0..600),
            shuffle in any::<u64>(),
        ) {
            let span = if small { 7 } else { 1 << 30 };
            let ids: Vec<i64> = raw.iter().map(|&r| i64::from(r % span) - 1).collect();
            let (lo, hi) = (0, span as i64 - 2);
            let want = last_occurrences(&ids, lo, hi);
            prop_assert_eq!(keep_mask(&ids, lo, hi), want.clone());
            // Another interleaving of the device's threads: a permutation of
            // the inserts (Fisher–Yates with a splitmix stream).
            let mut order: Vec<usize> = (0..ids.len()).collect();
            let mut s = shuffle;
            for k in (1..order.len()).rev() {
                s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let j = (hash(s) % (k as u64 + 1)) as usize;
                order.swap(k, j);
            }
            prop_assert_eq!(keep_mask_in_order(&ids, lo, hi, order), want);
        }
    }
}
