//! Which rows a cache holds, and which it admits next: the placement of
//! rows in slots, the tags, the access counts and the replacement rule.
//! Pure bookkeeping — no memory is touched here — so every rank of a node
//! can keep an identical copy of the tags, and the node's leader alone
//! keeps the counts and decides.
//!
//! Rows are numbered from 0 among the rows the cache may hold (a node
//! cache: the rows other nodes own, see [`RowSpace`]). Two placements:
//!
//! - **Direct**, when there is a slot for every such row: row `r` lives in
//!   slot `r`, nothing is ever evicted, and no counts are needed.
//! - **Sets**: slots grouped in sets of [`WAYS`]; a row may only live in the
//!   set its number hashes to. Each row has an access count (how often any
//!   rank of the node asked for it since the cache was created). When rows
//!   missed, each takes an empty way of its set, or evicts the way whose row
//!   has the lowest count when its own count is higher. So each set keeps
//!   the most frequently asked of the rows hashed to it — WholeGraph's
//!   32-way sets with LFU counters, with two differences: rows are hashed to
//!   sets (WholeGraph gives each set a run of consecutive rows, so hot
//!   neighbours compete for one set's ways), and counts are exact 32-bit
//!   counters (WholeGraph keeps 64-bit counters per row and 14-bit scaled
//!   copies in the tags).
//!
//! Counts **age**: once the node has counted [`AGEING_PER_SLOT`] accesses
//! per slot of the cache (by default; [`Tags::set_ageing`]), every count is halved
//! before the next decision. Order among rows asked at a steady rate is
//! kept, while a row that stopped being asked loses half its weight every
//! period, so a hot set that moves takes the slots of the one it left
//! within a period or two (LFU with ageing, as in TinyLFU's reset).

/// Ways per set.
pub const WAYS: usize = 32;

/// Accesses per slot between two halvings of the counts, by default: on a
/// Zipf hot set that moves every 10 or 25 batches, 4 kept more hits than
/// 0.25, 1, 8 and 16, and than no ageing (docs/cache.md, "Ageing").
pub const AGEING_PER_SLOT: usize = 4;

/// A tag for a slot that holds nothing.
const EMPTY: u64 = u64::MAX;

/// How rows map to slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// One slot per row: row `r` in slot `r`.
    Direct,
    /// `sets` sets of [`WAYS`] slots.
    Sets {
        /// Number of sets.
        sets: usize,
    },
}

impl Placement {
    /// The placement of a cache of (at least) `capacity` slots for `rows`
    /// rows: direct when the sets would hold every row anyway.
    pub(crate) fn for_capacity(capacity: usize, rows: usize) -> Self {
        let sets = capacity.div_ceil(WAYS).max(1);
        if sets.saturating_mul(WAYS) >= rows { Self::Direct } else { Self::Sets { sets } }
    }

    /// Slots the placement needs for `rows` rows.
    pub(crate) fn slots(&self, rows: usize) -> usize {
        match *self {
            Self::Direct => rows,
            Self::Sets { sets } => sets * WAYS,
        }
    }
}

