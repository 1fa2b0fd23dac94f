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
use wholemem::{AllocRequest, Location, WholeMemory};
use wm_comm::{CommExt, Communicator, ExchangePlan};
use wm_gather::{DType, Ids, RowLayout};

use crate::baseline::{Baseline, one_machine, ratio_by_batch, step, wall_seconds};
use crate::ids::IdDist;
use crate::moves::{BaselineRanks, DEFAULT_TABLE_BYTES, batch_ids};
pub use crate::moves::{MoveArgs, Op};
use crate::ranks::Started;
use crate::report::{self, Speeds, Spread};
use crate::shape::IdType;
use crate::values;

/// Runs `wm-bench gather` or `wm-bench scatter`: starts `--ranks` local
/// ranks when no launcher did, then benchmarks. Returns the exit code (3
/// when verification failed).
///
/// # Errors
/// Bad options, an unsupported type or location, a failed move, a lost peer.
pub fn start(op: Op, a: &MoveArgs) -> Result<i32> {
    ensure!(a.shape.dim > 0 && a.batches.batch > 0 && a.batches.iters > 0, "--dim, --batch and --iters must be positive");
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

/// The benchmark proper, on every rank: set up, the batches, the scattered
/// rows read back, every rank's figures gathered, rank 0's report.
///
/// # Errors
/// An unsupported type or location, a failed move, a lost peer.
pub fn bench(op: Op, world: &Arc<dyn Communicator>, a: &MoveArgs) -> Result<i32> {
    if a.cache_ratio.is_some() || a.embedding {
        return crate::cached::bench(world, a);
    }
    let mut run = Run::set_up(op, world, a)?;
    let mut timings = run.batches(world.as_ref())?;
    if op == Op::Scatter {
        timings.wrong += run.wrong_scattered(world.as_ref(), &timings.scattered)?;
    }
    let figures = run.finish(world.as_ref(), &timings)?;
    let verified = figures.wrong_total == 0.0;
    if world.rank() == 0 {
        // Under MPI the rows between nodes travel through MPI's own
        // connections, whose congestion control is the host's.
        let tcp_congestion = wm_comm::tcp::in_use().filter(|_| world.backend() == "socket");
        if a.json {
            figures.print_json(op, a, tcp_congestion);
        } else {
            figures.print_text(op, a, tcp_congestion);
        }
    }
    Ok(if verified { 0 } else { 3 })
}

/// One rank's table, buffers and baselines for a run of `wm-bench gather`
/// or `scatter`.
struct Run<'a> {
    op: Op,
    a: &'a MoveArgs,
    rows: usize,
    /// The local buffer's element type.
    out_dt: DType,
    /// Bytes of one row of the local buffer.
    buf_row: usize,
    mem: WholeMemory,
    layout: RowLayout,
    /// Of the table this rank maps, as a fraction, after filling it.
    huge_pages: f64,
    /// The local buffer of a batch.
    buf: Vec<u8>,
    /// One row as it should be.
    expect: Vec<u8>,
    /// `--baseline-ranks all`: every rank runs the baseline at once.
    all_base: bool,
    base: Option<Baseline>,
    #[cfg(feature = "cuda")]
    gpu: Option<DeviceRun>,
}

/// What the batches measured on one rank.
#[derive(Default)]
struct Timings {
    /// Seconds of the timed calls.
    seconds: f64,
    /// With every rank on the baseline: both timed as steps, from when the
    /// last rank was ready to when the last rank was done.
    step_seconds: f64,
    step_base_seconds: f64,
    /// Each timed batch's call time (its step with every rank on the
    /// baseline), and the baseline's steps, for the ratio batch by batch.
    call_times: Vec<f64>,
    base_steps: Vec<f64>,
    /// Rows that came out wrong.
    wrong: u64,
    /// The last batch's ids (scatter: read back afterwards).
    scattered: Vec<i64>,
}

