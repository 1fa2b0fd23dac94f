//! The options every benchmark shares about its ranks, and how a tool starts
//! its own ranks when no launcher did.

use std::ffi::OsString;
use std::sync::Arc;

use anyhow::{Context, Result};
use wm_comm::launch::{self, Launch};
use wm_comm::{Communicator, RankEnv, RankSource};

/// `--ranks` and `--node-size`: the local ranks a benchmark starts when no
/// launcher started it.
#[derive(Debug, Clone, clap::Args)]
pub struct RankArgs {
    /// Ranks to start when no launcher (wm-run, mpirun, srun) started this process [default: cores, at most 4].
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Pose as nodes of K ranks each (with --ranks).
    #[arg(long)]
    pub node_size: Option<usize>,
}

/// Where a benchmark runs after [`RankArgs::start`].
pub enum Started {
    /// This process is a rank of this world: run the benchmark here.
    Rank(Arc<dyn Communicator>),
    /// This process started the ranks, which ran the benchmark; this is the
    /// exit code.
    Launched(i32),
}

impl RankArgs {
    /// Starts `--ranks` local ranks of this program (with the same
    /// arguments) when no launcher started this process and more than one
    /// is wanted; otherwise joins the world this process belongs to.
    ///
    /// # Errors
    /// A malformed launcher environment, ranks that cannot be started, a
    /// communicator that cannot start.
    pub fn start(&self) -> Result<Started> {
        if !under_launcher()? {
            let ranks = self.ranks.unwrap_or_else(default_ranks);
            if ranks > 1 {
                return run_as_ranks(ranks, self.node_size).map(Started::Launched);
            }
        }
        Ok(Started::Rank(wm_comm::init().context("starting the communicator")?))
    }
}

/// Whether a launcher (wm-run, mpirun, srun, PMI) started this process.
///
/// # Errors
/// A malformed launcher environment.
pub fn under_launcher() -> Result<bool> {
    Ok(RankEnv::from_env()?.source != RankSource::Singleton)
}

/// Re-runs this program as `ranks` local ranks with the same arguments and
/// returns its exit code. Rank 0's output is printed as is; the others'
/// only when something failed, prefixed with their rank. `SIGINT`,
/// `SIGTERM` and `SIGHUP` to this process stop the ranks (and what they
/// started) as they do under `wm-run`.
///
/// # Errors
/// When the ranks cannot be started.
pub fn run_as_ranks(ranks: usize, node_size: Option<usize>) -> Result<i32> {
    launch::forward_signals().context("forwarding signals to the ranks")?;
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

/// Default rank count: the cores of this machine, at most 4.
pub fn default_ranks() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}
