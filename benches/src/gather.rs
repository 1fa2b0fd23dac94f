//! `wm-bench gather` and `wm-bench scatter` move batches of random rows
//! between a table spread over the ranks and a local buffer, verify every
//! value moved, and report per-rank GB/s (decimal, output bytes for gather,
//! input bytes for scatter) beside a baseline measured in the same run: the
//! same batches moved by plain single-threaded code in one process, from or
//! into a private table of the same shape. The baseline batches interleave
//! with the timed ones (rank 0 runs one alone after each batch, while the
//! other ranks wait), so both see the machine in the same state. Without a
//! launcher it starts `--ranks` local ranks itself.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail, ensure};
use clap::ValueEnum;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator};
use wm_gather::{DType, Ids, RowLayout};

use crate::ids::IdDist;
use crate::ranks::{RankArgs, Started};
use crate::report::{self, Speeds, Spread};
use crate::shape::ShapeArgs;
use crate::values;

/// The ids' integer type.
/// `--cache-bypass`: [`wm_gather::cache::Bypass`] by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CacheBypass {
    /// The faster path, measured.
    Auto,
    /// Always through the cache.
    Off,
    /// Always uncached.
    Always,
}

impl CacheBypass {
    pub(crate) fn mode(self) -> wm_gather::cache::Bypass {
        match self {
            Self::Auto => wm_gather::cache::Bypass::Auto,
            Self::Off => wm_gather::cache::Bypass::Off,
            Self::Always => wm_gather::cache::Bypass::Always,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum IdType {
    I32,
    I64,
}

/// The options of `wm-bench gather` and `wm-bench scatter`.
#[derive(Debug, Clone, clap::Args)]
pub struct MoveArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "chunked")]
    pub(crate) ty: MemoryType,
    /// Location: host or device.
    #[arg(long, default_value = "host")]
    pub(crate) location: Location,
    /// Where gather's output lives: host, or device (a kernel on this rank's GPU reads the table — device memory, or
    /// host memory registered with CUDA — and the baseline is a copy of the same bytes to the GPU) [default: --location].
    #[arg(long)]
    pub(crate) out_location: Option<Location>,
    /// The local ranks to start without a launcher.
    #[command(flatten)]
    pub(crate) ranks: RankArgs,
    /// The table's shape.
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// The local buffer's element type (gather output, scatter input) [default: --dtype].
    #[arg(long)]
    pub(crate) out_dtype: Option<DType>,
    /// Id type.
    #[arg(long, value_enum, default_value = "i64")]
    pub(crate) ids: IdType,
    /// Ids per batch, per rank.
    #[arg(long, default_value_t = 65_536)]
    pub(crate) batch: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 20)]
    pub(crate) iters: usize,
    /// Untimed batches first (with --cache-ratio or --embedding: through the path under test only, warming its cache).
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: usize,
    /// Seed of the random ids.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// How ids are drawn: uniform, or zipf:S (row of rank k asked with probability proportional to k^-S; ranks
    /// spread over the table by a fixed permutation).
    #[arg(long, default_value = "uniform")]
    pub(crate) id_dist: IdDist,
    /// With zipf ids: move the hot set every N batches (warm-up batches count): the Zipf ranks shift by 0.382 of the
    /// table, so each phase's hot rows were cold before.
    #[arg(long, value_name = "N")]
    pub(crate) id_drift: Option<usize>,
    /// Gather through a node cache of this fraction of the table's rows (distributed and hierarchy tables across
    /// nodes), and each batch also without it: reports both, the speed-up, the hit rate and the best static choice's.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) cache_ratio: Option<f64>,
    /// With --cache-ratio: how fast the node cache's access counts fade — `off` (pure LFU: counts only grow) or F
    /// (every count halved once the node counted F x slots accesses) [default: the library's, 4].
    #[arg(long, value_name = "off|F")]
    pub(crate) cache_ageing: Option<crate::cached::Ageing>,
    /// With --cache-ratio: which path the node cache's gathers take — `auto` (the faster of the cached and the
    /// uncached one, measured as it goes), `off` (always through the cache) or `always` (always uncached).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) cache_bypass: CacheBypass,
    /// Gather through `wm_embedding::Embedding::gather` (f32, f16 or bf16 tables; f32 output) instead of
    /// `wm_gather::gather`; with --cache-ratio, the embedding's node cache.
    #[arg(long)]
    pub(crate) embedding: bool,
    /// Pages of the baseline's private table: `default` (what plain code gets: on most systems small pages) or
    /// `huge` (transparent huge pages asked for with madvise), to see how much of a ratio is the table's huge pages.
    #[arg(long, value_enum, default_value = "default")]
    pub(crate) baseline_pages: BaselinePages,
    /// Who runs the baseline: `one` (rank 0 alone, the others waiting: the machine to itself) or `all` (every rank its
    /// own baseline at the same time — a private table and batches, or on the device its own copy to or on its GPU —
    /// the same sharing of cores, memory or GPUs as the benchmark). With `all`, both are timed as steps, from the last
    /// rank ready to the last rank done, the ratio compares the steps (ranks of one machine: their clocks are
    /// compared), and the report adds the all-ranks figures of both steps.
    #[arg(long, value_enum, default_value = "one")]
    pub(crate) baseline_ranks: BaselineRanks,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Split the timed calls into their phases (ids, owner copy, rows, placing, ...) on every rank and print the time
    /// of each per call, min/median/max over the ranks (JSON: `profile`).
    #[arg(long)]
    pub(crate) profile: bool,
}

