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

/// Every rank's profile of its timed calls ([`wm_gather::profile`]), per
/// phase: milliseconds per call, min/median/max over the ranks.
#[derive(Debug, Clone)]
pub struct Phases {
    /// Calls each rank recorded.
    pub calls: u64,
    /// Phase name and its spread over the ranks, in the order phases ran.
    pub phases: Vec<(String, Spread)>,
}

impl Phases {
    /// Gathers every rank's profile (collective).
    ///
    /// # Errors
    /// A lost peer, or a rank whose profile does not parse.
    pub fn gather(world: &dyn wm_comm::Communicator, mine: &wm_gather::profile::Profile) -> anyhow::Result<Self> {
        let calls = mine.calls.max(1) as f64;
        let encoded: Vec<(String, f64)> = mine.phases.iter().map(|(n, d)| ((*n).to_owned(), d.as_secs_f64() * 1e3 / calls)).collect();
        let all = world.allgatherv(&serde_json::to_vec(&encoded)?)?;
        let ranks: Vec<Vec<(String, f64)>> = all.iter().map(|b| serde_json::from_slice(b)).collect::<Result<_, _>>()?;
        let phases = encoded
            .iter()
            .map(|(name, _)| {
                let per_rank: Vec<f64> = ranks.iter().map(|r| r.iter().find(|(n, _)| n == name).map_or(0.0, |(_, ms)| *ms)).collect();
                (name.clone(), Spread::of(&per_rank))
            })
            .collect();
        Ok(Self { calls: mine.calls, phases })
    }

    /// The JSON form: `{"calls": n, "ms_per_call": {phase: {min, median, max}}}`.
    pub fn json(&self) -> serde_json::Value {
        let map: serde_json::Map<String, serde_json::Value> = self.phases.iter().map(|(n, s)| (n.clone(), serde_json::json!(s))).collect();
        serde_json::json!({ "calls": self.calls, "ms_per_call": map })
    }

    /// Prints one line per phase.
    pub fn print(&self) {
        println!("  profile         ms per call over {} calls, min / median / max over the ranks", self.calls);
        for (name, s) in &self.phases {
            println!("    {name:<14}{:>8.3} {:>8.3} {:>8.3}", s.min, s.median, s.max);
        }
    }
}
