//! `wm-run -n N [--node-size K] -- CMD ARGS…`: starts N local ranks of CMD.
//!
//! Each rank gets `WM_RANK`, `WM_WORLD_SIZE` and `WM_RENDEZVOUS` (a private
//! directory, or a free TCP port with `--tcp`); with `--node-size K`, rank r
//! also gets `WM_NODE_ID=node<r/K>`, so one machine poses as N/K nodes.
//! Output lines are prefixed with `[rank]`, except those a rank prints
//! through `wm_comm::launch::untagged` (a result line for scripts). wm-run exits non-zero when any
//! rank does, naming it, and stops the others after `--grace-s` seconds.
//!
//! Each rank runs in a process group of its own. Stopping ranks means
//! `SIGTERM` to every rank's group, then `SIGKILL`; `SIGINT`, `SIGTERM` or
//! `SIGHUP` sent to wm-run is passed on to every group the same way (then
//! `SIGKILL` after `--grace-s`), and wm-run exits with 128 + the signal's
//! number. Whatever the ranks leave running in their groups is stopped
//! before wm-run returns, and it does not wait for output pipes that
//! something else still holds (see `wm_comm::launch`).
#![forbid(unsafe_code)]

use std::ffi::OsString;

use clap::Parser;
use wm_comm::launch::{self, Launch, Meet};

#[derive(Debug, Parser)]
#[command(name = "wm-run", version, about = "Start N local ranks of a program for wholemem's embedded backend")]
struct Args {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks")]
    ranks: usize,
    /// Pose as nodes of K ranks each (rank r gets WM_NODE_ID=node<r/K>).
    #[arg(long)]
    node_size: Option<usize>,
    /// Meet over a free TCP port on 127.0.0.1 instead of a private directory.
    #[arg(long)]
    tcp: bool,
    /// Seconds the other ranks may keep running after one fails (and from SIGTERM to SIGKILL after a signal to wm-run).
    #[arg(long, default_value = "5", value_parser = grace)]
    grace_s: std::time::Duration,
    /// The program and its arguments.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// `--grace-s`: zero or more seconds, fractions allowed.
fn grace(raw: &str) -> Result<std::time::Duration, String> {
    wm_topology::env::seconds("--grace-s", raw, true)
}

fn main() {
    let args = Args::parse();
    if args.ranks == 0 {
        eprintln!("wm-run: -n must be at least 1");
        std::process::exit(2);
    }
    let mut l = Launch::new(args.ranks, args.command[0].clone(), args.command[1..].iter().cloned());
    l.node_size = args.node_size;
    l.meet = if args.tcp { Meet::Tcp } else { Meet::Dir };
    l.grace = args.grace_s;
    if let Err(e) = launch::forward_signals() {
        eprintln!("wm-run: cannot forward signals to the ranks: {e}");
        std::process::exit(2);
    }
    let report = match launch::run(&l) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wm-run: {e}");
            std::process::exit(2);
        }
    };
    if !report.success() {
        for f in report.failures() {
            eprintln!("wm-run: {f}");
        }
    }
    std::process::exit(report.exit_code());
}