/// Who runs the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BaselineRanks {
    One,
    All,
}

/// Pages of the baseline's private table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BaselinePages {
    Default,
    Huge,
}

impl MoveArgs {
    /// The hot-set phase of batch `b` (`--id-drift`; 0 without).
    pub(crate) fn phase(&self, b: usize) -> u64 {
        self.id_drift.map_or(0, |n| (b / n.max(1)) as u64)
    }

    /// Whether the gathered rows land in device memory.
    pub(crate) fn device_out(&self) -> bool {
        self.location == Location::Device || self.out_location == Some(Location::Device)
    }
}

/// Which way rows move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// From the table into the local buffer.
    Gather,
    /// From the local buffer into the table.
    Scatter,
}

impl Op {
    /// The subcommand's name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Gather => "gather",
            Op::Scatter => "scatter",
        }
    }
}

pub(crate) const DEFAULT_TABLE_BYTES: usize = 2 << 30;

/// Runs `wm-bench gather` or `wm-bench scatter`: starts `--ranks` local
/// ranks when no launcher did, then benchmarks. Returns the exit code (3
/// when verification failed).
///
/// # Errors
/// Bad options, an unsupported type or location, a failed move, a lost peer.
pub fn start(op: Op, a: &MoveArgs) -> Result<i32> {
    ensure!(a.shape.dim > 0 && a.batch > 0 && a.iters > 0, "--dim, --batch and --iters must be positive");
    if let Some(n) = a.id_drift {
        ensure!(n > 0, "--id-drift {n}: the hot set moves every N batches, N at least 1");
        ensure!(matches!(a.id_dist, IdDist::Zipf(_)), "--id-drift moves a Zipf hot set; {} ids have none", a.id_dist);
    }
    ensure!(a.cache_ageing.is_none() || a.cache_ratio.is_some(), "--cache-ageing applies to a node cache (--cache-ratio)");
    a.shape.dtype.check_conversion(a.out_dtype.unwrap_or(a.shape.dtype))?;
    ensure!(
        !(op == Op::Scatter && a.out_location.is_some_and(|l| l != a.location)),
        "--out-location applies to gather; scatter reads its input from the table's side"
    );
    if a.cache_ratio.is_some() || a.embedding {
        ensure!(op == Op::Gather, "--cache-ratio and --embedding apply to gather");
        crate::cached::check(a)?;
    }
    if a.device_out() {
        // Say why before starting any rank.
        #[cfg(feature = "cuda")]
        if let Err(why) = wholemem::device::status() {
            bail!("device memory is unavailable here: {why}");
        }
        #[cfg(not(feature = "cuda"))]
        bail!("device memory is unavailable here: {}", wholemem::NO_CUDA);
    }
    match a.ranks.start()? {
        Started::Launched(code) => Ok(code),
        Started::Rank(world) => bench(op, &world, a),
    }
}

/// Batch `b` of rank `rank`, as `--id-dist` draws it.
pub(crate) fn batch_ids(a: &MoveArgs, rows: usize, rank: usize, b: usize) -> Vec<i64> {
    crate::ids::batch(a.id_dist, a.seed, rows, a.batch, rank, b, a.phase(b))
}

