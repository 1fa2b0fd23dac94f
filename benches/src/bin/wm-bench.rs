//! `wm-bench`: wholemem's benchmarks. This file parses the command line and
//! dispatches; each subcommand lives in its own module of the `wm_bench`
//! library ([`wm_bench::gather`] for gather and scatter, [`wm_bench::apply`], [`wm_bench::get`],
//! [`wm_bench::load`],
//! [`wm_bench::sample`], [`wm_bench::probe`], [`wm_bench::kernels`]).
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use wm_bench::gather::{MoveArgs, Op};
use wm_bench::kernels::KernelsArgs;
use wm_bench::load::LoadArgs;
use wm_bench::probe::ProbeArgs;

#[derive(Debug, Parser)]
#[command(name = "wm-bench", version, about = "wholemem benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Gather random rows of a table spread over the ranks into a local buffer.
    Gather(MoveArgs),
    /// Scatter a local buffer into random rows of a table spread over the ranks.
    Scatter(MoveArgs),
    /// Apply SGD gradients to random rows of an embedding spread over the ranks (`apply_gradients`), verified,
    /// beside plain code updating a private table row by row.
    Apply(MoveArgs),
    /// Read random rows one-sidedly (no owner takes part), from ranks of the job or, with --join, from outside it.
    Get(wm_bench::get::GetArgs),
    /// Write sharded files of known content, load them with every rank reading its own rows, verify,
    /// and compare with one process reading the files sequentially.
    Load(LoadArgs),
    /// Sample neighbours from a CSR graph in wholemem tables, verify every sample, and compare
    /// with one thread sampling a private copy of the graph.
    Sample(wm_bench::sample::SampleArgs),
    /// Print this machine's topology and which memory types and locations the
    /// ranks support, with reasons; `--active` also tries each one.
    Probe(ProbeArgs),
    /// The CUDA kernels: `--check` compiles every kernel with NVRTC for each architecture.
    Kernels(KernelsArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Gather(a) => wm_bench::gather::start(Op::Gather, a),
        Cmd::Scatter(a) => wm_bench::gather::start(Op::Scatter, a),
        Cmd::Get(a) => wm_bench::get::start(a),
        Cmd::Apply(a) => wm_bench::apply::start(a),
        Cmd::Probe(a) => wm_bench::probe::run(a),
        Cmd::Kernels(a) => wm_bench::kernels::run(a),
        Cmd::Load(a) => wm_bench::load::start(a),
        Cmd::Sample(a) => wm_bench::sample::start(a),
    };
    match result {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("wm-bench: {e:#}");
            std::process::exit(1);
        }
    }
}
