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

/// The step lines of the text report, where every rank ran the baseline
/// (`--baseline-ranks all`): `per_step` GB/s per rank of a step of the
/// call, and beside it the all-ranks figures of both steps (`ranks` ranks,
/// `baseline` GB/s per rank of a baseline step).
pub fn print_step(per_step: Option<f64>, ranks: usize, baseline: f64) {
    if let Some(g) = per_step {
        println!("  step GB/s       {g:.2}   per rank, from the last rank ready to the last rank done");
        let n = ranks as f64;
        println!("  steps, all      {:.2}   all ranks GB/s of a step; of a baseline step {:.2}", g * n, baseline * n);
    }
}

/// The ratio batch by batch (`ratio_batches`), beside the ratio of totals.
pub fn print_ratio_by_batch(r: f64) {
    println!("  ratio by batch  {r:.2}   median over the timed batches of each one's call beside its baseline");
}

/// What a cached gather run reports (`wm-bench gather --cache-ratio`):
/// the path under test beside the uncached gather of the same batches, and
/// how well the cache did against the best static choice.
#[derive(Debug, Clone)]
pub struct CacheFigures {
    /// `table` (`wm_gather` with a node cache) or `embedding`.
    pub path: &'static str,
    /// The cache ratio, if a cache was asked for.
    pub ratio: Option<f64>,
    /// Slots of rank 0's node's cache.
    pub capacity: usize,
    /// Rows ranks of other nodes own, from rank 0's node.
    pub remote_rows: usize,
    /// Per-rank GB/s of the path under test.
    pub test: Spread,
    /// All ranks' GB/s of the path under test.
    pub test_total: f64,
    /// Per-rank GB/s of the uncached gather of the same batches.
    pub uncached: Spread,
    /// All ranks' GB/s of the uncached gather.
    pub uncached_total: f64,
    /// Per-rank median of the path under test over the uncached one's.
    pub speedup: f64,
    /// The single-threaded baseline, GB/s.
    pub baseline: f64,
    /// Each node's hit rate over the timed batches, across ranks.
    pub hit_rate: Spread,
    /// Each node's best static choice's hit rate, across ranks.
    pub best_static: Spread,
    /// The largest shortfall of a node's hit rate from its best static
    /// choice's.
    pub gap: f64,
    /// Each node's hit rate of a static cache of the same size holding the
    /// rows the id distribution makes likeliest (by its probabilities, not
    /// by what the stream happened to ask), across ranks.
    pub likeliest: Spread,
    /// Per rank, the fraction of its timed lookups that asked for a row it
    /// had not asked for before in the run: misses no online cache avoids.
    pub first_seen: Spread,
    /// The caches' statistics since they were created, over all ranks
    /// (fills and evictions once per node).
    pub stats: crate::CacheStats,
    /// Where the timed calls' time went on the CPUs (`--profile`).
    pub sched: Option<SchedFigures>,
}

/// Milliseconds per timed call, across ranks, each rank's process on a
/// CPU and runnable waiting for one (all its threads), for the path under
/// test and for the uncached gather of the same batches. A call's wall
/// time less both is its wait on the link or on other ranks.
#[derive(Debug, Clone, Copy)]
pub struct SchedFigures {
    /// Wall time, the path under test.
    pub cached_wall: Spread,
    /// On a CPU, the path under test.
    pub cached_cpu: Spread,
    /// Waiting for a CPU, the path under test.
    pub cached_wait: Spread,
    /// Wall time, the uncached gather.
    pub uncached_wall: Spread,
    /// On a CPU, the uncached gather.
    pub uncached_cpu: Spread,
    /// Waiting for a CPU, the uncached gather.
    pub uncached_wait: Spread,
}

impl CacheFigures {
    /// The text report's lines.
    pub fn print(&self) {
        let line = |what: &str, s: &Spread, total: f64| {
            println!("  {what:<15} min {:.2}   median {:.2}   max {:.2}   (all ranks {total:.2})", s.min, s.median, s.max);
        };
        match self.ratio {
            Some(r) => println!(
                "  node cache      ratio {r}: {} slots per node for {} rows other nodes own ({:.1}%)",
                self.capacity,
                self.remote_rows,
                100.0 * self.capacity as f64 / self.remote_rows.max(1) as f64
            ),
            None => println!("  node cache      none"),
        }
        line(&format!("{} GB/s", if self.ratio.is_some() { "cached" } else { self.path }), &self.test, self.test_total);
        line("uncached GB/s", &self.uncached, self.uncached_total);
        println!("  speed-up        {:.2}   (per-rank median over the uncached gather of the same batches)", self.speedup);
        println!("  baseline GB/s   {:.2}   (one process, one thread, private table)", self.baseline);
        println!("  ratio           {:.2}   (per-rank median / baseline)", self.test.median / self.baseline);
        if self.ratio.is_some() {
            println!(
                "  hit rate        {:.3}   (nodes {:.3} to {:.3}; best static choice {:.3}; largest gap {:.3})",
                self.hit_rate.median, self.hit_rate.min, self.hit_rate.max, self.best_static.median, self.gap
            );
            println!("  first asked     {:.3}   (of the timed lookups: rows asked for the first time in the run)", self.first_seen.median);
            println!(
                "  likeliest rows  {:.3}   (hit rate of a static cache of the likeliest rows by the distribution)",
                self.likeliest.median
            );
            let s = &self.stats;
            println!(
                "  cache           lookups {} hits {} fills {} evictions {} writebacks {}",
                s.lookups, s.hits, s.fills, s.evictions, s.writebacks
            );
        }
        if let Some(c) = &self.sched {
            println!(
                "  cpu per call    {} {:.3} ms on a CPU, {:.3} ms waiting for one, of {:.3} ms; uncached {:.3}, {:.3}, of {:.3}   (medians over the ranks, all threads)",
                self.path,
                c.cached_cpu.median,
                c.cached_wait.median,
                c.cached_wall.median,
                c.uncached_cpu.median,
                c.uncached_wait.median,
                c.uncached_wall.median
            );
        }
    }

    /// The same figures as fields of a JSON report.
    pub fn extend_json(&self, j: &mut serde_json::Value) {
        let s = &self.stats;
        let fields = serde_json::json!({
            "path": self.path, "cache_ratio": self.ratio, "cache_slots": self.capacity, "remote_rows": self.remote_rows,
            "gbps_per_rank": self.test, "gbps_total": self.test_total,
            "uncached_gbps_per_rank": self.uncached, "uncached_gbps_total": self.uncached_total,
            "speedup": self.speedup, "baseline_gbps": self.baseline, "ratio": self.test.median / self.baseline,
            "hit_rate": self.hit_rate, "best_static_hit_rate": self.best_static, "hit_rate_gap": self.gap,
            "first_seen": self.first_seen, "likeliest_static_hit_rate": self.likeliest,
            "lookups": s.lookups, "hits": s.hits, "fills": s.fills, "evictions": s.evictions, "writebacks": s.writebacks,
        });
        let sched = self.sched.map(|c| {
            serde_json::json!({
                "ms_per_call": { "cached": c.cached_wall, "uncached": c.uncached_wall },
                "cpu_ms_per_call": { "cached": c.cached_cpu, "uncached": c.uncached_cpu },
                "cpu_wait_ms_per_call": { "cached": c.cached_wait, "uncached": c.uncached_wait },
            })
        });
        if let (Some(o), serde_json::Value::Object(f)) = (j.as_object_mut(), fields) {
            o.extend(f);
            if let Some(serde_json::Value::Object(f)) = sched {
                o.extend(f);
            }
        }
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
