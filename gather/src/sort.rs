//! Grouping ids: positions grouped by a small key such as an owner rank
//! ([`bucket`], [`Buckets`]: the exchanges' routing, the graph samplers'),
//! and what de-duplicating a request list (the hierarchy's exchange) and
//! summing a batch's repeated gradients (`wm_embedding`) both need — every
//! position of a list visited in order of its id ([`for_each_by_id`]),
//! positions of one id in the order they come.

thread_local! {
    /// Key buffers (of [`for_each_by_id`], the radix sort's second buffer,
    /// the hierarchy's de-duplication), reused between calls.
    pub(crate) static KEYS: std::cell::RefCell<wm_comm::BufferPool<u64>> = const { std::cell::RefCell::new(wm_comm::BufferPool::new(4096, 4)) };
}

/// Positions of `keys` grouped by key (a counting sort): `order[starts[k]..
/// starts[k + 1]]` are the positions with key `k`, in input order. Keys
/// must be below `buckets`.
///
/// # Panics
/// When a key is `buckets` or more.
pub fn bucket(keys: &[usize], buckets: usize) -> (Vec<usize>, Vec<usize>) {
    let mut starts = vec![0usize; buckets + 1];
    for &k in keys {
        starts[k + 1] += 1;
    }
    for k in 0..buckets {
        starts[k + 1] += starts[k];
    }
    let mut fill = starts.clone();
    let mut order = vec![0usize; keys.len()];
    for (i, &k) in keys.iter().enumerate() {
        order[fill[k]] = i;
        fill[k] += 1;
    }
    (order, starts)
}

/// Positions of keys grouped by key ([`bucket`]), each key's group at hand.
#[derive(Debug, Clone, Default)]
pub struct Buckets {
    order: Vec<usize>,
    starts: Vec<usize>,
}

impl Buckets {
    /// The positions of `keys` grouped by key, for keys below `buckets`.
    ///
    /// # Panics
    /// When a key is `buckets` or more.
    pub fn of(keys: &[usize], buckets: usize) -> Self {
        let (order, starts) = bucket(keys, buckets);
        Self { order, starts }
    }

    /// The positions with key `k`, in input order.
    ///
    /// # Panics
    /// When `k` is not below the bucket count.
    pub fn get(&self, k: usize) -> &[usize] {
        &self.order[self.starts[k]..self.starts[k + 1]]
    }
}

/// Calls `visit(id, position)` for every id of `ids` — its position is its
/// index in `ids` — in ascending order of id, the positions of equal ids
/// ascending. Where an id and a position pack into 64 bits (ids and batches
/// well below 2^32 do), the packed keys are sorted by the id bits alone,
/// by radix when there are many; else (id, position) pairs are compared.
pub fn for_each_by_id<I>(ids: I, mut visit: impl FnMut(u64, usize))
where
    I: Iterator<Item = u64> + Clone,
{
    let (total, largest) = ids.clone().fold((0usize, 0u64), |(n, m), id| (n + 1, m.max(id)));
    let bits = |x: u64| u64::BITS - x.leading_zeros();
    let index_bits = bits(total as u64);
    if index_bits < u64::BITS && bits(largest) + index_bits <= u64::BITS {
        // One u64 per position, the id above it, so the sort moves plain
        // integers; they enter in position order, so sorting by the id bits
        // alone (stably) keeps the positions of each id in order.
        let mut keys: Vec<u64> = KEYS.with(|k| k.borrow_mut().get(total));
        keys.clear();
        keys.extend(ids.zip(0u64..).map(|(id, i)| (id << index_bits) | i));
        sort_keys(&mut keys, index_bits, bits(largest) + index_bits);
        let low = (1u64 << index_bits) - 1;
        for &key in &keys {
            visit(key >> index_bits, (key & low) as usize);
        }
        KEYS.with(|k| k.borrow_mut().keep(keys));
    } else {
        let mut pairs: Vec<(u64, usize)> = ids.zip(0..).collect();
        pairs.sort_unstable();
        for (id, i) in pairs {
            visit(id, i);
        }
    }
}

/// Keys at least this many are radix-sorted; fewer, compared.
const RADIX_MIN: usize = 1 << 14;
/// Bits of a key one radix pass sorts by.
const RADIX_BITS: u32 = 11;

/// Sorts `keys` by their bits `low..high` (none set at `high` or above),
/// keeping the order of keys equal there — for keys that come in ascending
/// order of their bits below `low`, the order of whole keys. Many keys go
/// through a least-significant-digit radix sort, a counting pass per
/// [`RADIX_BITS`] bits from `low` up (a request list of 65 536 ids in a
/// fraction of a comparison sort's time, and the fewer passes the lower
/// `high - low`); fewer are compared whole.
fn sort_keys(keys: &mut Vec<u64>, low: u32, high: u32) {
    if keys.len() < RADIX_MIN {
        keys.sort_unstable();
        return;
    }
    let mut other = KEYS.with(|k| k.borrow_mut().get(keys.len()));
    let mask = (1u64 << RADIX_BITS) - 1;
    let mut shift = low;
    while shift < high {
        let mut counts = [0usize; 1 << RADIX_BITS];
        for &k in keys.iter() {
            counts[((k >> shift) & mask) as usize] += 1;
        }
        let mut at = 0;
        for c in counts.iter_mut() {
            let n = *c;
            *c = at;
            at += n;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & mask) as usize;
            other[counts[d]] = k;
            counts[d] += 1;
        }
        std::mem::swap(keys, &mut other);
        shift += RADIX_BITS;
    }
    KEYS.with(|k| k.borrow_mut().keep(other));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radix_and_comparison_sorts_agree() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for (n, bits) in [(10, 40), (RADIX_MIN, 40), (RADIX_MIN + 77, 33), (3 * RADIX_MIN, 64)] {
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let keys: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x & mask
                })
                .collect();
            let mut radix = keys.clone();
            sort_keys(&mut radix, 0, bits);
            let mut expect = keys.clone();
            expect.sort_unstable();
            assert_eq!(radix, expect, "{n} keys of {bits} bits");
            // By the high bits only, over keys numbered in order below them
            // (as the de-duplication's): still the order of whole keys.
            let low = 20;
            let mut numbered: Vec<u64> = keys.iter().enumerate().map(|(i, k)| (k >> low << low) | i as u64).collect();
            let mut expect = numbered.clone();
            sort_keys(&mut numbered, low, bits.max(low));
            expect.sort_unstable();
            assert_eq!(numbered, expect, "{n} keys of {bits} bits, by bits {low}..");
        }
    }

    #[test]
    fn positions_come_in_id_order_and_in_order_within_an_id() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        // Few and many ids (compared, radix-sorted), and ids too large to
        // pack beside their positions (pairs).
        for (n, range) in [(0usize, 1u64), (7, 3), (1000, 50), (RADIX_MIN + 5, 1 << 20), (RADIX_MIN, u64::MAX)] {
            let ids: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if range == u64::MAX { x } else { x % range }
                })
                .collect();
            let mut got = Vec::new();
            for_each_by_id(ids.iter().copied(), |id, i| got.push((id, i)));
            let mut want: Vec<(u64, usize)> = ids.iter().copied().zip(0..).collect();
            want.sort_unstable();
            assert_eq!(got, want, "{n} ids below {range}");
        }
    }
}