/// A 64-bit mix of row number `r` (splitmix64's finaliser).
#[inline]
fn mix(r: usize) -> u64 {
    let mut z = (r as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The set of row `r` among `sets`: its mix reduced by a multiply (the
/// high bits; no modulo bias worth naming, no division).
#[inline]
fn set_of(r: usize, sets: usize) -> usize {
    reduce(mix(r), sets)
}

/// A mix reduced to one of `sets` by a multiply (its high bits).
#[inline]
fn reduce(m: u64, sets: usize) -> usize {
    ((u128::from(m) * sets as u128) >> 64) as usize
}

/// One byte of row `r`'s mix (its low bits, which the set does not use):
/// a lookup compares these first, 32 ways in one cache line, and reads a
/// tag only where the byte matches.
#[inline]
fn fingerprint(r: usize) -> u8 {
    mix(r) as u8
}

/// The ways among 8 fingerprint bytes (`word`, little-endian) equal to
/// `fp`: bit 7 of each matching byte set (the classic zero-byte test on
/// `word ^ fp…fp`; a byte above a true match may show a false one, which
/// the tag check discards).
#[inline]
fn matches(word: u64, fp: u8) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let x = word ^ (ONES * u64::from(fp));
    x.wrapping_sub(ONES) & !x & (ONES << 7)
}

/// `v` with every page of its memory written once: large zeroed memory
/// comes from the kernel untouched, and each page's first write would
/// otherwise fault inside a gather (the rows' counts are touched page by
/// page as a Zipf stream's tail reaches them, for thousands of calls).
fn faulted_in<T: Copy + Default>(mut v: Vec<T>) -> Vec<T> {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for x in v.iter_mut().step_by(step) {
        // Opaque to the optimiser, which could otherwise drop a store of
        // the zero the allocator promised.
        *x = std::hint::black_box(T::default());
    }
    v
}

/// A change the leader decided: `slot` now holds `row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fill {
    /// The slot.
    pub(crate) slot: usize,
    /// The row (numbered among the cacheable rows).
    pub(crate) row: usize,
    /// The row the slot held before, if any (known to the decider).
    pub(crate) evicted: Option<usize>,
}

/// The tags of every slot (identical on every rank of a node) and, on the
/// leader of a set-associative cache, every row's access count.
#[derive(Debug)]
pub(crate) struct Tags {
    placement: Placement,
    rows: usize,
    tags: Vec<u64>,
    /// [`fingerprint`] of each slot's row (set-associative caches).
    fps: Vec<u8>,
    /// Empty ways per set (set-associative caches): a decision looks for
    /// an empty way only in a set that has one (in a warm cache, none).
    free: Vec<u8>,
    /// Accesses per row (set-associative caches, on the leader): the
    /// count of a row no slot holds. A held row's count is in `held`.
    counts: Option<Vec<u32>>,
    /// Accesses per slot: the count of the row the slot holds (beside
    /// `counts`, on the leader). A decision compares the ways of a set:
    /// here they are 128 contiguous bytes, where by row they were 32 reads
    /// scattered over every row's count. A hit counts here too, in a table
    /// a fifth the size of the rows'.
    held: Vec<u32>,
    /// Accesses counted between two halvings of every count (`None`:
    /// counts only grow).
    ageing: Option<u64>,
    /// Accesses counted since the last halving.
    counted: u64,
}

impl Tags {
    /// Empty tags for `rows` cacheable rows; `leader`: this rank keeps the
    /// counts and decides.
    pub(crate) fn new(placement: Placement, rows: usize, leader: bool) -> Self {
        let counts = match placement {
            Placement::Sets { .. } if leader => Some(faulted_in(vec![0u32; rows])),
            _ => None,
        };
        let slots = placement.slots(rows);
        let fps = match placement {
            Placement::Direct => Vec::new(),
            Placement::Sets { .. } => faulted_in(vec![0; slots]),
        };
        let held = if counts.is_some() { faulted_in(vec![0; slots]) } else { Vec::new() };
        let free = match placement {
            Placement::Direct => Vec::new(),
            Placement::Sets { sets } => vec![WAYS as u8; sets],
        };
        let ageing = Some((AGEING_PER_SLOT * slots.max(1)) as u64);
        Self { placement, rows, tags: vec![EMPTY; slots], fps, free, counts, held, ageing, counted: 0 }
    }

    /// Halve every count each time `every` accesses were counted (`None`:
    /// never, pure LFU). The default is [`AGEING_PER_SLOT`] per slot.
    pub(crate) fn set_ageing(&mut self, every: Option<u64>) {
        self.ageing = every.map(|e| e.max(1));
    }

    /// Halves every count when a period of accesses was counted; whether
    /// it did.
    fn age_if_due(&mut self) -> bool {
        match (&mut self.counts, self.ageing) {
            (Some(counts), Some(every)) if self.counted >= every => {
                for c in counts.iter_mut().chain(self.held.iter_mut()) {
                    *c >>= 1;
                }
                self.counted = 0;
                true
            }
            _ => false,
        }
    }

    /// Slots in the cache.
    pub(crate) fn slots(&self) -> usize {
        self.tags.len()
    }

    /// The slot holding row `r` (`r < rows`), if any.
    #[inline]
    pub(crate) fn lookup(&self, r: usize) -> Option<usize> {
        match self.placement {
            Placement::Direct => (self.tags[r] == r as u64).then_some(r),
            Placement::Sets { sets } => {
                // One mix gives both the set (its high bits) and the
                // fingerprint (its low byte).
                let m = mix(r);
                let first = reduce(m, sets) * WAYS;
                let fp = m as u8;
                for (c, chunk) in self.fps[first..first + WAYS].chunks_exact(8).enumerate() {
                    let mut m = matches(u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])), fp);
                    while m != 0 {
                        let slot = first + c * 8 + m.trailing_zeros() as usize / 8;
                        if self.tags[slot] == r as u64 {
                            return Some(slot);
                        }
                        m &= m - 1;
                    }
                }
                None
            }
        }
    }

    /// The set row `r` may live in, and the sets there are (`None` where
    /// each row has its own slot).
    pub(crate) fn set_of_row(&self, r: usize) -> Option<(usize, usize)> {
        match self.placement {
            Placement::Direct => None,
            Placement::Sets { sets } => Some((set_of(r, sets), sets)),
        }
    }

    /// The row slot `slot` holds, if any.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn row_at(&self, slot: usize) -> Option<usize> {
        self.tags.get(slot).copied().filter(|&t| t != EMPTY).map(|t| t as usize)
    }

    /// Asks for the memory [`lookup`](Self::lookup) of row `r` will read
    /// (a hint: lookups of random rows wait on memory, so a caller asks a
    /// few rows ahead).
    #[inline]
    pub(crate) fn prefetch(&self, r: usize) {
        match self.placement {
            Placement::Direct => crate::kernel::prefetch_slice(&self.tags[r..=r]),
            Placement::Sets { sets } => {
                let first = set_of(r, sets) * WAYS;
                crate::kernel::prefetch_slice(&self.fps[first..first + WAYS]);
                // The set's tags too (a few lines): the one a fingerprint
                // points at is read next.
                crate::kernel::prefetch_slice(&self.tags[first..first + WAYS]);
            }
        }
    }

    /// Adds `n` to the count of every row a slot holds, outside the
    /// ageing's tally of accesses (leader of a set-associative cache; a
    /// no-op elsewhere): a preload's rows enter with this weight, which
    /// ageing halves away like any other.
    pub(crate) fn credit_held(&mut self, n: u32) {
        for (c, &tag) in self.held.iter_mut().zip(&self.tags) {
            if tag != EMPTY {
                *c = c.saturating_add(n);
            }
        }
    }

    /// Slots holding rows, now.
    pub(crate) fn occupied(&self) -> usize {
        self.tags.iter().filter(|&&t| t != EMPTY).count()
    }

    /// Adds `n` accesses to row `r`'s count (leader of a set-associative
    /// cache; a no-op elsewhere). Counts saturate. Looks the row up; a
    /// caller that just did uses [`count_held`](Self::count_held) or
    /// [`count_missed`](Self::count_missed).
    #[inline]
    pub(crate) fn count(&mut self, r: usize, n: u32) {
        if self.counts.is_some() {
            match self.lookup(r) {
                Some(slot) => self.count_held(slot, n),
                None => self.count_missed(r, n),
            }
        }
    }

    /// Adds `n` accesses to the count of the row `slot` holds (a slot a
    /// lookup found it in).
    #[inline]
    pub(crate) fn count_held(&mut self, slot: usize, n: u32) {
        if let Some(c) = self.held.get_mut(slot) {
            *c = c.saturating_add(n);
            self.counted += u64::from(n);
        }
    }

    /// Adds `n` accesses to the count of row `r`, which no slot holds (a
    /// lookup found none).
    #[inline]
    pub(crate) fn count_missed(&mut self, r: usize, n: u32) {
        debug_assert!(self.lookup(r).is_none(), "row {r} is held");
        if let Some(c) = &mut self.counts {
            c[r] = c[r].saturating_add(n);
            self.counted += u64::from(n);
        }
    }

    /// Asks for the memory counting row `r` as missed will write (on the
    /// leader; a hint).
    #[inline]
    pub(crate) fn prefetch_count(&self, r: usize) {
        if let Some(c) = &self.counts {
            crate::kernel::prefetch_slice(&c[r..=r]);
        }
    }

    /// Asks for the memory counting a hit in `slot` will write (on the
    /// leader; a hint).
    #[inline]
    pub(crate) fn prefetch_held(&self, slot: usize) {
        if let Some(c) = self.held.get(slot..=slot) {
            crate::kernel::prefetch_slice(c);
        }
    }

    /// Whether the empty ways counted per set are the empty tags.
    #[cfg(test)]
    fn free_agrees(&self) -> bool {
        self.free
            .iter()
            .enumerate()
            .all(|(set, &f)| usize::from(f) == self.tags[set * WAYS..][..WAYS].iter().filter(|&&t| t == EMPTY).count())
    }

    /// Row `r`'s access count (0 where counts are not kept).
    #[cfg(test)]
    fn count_of(&self, r: usize) -> u32 {
        match (&self.counts, self.lookup(r)) {
            (None, _) => 0,
            (Some(_), Some(slot)) => self.held[slot],
            (Some(c), None) => c[r],
        }
    }

    /// The leader's decision for the rows that missed (`missed`, distinct,
    /// each `< rows`, counted already): which slots take which rows. Applies
    /// it to these tags and returns it, with how many rows it evicts. Ages
    /// the counts first when a period is due.
    pub(crate) fn decide(&mut self, missed: &[usize]) -> (Vec<Fill>, u64) {
        self.age_if_due();
        let mut fills = Vec::new();
        let mut evicted = 0u64;
        match self.placement {
            Placement::Direct => {
                for &r in missed {
                    if self.tags[r] != r as u64 {
                        self.tags[r] = r as u64;
                        fills.push(Fill { slot: r, row: r, evicted: None });
                    }
                }
            }
            Placement::Sets { sets } => {
                // Per set, the hottest candidates first: each takes an empty
                // way or beats the coldest row, until one cannot.
                let counts = self.counts.as_deref();
                let mut order: Vec<(usize, u32, usize)> = missed
                    .iter()
                    .filter(|&&r| self.lookup(r).is_none())
                    .map(|&r| (set_of(r, sets), counts.map_or(0, |c| c[r]), r))
                    .collect();
                order.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
                let mut i = 0;
                while i < order.len() {
                    let set = order[i].0;
                    let first = set * WAYS;
                    let mut full = false;
                    while i < order.len() && order[i].0 == set {
                        let (_, count, r) = order[i];
                        i += 1;
                        if full {
                            continue;
                        }
                        let ways = &self.tags[first..first + WAYS];
                        let empty = if self.free[set] > 0 { ways.iter().position(|&t| t == EMPTY) } else { None };
                        let way = match empty {
                            Some(w) => Some(w),
                            None => {
                                // The coldest way (the first of equals).
                                let (w, coldest) = match self.held.get(first..first + WAYS) {
                                    Some(held) => held.iter().enumerate().min_by_key(|&(w, &c)| (c, w)).map_or((0, 0), |(w, &c)| (w, c)),
                                    None => (0, 0),
                                };
                                if count > coldest {
                                    evicted += 1;
                                    Some(w)
                                } else {
                                    // The rest of this set's candidates are
                                    // no hotter.
                                    full = true;
                                    None
                                }
                            }
                        };
                        if let Some(w) = way {
                            let before = self.set_tag(first + w, r as u64);
                            let evicted = (before != EMPTY).then_some(before as usize);
                            fills.push(Fill { slot: first + w, row: r, evicted });
                        }
                    }
                }
            }
        }
        (fills, evicted)
    }

    /// Applies a fill the leader decided (`slot < slots`, `row < rows`,
    /// checked by the caller); whether it evicted a row.
    pub(crate) fn apply(&mut self, f: Fill) -> bool {
        let before = self.set_tag(f.slot, f.row as u64);
        before != EMPTY && before != f.row as u64
    }

    /// Whether `f` names a slot and a row this cache has, and a slot the
    /// row may live in.
    pub(crate) fn fits(&self, f: Fill) -> bool {
        f.slot < self.tags.len()
            && f.row < self.rows
            && match self.placement {
                Placement::Direct => f.slot == f.row,
                Placement::Sets { sets } => f.slot / WAYS == set_of(f.row, sets),
            }
    }

    /// Forgets row `r` (`r < rows`) if it is held; whether it was.
    pub(crate) fn invalidate(&mut self, r: usize) -> bool {
        match self.lookup(r) {
            Some(s) => {
                self.set_tag(s, EMPTY);
                true
            }
            None => false,
        }
    }

    /// Forgets every row numbered in `rows` (counts stay); how many were
    /// held. Looks at each slot or each row, whichever are fewer.
    pub(crate) fn invalidate_range(&mut self, rows: std::ops::Range<usize>) -> usize {
        let rows = rows.start.min(self.rows)..rows.end.min(self.rows);
        if rows.len() <= self.tags.len() {
            return rows.filter(|&r| self.invalidate(r)).count();
        }
        let mut dropped = 0;
        for slot in 0..self.tags.len() {
            let t = self.tags[slot];
            if t != EMPTY && rows.contains(&(t as usize)) {
                self.set_tag(slot, EMPTY);
                dropped += 1;
            }
        }
        dropped
    }

    /// Forgets every row (counts stay: a row hot before is hot after).
    pub(crate) fn clear(&mut self) {
        for slot in 0..self.tags.len() {
            self.set_tag(slot, EMPTY);
        }
    }

    /// Puts `tag` in `slot` (with its fingerprint, and on the leader moving
    /// the counts: the row leaving takes its count back to the rows', the
    /// row entering brings its own); the tag it held.
    fn set_tag(&mut self, slot: usize, tag: u64) -> u64 {
        if let Some(fp) = self.fps.get_mut(slot) {
            *fp = if tag == EMPTY { 0 } else { fingerprint(tag as usize) };
        }
        let before = std::mem::replace(&mut self.tags[slot], tag);
        if let Some(free) = self.free.get_mut(slot / WAYS) {
            match (before == EMPTY, tag == EMPTY) {
                (true, false) => *free -= 1,
                (false, true) => *free += 1,
                _ => {}
            }
        }
        if let (Some(counts), Some(held)) = (&mut self.counts, self.held.get_mut(slot)) {
            if before != EMPTY {
                counts[before as usize] = *held;
            }
            *held = if tag == EMPTY { 0 } else { counts[tag as usize] };
        }
        before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_with_a_slot_for_every_row_places_rows_directly() {
        assert_eq!(Placement::for_capacity(100, 100), Placement::Direct);
        assert_eq!(Placement::for_capacity(97, 100), Placement::Direct, "4 sets of 32 would cover 100 rows");
        assert_eq!(Placement::for_capacity(96, 100), Placement::Sets { sets: 3 });
        assert_eq!(Placement::for_capacity(64, 100), Placement::Sets { sets: 2 });
        assert_eq!(Placement::for_capacity(1, 1000), Placement::Sets { sets: 1 });
        let mut t = Tags::new(Placement::Direct, 10, true);
        assert_eq!(t.slots(), 10);
        let (fills, evicted) = t.decide(&[3, 7]);
        assert_eq!((fills, evicted), (vec![Fill { slot: 3, row: 3, evicted: None }, Fill { slot: 7, row: 7, evicted: None }], 0));
        assert_eq!(t.lookup(3), Some(3));
        assert_eq!(t.lookup(4), None);
        assert!(t.invalidate(3) && !t.invalidate(3));
        assert_eq!(t.lookup(3), None);
    }

    #[test]
    fn sets_keep_the_most_frequently_asked_rows() {
        // One set: 32 ways, 100 rows. Row r is asked r times. (Pure LFU:
        // the ageing test below covers halving.)
        let mut t = Tags::new(Placement::Sets { sets: 1 }, 100, true);
        t.set_ageing(None);
        for r in 0..100 {
            t.count(r, r as u32);
        }
        let all: Vec<usize> = (0..100).collect();
        let (fills, evicted) = t.decide(&all);
        assert_eq!((fills.len(), evicted), (32, 0), "the 32 hottest fill the empty ways");
        for r in 68..100 {
            assert!(t.lookup(r).is_some(), "row {r} is among the hottest");
        }
        // Row 5 becomes the hottest: it evicts the coldest held row (68).
        t.count(5, 1000);
        let (fills, evicted) = t.decide(&[5, 6]);
        assert_eq!((fills.len(), evicted), (1, 1));
        assert_eq!(fills[0].evicted, Some(68), "the coldest held row goes");
        assert!(t.lookup(5).is_some() && t.lookup(68).is_none() && t.lookup(6).is_none());
        // A row no hotter than the coldest held one stays out.
        t.count(7, 69 - 7);
        let (fills, _) = t.decide(&[7]);
        assert!(fills.is_empty(), "a tie does not evict");
    }

    #[test]
    fn every_fill_lands_in_its_rows_set_and_a_follower_replays_it() {
        let mut leader = Tags::new(Placement::Sets { sets: 8 }, 10_000, true);
        let mut follower = Tags::new(Placement::Sets { sets: 8 }, 10_000, false);
        for round in 0..20u64 {
            let missed: Vec<usize> = (0..300).map(|i| ((i * 7919 + round * 104_729) % 10_000) as usize).collect();
            let mut distinct = missed.clone();
            distinct.sort_unstable();
            distinct.dedup();
            for &r in &missed {
                leader.count(r, 1 + (r % 5) as u32);
            }
            let (fills, evicted) = leader.decide(&distinct);
            let mut replayed = 0;
            for f in &fills {
                assert!(follower.fits(*f), "{f:?}");
                replayed += u64::from(follower.apply(*f));
            }
            assert_eq!(replayed, evicted);
            assert_eq!(leader.tags, follower.tags);
        }
        assert_eq!(leader.occupied(), leader.slots());
        assert!(!leader.fits(Fill { slot: 0, row: 10_000, evicted: None }));
        assert!(!leader.fits(Fill { slot: 8 * WAYS, row: 1, evicted: None }));
        leader.clear();
        assert_eq!(leader.occupied(), 0);
    }

    /// One set of 32 ways and 64 rows: rows 0..32 are asked 1 000 times,
    /// then the hot set moves to rows 32..64, asked 10 times a round. With
    /// ageing the new rows own the set after a few periods; without it
    /// the old rows' counts keep them out for ten rounds and more.
    #[test]
    fn aged_counts_let_a_moved_hot_set_in_and_pure_lfu_does_not() {
        let rounds_to_take_over = |ageing: Option<u64>| {
            let mut t = Tags::new(Placement::Sets { sets: 1 }, 64, true);
            t.set_ageing(ageing);
            let old: Vec<usize> = (0..32).collect();
            for &r in &old {
                t.count(r, 1000);
            }
            t.decide(&old);
            let new: Vec<usize> = (32..64).collect();
            for round in 1..=20 {
                let missed: Vec<usize> = new.iter().copied().filter(|&r| t.lookup(r).is_none()).collect();
                for &r in &new {
                    t.count(r, 10);
                }
                t.decide(&missed);
                if new.iter().all(|&r| t.lookup(r).is_some()) {
                    return Some(round);
                }
            }
            None
        };
        // A period of 320 accesses: one round of the new set.
        let aged = rounds_to_take_over(Some(320)).expect("with ageing the new hot set takes the set");
        assert!(aged <= 8, "{aged} rounds");
        assert_eq!(rounds_to_take_over(None), None, "pure LFU keeps the old rows for 20 rounds");
    }

    /// A row asked a few times displaces a preloaded row asked once, but
    /// not one credited with a preload's weight — until ageing has halved
    /// that away and the row is still asked.
    #[test]
    fn a_preload_credit_keeps_its_rows_against_rows_asked_a_few_times() {
        let displaced = |credit: u32| {
            let mut t = Tags::new(Placement::Sets { sets: 1 }, 64, true);
            t.set_ageing(Some(64));
            let preloaded: Vec<usize> = (0..32).collect();
            for &r in &preloaded {
                t.count(r, 1);
            }
            t.decide(&preloaded);
            t.credit_held(credit);
            // Each round, rows 32..64 are asked twice and miss.
            (1..=6)
                .map(|_| {
                    let missed: Vec<usize> = (32..64).filter(|&r| t.lookup(r).is_none()).collect();
                    for &r in &missed {
                        t.count(r, 2);
                    }
                    t.decide(&missed);
                    preloaded.iter().filter(|&&r| t.lookup(r).is_none()).count()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(displaced(0)[0], 32, "without a credit, rows asked twice take every slot at once");
        let kept = displaced(AGEING_PER_SLOT as u32);
        assert_eq!(kept[0], 0, "with it, none at first: {kept:?}");
        assert_eq!(*kept.last().unwrap_or(&0), 32, "but rows still asked win once ageing halved it: {kept:?}");
    }

    #[test]
    fn ageing_halves_counts_once_a_period_and_keeps_their_order() {
        let mut t = Tags::new(Placement::Sets { sets: 1 }, 100, true);
        assert_eq!(t.ageing, Some((AGEING_PER_SLOT * WAYS) as u64), "the default period is per slot");
        t.set_ageing(Some(1000));
        for r in 0..100 {
            t.count(r, 4 * r as u32);
        }
        // 19 800 accesses counted: due.
        t.decide(&[]);
        assert_eq!((t.count_of(10), t.count_of(99), t.counted), (20, 198, 0));
        t.count(1, 3);
        t.decide(&[]);
        assert_eq!(t.count_of(1), 5, "not due again before a period");
        let mut f = Tags::new(Placement::Sets { sets: 1 }, 100, false);
        f.count(3, 5000);
        f.decide(&[]);
        assert_eq!((f.count_of(3), f.counted), (0, 0), "a follower keeps no counts");
    }

    #[test]
    fn a_rows_count_goes_with_it_into_a_slot_and_back_out() {
        // One set of 32 ways, 100 rows, no ageing: counts are plain sums.
        let mut t = Tags::new(Placement::Sets { sets: 1 }, 100, true);
        t.set_ageing(None);
        for r in 0..WAYS {
            t.count_missed(r, 10);
        }
        let (fills, _) = t.decide(&(0..WAYS).collect::<Vec<_>>());
        assert_eq!(fills.len(), WAYS);
        // Hits count in the slot: by the slot a lookup found, or by row.
        let slot = t.lookup(7).expect("row 7 entered");
        t.count_held(slot, 5);
        t.count(7, 1);
        assert_eq!(t.count_of(7), 16);
        // Row 50 asked 12 times beats the coldest way (count 10, the
        // first of equals: row 0), which leaves with its count.
        t.count(50, 12);
        let (fills, evicted) = t.decide(&[50]);
        assert_eq!((fills.len(), evicted, fills[0].evicted), (1, 1, Some(0)));
        assert_eq!((t.lookup(0), t.count_of(0), t.count_of(50)), (None, 10, 12));
        // Row 7 is now the hottest held row; dropping it keeps its count,
        // and it comes back with it.
        assert!(t.invalidate(7));
        assert_eq!(t.count_of(7), 16);
        let (fills, _) = t.decide(&[7]);
        assert_eq!((fills.len(), t.count_of(7)), (1, 16));
        t.clear();
        assert_eq!((t.count_of(7), t.count_of(50), t.occupied()), (16, 12, 0), "a cleared cache keeps its counts");
    }

    #[test]
    fn fingerprints_find_every_matching_way_and_only_tags_decide() {
        // Every byte position, and a match above another match.
        for pos in 0..8 {
            let word = u64::from_le_bytes(std::array::from_fn(|i| if i == pos { 0xab } else { 0x11 }));
            let m = matches(word, 0xab);
            assert_eq!(m.trailing_zeros() as usize / 8, pos, "{m:#x}");
        }
        assert_eq!(matches(u64::from_le_bytes([7; 8]), 7).count_ones(), 8);
        assert_eq!(matches(u64::from_le_bytes([7; 8]), 8), 0);
        // Many rows in one set: each is found in its own way, the others not.
        let mut t = Tags::new(Placement::Sets { sets: 1 }, 10_000, true);
        let held: Vec<usize> = (0..WAYS).map(|i| i * 313).collect();
        for &r in &held {
            t.count(r, 1);
        }
        t.decide(&held);
        for &r in &held {
            assert_eq!(t.tags[t.lookup(r).expect("held")], r as u64);
        }
        assert_eq!((0..10_000).filter(|r| t.lookup(*r).is_some()).count(), WAYS);
        t.invalidate(held[3]);
        assert_eq!(t.lookup(held[3]), None);
    }

    #[test]
    fn hashed_sets_spread_consecutive_rows() {
        // Hot rows are often neighbours: they must not crowd one set.
        let sets = 64;
        let mut per_set = vec![0usize; sets];
        for r in 0..sets * WAYS {
            per_set[set_of(r, sets)] += 1;
        }
        let max = per_set.iter().max().copied().unwrap_or(0);
        assert!(max < 2 * WAYS, "{per_set:?}");
    }

    #[test]
    fn a_range_of_rows_leaves_exactly_as_row_by_row() {
        // Ranges shorter and longer than the slots (the two ways of
        // walking), over direct and set placements, against forgetting
        // the rows one by one.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for placement in [Placement::Direct, Placement::Sets { sets: 2 }] {
            let rows = 300;
            for _ in 0..200 {
                let mut a = Tags::new(placement, rows, true);
                let missed: Vec<usize> = {
                    let mut m: Vec<usize> = (0..next(250)).map(|_| next(rows)).collect();
                    m.sort_unstable();
                    m.dedup();
                    m
                };
                for &r in &missed {
                    a.count(r, 1 + next(5) as u32);
                }
                a.decide(&missed);
                let mut b = Tags::new(placement, rows, false);
                for s in 0..a.slots() {
                    if let Some(r) = a.row_at(s) {
                        b.apply(Fill { slot: s, row: r, evicted: None });
                    }
                }
                let (lo, len) = (next(rows), next(rows));
                let range = lo..lo + len;
                let dropped = a.invalidate_range(range.clone());
                let by_row = range.clone().filter(|&r| r < rows && b.invalidate(r)).count();
                assert_eq!(dropped, by_row, "{placement:?} {range:?}");
                assert!((0..rows).all(|r| a.lookup(r) == b.lookup(r)), "{placement:?} {range:?}");
                assert!((0..rows).filter(|r| range.contains(r)).all(|r| a.lookup(r).is_none()));
                // The empty ways counted per set are the empty tags, after
                // the drop and after a decision that fills what it emptied.
                assert!(a.free_agrees() && b.free_agrees(), "{placement:?} {range:?}");
                a.decide(&missed);
                assert!(a.free_agrees(), "{placement:?} {range:?}");
            }
        }
    }
}
