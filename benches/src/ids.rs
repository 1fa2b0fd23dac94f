//! The ids a benchmark gathers: `--id-dist uniform` (every row alike) or
//! `--id-dist zipf:S` (row of rank `k` asked with probability ∝ `k^-S`,
//! the ranks spread over the table by a fixed permutation so that hot rows
//! are not neighbours and every rank's rows get their share of them). The
//! same `(seed, rank, batch)` gives the same ids, so a run can gather one
//! batch twice (cached and uncached) and a baseline can replay it.

use std::str::FromStr;

/// How ids are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IdDist {
    /// Every row equally likely.
    Uniform,
    /// Zipf with this exponent (greater than 0).
    Zipf(f64),
}

impl FromStr for IdDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "uniform" {
            return Ok(Self::Uniform);
        }
        let Some(exp) = s.strip_prefix("zipf:") else {
            return Err(format!("{s:?}: expected uniform or zipf:S (S > 0, e.g. zipf:1.1)"));
        };
        match exp.parse::<f64>() {
            Ok(e) if e.is_finite() && e > 0.0 && e <= 20.0 => Ok(Self::Zipf(e)),
            _ => Err(format!("{s:?}: the Zipf exponent must be a number greater than 0 and at most 20")),
        }
    }
}

impl std::fmt::Display for IdDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Zipf(e) => write!(f, "zipf:{e}"),
        }
    }
}

/// A small fast generator (xorshift64*), seeded per rank and batch.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64, rank: usize, batch: usize) -> Self {
        let mut s = seed ^ ((rank as u64) << 40) ^ ((batch as u64) << 20) ^ 0x9E37_79B9_7F4A_7C15;
        for _ in 0..4 {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
        }
        Self(s | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `n` (> 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 11) % n
    }

    /// A uniform value in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `(e^t - 1) / t`, exact near 0.
fn expm1_over(t: f64) -> f64 {
    if t.abs() > 1e-8 { t.exp_m1() / t } else { 1.0 + t / 2.0 * (1.0 + t / 3.0) }
}

/// `ln(1 + t) / t`, exact near 0.
fn ln1p_over(t: f64) -> f64 {
    if t.abs() > 1e-8 { t.ln_1p() / t } else { 1.0 - t / 2.0 * (1.0 - 2.0 * t / 3.0) }
}

/// Zipf ranks 1..=n with exponent `s`, by rejection-inversion (Hörmann and
/// Derflinger, 1996): invert the integral `H` of the hat `h(x) = x^-s`
/// over cells `[k - ½, k + ½]`, and accept unless the point falls in the
/// sliver the hat adds over the true weight `k^-s`. Constant time and
/// memory per draw, whatever `n`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    squeeze: f64,
}

