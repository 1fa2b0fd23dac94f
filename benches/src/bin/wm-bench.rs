//! `wm-bench`: wholemem's benchmarks and demos.
//!
//! `wm-bench fill` allocates a table of one memory type across the ranks,
//! has every rank write its own rows (a known function of row and column),
//! then read back every row it can reach — all rows through the mapping for
//! continuous and chunked memory, its own rows otherwise — and verifies each
//! value. It reports per-rank write and read GB/s (decimal) and exits
//! non-zero if any value is wrong. Without a launcher it starts `--ranks`
//! local ranks itself.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use wholemem::{Location, MemoryType, WholeTensor};
use wm_bench::{Spread, default_ranks, run_as_ranks, under_launcher};
use wm_comm::{CommExt, Communicator};

#[derive(Debug, Parser)]
#[command(name = "wm-bench", version, about = "wholemem benchmarks and demos")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Allocate a table, write every rank's rows, read back and verify.
    Fill(FillArgs),
}

#[derive(Debug, clap::Args)]
struct FillArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "chunked")]
    ty: MemoryType,
    /// Location: host or device.
    #[arg(long, default_value = "host")]
    location: Location,
    /// Ranks to start when no launcher started this process (default: cores, at most 4).
    #[arg(long)]
    ranks: Option<usize>,
    /// Pose as nodes of K ranks each (with --ranks).
    #[arg(long)]
    node_size: Option<usize>,
    /// Rows in the table.
    #[arg(long, default_value_t = 1 << 20)]
    rows: usize,
    /// f32 values per row.
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Fill(a) => fill_main(&a),
    };
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("wm-bench: {e:#}");
            std::process::exit(1);
        }
    }
}

fn value(row: usize, col: usize) -> f32 {
    ((row * 131 + col * 7) % 65_521) as f32
}

fn fill_main(a: &FillArgs) -> Result<i32> {
    if a.rows == 0 || a.dim == 0 {
        bail!("--rows {} --dim {}: a table needs at least one row and one column", a.rows, a.dim);
    }
    if !under_launcher()? {
        let ranks = a.ranks.unwrap_or_else(default_ranks);
        if ranks > 1 {
            return run_as_ranks(ranks, a.node_size);
        }
    }
    let world = wm_comm::init().context("starting the communicator")?;
    fill(&world, a)
}

fn fill(world: &Arc<dyn Communicator>, a: &FillArgs) -> Result<i32> {
    let support = wholemem::query(world.as_ref(), a.ty, a.location);
    if let Some(reason) = support.reason() {
        bail!("{} {} memory on {} ranks: {reason}", a.location, a.ty, world.size());
    }
    let mut t = WholeTensor::<f32>::matrix(world, a.ty, a.location, a.rows, a.dim, None)?;
    let first = t.local_rows().start;
    world.barrier()?;
    let start = Instant::now();
    for (i, row) in t.local_mut().chunks_mut(a.dim).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = value(first + i, c);
        }
    }
    let write_s = start.elapsed().as_secs_f64();
    let written = t.local().len() * 4;
    world.barrier()?;
    let rows: Vec<usize> = if a.ty.is_mapped() { (0..a.rows).collect() } else { t.local_rows().collect() };
    let mut buf = vec![0f32; a.dim];
    let mut wrong = 0u64;
    let start = Instant::now();
    for &row in &rows {
        t.read_row(row, &mut buf)?;
        wrong += buf.iter().enumerate().filter(|&(c, &v)| v != value(row, c)).count() as u64;
    }
    let read_s = start.elapsed().as_secs_f64();
    let read = rows.len() * a.dim * 4;
    let stats = world.allgather_pod(&[written as f64 / write_s.max(1e-9) / 1e9, read as f64 / read_s.max(1e-9) / 1e9, wrong as f64])?;
    let write_gbps: Vec<f64> = stats.chunks(3).map(|s| s[0]).collect();
    let read_gbps: Vec<f64> = stats.chunks(3).map(|s| s[1]).collect();
    let wrong_total: f64 = stats.chunks(3).map(|s| s[2]).sum();
    let verified = wrong_total == 0.0;
    let nodes = {
        let mut n = world.nodes().to_vec();
        n.dedup();
        n.len()
    };
    t.free()?;
    if world.rank() == 0 {
        let (w, r) = (Spread::of(&write_gbps), Spread::of(&read_gbps));
        if a.json {
            let j = serde_json::json!({
                "op": "fill", "type": a.ty.name(), "location": a.location.name(), "ranks": world.size(), "nodes": nodes,
                "rows": a.rows, "dim": a.dim, "dtype": "f32",
                "write_gbps_per_rank": w, "read_gbps_per_rank": r, "rows_read_per_rank": rows.len(),
                "verified": verified,
            });
            println!("{j}");
        } else {
            println!(
                "fill: {} {} memory, {} ranks on {nodes} node(s), {} rows x {} f32 ({:.1} MiB)",
                a.location,
                a.ty,
                world.size(),
                a.rows,
                a.dim,
                (a.rows * a.dim * 4) as f64 / 1048576.0
            );
            println!("{:<28} {:>9} {:>9} {:>9}", "per rank (GB/s)", "min", "median", "max");
            println!("{:<28} {:>9.2} {:>9.2} {:>9.2}", "write own rows", w.min, w.median, w.max);
            println!(
                "{:<28} {:>9.2} {:>9.2} {:>9.2}",
                if a.ty.is_mapped() { "read every row (mapped)" } else { "read own rows" },
                r.min,
                r.median,
                r.max
            );
            println!("verified: {verified}{}", if verified { String::new() } else { format!(" ({wrong_total} wrong values)") });
        }
    }
    Ok(if verified { 0 } else { 3 })
}
