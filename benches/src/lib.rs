//! Shared pieces of wholemem's command-line tools: how a tool starts its own
//! ranks when no launcher did, and how results are summarised across ranks.
#![forbid(unsafe_code)]

use std::ffi::OsString;

use wm_comm::launch::{self, Launch};
use wm_comm::{RankEnv, RankSource};

/// Whether a launcher (wm-run, mpirun, srun, PMI) started this process.
pub fn under_launcher() -> anyhow::Result<bool> {
    Ok(RankEnv::from_env()?.source != RankSource::Singleton)
}

/// Re-runs this program as `ranks` local ranks with the same arguments and
/// returns its exit code. Rank 0's output is printed as is; the others'
/// only when something failed, prefixed with their rank.
///
/// # Errors
/// When the ranks cannot be started.
pub fn run_as_ranks(ranks: usize, node_size: Option<usize>) -> anyhow::Result<i32> {
    let exe = std::env::current_exe()?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut l = Launch::new(ranks, exe, args);
    l.node_size = node_size;
    l.echo = false;
    let report = launch::run(&l)?;
    for line in &report.ranks[0].output {
        println!("{line}");
    }
    if !report.success() {
        for r in report.ranks.iter().skip(1) {
            for line in &r.output {
                eprintln!("[{}] {line}", r.rank);
            }
        }
        for f in report.failures() {
            eprintln!("wm-bench: {f}");
        }
    }
    Ok(report.exit_code())
}

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

/// Default rank count: the cores of this machine, at most 4.
pub fn default_ranks() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
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