/// The benchmark proper, on every rank.
///
/// # Errors
/// An unsupported type or location, a failed move, a lost peer.
pub fn bench(op: Op, world: &Arc<dyn Communicator>, a: &MoveArgs) -> Result<i32> {
    if a.cache_ratio.is_some() || a.embedding {
        return crate::cached::bench(world, a);
    }
    let (me, n) = (world.rank(), world.size());
    let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
    let row_bytes = a.shape.row_bytes();
    let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
    if a.ids == IdType::I32 && rows > i32::MAX as usize {
        bail!("--ids i32 cannot address {rows} rows");
    }
    if let Some(reason) = wholemem::query(world.as_ref(), a.ty, a.location).reason() {
        bail!("{} {} memory on {n} ranks: {reason}", a.location, a.ty);
    }
    let req = AllocRequest { ty: a.ty, loc: a.location, total: rows * row_bytes, granularity: row_bytes, partition: None };
    let mut mem = WholeMemory::allocate(world, &req)?;
    values::fill(&mut mem, a.shape.dim, a.shape.dtype)?;
    let huge_pages = mem.huge_page_bytes() as f64 / mem.mapped_bytes().max(1) as f64;
    let layout = RowLayout::new(a.shape.dtype, a.shape.dim, 0)?;
    let buf_row = a.shape.dim * out_dt.size();
    let mut buf = vec![0u8; a.batch * buf_row];
    let mut expect = vec![0u8; buf_row];
    let progress = me == 0 && std::io::stderr().is_terminal();
    // A run into device memory has a copy to the GPU as its baseline: no
    // private host table needed. With every rank on the baseline, each
    // copies on (or to) its own GPU at once: ranks sharing a GPU share it
    // in the baseline too.
    let host_rows = if a.device_out() { 0 } else { rows };
    let all_base = a.baseline_ranks == BaselineRanks::All;
    let mut base = if me == 0 || all_base { Some(Baseline::new(op, a, host_rows, out_dt)) } else { None };
    #[cfg(feature = "cuda")]
    let mut gpu = if a.device_out() { Some(DeviceRun::new(&mem, a.batch * buf_row, me == 0 || all_base)?) } else { None };
    if all_base {
        one_machine(world.as_ref())?;
    }
    world.barrier()?;
    let mut seconds = 0.0f64;
    // With every rank running the baseline: both timed as steps, from when
    // the last rank was ready to when the last rank was done.
    let (mut step_seconds, mut step_base_seconds) = (0.0f64, 0.0f64);
    // Each timed batch's call and baseline times (steps with every rank
    // running the baseline), for the ratio batch by batch.
    let (mut call_times, mut base_steps) = (Vec::new(), Vec::new());
    let mut wrong = 0u64;
    let mut scattered: Vec<i64> = Vec::new();
    for b in 0..a.warmup + a.iters {
        if a.profile && b == a.warmup {
            wm_gather::profile::record();
        }
        let ids = batch_ids(a, rows, me, b);
        let narrow: Vec<i32> = if a.ids == IdType::I32 { ids.iter().map(|&x| x as i32).collect() } else { Vec::new() };
        let id_arg = || if a.ids == IdType::I32 { Ids::I32(&narrow) } else { Ids::I64(&ids) };
        if op == Op::Scatter {
            // Every rank writes the same function of (row, column), so rows
            // written by several ranks are the same whoever wins.
            for (i, &id) in ids.iter().enumerate() {
                values::row(id as usize + rows, a.shape.dim, a.shape.dtype, out_dt, &mut buf[i * buf_row..][..buf_row]);
            }
        }
        let ready = wall_seconds();
        world.barrier()?;
        let dt = match op {
            #[cfg(feature = "cuda")]
            Op::Gather if gpu.is_some() => gpu.as_mut().expect("checked").gather(&mem, &layout, id_arg(), &mut buf, out_dt)?,
            Op::Gather => {
                let t0 = Instant::now();
                wm_gather::gather(&mem, &layout, id_arg(), &mut buf, out_dt)?;
                t0.elapsed().as_secs_f64()
            }
            #[cfg(feature = "cuda")]
            Op::Scatter if gpu.is_some() => gpu.as_mut().expect("checked").scatter(&mut mem, &layout, id_arg(), &buf, out_dt)?,
            Op::Scatter => {
                let t0 = Instant::now();
                wm_gather::scatter(&mut mem, &layout, id_arg(), &buf, out_dt)?;
                t0.elapsed().as_secs_f64()
            }
        };
        if b >= a.warmup {
            seconds += dt;
            if all_base {
                let st = step(world.as_ref(), ready, wall_seconds())?;
                step_seconds += st;
                call_times.push(st);
            } else {
                call_times.push(dt);
            }
        }
        match op {
            Op::Gather => {
                for (i, &id) in ids.iter().enumerate() {
                    values::row(id as usize, a.shape.dim, a.shape.dtype, out_dt, &mut expect);
                    wrong += u64::from(buf[i * buf_row..][..buf_row] != expect[..]);
                }
            }
            Op::Scatter if b + 1 == a.warmup + a.iters => scattered = ids.clone(),
            Op::Scatter => {}
        }
        // The baseline's batch: by rank 0 alone, or by every rank at once
        // (`--baseline-ranks all`), each its own batch.
        let ready = wall_seconds();
        world.barrier()?;
        if let Some(base) = &mut base {
            #[cfg(feature = "cuda")]
            if let Some(g) = &mut gpu {
                base.device_batch(g, &mem, b >= a.warmup)?;
            } else {
                base.batch(&ids, b >= a.warmup);
            }
            #[cfg(not(feature = "cuda"))]
            base.batch(&ids, b >= a.warmup);
        }
        if all_base && b >= a.warmup {
            let st = step(world.as_ref(), ready, wall_seconds())?;
            step_base_seconds += st;
            base_steps.push(st);
        }
        if progress {
            eprint!("\r{} batch {}/{}", op.name(), b + 1, a.warmup + a.iters);
        }
    }
    if progress {
        eprintln!();
    }
    if op == Op::Scatter {
        // Read back the last batch's rows: each holds the scattered value.
        world.barrier()?;
        let mut back = vec![0u8; scattered.len() * row_bytes];
        wm_gather::gather(&mem, &layout, Ids::I64(&scattered), &mut back, a.shape.dtype)?;
        let mut stored = vec![0u8; row_bytes];
        for (i, &id) in scattered.iter().enumerate() {
            values::row(id as usize + rows, a.shape.dim, a.shape.dtype, out_dt, &mut expect);
            // What the table holds after converting the buffer's row back.
            for c in 0..a.shape.dim {
                let v = values::get(out_dt, &expect[c * out_dt.size()..][..out_dt.size()]);
                values::put(a.shape.dtype, &mut stored[c * a.shape.dtype.size()..][..a.shape.dtype.size()], v);
            }
            wrong += u64::from(back[i * row_bytes..][..row_bytes] != stored[..]);
        }
    }
    let phases = if a.profile { Some(report::Phases::gather(world.as_ref(), &wm_gather::profile::take())?) } else { None };
    let wire = if a.location == Location::Host && !a.device_out() { Wire::measure(world.as_ref(), a, buf_row)? } else { None };
    let bytes = (a.iters * a.batch * buf_row) as f64;
    let stats = world.allgather_pod(&[bytes / seconds.max(1e-12) / 1e9, seconds, wrong as f64])?;
    let (per_step, baseline) = if all_base {
        (Some(bytes / step_seconds.max(1e-12) / 1e9), bytes / step_base_seconds.max(1e-12) / 1e9)
    } else {
        (None, base.as_ref().map_or(0.0, Baseline::gbps))
    };
    let baseline_huge = base.as_ref().map_or(0.0, |b| wholemem::huge_page_bytes(&b.table) as f64 / b.table.len().max(1) as f64);
    // Every rank's call times, batch after batch (rank-major).
    let all_calls = world.allgather_pod(&call_times)?;
    let batch_bytes = (a.batch * buf_row) as f64;
    let base_batches: Vec<(f64, f64)> = if all_base {
        base_steps.iter().map(|&t| (t, batch_bytes)).collect()
    } else {
        base.as_ref().map_or_else(Vec::new, |b| b.batches.clone())
    };
    let ratio_batches = ratio_by_batch(&all_calls, batch_bytes, &base_batches);
    // Each rank's median time of one call, in microseconds (the figure to
    // set beside a binding's own per-call time).
    let medians: Vec<f64> = all_calls.chunks(call_times.len().max(1)).map(|c| Spread::of(c).median * 1e6).collect();
    let us_per_call = (!call_times.is_empty()).then(|| Spread::of(&medians));
    drop(base);
    #[cfg(feature = "cuda")]
    drop(gpu);
    let nodes = wm_topology::NodeLayout::of(world.nodes()).nodes;
    // Whether the GPU read this rank's host rows in place, or why not.
    #[cfg(feature = "cuda")]
    let registration = mem.host_registration().err().map(str::to_owned);
    #[cfg(not(feature = "cuda"))]
    let registration: Option<String> = None;
    mem.free()?;
    let per_rank: Vec<f64> = stats.chunks(3).map(|s| s[0]).collect();
    let slowest = stats.chunks(3).map(|s| s[1]).fold(0.0f64, f64::max);
    let wrong_total: f64 = stats.chunks(3).map(|s| s[2]).sum();
    let verified = wrong_total == 0.0;
    if me == 0 {
        let s = Spread::of(&per_rank);
        let total = bytes * n as f64 / slowest.max(1e-12) / 1e9;
        // With every rank running the baseline, the steps compare: what
        // a rank gets when the machine's cores are shared the same way.
        let ratio = per_step.unwrap_or(s.median) / baseline;
        // Under MPI the rows between nodes travel through MPI's own
        // connections, whose congestion control is the host's.
        let tcp_congestion = wm_comm::tcp::in_use().filter(|_| world.backend() == "socket");
        if a.json {
            let j = serde_json::json!({
                "op": op.name(), "type": a.ty.name(), "location": a.location.name(),
                "out_location": if a.device_out() { "device" } else { "host" }, "ranks": n, "nodes": nodes,
                "rows": rows, "dim": a.shape.dim, "dtype": a.shape.dtype.name(), "out_dtype": out_dt.name(),
                "ids": if a.ids == IdType::I32 { "i32" } else { "i64" }, "batch": a.batch, "iters": a.iters,
                "gbps_per_rank": s, "gbps_total": total, "baseline_gbps": baseline, "ratio": ratio,
                "ratio_batches": ratio_batches, "verified": verified,
                "huge_pages": huge_pages, "baseline_huge_pages": baseline_huge,
                "baseline_ranks": if all_base { "all" } else { "one" },
                "us_per_call": us_per_call,
            });
            let mut j = j;
            if let Some(g) = per_step {
                // The all-ranks figures of both steps (every rank ran both).
                j["step_gbps_per_rank"] = serde_json::json!(g);
                j["step_gbps_total"] = serde_json::json!(g * n as f64);
                j["baseline_gbps_total"] = serde_json::json!(baseline * n as f64);
            }
            if a.location == Location::Host && a.device_out() {
                j["host_registration"] = serde_json::json!(registration.as_deref().unwrap_or("registered"));
            }
            if let Some(p) = &phases {
                j["profile"] = p.json();
            }
            if let Some(w) = &wire {
                j["wire_gbps_per_rank"] = serde_json::json!(w.per_rank);
                j["wire_share"] = serde_json::json!(w.share(a.batch * buf_row, s.median));
            }
            if let Some(cc) = tcp_congestion {
                j["tcp_congestion"] = serde_json::json!(cc);
            }
            report::json_line(&j);
        } else {
            println!(
                "{} {} {} memory: {n} ranks on {nodes} node(s), {rows} rows x {} {} ({:.2} GiB), batches of {} ids -> {}, {} timed",
                op.name(),
                a.location,
                a.ty,
                a.shape.dim,
                a.shape.dtype,
                (rows * row_bytes) as f64 / (1u64 << 30) as f64,
                a.batch,
                out_dt,
                a.iters
            );
            let what = match (a.location, a.out_location) {
                (Location::Device, _) if all_base => {
                    "every rank at once, a device-to-device copy of the same bytes on its GPU, per rank of a step"
                }
                (Location::Device, _) => "rank 0's GPU, a device-to-device copy of the same bytes",
                (Location::Host, Some(Location::Device)) if all_base => {
                    "every rank at once, its rows copied to its GPU over the host link, per rank of a step"
                }
                (Location::Host, Some(Location::Device)) => "rank 0's rows copied to its GPU over the host link",
                _ if all_base => "every rank at once, one thread each, private tables, per rank of a step",
                _ => "one process, one thread, private table",
            };
            Speeds { per_rank: s, total, baseline, ratio }
                .print(what, if all_base { "per rank of a step / baseline" } else { "per-rank median / baseline" });
            report::print_step(per_step, n, baseline);
            report::print_ratio_by_batch(ratio_batches);
            if a.location == Location::Host && a.device_out() {
                let how =
                    registration.as_deref().map_or_else(|| "registered with CUDA, read in place".to_owned(), |why| format!("none: {why}"));
                println!("  registration    {how} (rank 0's host rows)");
            }
            println!(
                "  huge pages      {:.0}% of the table rank 0 maps, {:.0}% of the baseline's",
                huge_pages * 100.0,
                baseline_huge * 100.0
            );
            if let Some(w) = &wire {
                println!(
                    "  wire GB/s       {:.2}   per rank (median): {:.1} MiB a call from other nodes through the same exchange, no row copied",
                    w.per_rank.median,
                    w.cross_bytes as f64 / (1u64 << 20) as f64
                );
                println!("  wire share      {:.2}   of a call's time, the bare exchange's", w.share(a.batch * buf_row, s.median));
            }
            if let Some(cc) = tcp_congestion {
                println!("  TCP             {cc} congestion control between nodes (WM_TCP_CONGESTION)");
            }
            report::print_verified(wrong_total);
            if let Some(p) = &phases {
                p.print();
            }
        }
    }
    Ok(if verified { 0 } else { 3 })
}

