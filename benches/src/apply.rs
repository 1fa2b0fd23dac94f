//! `wm-bench apply`: `Embedding::apply_gradients` with SGD on random ids,
//! timed per call, beside plain code doing the same updates.
//!
//! Every rank draws its batches as `wm-bench gather` does (`--id-dist`,
//! `--seed`), with gradient 1 for every element and learning rate 1, on a
//! table that starts at 0: afterwards a row holds minus the number of
//! times any rank named it in a timed or warm-up batch — an exact integer
//! in f32 — which every rank checks for the ids of its last batch, so the
//! figure is of updates that were all applied once. The baseline: rank 0
//! alone (or with `--baseline-ranks all` every rank at once, both then
//! timed as steps, as in `wm-bench gather`) applies its own batches, one
//! row at a time (read, subtract, write), to a private table of the same
//! shape, single-threaded. Bytes are those of the gradients a rank passes.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, ensure};
use wholemem::{Location, WholeTensor};
use wm_comm::{CommExt, Communicator};
use wm_embedding::{Embedding, Optimizer};

use crate::baseline::{one_machine, ratio_by_batch, step, wall_seconds};
use crate::moves::{BaselinePages, BaselineRanks, DEFAULT_TABLE_BYTES, MoveArgs, batch_ids};
use crate::ranks::Started;
use crate::report::{self, Speeds, Spread};
use crate::shape::IdType;

/// Runs `wm-bench apply`: starts `--ranks` local ranks when no launcher
/// did, then benchmarks. Returns the exit code (3 when verification
/// failed).
///
/// # Errors
/// Bad options, an unsupported type, a failed step, a lost peer.
pub fn start(a: &MoveArgs) -> Result<i32> {
    ensure!(a.shape.dim > 0 && a.batches.batch > 0 && a.batches.iters > 0, "--dim, --batch and --iters must be positive");
    ensure!(a.location == Location::Host, "wm-bench apply measures host tables (--location host)");
    ensure!(a.shape.dtype == wholemem::DType::F32, "wm-bench apply measures f32 tables (--dtype f32), got {}", a.shape.dtype);
    ensure!(
        a.cache_ratio.is_none() && !a.embedding && a.out_dtype.is_none() && a.out_location.is_none(),
        "--cache-ratio, --embedding, --out-dtype and --out-location apply to gather and scatter, not to apply"
    );
    ensure!(a.batches.ids == IdType::I64, "wm-bench apply passes i64 ids (apply_gradients takes i64), got --ids i32");
    ensure!(
        a.baseline_pages == BaselinePages::Default,
        "wm-bench apply's baseline table has the pages plain code gets (--baseline-pages default), got --baseline-pages huge"
    );
    match a.ranks.start()? {
        Started::Launched(code) => Ok(code),
        Started::Rank(world) => bench(&world, a),
    }
}

