//! The random streams of the samplers: one per (seed, center, hop), so a
//! center's sample never depends on which thread or rank draws it.

/// splitmix64's finaliser: a bijective mix of 64 bits.
#[inline]
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The seed of hop `hop` of a multi-hop sample drawn with `seed`.
pub fn hop_seed(seed: u64, hop: usize) -> u64 {
    mix(seed ^ mix((hop as u64).wrapping_add(1).wrapping_mul(GOLDEN)))
}

/// A splitmix64 stream keyed by a seed and a node id.
#[derive(Debug, Clone)]
pub(crate) struct Stream(u64);

impl Stream {
    /// The stream of `node` under `seed`.
    #[inline]
    pub(crate) fn new(seed: u64, node: u64) -> Self {
        Stream(mix(seed.wrapping_add(GOLDEN)) ^ mix(node.wrapping_mul(GOLDEN).wrapping_add(0x632B_E59B_D9B4_E019)))
    }

    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix(self.0)
    }

    /// A uniform integer in `0..n` (`n > 0`), without modulo bias
    /// (Lemire's multiply-and-reject).
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// A uniform float in the open interval (0, 1).
    #[inline]
    pub(crate) fn open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut s = Stream::new(1, 2);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            seen[s.below(7) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
        assert_eq!(Stream::new(3, 4).next_u64(), Stream::new(3, 4).next_u64());
        assert_ne!(Stream::new(3, 4).next_u64(), Stream::new(3, 5).next_u64());
        assert_ne!(hop_seed(3, 0), hop_seed(3, 1));
    }

    #[test]
    fn open01_is_strictly_inside() {
        let mut s = Stream::new(0, 0);
        for _ in 0..1000 {
            let u = s.open01();
            assert!(u > 0.0 && u < 1.0);
        }
    }
}