/// What the transport alone gives a call across nodes, measured in the same
/// run: every rank exchanges with each rank of another node the bytes a
/// call of uniform ids brings from it (`batch × row / ranks`), through the
/// same in-place exchange as the gather, but with nothing copied in or out.
/// Set beside the gather, it says how much of a call is the wire itself and
/// how much is ours (ids, copies, placing), whatever the machine's network
/// speed that day.
struct Wire {
    /// Bytes a rank receives from other nodes per exchange.
    cross_bytes: usize,
    /// Those bytes per second of an exchange, per rank, decimal GB/s.
    per_rank: Spread,
}

impl Wire {
    /// `None` on one node (nothing crosses).
    fn measure(world: &dyn Communicator, a: &MoveArgs, out_row: usize) -> Result<Option<Self>> {
        let placement = wm_topology::NodeLayout::of(world.nodes());
        if placement.nodes < 2 {
            return Ok(None);
        }
        let (me, n) = (world.rank(), world.size());
        let part = a.batch * out_row / n;
        let sizes: Vec<usize> = (0..n).map(|r| if placement.node[r] == placement.node[me] { 0 } else { part }).collect();
        let cross_bytes: usize = sizes.iter().sum();
        let mut seconds = 0.0f64;
        for b in 0..a.warmup + a.iters {
            world.barrier()?;
            let t0 = Instant::now();
            world.alltoallv_in_place(&sizes, &mut |_, _| {}, &mut || {}, &mut |_, _| {})?;
            if b >= a.warmup {
                seconds += t0.elapsed().as_secs_f64();
            }
        }
        let mine = (cross_bytes * a.iters) as f64 / seconds.max(1e-12) / 1e9;
        let all = world.allgather_pod(&[mine])?;
        Ok(Some(Self { cross_bytes, per_rank: Spread::of(&all) }))
    }