impl Zipf {
    pub(crate) fn new(n: u64, s: f64) -> Self {
        let mut z = Self { n: n as f64, s, h_x1: 0.0, h_n: 0.0, squeeze: 0.0 };
        z.h_x1 = z.big_h(1.5) - 1.0;
        z.h_n = z.big_h(z.n + 0.5);
        z.squeeze = 2.0 - z.big_h_inv(z.big_h(2.5) - z.h(2.0));
        z
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// `∫₁ˣ t^-s dt`, through forms that stay exact at `s = 1`.
    fn big_h(&self, x: f64) -> f64 {
        let l = x.ln();
        expm1_over((1.0 - self.s) * l) * l
    }

    fn big_h_inv(&self, y: f64) -> f64 {
        let t = (y * (1.0 - self.s)).max(-1.0);
        (ln1p_over(t) * y).exp()
    }

    /// A rank in 1..=n.
    pub(crate) fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_n + rng.unit() * (self.h_x1 - self.h_n);
            let x = self.big_h_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.squeeze || u >= self.big_h(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }
}

/// The row of Zipf rank `k` (1-based) among `rows`: `(k - 1) · a mod rows`
/// for an `a` coprime with `rows` near the golden section, a permutation
/// that spreads consecutive ranks over the table.
pub(crate) fn row_of_rank(k: u64, rows: u64, a: u64) -> u64 {
    ((u128::from(k - 1) * u128::from(a)) % u128::from(rows)) as u64
}

/// The multiplier of [`row_of_rank`] for `rows`.
pub(crate) fn spread(rows: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let mut a = ((rows as f64 * 0.618_033_988_75) as u64).max(1);
    while gcd(a, rows) != 1 {
        a += 1;
    }
    a
}

/// The Zipf rank that rank `k` (1-based) of phase `phase` is asked as,
/// among `rows`: ranks move by 0.382 of the table per phase (the golden
/// section's smaller part, so that no phase of the first twenty comes
/// back within 1.3 % of the table to an earlier one's ranks), and the hot
/// rows of one phase were cold rows of every phase before
/// (`--id-drift`).
pub(crate) fn drifted(k: u64, rows: u64, phase: u64) -> u64 {
    let step = ((rows as f64 * 0.381_966_011_25) as u64).max(1);
    ((u128::from(k - 1) + u128::from(phase) * u128::from(step)) % u128::from(rows)) as u64 + 1
}

/// Batch `b` of rank `rank`: `len` ids below `rows` drawn from `dist`, the
/// Zipf ranks of hot-set phase `phase` ([`drifted`]; 0 without drift).
pub(crate) fn batch(dist: IdDist, seed: u64, rows: usize, len: usize, rank: usize, b: usize, phase: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed, rank, b);
    match dist {
        IdDist::Uniform => (0..len).map(|_| rng.below(rows as u64) as i64).collect(),
        IdDist::Zipf(s) => {
            let z = Zipf::new(rows as u64, s);
            let a = spread(rows as u64);
            (0..len).map(|_| row_of_rank(drifted(z.sample(&mut rng), rows as u64, phase), rows as u64, a) as i64).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_parse_and_refuse_with_the_value() {
        assert_eq!("uniform".parse::<IdDist>(), Ok(IdDist::Uniform));
        assert_eq!("zipf:1.1".parse::<IdDist>(), Ok(IdDist::Zipf(1.1)));
        for bad in ["zipf", "zipf:0", "zipf:-1", "zipf:x", "normal"] {
            let e = bad.parse::<IdDist>().unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        assert_eq!(IdDist::Zipf(1.1).to_string(), "zipf:1.1");
    }

    /// Frequencies within a few standard deviations of `k^-s / Σ`, for
    /// exponents around 1 (where `H` changes form) and a large one.
    #[test]
    fn zipf_draws_follow_the_law() {
        for s in [0.5, 1.0, 1.1, 2.5] {
            let n = 20u64;
            let z = Zipf::new(n, s);
            let mut rng = Rng::new(5, 0, 0);
            let draws = 200_000;
            let mut seen = vec![0u64; n as usize + 1];
            for _ in 0..draws {
                let k = z.sample(&mut rng);
                assert!((1..=n).contains(&k));
                seen[k as usize] += 1;
            }
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            for k in 1..=n {
                let p = (k as f64).powf(-s) / norm;
                let (want, drawn) = (p * draws as f64, seen[k as usize] as f64);
                let sd = (draws as f64 * p * (1.0 - p)).sqrt();
                assert!((drawn - want).abs() < 5.0 * sd + 1.0, "s {s} rank {k}: {drawn} draws, {want:.0} expected");
            }
        }
    }

    #[test]
    fn ranks_spread_over_the_table_as_a_permutation() {
        for rows in [1u64, 7, 1000, 4096] {
            let a = spread(rows);
            let mut hit = vec![false; rows as usize];
            for k in 1..=rows {
                let r = row_of_rank(k, rows, a) as usize;
                assert!(!std::mem::replace(&mut hit[r], true), "rows {rows}: row {r} twice");
            }
        }
        let b = batch(IdDist::Zipf(1.1), 1, 1000, 5000, 0, 0, 0);
        assert!(b.iter().all(|&x| (0..1000).contains(&x)));
        assert_eq!(b, batch(IdDist::Zipf(1.1), 1, 1000, 5000, 0, 0, 0), "the same seed, the same ids");
    }

    /// `--id-drift`: each phase's ranks are a permutation, and the hot rows
    /// of one phase (its first ranks) are none of an earlier phase's.
    #[test]
    fn drifted_ranks_move_the_hot_set_to_rows_that_were_cold() {
        let rows = 3000u64;
        for phase in 0..4 {
            let mut hit = vec![false; rows as usize + 1];
            for k in 1..=rows {
                let d = drifted(k, rows, phase);
                assert!((1..=rows).contains(&d));
                assert!(!std::mem::replace(&mut hit[d as usize], true), "phase {phase}: rank {d} twice");
            }
        }
        assert_eq!(drifted(1, rows, 0), 1);
        let a = spread(rows);
        let hot = |phase| -> std::collections::HashSet<u64> { (1..=100).map(|k| row_of_rank(drifted(k, rows, phase), rows, a)).collect() };
        for phase in 1..8 {
            for before in 0..phase {
                assert!(hot(phase).is_disjoint(&hot(before)), "phase {phase} and {before}");
            }
        }
        // And the ids follow: the first batch of phase 1 mostly asks rows
        // that phase 0's likeliest 100 do not hold.
        let ids = batch(IdDist::Zipf(1.1), 1, rows as usize, 5000, 0, 0, 1);
        let old = hot(0);
        let stale = ids.iter().filter(|&&x| old.contains(&(x as u64))).count();
        assert!(stale < 500, "{stale} of 5000 ids in the old hot set");
    }
}
