//! What every benchmark reports, in one shape: per-rank figures as a
//! [`Spread`], the all-ranks figure, the same-run baseline and the ratio,
//! and whether every value moved was verified; as text, or as one JSON line
//! for scripts ([`json_line`]).

/// Minimum, median and maximum of per-rank figures.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `v` (not empty).
    pub fn of(v: &[f64]) -> Self {
        assert!(!v.is_empty());
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Self { min: s[0], median, max: s[n - 1] }
    }
}

/// A benchmark's speeds beside its baseline, decimal GB/s.
#[derive(Debug, Clone, Copy)]
pub struct Speeds {
    /// Per rank.
    pub per_rank: Spread,
    /// All ranks together.
    pub total: f64,
    /// The baseline, measured in the same run.
    pub baseline: f64,
    /// The figure compared with the baseline, over the baseline.
    pub ratio: f64,
}

impl Speeds {
    /// The speed lines of the text report: per rank, all ranks, the
    /// baseline (`baseline_is` says what it is) and the ratio (`ratio_is`
    /// says of what).
    pub fn print(&self, baseline_is: &str, ratio_is: &str) {
        let s = &self.per_rank;
        println!("  per rank GB/s   min {:.2}   median {:.2}   max {:.2}", s.min, s.median, s.max);
        println!("  all ranks GB/s  {:.2}", self.total);
        println!("  baseline GB/s   {:.2}   ({baseline_is})", self.baseline);
        println!("  ratio           {:.2}   ({ratio_is})", self.ratio);
    }
}

/// The verification line of the text report: `wrong` rows (over all ranks)
/// differed from what was expected.
pub fn print_verified(wrong: f64) {
    let verified = wrong == 0.0;
    println!("  verified        {verified}{}", if verified { String::new() } else { format!(" ({wrong} wrong rows)") });
}

/// Prints one JSON result line, untagged under `wm-run` (and under
/// `wm-bench`'s own launch) so that a script can parse what it reads, and
/// unchanged under any other launcher; see [`wm_comm::launch::untagged`].
pub fn json_line(j: &serde_json::Value) {
    println!("{}", wm_comm::launch::untagged(&j.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Spread { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]), Spread { min: 1.0, median: 2.5, max: 4.0 });
    }
}