    /// The bare exchange's time over a call's, for a call that moves
    /// `call_bytes` at `gbps` per rank.
    fn share(&self, call_bytes: usize, gbps: f64) -> f64 {
        let wire = self.cross_bytes as f64 / self.per_rank.median.max(1e-12);
        let call = call_bytes as f64 / gbps.max(1e-12);
        wire / call
    }
}

/// The device side of a gather benchmark: an output buffer on the GPU, and
/// for rank 0 the two buffers of the device-to-device baseline copy.
#[cfg(feature = "cuda")]
struct DeviceRun {
    out: wholemem::device::DeviceBuffer,
    copy: Option<(wholemem::device::DeviceBuffer, wholemem::device::DeviceBuffer)>,
}

#[cfg(feature = "cuda")]
impl DeviceRun {
    fn new(mem: &WholeMemory, bytes: usize, baseline: bool) -> Result<Self> {
        use wholemem::device::DeviceBuffer;
        let out = DeviceBuffer::new(mem, bytes)?;
        let copy = if baseline { Some((DeviceBuffer::new(mem, bytes)?, DeviceBuffer::new(mem, bytes)?)) } else { None };
        Ok(Self { out, copy })
    }

    /// Uploads the ids (untimed), gathers into device memory (timed), and
    /// brings the rows back for verification (untimed). Seconds.
    fn gather(&mut self, mem: &WholeMemory, layout: &RowLayout, ids: Ids<'_>, buf: &mut [u8], out: DType) -> Result<f64> {
        let dev_ids = wm_gather::device::DeviceIds::upload(mem, ids)?;
        let t0 = Instant::now();
        wm_gather::device::gather_device(mem, layout, &dev_ids, &mut self.out, out)?;
        let dt = t0.elapsed().as_secs_f64();
        self.out.download(buf)?;
        Ok(dt)
    }