fn bench(world: &Arc<dyn Communicator>, a: &MoveArgs) -> Result<i32> {
    let (me, n) = (world.rank(), world.size());
    let dim = a.shape.dim;
    let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
    if let Some(reason) = wholemem::query(world.as_ref(), a.ty, a.location).reason() {
        anyhow::bail!("{} {} memory on {n} ranks: {reason}", a.location, a.ty);
    }
    let mut emb = Embedding::<f32>::allocate(world, a.ty, a.location, rows, dim, None, Some(Optimizer::sgd()))?;
    zero(emb.table_mut(), dim)?;
    world.barrier()?;
    let all_base = a.baseline_ranks == BaselineRanks::All;
    if all_base {
        one_machine(world.as_ref())?;
    }
    // Written once, so its pages exist before the timing (as the table's
    // do).
    let mut base = (me == 0 || all_base).then(|| {
        let mut t = vec![1f32; rows * dim];
        t.fill(0.0);
        std::hint::black_box(t)
    });
    let t = batches(world.as_ref(), a, &mut emb, base.as_deref_mut(), rows)?;
    let phases = if a.profile { Some(report::Phases::gather(world.as_ref(), &wm_gather::profile::take())?) } else { None };
    let wrong = wrong_rows(a, n, rows, &emb, &t.last)?;
    let bytes = (a.batches.iters * a.batches.batch * dim * 4) as f64;
    let stats = world.allgather_pod(&[bytes / t.seconds.max(1e-12) / 1e9, t.seconds, wrong as f64])?;
    let all_calls = world.allgather_pod(&t.call_times)?;
    let nodes = wm_topology::NodeLayout::of(world.nodes()).nodes;
    emb.free()?;
    if me != 0 {
        return Ok(if stats.chunks(3).all(|s| s[2] == 0.0) { 0 } else { 3 });
    }
    let per_rank: Vec<f64> = stats.chunks(3).map(|s| s[0]).collect();
    let slowest = stats.chunks(3).map(|s| s[1]).fold(0.0f64, f64::max);
    let wrong_total: f64 = stats.chunks(3).map(|s| s[2]).sum();
    let s = Spread::of(&per_rank);
    let total = bytes * n as f64 / slowest.max(1e-12) / 1e9;
    // With every rank running the baseline, the steps compare: what a rank
    // moves per step of the benchmark against per step of the baseline.
    let (per_step, baseline) = if all_base {
        (Some(bytes / t.step_seconds.max(1e-12) / 1e9), bytes / t.step_base_seconds.max(1e-12) / 1e9)
    } else {
        (None, bytes / t.base_seconds.max(1e-12) / 1e9)
    };
    let ratio = per_step.unwrap_or(s.median) / baseline;
    let ratio_batches = ratio_by_batch(&all_calls, (a.batches.batch * dim * 4) as f64, &t.base_times);
    let shown = Shown { a, ranks: n, nodes, rows, per_step, ratio_batches, phases, wrong_total };
    if a.json {
        shown.print_json(&Speeds { per_rank: s, total, baseline, ratio });
    } else {
        shown.print_text(&Speeds { per_rank: s, total, baseline, ratio });
    }
    Ok(if wrong_total == 0.0 { 0 } else { 3 })
}

/// What the batches measured on one rank.
#[derive(Default)]
struct Timings {
    /// Seconds of the timed calls and of this rank's baseline batches.
    seconds: f64,
    base_seconds: f64,
    /// With every rank running the baseline: both timed as steps, from when
    /// the last rank was ready to when the last rank was done.
    step_seconds: f64,
    step_base_seconds: f64,
    /// Each timed batch's call and baseline times (steps with every rank on
    /// the baseline), for the ratio batch by batch.
    call_times: Vec<f64>,
    base_times: Vec<(f64, f64)>,
    /// The last batch's ids.
    last: Vec<i64>,
}

/// The warm-up and timed batches: each applied to the table, then to the
/// private table `base` where this rank runs the baseline. Collective.
fn batches(world: &dyn Communicator, a: &MoveArgs, emb: &mut Embedding<f32>, mut base: Option<&mut [f32]>, rows: usize) -> Result<Timings> {
    let (me, dim) = (world.rank(), a.shape.dim);
    let grads = vec![1f32; a.batches.batch * dim];
    let all_base = a.baseline_ranks == BaselineRanks::All;
    let batch_bytes = (a.batches.batch * dim * 4) as f64;
    let mut t = Timings::default();
    for b in 0..a.batches.warmup + a.batches.iters {
        if a.profile && b == a.batches.warmup {
            wm_gather::profile::record();
        }
        let ids = batch_ids(a, rows, me, b);
        let ready = wall_seconds();
        world.barrier()?;
        let t0 = Instant::now();
        emb.apply_gradients(&ids, &grads, 1.0)?;
        let dt = t0.elapsed().as_secs_f64();
        if all_base && b >= a.batches.warmup {
            let st = step(world, ready, wall_seconds())?;
            t.step_seconds += st;
            t.call_times.push(st);
        } else if b >= a.batches.warmup {
            t.call_times.push(dt);
        }
        let ready = wall_seconds();
        world.barrier()?;
        if let Some(table) = base.as_deref_mut() {
            let t0 = Instant::now();
            for &id in &ids {
                for v in &mut table[id as usize * dim..][..dim] {
                    *v -= 1.0;
                }
            }
            if b >= a.batches.warmup {
                let bt = t0.elapsed().as_secs_f64();
                t.base_seconds += bt;
                if !all_base {
                    t.base_times.push((bt, batch_bytes));
                }
            }
        }
        if all_base && b >= a.batches.warmup {
            let st = step(world, ready, wall_seconds())?;
            t.step_base_seconds += st;
            t.base_times.push((st, batch_bytes));
        }
        if b >= a.batches.warmup {
            t.seconds += dt;
        }
        if b + 1 == a.batches.warmup + a.batches.iters {
            t.last = ids;
        }
    }
    Ok(t)
}