impl<'a> Run<'a> {
    /// Allocates and fills the table, then the baseline's private table and
    /// the device buffers. Collective.
    fn set_up(op: Op, world: &Arc<dyn Communicator>, a: &'a MoveArgs) -> Result<Self> {
        let (me, n) = (world.rank(), world.size());
        let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
        let row_bytes = a.shape.row_bytes();
        let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
        if a.batches.ids == IdType::I32 && rows > i32::MAX as usize {
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
        let buf = vec![0u8; a.batches.batch * buf_row];
        let expect = vec![0u8; buf_row];
        // A run into device memory has a copy to the GPU as its baseline: no
        // private host table needed. With every rank on the baseline, each
        // copies on (or to) its own GPU at once: ranks sharing a GPU share it
        // in the baseline too.
        let host_rows = if a.device_out() { 0 } else { rows };
        let all_base = a.baseline_ranks == BaselineRanks::All;
        let base = if me == 0 || all_base { Some(Baseline::new(op, a, host_rows, out_dt)) } else { None };
        #[cfg(feature = "cuda")]
        let gpu = if a.device_out() { Some(DeviceRun::new(&mem, a.batches.batch * buf_row, me == 0 || all_base)?) } else { None };
        if all_base {
            one_machine(world.as_ref())?;
        }
        Ok(Self {
            op,
            a,
            rows,
            out_dt,
            buf_row,
            mem,
            layout,
            huge_pages,
            buf,
            expect,
            all_base,
            base,
            #[cfg(feature = "cuda")]
            gpu,
        })
    }

    /// The warm-up and timed batches: each one moved, checked (gather) and
    /// moved again by the baseline. Collective.
    fn batches(&mut self, world: &dyn Communicator) -> Result<Timings> {
        let a = self.a;
        let me = world.rank();
        let progress = me == 0 && std::io::stderr().is_terminal();
        let mut t = Timings::default();
        world.barrier()?;
        for b in 0..a.batches.warmup + a.batches.iters {
            let timed = b >= a.batches.warmup;
            if a.profile && b == a.batches.warmup {
                wm_gather::profile::record();
            }
            let ids = batch_ids(a, self.rows, me, b);
            let narrow: Vec<i32> = if a.batches.ids == IdType::I32 { ids.iter().map(|&x| x as i32).collect() } else { Vec::new() };
            let id_arg = if a.batches.ids == IdType::I32 { Ids::I32(&narrow) } else { Ids::I64(&ids) };
            if self.op == Op::Scatter {
                self.fill_scattered(&ids);
            }
            let ready = wall_seconds();
            world.barrier()?;
            let dt = self.call(id_arg)?;
            if timed {
                t.seconds += dt;
                if self.all_base {
                    let st = step(world, ready, wall_seconds())?;
                    t.step_seconds += st;
                    t.call_times.push(st);
                } else {
                    t.call_times.push(dt);
                }
            }
            match self.op {
                Op::Gather => t.wrong += self.wrong_gathered(&ids),
                Op::Scatter if b + 1 == a.batches.warmup + a.batches.iters => t.scattered = ids.clone(),
                Op::Scatter => {}
            }
            // The baseline's batch: by rank 0 alone, or by every rank at once
            // (`--baseline-ranks all`), each its own batch.
            let ready = wall_seconds();
            world.barrier()?;
            self.baseline_batch(&ids, timed)?;
            if self.all_base && timed {
                let st = step(world, ready, wall_seconds())?;
                t.step_base_seconds += st;
                t.base_steps.push(st);
            }
            if progress {
                eprint!("\r{} batch {}/{}", self.op.name(), b + 1, a.batches.warmup + a.batches.iters);
            }
        }
        if progress {
            eprintln!();
        }
        Ok(t)
    }

    /// Every rank writes the same function of (row, column), so rows
    /// written by several ranks are the same whoever wins.
    fn fill_scattered(&mut self, ids: &[i64]) {
        let (a, buf_row) = (self.a, self.buf_row);
        for (i, &id) in ids.iter().enumerate() {
            let row = id as usize + self.rows;
            values::row(row, a.shape.dim, a.shape.dtype, self.out_dt, &mut self.buf[i * buf_row..][..buf_row]);
        }
    }

    /// One call of the move under test. Seconds.
    fn call(&mut self, ids: Ids<'_>) -> Result<f64> {
        let out_dt = self.out_dt;
        Ok(match self.op {
            #[cfg(feature = "cuda")]
            Op::Gather if self.gpu.is_some() => {
                self.gpu.as_mut().expect("checked").gather(&self.mem, &self.layout, ids, &mut self.buf, out_dt)?
            }
            Op::Gather => {
                let t0 = Instant::now();
                wm_gather::gather(&self.mem, &self.layout, ids, &mut self.buf, out_dt)?;
                t0.elapsed().as_secs_f64()
            }
            #[cfg(feature = "cuda")]
            Op::Scatter if self.gpu.is_some() => {
                self.gpu.as_mut().expect("checked").scatter(&mut self.mem, &self.layout, ids, &self.buf, out_dt)?
            }
            Op::Scatter => {
                let t0 = Instant::now();
                wm_gather::scatter(&mut self.mem, &self.layout, ids, &self.buf, out_dt)?;
                t0.elapsed().as_secs_f64()
            }
        })
    }

    /// The gathered rows of `ids` in the buffer that are not what the table
    /// holds.
    fn wrong_gathered(&mut self, ids: &[i64]) -> u64 {
        let (a, buf_row) = (self.a, self.buf_row);
        let mut wrong = 0;
        for (i, &id) in ids.iter().enumerate() {
            values::row(id as usize, a.shape.dim, a.shape.dtype, self.out_dt, &mut self.expect);
            wrong += u64::from(self.buf[i * buf_row..][..buf_row] != self.expect[..]);
        }
        wrong
    }

    /// The baseline's move of the same batch, where this rank runs one.
    fn baseline_batch(&mut self, ids: &[i64], timed: bool) -> Result<()> {
        if let Some(base) = &mut self.base {
            #[cfg(feature = "cuda")]
            if let Some(g) = &mut self.gpu {
                g.baseline_batch(base, &self.mem, timed)?;
            } else {
                base.batch(ids, timed);
            }
            #[cfg(not(feature = "cuda"))]
            base.batch(ids, timed);
        }
        Ok(())
    }

    /// Reads back the last batch's rows (`scattered`): each must hold the
    /// scattered value. The rows that do not. Collective.
    fn wrong_scattered(&mut self, world: &dyn Communicator, scattered: &[i64]) -> Result<u64> {
        let (a, out_dt) = (self.a, self.out_dt);
        let (dim, dtype, row_bytes) = (a.shape.dim, a.shape.dtype, a.shape.row_bytes());
        world.barrier()?;
        let mut back = vec![0u8; scattered.len() * row_bytes];
        wm_gather::gather(&self.mem, &self.layout, Ids::I64(scattered), &mut back, dtype)?;
        let mut stored = vec![0u8; row_bytes];
        let mut wrong = 0;
        for (i, &id) in scattered.iter().enumerate() {
            values::row(id as usize + self.rows, dim, dtype, out_dt, &mut self.expect);
            // What the table holds after converting the buffer's row back.
            for c in 0..dim {
                let v = out_dt.read_f64(&self.expect[c * out_dt.size()..][..out_dt.size()]);
                dtype.write_f64(&mut stored[c * dtype.size()..][..dtype.size()], v);
            }
            wrong += u64::from(back[i * row_bytes..][..row_bytes] != stored[..]);
        }
        Ok(wrong)
    }

    /// Gathers every rank's figures and frees the table. Collective.
    fn finish(self, world: &dyn Communicator, t: &Timings) -> Result<Figures> {
        let a = self.a;
        let n = world.size();
        let phases = if a.profile { Some(report::Phases::gather(world, &wm_gather::profile::take())?) } else { None };
        let wire = if a.location == Location::Host && !a.device_out() { Wire::measure(world, a, self.buf_row)? } else { None };
        let bytes = (a.batches.iters * a.batches.batch * self.buf_row) as f64;
        let stats = world.allgather_pod(&[bytes / t.seconds.max(1e-12) / 1e9, t.seconds, t.wrong as f64])?;
        let (per_step, baseline) = if self.all_base {
            (Some(bytes / t.step_seconds.max(1e-12) / 1e9), bytes / t.step_base_seconds.max(1e-12) / 1e9)
        } else {
            (None, self.base.as_ref().map_or(0.0, Baseline::gbps))
        };
        let baseline_huge = self.base.as_ref().map_or(0.0, Baseline::huge_fraction);
        // Every rank's call times, batch after batch (rank-major).
        let all_calls = world.allgather_pod(&t.call_times)?;
        let batch_bytes = (a.batches.batch * self.buf_row) as f64;
        let base_batches: Vec<(f64, f64)> = if self.all_base {
            t.base_steps.iter().map(|&s| (s, batch_bytes)).collect()
        } else {
            self.base.as_ref().map_or_else(Vec::new, |b| b.batches().to_vec())
        };
        let ratio_batches = ratio_by_batch(&all_calls, batch_bytes, &base_batches);
        // Each rank's median time of one call, in microseconds (the figure to
        // set beside a binding's own per-call time).
        let medians: Vec<f64> = all_calls.chunks(t.call_times.len().max(1)).map(|c| Spread::of(c).median * 1e6).collect();
        let us_per_call = (!t.call_times.is_empty()).then(|| Spread::of(&medians));
        let Self { mem, base, rows, out_dt, buf_row, huge_pages, all_base, .. } = self;
        drop(base);
        #[cfg(feature = "cuda")]
        drop(self.gpu);
        let nodes = wm_topology::NodeLayout::of(world.nodes()).nodes;
        // Whether the GPU read this rank's host rows in place, or why not.
        #[cfg(feature = "cuda")]
        let registration = mem.host_registration().err().map(str::to_owned);
        #[cfg(not(feature = "cuda"))]
        let registration: Option<String> = None;
        mem.free()?;
        let wrong_total: f64 = stats.chunks(3).map(|s| s[2]).sum();
        let per_rank = Spread::of(&stats.chunks(3).map(|s| s[0]).collect::<Vec<_>>());
        let slowest = stats.chunks(3).map(|s| s[1]).fold(0.0f64, f64::max);
        let total = bytes * n as f64 / slowest.max(1e-12) / 1e9;
        // With every rank running the baseline, the steps compare: what
        // a rank gets when the machine's cores are shared the same way.
        let ratio = per_step.unwrap_or(per_rank.median) / baseline;
        Ok(Figures {
            speeds: Speeds { per_rank, total, baseline, ratio },
            ranks: n,
            nodes,
            rows,
            out_dt,
            buf_row,
            all_base,
            per_step,
            ratio_batches,
            us_per_call,
            huge_pages,
            baseline_huge,
            registration,
            phases,
            wire,
            wrong_total,
        })
    }
}

/// Every rank's figures of a run, gathered: what rank 0 reports.
struct Figures {
    speeds: Speeds,
    ranks: usize,
    nodes: usize,
    rows: usize,
    out_dt: DType,
    buf_row: usize,
    all_base: bool,
    /// GB/s per rank of a step, with every rank on the baseline.
    per_step: Option<f64>,
    ratio_batches: f64,
    /// Each rank's median microseconds of one call.
    us_per_call: Option<Spread>,
    huge_pages: f64,
    baseline_huge: f64,
    /// Why the GPU could not read rank 0's host rows in place, if it could
    /// not.
    registration: Option<String>,
    phases: Option<report::Phases>,
    wire: Option<Wire>,
    wrong_total: f64,
}

impl Figures {
    /// The report as one JSON line.
    fn print_json(&self, op: Op, a: &MoveArgs, tcp_congestion: Option<&str>) {
        let (s, n) = (self.speeds.per_rank, self.ranks);
        let mut j = serde_json::json!({
            "op": op.name(), "type": a.ty.name(), "location": a.location.name(),
            "out_location": if a.device_out() { "device" } else { "host" }, "ranks": n, "nodes": self.nodes,
            "rows": self.rows, "dim": a.shape.dim, "dtype": a.shape.dtype.name(), "out_dtype": self.out_dt.name(),
            "ids": if a.batches.ids == IdType::I32 { "i32" } else { "i64" }, "batch": a.batches.batch, "iters": a.batches.iters,
            "gbps_per_rank": s, "gbps_total": self.speeds.total, "baseline_gbps": self.speeds.baseline, "ratio": self.speeds.ratio,
            "ratio_batches": self.ratio_batches, "verified": self.wrong_total == 0.0,
            "huge_pages": self.huge_pages, "baseline_huge_pages": self.baseline_huge,
            "baseline_ranks": if self.all_base { "all" } else { "one" },
            "us_per_call": self.us_per_call,
        });
        if let Some(g) = self.per_step {
            // The all-ranks figures of both steps (every rank ran both).
            j["step_gbps_per_rank"] = serde_json::json!(g);
            j["step_gbps_total"] = serde_json::json!(g * n as f64);
            j["baseline_gbps_total"] = serde_json::json!(self.speeds.baseline * n as f64);
        }
        if a.location == Location::Host && a.device_out() {
            j["host_registration"] = serde_json::json!(self.registration.as_deref().unwrap_or("registered"));
        }
        if let Some(p) = &self.phases {
            j["profile"] = p.json();
        }
        if let Some(w) = &self.wire {
            j["wire_gbps_per_rank"] = serde_json::json!(w.per_rank);
            j["wire_share"] = serde_json::json!(w.share(a.batches.batch * self.buf_row, s.median));
        }
        if let Some(cc) = tcp_congestion {
            j["tcp_congestion"] = serde_json::json!(cc);
        }
        report::json_line(&j);
    }