    /// Uploads the ids and the rows (untimed), scatters them from device
    /// memory (timed). Seconds.
    fn scatter(&mut self, mem: &mut WholeMemory, layout: &RowLayout, ids: Ids<'_>, buf: &[u8], src: DType) -> Result<f64> {
        let dev_ids = wm_gather::device::DeviceIds::upload(mem, ids)?;
        self.out.upload(buf)?;
        let t0 = Instant::now();
        wm_gather::device::scatter_device(mem, layout, &dev_ids, &self.out, src)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// One timed copy of the batch's bytes to the GPU: device to device for
    /// a device table; for a host table, from this rank's rows (registered
    /// with CUDA, so page-locked) over the host link. Seconds and bytes.
    fn copy(&mut self, mem: &WholeMemory) -> Result<(f64, usize)> {
        use anyhow::Context as _;
        let (dst, src) = self.copy.as_mut().expect("rank 0 holds the baseline buffers");
        if mem.location() == Location::Host {
            let t0 = Instant::now();
            let n = mem.upload_local(dst)?;
            return Ok((t0.elapsed().as_secs_f64(), n));
        }
        let ctx = wholemem::device::raw::context(mem).context("the table has no GPU")?;
        let t0 = Instant::now();
        dst.copy_from(src, src.len())?;
        ctx.synchronize().map_err(|e| anyhow::anyhow!("waiting for the GPU: {e:?}"))?;
        Ok((t0.elapsed().as_secs_f64(), src.len()))
    }
}

/// The ratio batch by batch: for each timed batch, the call's speed (by the
/// median over the ranks of their times for it, or by the step) over the
/// baseline's on it, and the median of those over the batches. Unlike the
/// ratio of totals, a batch that stalled — in the call or in the baseline —
/// moves it by one place, not by its length. `calls` holds every rank's
/// times, rank-major, `base.len()` of them each; 0 without a baseline.
pub(crate) fn ratio_by_batch(calls: &[f64], call_bytes: f64, base: &[(f64, f64)]) -> f64 {
    let iters = base.len();
    if iters == 0 || calls.len() % iters != 0 {
        return 0.0;
    }
    let ranks = calls.len() / iters;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
    };
    let ratios: Vec<f64> = (0..iters)
        .map(|b| {
            let call = median((0..ranks).map(|r| calls[r * iters + b]).collect());
            let (secs, bytes) = base[b];
            (call_bytes / call.max(1e-12)) / (bytes / secs.max(1e-12))
        })
        .collect();
    median(ratios)
}