/// Rows of the last batch (`last`) that do not hold minus the number of
/// times any of the `n` ranks named them in any batch.
fn wrong_rows(a: &MoveArgs, n: usize, rows: usize, emb: &Embedding<f32>, last: &[i64]) -> Result<usize> {
    let dim = a.shape.dim;
    let mut named = std::collections::HashMap::<i64, u32>::new();
    for r in 0..n {
        for b in 0..a.batches.warmup + a.batches.iters {
            for id in batch_ids(a, rows, r, b) {
                *named.entry(id).or_default() += 1;
            }
        }
    }
    let mut held = vec![0f32; last.len() * dim];
    emb.gather(last, &mut held)?;
    Ok(last
        .iter()
        .zip(held.chunks_exact(dim))
        .filter(|(id, row)| {
            let want = -(named.get(id).copied().unwrap_or(0) as f32);
            row.iter().any(|&v| v != want)
        })
        .count())
}

/// What rank 0 reports beside the speeds.
struct Shown<'a> {
    a: &'a MoveArgs,
    ranks: usize,
    nodes: usize,
    rows: usize,
    /// GB/s per rank of a step, with every rank on the baseline.
    per_step: Option<f64>,
    ratio_batches: f64,
    phases: Option<report::Phases>,
    wrong_total: f64,
}

impl Shown<'_> {
    /// The report as one JSON line.
    fn print_json(&self, sp: &Speeds) {
        let (a, n) = (self.a, self.ranks);
        let all_base = a.baseline_ranks == BaselineRanks::All;
        let mut j = serde_json::json!({
            "op": "apply", "optimizer": "sgd", "type": a.ty.name(), "ranks": n, "nodes": self.nodes, "rows": self.rows,
            "dim": a.shape.dim, "batch": a.batches.batch, "iters": a.batches.iters, "gbps_per_rank": sp.per_rank, "gbps_total": sp.total,
            "baseline_gbps": sp.baseline, "baseline_ranks": if all_base { "all" } else { "one" }, "ratio": sp.ratio,
            "ratio_batches": self.ratio_batches, "verified": self.wrong_total == 0.0,
        });
        if let Some(g) = self.per_step {
            j["step_gbps_per_rank"] = serde_json::json!(g);
            j["step_gbps_total"] = serde_json::json!(g * n as f64);
            j["baseline_gbps_total"] = serde_json::json!(sp.baseline * n as f64);
        }
        if let Some(p) = &self.phases {
            j["profile"] = p.json();
        }
        report::json_line(&j);
    }

    /// The report as text.
    fn print_text(&self, sp: &Speeds) {
        let (a, n) = (self.a, self.ranks);
        println!(
            "apply_gradients (SGD) on host {} memory: {n} ranks on {} node(s), {} rows x {} f32, batches of {} ids, {} timed",
            a.ty, self.nodes, self.rows, a.shape.dim, a.batches.batch, a.batches.iters
        );
        let (what, how) = if a.baseline_ranks == BaselineRanks::All {
            (
                "every rank at once, one thread each, private tables, row by row, per rank of a step",
                "per rank of a step / baseline, in gradient bytes",
            )
        } else {
            ("one process, one thread, private table, row by row", "per-rank median / baseline, in gradient bytes")
        };
        sp.print(what, how);
        report::print_step(self.per_step, n, sp.baseline);
        report::print_ratio_by_batch(self.ratio_batches);
        if let Some(p) = &self.phases {
            p.print();
        }
        report::print_verified(self.wrong_total);
    }
}

/// Sets this rank's rows of `t` to 0.
fn zero(t: &mut WholeTensor<f32>, dim: usize) -> Result<()> {
    let own = t.local_rows().len();
    t.write_local(&vec![0f32; own * dim])?;
    Ok(())
}