    /// The report as text.
    fn print_text(&self, op: Op, a: &MoveArgs, tcp_congestion: Option<&str>) {
        let (n, rows, all_base) = (self.ranks, self.rows, self.all_base);
        println!(
            "{} {} {} memory: {n} ranks on {} node(s), {rows} rows x {} {} ({:.2} GiB), batches of {} ids -> {}, {} timed",
            op.name(),
            a.location,
            a.ty,
            self.nodes,
            a.shape.dim,
            a.shape.dtype,
            (rows * a.shape.row_bytes()) as f64 / (1u64 << 30) as f64,
            a.batches.batch,
            self.out_dt,
            a.batches.iters
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
        self.speeds.print(what, if all_base { "per rank of a step / baseline" } else { "per-rank median / baseline" });
        report::print_step(self.per_step, n, self.speeds.baseline);
        report::print_ratio_by_batch(self.ratio_batches);
        if a.location == Location::Host && a.device_out() {
            let how =
                self.registration.as_deref().map_or_else(|| "registered with CUDA, read in place".to_owned(), |why| format!("none: {why}"));
            println!("  registration    {how} (rank 0's host rows)");
        }
        println!(
            "  huge pages      {:.0}% of the table rank 0 maps, {:.0}% of the baseline's",
            self.huge_pages * 100.0,
            self.baseline_huge * 100.0
        );
        if let Some(w) = &self.wire {
            println!(
                "  wire GB/s       {:.2}   per rank (median): {:.1} MiB a call from other nodes through the same exchange, no row copied",
                w.per_rank.median,
                w.cross_bytes as f64 / (1u64 << 20) as f64
            );
            println!(
                "  wire share      {:.2}   of a call's time, the bare exchange's",
                w.share(a.batches.batch * self.buf_row, self.speeds.per_rank.median)
            );
        }
        if let Some(cc) = tcp_congestion {
            println!("  TCP             {cc} congestion control between nodes (WM_TCP_CONGESTION)");
        }
        report::print_verified(self.wrong_total);
        if let Some(p) = &self.phases {
            p.print();
        }
    }
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
        let per_peer = a.batches.batch * out_row / n;
        let sizes: Vec<usize> = (0..n).map(|r| if placement.node[r] == placement.node[me] { 0 } else { per_peer }).collect();
        let cross_bytes: usize = sizes.iter().sum();
        let mut seconds = 0.0f64;
        for b in 0..a.batches.warmup + a.batches.iters {
            world.barrier()?;
            let t0 = Instant::now();
            world.exchange(ExchangePlan::new(&sizes, &mut |_, _| {}))?;
            if b >= a.batches.warmup {
                seconds += t0.elapsed().as_secs_f64();
            }
        }
        let mine = (cross_bytes * a.batches.iters) as f64 / seconds.max(1e-12) / 1e9;
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

    /// The device baseline: one device-to-device copy of a batch's output
    /// bytes on this rank's GPU, added to `base` when `timed`.
    fn baseline_batch(&mut self, base: &mut Baseline, mem: &WholeMemory, timed: bool) -> Result<()> {
        let (dt, bytes) = self.copy(mem)?;
        if timed {
            base.add(dt, bytes as f64);
        }
        Ok(())
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