/// Fails unless every rank runs on this one machine: step times
/// (`--baseline-ranks all`) compare the ranks' clocks, so one kernel's only
/// (network namespaces that pose as hosts are fine). Collective.
pub(crate) fn one_machine(world: &dyn Communicator) -> Result<()> {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let boots = world.allgatherv(&boot)?;
    ensure!(
        !boot.is_empty() && boots.iter().all(|b| b == &boots[0]),
        "--baseline-ranks all times steps across ranks by their clocks: every rank must run on this one machine"
    );
    Ok(())
}

/// Seconds on this machine's real-time clock (steps compare ranks' clocks:
/// ranks of one machine only).
pub(crate) fn wall_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One step of every rank: from the last rank's `ready` to the last rank's
/// `done`.
pub(crate) fn step(world: &dyn Communicator, ready: f64, done: f64) -> Result<f64> {
    let all = world.allgather_pod(&[ready, done])?;
    let last = |k: usize| all.chunks(2).map(|c| c[k]).fold(f64::MIN, f64::max);
    Ok((last(1) - last(0)).max(0.0))
}

/// The same batches (rank 0's) moved by plain single-threaded code from or
/// into a private table of the same shape (also `wm-bench get`'s baseline).
pub(crate) struct Baseline {
    op: Op,
    table: Vec<u8>,
    buf: Vec<u8>,
    dim: usize,
    dtype: DType,
    out: DType,
    /// Each timed batch's seconds and bytes.
    batches: Vec<(f64, f64)>,
}

impl Baseline {
    pub(crate) fn new(op: Op, a: &MoveArgs, rows: usize, out: DType) -> Self {
        Self::with(op, rows, a.shape.dim, a.shape.dtype, out, a.batch, a.baseline_pages == BaselinePages::Huge)
    }

    /// A private table of `rows` rows of `dim` elements of `dtype`, holding
    /// the benchmark values, for batches of `batch` ids moved as `out`.
    pub(crate) fn with(op: Op, rows: usize, dim: usize, dtype: DType, out: DType, batch: usize, huge: bool) -> Self {
        let es = dtype.size();
        let row_bytes = dim * es;
        let mut table = vec![0u8; rows * row_bytes];
        if huge {
            wholemem::advise_huge_pages(&mut table);
        }
        for (r, row) in table.chunks_mut(row_bytes).enumerate() {
            for c in 0..dim {
                values::put(dtype, &mut row[c * es..][..es], values::at(r, c, dtype));
            }
        }
        let buf = vec![0u8; batch * dim * out.size()];
        Self { op, table, buf, dim, dtype, out, batches: Vec::new() }
    }

    /// Bytes of huge pages of the private table, as a fraction.
    pub(crate) fn huge_fraction(&self) -> f64 {
        wholemem::huge_page_bytes(&self.table) as f64 / self.table.len().max(1) as f64
    }

    /// Moves one batch; `timed` adds it to the figures.
    pub(crate) fn batch(&mut self, ids: &[i64], timed: bool) {
        let (es, os, dim) = (self.dtype.size(), self.out.size(), self.dim);
        let (row_bytes, buf_row) = (dim * es, dim * os);
        let same = self.dtype == self.out;
        let t0 = Instant::now();
        for (i, &id) in ids.iter().enumerate() {
            let t = &mut self.table[id as usize * row_bytes..][..row_bytes];
            let o = &mut self.buf[i * buf_row..][..buf_row];
            match (self.op, same) {
                (Op::Gather, true) => o.copy_from_slice(t),
                (Op::Scatter, true) => t.copy_from_slice(o),
                (Op::Gather, false) => {
                    for c in 0..dim {
                        values::put(self.out, &mut o[c * os..][..os], values::get(self.dtype, &t[c * es..][..es]));
                    }
                }
                (Op::Scatter, false) => {
                    for c in 0..dim {
                        values::put(self.dtype, &mut t[c * es..][..es], values::get(self.out, &o[c * os..][..os]));
                    }
                }
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(&self.buf);
        if timed {
            self.batches.push((dt, (ids.len() * buf_row) as f64));
        }
    }

    /// The device baseline: one device-to-device copy of a batch's output
    /// bytes on this rank's GPU.
    #[cfg(feature = "cuda")]
    fn device_batch(&mut self, gpu: &mut DeviceRun, mem: &WholeMemory, timed: bool) -> Result<()> {
        let (dt, bytes) = gpu.copy(mem)?;
        if timed {
            self.batches.push((dt, bytes as f64));
        }
        Ok(())
    }

    pub(crate) fn gbps(&self) -> f64 {
        let (seconds, bytes) = self.batches.iter().fold((0.0, 0.0), |(s, b), &(ds, db)| (s + ds, b + db));
        bytes / f64::max(seconds, 1e-12) / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::ratio_by_batch;

    #[test]
    fn a_stalled_batch_moves_the_batch_ratio_by_one_place_only() {
        // Two ranks, four batches of 1 MB; the baseline takes 1 ms a batch.
        let base = vec![(1e-3, 1e6); 4];
        // Calls of 2 ms (rank 0) and 4 ms (rank 1): their median, 3 ms.
        let calls = [[2e-3; 4], [4e-3; 4]].concat();
        assert!((ratio_by_batch(&calls, 1e6, &base) - 1.0 / 3.0).abs() < 1e-9);
        // One batch stalls for a second on both ranks: the ratio of totals
        // would fall to about 0.003; batch by batch it stays.
        let mut stalled = calls.clone();
        stalled[2] = 1.0;
        stalled[4 + 2] = 1.0;
        assert!((ratio_by_batch(&stalled, 1e6, &base) - 1.0 / 3.0).abs() < 1e-9);
        // A stall in the baseline likewise.
        let mut slow_base = base.clone();
        slow_base[1].0 = 1.0;
        assert!((ratio_by_batch(&calls, 1e6, &slow_base) - 1.0 / 3.0).abs() < 1e-9);
        // Bytes count: a baseline that moved twice the bytes in the same
        // time is twice as fast.
        let double = vec![(1e-3, 2e6); 4];
        assert!((ratio_by_batch(&calls, 1e6, &double) - 1.0 / 6.0).abs() < 1e-9);
        // No baseline (ranks other than 0), or times that do not fit it: 0.
        assert_eq!(ratio_by_batch(&calls, 1e6, &[]), 0.0);
        assert_eq!(ratio_by_batch(&calls[..7], 1e6, &base), 0.0);
    }
}
