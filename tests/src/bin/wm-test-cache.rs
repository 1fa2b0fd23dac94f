//! One rank of a multi-process cache scenario: `wm-test-cache SCENARIO`.
//! Started by `tests/tests/cache.rs` through the harness (or by hand under
//! `wm-run --node-size K`). Every check runs on every rank; the first wrong
//! result exits non-zero naming the rank, the case and what differed.
//!
//! Scenarios: `node` (the node cache of remote rows on every collective
//! type), `embedding` (an embedding with a node cache, trained), `bad-ratio`
//! (refusals on every rank), `coherence DIR` (writes by every path the
//! table offers, by a rank of another node, that nobody tells the cache
//! of), `all-or-nothing DIR` (every operation of many ids, with one bad
//! id, changes neither the table nor the cache), `reused-table` (a cache
//! refuses a table allocated where a freed one was), `generations DIR`
//! (every write path moves the write generations of exactly the ranks whose
//! rows it wrote), `preload DIR` (a cache filled before its first gather
//! serves the rows it was given, fresh after an untold write, and a bad id
//! on one rank changes nothing), `device` (an
//! embedding with a device cache of its host rows, trained beside one
//! without: on a GPU only; elsewhere it prints why it skips, and fails
//! under `WM_REQUIRE_GPU=1`). `DIR` is a scratch directory for files.
//!
//! The node cache is checked two ways after every cached gather: against
//! an uncached gather of the same ids (byte for byte), and against this
//! program's own model of the table (each row's value is a function of
//! row, column and the row's version, and every rank knows every write's
//! rows and version, so every rank knows what every row holds).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use half::bf16;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory, query};
use wm_comm::{CommExt, Communicator};
use wm_embedding::{Embedding, EmbeddingElement, Init, Optimizer};
use wm_gather::cache::{Bypass, CacheStats, NodeCache};
use wm_gather::{DType, Ids, RowLayout};
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| match scenario {
        "node" => node_cache(world),
        "embedding" => embedding(world),
        "bad-ratio" => bad_ratio(world),
        "coherence" => scratch(rest).and_then(|dir| coherence(world, &dir)),
        "all-or-nothing" => scratch(rest).and_then(|dir| all_or_nothing(world, &dir)),
        "reused-table" => reused_table(world),
        "preload" => scratch(rest).and_then(|dir| preload(world, &dir)),
        "generations" => scratch(rest).and_then(|dir| write_generations(world, &dir)),
        "device" => device(world),
        other => bail!("unknown scenario {other:?}"),
    });
}

/// The scratch directory a scenario writes files to (its second argument).
fn scratch(rest: &[String]) -> Result<PathBuf> {
    rest.first().map(PathBuf::from).context("usage: wm-test-cache SCENARIO DIR")
}

fn nodes(world: &Comm) -> usize {
    wm_topology::NodeLayout::of(world.nodes()).nodes
}

/// Distributed and hierarchy, where this world supports them (printing why
/// not otherwise).
fn collective_types(world: &Comm) -> Vec<MemoryType> {
    let mut v = Vec::new();
    for ty in [MemoryType::Distributed, MemoryType::Hierarchy] {
        match query(world.as_ref(), ty, Location::Host).reason() {
            Some(reason) => println!("skip host {ty}: {reason}"),
            None => v.push(ty),
        }
    }
    v
}

// ------------------------------------------------------------- the model

/// What row `row` holds in column `col` at `version`, before rounding to
/// the table's type: depends on all three.
fn value(row: usize, col: usize, version: u32) -> f32 {
    ((row * 7 + col * 3) % 509) as f32 * 0.25 - 40.0 + version as f32 * 1000.0
}

/// `v` stored as `dt` and read back as f32.
fn stored(dt: DType, v: f32) -> f32 {
    match dt {
        DType::F32 => v,
        DType::Bf16 => bf16::from_f32(v).to_f32(),
        other => unreachable!("the scenarios use f32 and bf16 tables, not {other}"),
    }
}

/// Elements of `v` as `dt` bytes.
fn encode(dt: DType, v: &[f32]) -> Vec<u8> {
    match dt {
        DType::F32 => bytemuck::cast_slice(v).to_vec(),
        DType::Bf16 => v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
        other => unreachable!("{other}"),
    }
}

/// Bytes of `dt` back to f32.
fn decode(dt: DType, b: &[u8]) -> Vec<f32> {
    match dt {
        DType::F32 => bytemuck::pod_collect_to_vec(b),
        DType::Bf16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        other => unreachable!("{other}"),
    }
}

/// Skewed ids for rank `rank` in round `round`: half from `hot`, the rest
/// anywhere; some ranks get none in some rounds.
fn batch(rows: usize, hot: &[usize], rank: usize, round: u64, world: usize) -> Vec<i64> {
    let mut rng = Rng::new(&[11, rank as u64, round, world as u64]);
    let n = if (round as usize + rank) % 5 == 3 { 0 } else { 50 + rng.below(250) as usize };
    (0..n)
        .map(|_| if rng.below(2) == 0 { hot[rng.below(hot.len() as u64) as usize] } else { rng.below(rows as u64) as usize } as i64)
        .collect()
}

/// A host f32 table of `ty`, `rows` x `cols`, holding the model's first
/// version of every row (written by its owner). Collective.
fn model_table(world: &Comm, ty: MemoryType, rows: usize, cols: usize) -> Result<WholeMemory> {
    let req = AllocRequest { ty, loc: Location::Host, total: rows * cols * 4, granularity: cols * 4, partition: None };
    let mut mem = WholeMemory::allocate(world, &req)?;
    let own = mem.local_rows();
    mem.write_rows(own.start, &model_rows(own.clone(), cols, &vec![0u32; rows]))?;
    world.barrier()?;
    Ok(mem)
}

/// A node cache of `ratio` of the rows of `mem` (f32 rows of `cols`) that
/// every call goes through, so that the checks count its hits.
fn checked_cache(mem: &WholeMemory, cols: usize, ratio: f64) -> Result<NodeCache> {
    let layout = RowLayout::new(DType::F32, cols, 0)?;
    let mut cache = NodeCache::new(mem, &layout, ratio)?;
    cache.set_bypass(Bypass::Off);
    Ok(cache)
}

/// The rows rank `rank` writes in round `round`: its share of the hot rows
/// and a few others, never a row another rank writes in the same round.
fn writes(rows: usize, hot: &[usize], rank: usize, round: u64, world: usize) -> Vec<i64> {
    let mut rng = Rng::new(&[13, rank as u64, round]);
    let mut v: Vec<usize> = hot.iter().copied().filter(|&r| r % world == rank).collect();
    v.extend((0..20).map(|_| rng.below(rows as u64) as usize).filter(|&r| r % world == rank));
    v.iter().map(|&r| r as i64).collect()
}

/// A random partition of `rows` over `n` ranks (the same on every rank),
/// one rank without rows.
fn random_partition(n: usize, rows: usize) -> Vec<usize> {
    let mut prng = Rng::new(&[7, n as u64, rows as u64]);
    let mut counts: Vec<usize> = (0..n).map(|_| 1 + prng.below(3) as usize).collect();
    counts[n / 2] = 0;
    let sum: usize = counts.iter().sum();
    let mut partition: Vec<usize> = counts.iter().map(|c| c * rows / sum).collect();
    let given: usize = partition.iter().sum();
    partition[0] += rows - given;
    partition
}

/// What a node-cache case knows besides its table and cache: its shape,
/// the cached columns, the hot rows and each row's version (the model).
struct NodeModel {
    case: String,
    rows: usize,
    cols: usize,
    dt: DType,
    /// The cached columns: `width` of them from `first`.
    first: usize,
    width: usize,
    /// Whether the cache holds a column slice.
    sliced: bool,
    layout: RowLayout,
    hot: Vec<usize>,
    /// The round that last wrote each row (0: the initial values).
    version: Vec<u32>,
}

/// One node-cache case: a table, a cache, rounds of gathers checked
/// against an uncached gather and the model, writes by every path.
fn node_case(world: &Comm, ty: MemoryType, dt: DType, ratio: f64, layout_cols: Option<(usize, usize)>) -> Result<()> {
    let n = world.size();
    let cols = 6;
    let rows = 1000 + 37 * n;
    let case = format!("{ty} {dt} ratio {ratio} layout {layout_cols:?}");
    let rb = cols * dt.size();
    let req = AllocRequest { ty, loc: Location::Host, total: rows * rb, granularity: rb, partition: Some(random_partition(n, rows)) };
    let mut mem = WholeMemory::allocate(world, &req).with_context(|| format!("allocating {case}"))?;
    let own = mem.local_rows();
    let init: Vec<f32> = own.clone().flat_map(|r| (0..cols).map(move |c| value(r, c, 0))).collect();
    mem.write_rows(own.start, &encode(dt, &init))?;
    world.barrier()?;

    let (first, width) = layout_cols.unwrap_or((0, cols));
    let layout = RowLayout::new(dt, width, first)?;
    let mut cache = NodeCache::new(&mem, &layout, ratio).with_context(|| format!("a node cache for {case}"))?;
    // Every call through the cache: the checks count its hits.
    cache.set_bypass(Bypass::Off);
    // Hot rows: the same on every rank.
    let mut hrng = Rng::new(&[17, rows as u64]);
    let hot: Vec<usize> = (0..24).map(|_| hrng.below(rows as u64) as usize).collect();
    let version = vec![0u32; rows];
    let mut m = NodeModel { case, rows, cols, dt, first, width, sliced: layout_cols.is_some(), layout, hot, version };
    for round in 0..12u64 {
        m.check_round(world, &mem, &mut cache, round)?;
        m.write_round(world, &mut mem, &mut cache, round)?;
    }
    m.check_stats(world, &mem, &mut cache, ratio)?;
    cache.free()?;
    mem.free()?;
    Ok(())
}

impl NodeModel {
    /// Round `round`'s batch through the cache: the same bytes as the
    /// uncached gather, and the values the model says.
    fn check_round(&self, world: &Comm, mem: &WholeMemory, cache: &mut NodeCache, round: u64) -> Result<()> {
        let (case, width, first) = (&self.case, self.width, self.first);
        let ids = batch(self.rows, &self.hot, world.rank(), round, world.size());
        let out_dt = if round % 3 == 2 { DType::Bf16 } else { DType::F32 };
        let narrow: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
        let id_arg = || if round % 2 == 0 { Ids::I32(&narrow) } else { Ids::I64(&ids) };
        let mut cached = vec![0u8; ids.len() * width * out_dt.size()];
        cache.gather(mem, id_arg(), &mut cached, out_dt).with_context(|| format!("{case}: cached gather, round {round}"))?;
        let mut plain = vec![0u8; cached.len()];
        wm_gather::gather(mem, &self.layout, id_arg(), &mut plain, out_dt)?;
        let out_row = width * out_dt.size();
        if cached != plain {
            let k = (0..ids.len()).find(|&k| cached[k * out_row..][..out_row] != plain[k * out_row..][..out_row]);
            bail!("{case}, round {round}: the cached gather differs from the uncached one first at id {:?}", k.map(|k| ids[k]));
        }
        let held = decode(out_dt, &cached);
        for (k, &id) in ids.iter().enumerate() {
            let row = id as usize;
            for c in 0..width {
                let want = stored(out_dt, stored(self.dt, value(row, first + c, self.version[row])));
                ensure!(
                    held[k * width + c] == want,
                    "{case}, round {round}: row {row} column {} holds {} instead of {want} (version {})",
                    first + c,
                    held[k * width + c],
                    self.version[row]
                );
            }
        }
        Ok(())
    }

    /// Round `round`'s writes, each path in turn, by every rank (ranks of
    /// every node), and the versions they leave.
    fn write_round(&mut self, world: &Comm, mem: &mut WholeMemory, cache: &mut NodeCache, round: u64) -> Result<()> {
        let (me, n) = (world.rank(), world.size());
        let (rows, cols, width, first) = (self.rows, self.cols, self.width, self.first);
        let v = round as u32 + 1;
        match round % 4 {
            1 | 2 => {
                let mine = writes(rows, &self.hot, me, round, n);
                let vals: Vec<f32> = mine.iter().flat_map(|&r| (0..width).map(move |c| value(r as usize, first + c, v))).collect();
                if round % 4 == 1 {
                    cache.scatter(mem, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                } else {
                    wm_gather::scatter(mem, &self.layout, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                    cache.invalidate(Ids::I64(&mine))?;
                }
                if self.sliced {
                    // Only the layout's columns changed: the model keeps
                    // whole rows, so the others are written alike here.
                    let whole = RowLayout::new(self.dt, cols, 0)?;
                    let vals: Vec<f32> = mine.iter().flat_map(|&r| (0..cols).map(move |c| value(r as usize, c, v))).collect();
                    wm_gather::scatter(mem, &whole, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                    cache.invalidate(Ids::I64(&mine))?;
                }
                for r in 0..n {
                    for row in writes(rows, &self.hot, r, round, n) {
                        self.version[row as usize] = v;
                    }
                }
            }
            3 => {
                // The last rank rewrites all its rows in place; every rank
                // then empties the cache.
                let last = n - 1;
                if me == last {
                    let vals: Vec<f32> = mem.local_rows().flat_map(|r| (0..cols).map(move |c| value(r, c, v))).collect();
                    mem.write_local(&encode(self.dt, &vals))?;
                }
                cache.clear()?;
                for row in mem.partition().range(last) {
                    self.version[row] = v;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The cache's statistics and size after the rounds, a second read of
    /// the hot rows hitting where every remote row has a slot, and the
    /// node's ranks agreeing about their cache.
    fn check_stats(&self, world: &Comm, mem: &WholeMemory, cache: &mut NodeCache, ratio: f64) -> Result<()> {
        let (case, rows, width) = (&self.case, self.rows, self.width);
        let s = cache.stats();
        ensure!(s.lookups > 0 && s.hits > 0 && s.hits <= s.lookups, "{case}: implausible statistics {s:?}");
        ensure!(s.writebacks == 0, "{case}: a read-only cache wrote back {s:?}");
        ensure!(cache.cached_rows() <= cache.capacity(), "{case}: {} rows held in {} slots", cache.cached_rows(), cache.capacity());
        // At least the slots asked for, at most one per remote row.
        let asked = ((ratio * rows as f64).ceil() as usize).min(cache.remote_rows());
        ensure!(
            (asked..=cache.remote_rows()).contains(&cache.capacity()),
            "{case}: {} slots for {asked} asked and {} remote rows",
            cache.capacity(),
            cache.remote_rows()
        );
        if ratio == 1.0 {
            // A cache larger than the remote part: a slot per row, nothing
            // ever evicted, and rows read twice hit the second time.
            ensure!(cache.capacity() == cache.remote_rows(), "{case}: {} slots for {} remote rows", cache.capacity(), cache.remote_rows());
            ensure!(s.evictions == 0, "{case}: a cache with a slot per row evicted {s:?}");
            let ids: Vec<i64> = self.hot.iter().map(|&h| h as i64).collect();
            let mut out = vec![0u8; ids.len() * width * 4];
            cache.gather(mem, Ids::I64(&ids), &mut out, DType::F32)?;
            let before = cache.stats();
            cache.gather(mem, Ids::I64(&ids), &mut out, DType::F32)?;
            let d = cache.stats().since(&before);
            ensure!(d.lookups > 0 && d.hits == d.lookups, "{case}: rows read twice missed the second time: {d:?}");
        }
        let s = cache.stats();
        // Fills and evictions are the node's: the same on every rank of it.
        let local = world.local();
        let node_stats = local.allgather_pod(&[s.fills, s.evictions, cache.cached_rows() as u64])?;
        ensure!(
            node_stats.chunks(3).all(|c| c == &node_stats[..3]),
            "{case}: the ranks of a node disagree about their cache: {node_stats:?}"
        );
        if world.rank() == 0 {
            println!(
                "case {case}: capacity {} of {} remote rows, lookups {} hits {} ({:.2}) fills {} evictions {}",
                cache.capacity(),
                cache.remote_rows(),
                s.lookups,
                s.hits,
                s.hit_rate(),
                s.fills,
                s.evictions
            );
        }
        Ok(())
    }
}

fn node_cache(world: &Comm) -> Result<()> {
    ensure!(nodes(world) >= 2, "the node-cache scenario needs ranks on several (simulated) nodes");
    for ty in collective_types(world) {
        for dt in [DType::F32, DType::Bf16] {
            for ratio in [0.01, 0.1, 0.5, 1.0] {
                node_case(world, ty, dt, ratio, None)?;
            }
        }
        // A cache of a column slice: 3 of the 6 columns, from column 2.
        node_case(world, ty, DType::F32, 0.1, Some((2, 3)))?;
    }
    Ok(())
}

// ------------------------------------------------------------- embeddings

/// The same gathers with and without the cache, through the embedding and
/// straight from its table: they must agree after every step of training
/// by every rank, after a loan of the table on one rank, and after `init`.
fn embedding_case<T: EmbeddingElement + FromF64>(world: &Comm, ty: MemoryType, ratio: f64) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, dim) = (900, 8);
    let case = format!("embedding {ty} {} ratio {ratio}", T::DTYPE);
    let mut emb = Embedding::<T>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::adam()))?;
    emb.init(Init::Normal { mean: 0.0, std: 0.1 }, 3)?;
    emb.enable_node_cache(ratio).with_context(|| case.clone())?;
    emb.set_node_cache_bypass(Bypass::Off);
    let layout = RowLayout::of(emb.table())?;
    let mut hrng = Rng::new(&[19, rows as u64]);
    let hot: Vec<usize> = (0..16).map(|_| hrng.below(rows as u64) as usize).collect();
    let check = |emb: &Embedding<T>, ids: &[i64], what: &str| -> Result<()> {
        let mut cached = vec![0f32; ids.len() * dim];
        emb.gather(ids, &mut cached)?;
        let mut plain = vec![0f32; ids.len() * dim];
        wm_gather::gather(emb.table().memory(), &layout, Ids::I64(ids), bytemuck::cast_slice_mut(&mut plain), DType::F32)?;
        ensure!(cached == plain, "{case}: {what}: the cached gather differs from the table");
        Ok(())
    };
    for step in 0..8u64 {
        let ids = batch(rows, &hot, me, step, n);
        check(&emb, &ids, &format!("step {step}, forward"))?;
        // Between two reads of the same rows (the first filled the cache):
        if step == 4 {
            // one rank rewrites its rows through a loan of the table,
            if me == n - 1 {
                let own = emb.table().local_rows();
                let vals: Vec<T> = own.clone().flat_map(|r| (0..dim).map(move |c| T::from_f64((r * dim + c) as f64 * 0.001))).collect();
                emb.table_mut().write_local(&vals)?;
            }
            world.barrier()?;
        }
        if step == 6 {
            // or every rank initialises the table again.
            emb.init(Init::Uniform { low: -0.5, high: 0.5 }, 9)?;
        }
        // A second read of the hot rows, as a second view of a batch would.
        let again: Vec<i64> = ids.iter().copied().filter(|id| hot.contains(&(*id as usize))).collect();
        check(&emb, &again, &format!("step {step}, second read"))?;
        let grads: Vec<f32> = (0..ids.len() * dim).map(|k| ((k as u64 * 31 + step * 7 + me as u64) % 13) as f32 * 0.01 - 0.06).collect();
        // Gradients for every row read, but in odd steps not for the hot
        // rows: those stay cached into the next step.
        let keep = |id: &i64| step % 2 == 0 || !hot.contains(&(*id as usize));
        let trained: Vec<i64> = ids.iter().copied().filter(keep).collect();
        let grads: Vec<f32> = grads.chunks(dim).zip(&ids).filter(|(_, id)| keep(id)).flat_map(|(g, _)| g.to_vec()).collect();
        emb.apply_gradients(&trained, &grads, 0.05)?;
    }
    let ids: Vec<i64> = hot.iter().map(|&h| h as i64).collect();
    check(&emb, &ids, "after training")?;
    let s = emb.node_cache_stats().context("the embedding has its cache")?;
    ensure!(s.lookups > 0 && s.hits > 0 && s.hits <= s.lookups, "{case}: implausible statistics {s:?}");
    if me == 0 {
        println!("case {case}: lookups {} hits {} ({:.2}) fills {} evictions {}", s.lookups, s.hits, s.hit_rate(), s.fills, s.evictions);
    }
    emb.free()?;
    Ok(())
}

trait FromF64 {
    fn from_f64(v: f64) -> Self;
}
impl FromF64 for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}
impl FromF64 for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

fn embedding(world: &Comm) -> Result<()> {
    ensure!(nodes(world) >= 2, "the embedding cache scenario needs ranks on several (simulated) nodes");
    for ty in collective_types(world) {
        embedding_case::<f32>(world, ty, 0.1)?;
        embedding_case::<bf16>(world, ty, 0.5)?;
    }
    Ok(())
}

// ------------------------------------------------------------- bad input

/// Expects `r` to fail with a message containing every one of `words`.
fn expect_err<T, E: std::fmt::Display>(r: std::result::Result<T, E>, words: &[&str], what: &str) -> Result<()> {
    match r {
        Ok(_) => bail!("{what} succeeded"),
        Err(e) => {
            let m = e.to_string();
            ensure!(words.iter().all(|w| m.contains(w)), "{what}: the error {m:?} does not say {words:?}");
            Ok(())
        }
    }
}

fn bad_ratio(world: &Comm) -> Result<()> {
    let me = world.rank();
    let (rows, cols) = (500, 4);
    let layout = RowLayout::new(DType::F32, cols, 0)?;
    let req = |ty| AllocRequest { ty, loc: Location::Host, total: rows * cols * 4, granularity: cols * 4, partition: None };
    let mem = WholeMemory::allocate(world, &req(MemoryType::Distributed))?;
    if nodes(world) < 2 {
        expect_err(NodeCache::new(&mem, &layout, 0.5), &["all on one node", "would hold nothing"], "a node cache on one node")?;
        mem.free()?;
        if query(world.as_ref(), MemoryType::Chunked, Location::Host).is_supported() {
            let mapped = WholeMemory::allocate(world, &req(MemoryType::Chunked))?;
            expect_err(NodeCache::new(&mapped, &layout, 0.5), &["chunked memory reaches every row"], "a node cache of a mapped table")?;
            mapped.free()?;
        }
        return Ok(());
    }
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        // Every rank passes the bad ratio; every rank names it.
        expect_err(NodeCache::new(&mem, &layout, bad), &[&format!("cache ratio {bad}"), "greater than 0 and at most 1"], "a bad ratio")?;
    }
    // One rank alone passes a bad ratio: every rank reports it.
    let one = if me == world.size() - 1 { -2.0 } else { 0.3 };
    expect_err(NodeCache::new(&mem, &layout, one), &["cache ratio -2"], "one rank's bad ratio")?;
    // Ratios that differ: both named.
    let mixed = if me == 0 { 0.1 } else { 0.2 };
    expect_err(NodeCache::new(&mem, &layout, mixed), &["different node caches", "ratio 0.1", "ratio 0.2"], "different ratios")?;
    // A layout wider than the rows.
    expect_err(NodeCache::new(&mem, &RowLayout::new(DType::F32, cols, 1)?, 0.5), &["do not fit in a row"], "a layout past the row")?;
    // The next call works: a cache and a gather.
    let mut cache = NodeCache::new(&mem, &layout, 0.1)?;
    // Every call through the cache: the checks count its hits.
    cache.set_bypass(Bypass::Off);
    let ids: Vec<i64> = (0..rows as i64).step_by(7).collect();
    let mut out = vec![0u8; ids.len() * cols * 4];
    cache.gather(&mem, Ids::I64(&ids), &mut out, DType::F32)?;
    // A bad id in a cached gather fails on every rank, naming it.
    let bad_ids: Vec<i64> = if me == 0 { vec![1, rows as i64 + 3] } else { vec![2] };
    let mut out = vec![0u8; bad_ids.len() * cols * 4];
    expect_err(
        cache.gather(&mem, Ids::I64(&bad_ids), &mut out, DType::F32),
        &[&format!("id {}", rows + 3)],
        "a bad id in a cached gather",
    )?;
    let mut out = vec![0u8; ids.len() * cols * 4];
    cache.gather(&mem, Ids::I64(&ids), &mut out, DType::F32)?;
    expect_err(cache.invalidate(Ids::I64(&bad_ids)), &[&format!("id {}", rows + 3)], "a bad id to invalidate")?;
    cache.free()?;
    mem.free()?;
    // The embedding refuses bad ratios alike, and works after.
    let mut emb = Embedding::<f32>::allocate(world, MemoryType::Distributed, Location::Host, rows, cols, None, Some(Optimizer::sgd()))?;
    expect_err(emb.enable_node_cache(-1.0), &["cache ratio -1"], "an embedding's bad ratio")?;
    emb.enable_node_cache(0.5)?;
    emb.set_node_cache_bypass(Bypass::Off);
    let mut x = vec![0f32; ids.len() * cols];
    emb.gather(&ids, &mut x)?;
    emb.free()?;
    Ok(())
}

// ------------------------------------------------------------- coherence

/// The ways a table's rows are written, none of which tells a node cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WritePath {
    /// `wm_gather::scatter` (collective): the writer's ids are the hot
    /// rows, whatever rank owns them.
    Scatter,
    /// `WholeMemory::write_rows`: the first half of the writer's rows.
    WriteRows,
    /// `WholeMemory::write_local`: every row of the writer.
    WriteLocal,
    /// `WholeMemory::local_bytes_mut`: every row of the writer, in place.
    InPlace,
    /// `wholemem::files::load` (collective) of files that hold every row,
    /// the writer's at a new version.
    Load,
}

const WRITE_PATHS: [WritePath; 5] = [WritePath::Scatter, WritePath::WriteRows, WritePath::WriteLocal, WritePath::InPlace, WritePath::Load];

/// Rows `rows` of the model at their versions, as f32 bytes of `cols`
/// columns each.
fn model_rows(rows: impl Iterator<Item = usize>, cols: usize, version: &[u32]) -> Vec<u8> {
    let vals: Vec<f32> = rows.flat_map(|r| (0..cols).map(move |c| value(r, c, version[r]))).collect();
    bytemuck::cast_slice(&vals).to_vec()
}

/// A cached gather of `ids` checked against an uncached one and against
/// the model (f32 tables read as f32).
fn read_checked(cache: &mut NodeCache, mem: &WholeMemory, ids: &[i64], version: &[u32], what: &str) -> Result<()> {
    let cols = cache.layout().cols();
    let mut cached = vec![0u8; ids.len() * cols * 4];
    cache.gather(mem, Ids::I64(ids), &mut cached, DType::F32).with_context(|| format!("{what}: cached gather"))?;
    let mut plain = vec![0u8; cached.len()];
    wm_gather::gather(mem, cache.layout(), Ids::I64(ids), &mut plain, DType::F32)?;
    let held: Vec<f32> = bytemuck::pod_collect_to_vec(&cached);
    for (k, &id) in ids.iter().enumerate() {
        let row = id as usize;
        for c in 0..cols {
            let want = value(row, c, version[row]);
            ensure!(
                held[k * cols + c] == want,
                "{what}: the cached gather returned a stale row {row}: column {c} holds {} instead of {want} (version {})",
                held[k * cols + c],
                version[row]
            );
        }
    }
    ensure!(cached == plain, "{what}: the cached gather differs from the uncached one");
    Ok(())
}

/// One rank (`writer`, on another node than rank 0) writes rows by `path`
/// at version `v`, telling the cache nothing; the model learns it on every
/// rank.
#[allow(clippy::too_many_arguments)]
fn write_by(
    world: &Comm,
    mem: &mut WholeMemory,
    path: WritePath,
    writer: usize,
    hot: &[usize],
    version: &mut [u32],
    v: u32,
    files: &Path,
) -> Result<()> {
    let me = world.rank();
    let cols = mem.granularity() / 4;
    let theirs = mem.partition().range(writer);
    let written: Vec<usize> = match path {
        WritePath::Scatter => hot.to_vec(),
        WritePath::WriteRows => (theirs.start..theirs.start + theirs.len().div_ceil(2)).collect(),
        WritePath::WriteLocal | WritePath::InPlace | WritePath::Load => theirs.clone().collect(),
    };
    let mut next = version.to_vec();
    for &r in &written {
        next[r] = v;
    }
    match path {
        WritePath::Scatter => {
            let ids: Vec<i64> = if me == writer { written.iter().map(|&r| r as i64).collect() } else { Vec::new() };
            let layout = RowLayout::new(DType::F32, cols, 0)?;
            let src = model_rows(ids.iter().map(|&r| r as usize), cols, &next);
            wm_gather::scatter(mem, &layout, Ids::I64(&ids), &src, DType::F32)?;
        }
        WritePath::WriteRows if me == writer => {
            mem.write_rows(theirs.start, &model_rows(written.iter().copied(), cols, &next))?;
        }
        WritePath::WriteLocal if me == writer => mem.write_local(&model_rows(theirs.clone(), cols, &next))?,
        WritePath::InPlace if me == writer => {
            let src = model_rows(theirs.clone(), cols, &next);
            // SAFETY: distributed and hierarchy host rows are this
            // process's private memory: no other process reads or writes
            // them while the slice lives.
            let rows = unsafe { mem.local_bytes_mut() };
            rows.copy_from_slice(&src);
        }
        WritePath::Load => {
            // Files of every row at its next version, written from a table
            // of the same shape, then loaded over this one.
            let req = AllocRequest {
                ty: mem.memory_type(),
                loc: Location::Host,
                total: mem.total_bytes(),
                granularity: mem.granularity(),
                partition: Some(mem.partition().counts()),
            };
            let mut src = WholeMemory::allocate(world, &req)?;
            let own = src.local_rows();
            src.write_local(&model_rows(own, cols, &next))?;
            let format = wholemem::files::RowFormat::vector(DType::F32, cols);
            let dir = files.join(format!("load-v{v}"));
            wholemem::files::store(&src, &format, &wholemem::files::StoreTarget::NpyDir(dir.clone()))?;
            src.free()?;
            wholemem::files::load(mem, &format, &wholemem::files::ShardSet::npy_dir(&dir))?;
        }
        WritePath::WriteRows | WritePath::WriteLocal | WritePath::InPlace => {}
    }
    version.copy_from_slice(&next);
    Ok(())
}

/// A node cache of a table written by every path, by a rank of another
/// node, between cached gathers, with nobody telling the cache: no cached
/// gather returns a stale row. No barrier separates a write from the next
/// cached gather, so the other ranks may already be in it when the writer
/// writes.
fn coherence_case(world: &Comm, ty: MemoryType, ratio: f64, files: &Path) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (300 + 23 * n, 4);
    let writer = n - 1;
    let layout_of = wm_topology::NodeLayout::of(world.nodes());
    ensure!(layout_of.node[writer] != layout_of.node[0], "the writer must be on another node than rank 0");
    let mut mem = model_table(world, ty, rows, cols)?;
    let mut version = vec![0u32; rows];
    let mut cache = checked_cache(&mem, cols, ratio)?;
    // Hot rows: the writer's first rows and rows of every owner.
    let theirs = mem.partition().range(writer);
    let mut hrng = Rng::new(&[29, rows as u64]);
    let mut hot: Vec<usize> = theirs.clone().take(6).collect();
    hot.extend((0..18).map(|_| hrng.below(rows as u64) as usize));
    let mut last: Option<WritePath> = None;
    for (round, &path) in WRITE_PATHS.iter().chain(WRITE_PATHS.iter()).enumerate() {
        let what = match last {
            None => format!("{ty} ratio {ratio}, round {round}"),
            Some(p) => format!("{ty} ratio {ratio}, round {round}, after a write by {p:?} on rank {writer}"),
        };
        let mut rng = Rng::new(&[31, me as u64, round as u64]);
        let mut ids: Vec<i64> = hot.iter().map(|&r| r as i64).collect();
        ids.extend((0..30).map(|_| rng.below(rows as u64) as i64));
        // Odd rounds read first on the uncached path (as a cache that
        // measured itself not paying does), with the write of the round
        // before unseen by any cached call yet: the cached read after it
        // must not serve the rows written while the cache was bypassed.
        let bypassed = round % 2 == 1;
        if bypassed {
            cache.set_bypass(Bypass::Always);
        }
        let before = cache.bypassed_calls();
        read_checked(&mut cache, &mem, &ids, &version, &format!("{what}, bypassed {bypassed}"))?;
        ensure!(cache.bypassed_calls() == before + u64::from(bypassed), "{what}: bypassed {bypassed} not honoured");
        cache.set_bypass(Bypass::Off);
        // The hot rows again: from the cache now.
        let hot_ids: Vec<i64> = hot.iter().map(|&r| r as i64).collect();
        read_checked(&mut cache, &mem, &hot_ids, &version, &format!("{what}, read twice"))?;
        write_by(world, &mut mem, path, writer, &hot, &mut version, round as u32 + 1, files)?;
        last = Some(path);
    }
    let all: Vec<i64> = (0..rows as i64).collect();
    read_checked(&mut cache, &mem, &all, &version, &format!("{ty} ratio {ratio}, every row at the end"))?;
    let s = cache.stats();
    ensure!(s.hits > 0, "{ty} ratio {ratio}: the cache never hit {s:?}");
    if me == 0 {
        println!("case coherence {ty} ratio {ratio}: lookups {} hits {}", s.lookups, s.hits);
    }
    cache.free()?;
    mem.free()?;
    Ok(())
}

/// An embedding trained without a node cache of its own, whose table a
/// node cache reads: `apply_gradients` by one rank of another node is a
/// write the cache is not told of either.
fn coherence_embedding(world: &Comm, ty: MemoryType) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, dim) = (300, 4);
    let mut emb = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::sgd()))?;
    emb.init(Init::Normal { mean: 0.0, std: 0.1 }, 7)?;
    let layout = RowLayout::of(emb.table())?;
    let mut cache = NodeCache::new(emb.table().memory(), &layout, 1.0)?;
    // Every call through the cache: the checks count its hits.
    cache.set_bypass(Bypass::Off);
    let hot: Vec<i64> = (0..rows as i64).step_by(11).collect();
    for step in 0..4 {
        for read in 0..2 {
            let mut cached = vec![0u8; hot.len() * dim * 4];
            cache.gather(emb.table().memory(), Ids::I64(&hot), &mut cached, DType::F32)?;
            let mut plain = vec![0u8; cached.len()];
            wm_gather::gather(emb.table().memory(), &layout, Ids::I64(&hot), &mut plain, DType::F32)?;
            ensure!(
                cached == plain,
                "embedding {ty}, step {step}, read {read}: a cached gather returned rows older than the table after apply_gradients on rank {}",
                n - 1
            );
        }
        let (ids, grads): (Vec<i64>, Vec<f32>) =
            if me == n - 1 { (hot.clone(), vec![0.5; hot.len() * dim]) } else { (Vec::new(), Vec::new()) };
        emb.apply_gradients(&ids, &grads, 0.1)?;
    }
    cache.free()?;
    emb.free()?;
    Ok(())
}

/// The hits of a cached gather of `ids` (every rank's own count).
fn hits_of(cache: &mut NodeCache, mem: &WholeMemory, ids: &[i64]) -> Result<CacheStats> {
    let before = cache.stats();
    let mut out = vec![0u8; ids.len() * cache.layout().cols() * 4];
    cache.gather(mem, Ids::I64(ids), &mut out, DType::F32)?;
    Ok(cache.stats().since(&before))
}

/// A host embedding of `shape` (rows, columns) with `optimizer`,
/// initialised from `seed`, behind a node cache with a slot for every
/// remote row that every call goes through, with the rows of `warm` read
/// once.
fn warm_cached_embedding(
    world: &Comm,
    ty: MemoryType,
    shape: (usize, usize),
    optimizer: Optimizer,
    seed: u64,
    warm: &[i64],
) -> Result<Embedding<f32>> {
    let (rows, cols) = shape;
    let mut emb = Embedding::<f32>::allocate(world, ty, Location::Host, rows, cols, None, Some(optimizer))?;
    emb.init(Init::Normal { mean: 0.0, std: 0.1 }, seed)?;
    emb.enable_node_cache(1.0)?;
    emb.set_node_cache_bypass(Bypass::Off);
    let mut x = vec![0f32; warm.len() * cols];
    emb.gather(warm, &mut x)?;
    Ok(emb)
}

/// The writes a cache makes or is told of cost it the rows written and no
/// others: after a `NodeCache::scatter`, and after a step of an embedding
/// with its own node cache, rows nobody wrote are still hits, and the rows
/// written read anew.
fn own_writes_keep_the_rest(world: &Comm, ty: MemoryType) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (400, 4);
    let mut mem = model_table(world, ty, rows, cols)?;
    let mut version = vec![0u32; rows];
    let mut cache = checked_cache(&mem, cols, 1.0)?;
    // Rows of every owner: some kept, some written.
    let kept: Vec<i64> = (0..rows as i64).filter(|r| r % 5 == 0).collect();
    let written: Vec<i64> = (0..rows as i64).filter(|r| r % 5 == 2).collect();
    let both: Vec<i64> = kept.iter().chain(&written).copied().collect();
    read_checked(&mut cache, &mem, &both, &version, &format!("{ty}: before the writes"))?;
    let mine: Vec<i64> = if me == n - 1 { written.clone() } else { Vec::new() };
    for &r in &written {
        version[r as usize] = 1;
    }
    let src = model_rows(mine.iter().map(|&r| r as usize), cols, &version);
    cache.scatter(&mut mem, Ids::I64(&mine), &src, DType::F32)?;
    let d = hits_of(&mut cache, &mem, &kept)?;
    ensure!(d.hits == d.lookups, "{ty}: a cached scatter of other rows dropped {} of the {} rows kept", d.lookups - d.hits, d.lookups);
    read_checked(&mut cache, &mem, &both, &version, &format!("{ty}: after a cached scatter"))?;
    cache.free()?;
    mem.free()?;

    let mut emb = warm_cached_embedding(world, ty, (rows, cols), Optimizer::sgd(), 5, &both)?;
    let grads = vec![0.5f32; mine.len() * cols];
    emb.apply_gradients(&mine, &grads, 0.1)?;
    let before = emb.node_cache_stats().context("the embedding has its cache")?;
    let mut y = vec![0f32; kept.len() * cols];
    emb.gather(&kept, &mut y)?;
    let d = emb.node_cache_stats().context("the embedding has its cache")?.since(&before);
    ensure!(d.hits == d.lookups, "{ty}: a step on other rows dropped {} of the {} rows kept", d.lookups - d.hits, d.lookups);
    let mut cached = vec![0f32; both.len() * cols];
    emb.gather(&both, &mut cached)?;
    let mut plain = vec![0f32; both.len() * cols];
    wm_gather::gather_into(emb.table(), &both, &mut plain)?;
    ensure!(cached == plain, "{ty}: the embedding's cached gather differs from its table after a step");
    emb.free()?;
    if me == 0 {
        println!("case own-writes {ty}: rows nobody wrote stayed cached");
    }
    Ok(())
}

fn coherence(world: &Comm, files: &Path) -> Result<()> {
    ensure!(nodes(world) >= 2, "the coherence scenario needs ranks on several (simulated) nodes");
    for ty in collective_types(world) {
        for ratio in [1.0, 0.1] {
            coherence_case(world, ty, ratio, files)?;
        }
        coherence_embedding(world, ty)?;
        own_writes_keep_the_rest(world, ty)?;
    }
    Ok(())
}

// ------------------------------------------------------------- preload

/// `NodeCache::preload` of a list of every row, hottest first, some
/// repeated: the hottest rows it may hold are hits at the first gather,
/// every row it holds is read as the table holds it, its fills are
/// counted and its lookups not; after a write nobody told the cache of,
/// a second preload reads the written rows anew; a bad id on one rank
/// fails on every rank naming it and changes nothing.
fn preload(world: &Comm, files: &Path) -> Result<()> {
    ensure!(nodes(world) >= 2, "the preload scenario needs ranks on several (simulated) nodes");
    let (me, n) = (world.rank(), world.size());
    // Rows enough for several reads of 8 192 per rank.
    let (rows, cols) = (40_000, 4);
    let writer = n - 1;
    let layout_of = wm_topology::NodeLayout::of(world.nodes());
    let mine = layout_of.node[me];
    let mut rng = Rng::new(&[17, rows as u64]);
    let mut hot: Vec<i64> = (0..rows as i64).collect();
    for i in (1..rows).rev() {
        hot.swap(i, rng.below(i as u64 + 1) as usize);
    }
    // The list may differ between nodes: rank 0's node gets a third of
    // it, so nodes make different numbers of reads (and some reads of
    // nothing).
    if mine == layout_of.node[0] {
        hot.truncate(rows / 3);
    }
    hot.extend_from_within(..50);
    for ty in collective_types(world) {
        for ratio in [0.05, 1.0] {
            let case = format!("{ty} ratio {ratio}");
            let mut mem = model_table(world, ty, rows, cols)?;
            let mut version = vec![0u32; rows];
            let mut cache = checked_cache(&mem, cols, ratio)?;
            let before = cache.stats();
            let held = cache.preload(&mem, Ids::I64(&hot)).with_context(|| format!("{case}: preload"))?;
            let d = cache.stats().since(&before);
            ensure!(
                held == cache.cached_rows() && held > 0 && held <= cache.capacity(),
                "{case}: preload says it holds {held} rows, the cache {} of {}",
                cache.cached_rows(),
                cache.capacity()
            );
            let remote_of = |ids: &[i64]| -> Vec<i64> {
                let mut seen = std::collections::HashSet::new();
                ids.iter().copied().filter(|&r| layout_of.node[mem.partition().owner(r as usize)] != mine && seen.insert(r)).collect()
            };
            if ratio == 1.0 {
                let listed = remote_of(&hot).len();
                ensure!(held == listed, "{case}: a cache with a slot for every remote row holds {held} of the {listed} remote rows listed");
            }
            ensure!(d.lookups == 0 && d.hits == 0, "{case}: the preload counted {} lookups and {} hits", d.lookups, d.hits);
            ensure!(d.fills == held as u64, "{case}: {} fills for {held} rows held", d.fills);
            // The 20 hottest rows other nodes own: hits at once.
            let remote: Vec<i64> = remote_of(&hot).into_iter().take(20).collect();
            let s = hits_of(&mut cache, &mem, &remote)?;
            ensure!(s.hits == s.lookups && s.lookups == 20, "{case}: {} of the 20 hottest remote rows were hits after the preload", s.hits);
            read_checked(&mut cache, &mem, &hot, &version, &format!("{case}: after the preload"))?;
            // A write nobody told the cache of, then a preload and a read.
            write_by(world, &mut mem, WritePath::WriteLocal, writer, &[], &mut version, 1, files)?;
            cache.preload(&mem, Ids::I64(&hot)).with_context(|| format!("{case}: preload after a write"))?;
            // It read the written rows anew, so the next gather keeps them.
            let s = hits_of(&mut cache, &mem, &remote)?;
            ensure!(s.hits == s.lookups, "{case}: {} of the 20 hottest remote rows missed after a write and a preload", s.lookups - s.hits);
            read_checked(&mut cache, &mem, &hot, &version, &format!("{case}: after a write and a preload"))?;
            // A bad id on one rank: refused on every rank, nothing changes.
            let held = cache.cached_rows();
            let mut bad = hot.clone();
            if me == writer {
                bad[7] = rows as i64 + 3;
            }
            let e = cache.preload(&mem, Ids::I64(&bad));
            expect_err(e, &[&format!("{}", rows + 3)], &format!("{case}: a preload with a bad id on rank {writer}"))?;
            ensure!(cache.cached_rows() == held, "{case}: a refused preload changed the cache from {held} rows to {}", cache.cached_rows());
            read_checked(&mut cache, &mem, &hot, &version, &format!("{case}: after a refused preload"))?;
            cache.free()?;
            mem.free()?;
            if me == 0 {
                println!("case preload {case}: {held} rows held, the hottest hit at once");
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------- all or nothing

/// What must not change when an operation fails on a bad id: the table's
/// rows (every row, read uncached), the node cache's rows on this rank,
/// and the hot rows' place in it (read again, every one of them hits).
struct Unchanged {
    table: Vec<u8>,
    held: usize,
}

impl Unchanged {
    fn take(mem: &WholeMemory, cache: &NodeCache) -> Result<Self> {
        Ok(Self { table: every_row(mem, cache.layout())?, held: cache.cached_rows() })
    }

    fn check(&self, mem: &WholeMemory, cache: &mut NodeCache, hot: &[i64], what: &str) -> Result<()> {
        ensure!(every_row(mem, cache.layout())? == self.table, "{what}: it changed rows of the table");
        ensure!(
            cache.cached_rows() == self.held,
            "{what}: the node cache held {} rows before and {} after",
            self.held,
            cache.cached_rows()
        );
        let cols = cache.layout().cols();
        let before = cache.stats();
        let mut out = vec![0u8; hot.len() * cols * 4];
        cache.gather(mem, Ids::I64(hot), &mut out, DType::F32)?;
        let d = cache.stats().since(&before);
        ensure!(d.hits == d.lookups, "{what}: {} of the {} cached hot rows were dropped", d.lookups - d.hits, d.lookups);
        let rb = cols * 4;
        for (k, &id) in hot.iter().enumerate() {
            ensure!(out[k * rb..][..rb] == self.table[id as usize * rb..][..rb], "{what}: row {id} reads otherwise from the cache");
        }
        Ok(())
    }
}

/// Every row of the table, read by an uncached gather (collective).
fn every_row(mem: &WholeMemory, layout: &RowLayout) -> Result<Vec<u8>> {
    let all: Vec<i64> = (0..mem.rows() as i64).collect();
    let mut out = vec![0u8; all.len() * layout.cols() * 4];
    wm_gather::gather(mem, layout, Ids::I64(&all), &mut out, DType::F32)?;
    Ok(out)
}

/// Every operation that takes many ids, with one bad id on one rank
/// (after good ones): the same error on every rank, and nothing changed —
/// not the table, not any node's cache. Then the same for a load of files
/// of the wrong shape, and for `apply_gradients` of an embedding with a
/// node cache.
fn all_or_nothing(world: &Comm, files: &Path) -> Result<()> {
    ensure!(nodes(world) >= 2, "the all-or-nothing scenario needs ranks on several (simulated) nodes");
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (400, 4);
    let bad = rows as i64 + 5;
    for ty in collective_types(world) {
        let mut mem = model_table(world, ty, rows, cols)?;
        let mut cache = checked_cache(&mem, cols, 1.0)?;
        let layout = RowLayout::new(DType::F32, cols, 0)?;
        let hot: Vec<i64> = (0..rows as i64).step_by(9).collect();
        let mut out = vec![0u8; hot.len() * cols * 4];
        cache.gather(&mem, Ids::I64(&hot), &mut out, DType::F32)?;
        let before = Unchanged::take(&mem, &cache)?;
        ensure!(before.held > 0, "{ty}: the cache holds nothing to keep");
        // Good ids (hot rows of every owner), and on the last rank the bad
        // one after them.
        let mut ids: Vec<i64> = hot.iter().copied().filter(|&r| r % 2 == 0).collect();
        if me == n - 1 {
            ids.push(bad);
        }
        let src: Vec<f32> = vec![-1.0; ids.len() * cols];
        let src: &[u8] = bytemuck::cast_slice(&src);
        let named = format!("id {bad}");
        let what = |op: &str| format!("{ty}: {op} with a bad id on rank {}", n - 1);

        expect_err(cache.scatter(&mut mem, Ids::I64(&ids), src, DType::F32), &[&named], &what("NodeCache::scatter"))?;
        before.check(&mem, &mut cache, &hot, &what("NodeCache::scatter"))?;
        expect_err(wm_gather::scatter(&mut mem, &layout, Ids::I64(&ids), src, DType::F32), &[&named], &what("wm_gather::scatter"))?;
        before.check(&mem, &mut cache, &hot, &what("wm_gather::scatter"))?;
        expect_err(cache.invalidate(Ids::I64(&ids)), &[&named], &what("NodeCache::invalidate"))?;
        before.check(&mem, &mut cache, &hot, &what("NodeCache::invalidate"))?;
        let mut out = vec![0u8; ids.len() * cols * 4];
        expect_err(cache.gather(&mem, Ids::I64(&ids), &mut out, DType::F32), &[&named], &what("NodeCache::gather"))?;
        before.check(&mem, &mut cache, &hot, &what("NodeCache::gather"))?;

        // Files of one row too few: refused before any row is read.
        let short = AllocRequest { ty, loc: Location::Host, total: (rows - 1) * cols * 4, granularity: cols * 4, partition: None };
        let small = WholeMemory::allocate(world, &short)?;
        let format = wholemem::files::RowFormat::vector(DType::F32, cols);
        let dir = files.join(format!("short-{ty}"));
        wholemem::files::store(&small, &format, &wholemem::files::StoreTarget::NpyDir(dir.clone()))?;
        small.free()?;
        let loaded = wholemem::files::load(&mut mem, &format, &wholemem::files::ShardSet::npy_dir(&dir));
        expect_err(loaded, &[&format!("{}", rows - 1)], &what("files::load of files of one row too few"))?;
        before.check(&mem, &mut cache, &hot, &what("files::load"))?;
        cache.free()?;
        mem.free()?;

        // An embedding with a node cache: a step with a bad id changes no
        // weight, no state and nothing cached.
        let mut emb = warm_cached_embedding(world, ty, (rows, cols), Optimizer::adam(), 1, &hot)?;
        let all: Vec<i64> = (0..rows as i64).collect();
        let weights = |e: &Embedding<f32>| -> Result<Vec<f32>> {
            let mut w = vec![0f32; rows * cols];
            e.gather(&all, &mut w)?;
            let mut m = vec![0f32; rows * cols];
            e.gather_state("m", &all, &mut m)?;
            w.extend(m);
            Ok(w)
        };
        let (w0, held) = (weights(&emb)?, emb.node_cache_rows());
        let grads = vec![0.25f32; ids.len() * cols];
        expect_err(emb.apply_gradients(&ids, &grads, 0.1), &[&named], &what("apply_gradients"))?;
        ensure!(weights(&emb)? == w0, "{}: it changed weights or state", what("apply_gradients"));
        ensure!(
            emb.node_cache_rows() == held,
            "{}: the node cache held {held:?} rows before and {:?} after",
            what("apply_gradients"),
            emb.node_cache_rows()
        );
        emb.free()?;
        if me == 0 {
            println!("case all-or-nothing {ty}: every operation refused the bad id on every rank and changed nothing");
        }
    }
    Ok(())
}

// ------------------------------------------------------------- write generations

/// Every rank's write generation of `mem`, after a barrier (writes before
/// it included).
fn generations(world: &Comm, mem: &WholeMemory) -> Result<Vec<u64>> {
    world.barrier()?;
    Ok(world.allgather_value(mem.write_generation())?)
}

/// Which ranks' generations moved from `a` to `b`.
fn moved(a: &[u64], b: &[u64]) -> Vec<usize> {
    (0..a.len()).filter(|&r| a[r] != b[r]).collect()
}

/// `WholeMemory::write_generation` moves for the ranks whose rows a write
/// changed — by every path, whichever rank wrote them — and for no other;
/// refused writes move nothing and write nothing; tables are told apart by
/// their allocation number.
fn write_generations(world: &Comm, files: &Path) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    ensure!(n >= 3, "the write-generations scenario needs 3 ranks or more");
    let (rows, cols) = (60 * n, 4);
    let layout = RowLayout::new(DType::F32, cols, 0)?;
    let mut types: Vec<MemoryType> = Vec::new();
    for ty in MemoryType::ALL {
        match query(world.as_ref(), ty, Location::Host).reason() {
            Some(reason) => println!("skip host {ty}: {reason}"),
            None => types.push(ty),
        }
    }
    let mut serials = Vec::new();
    for ty in types {
        let req = AllocRequest { ty, loc: Location::Host, total: rows * cols * 4, granularity: cols * 4, partition: None };
        let mut mem = WholeMemory::allocate(world, &req)?;
        serials.push(mem.serial());
        let p = mem.partition().clone();
        let own = mem.local_rows();
        let row = |v: f32| vec![v; cols * 4 / 4];
        let g0 = generations(world, &mem)?;
        ensure!(g0.iter().all(|&g| g == 0), "{ty}: a new table's generations are {g0:?}");

        // Rank 2 rewrites its rows.
        if me == 2 {
            let vals: Vec<f32> = vec![2.0; own.len() * cols];
            mem.write_local(bytemuck::cast_slice(&vals))?;
        }
        let g1 = generations(world, &mem)?;
        ensure!(moved(&g0, &g1) == [2], "{ty}: write_local on rank 2 moved the generations of ranks {:?}", moved(&g0, &g1));

        // Rank 0 scatters into one row of rank 1 (collective for the
        // collective types).
        let target = p.offset(1) as i64;
        let ids: Vec<i64> = if me == 0 { vec![target] } else { Vec::new() };
        let src: Vec<f32> = ids.iter().flat_map(|_| row(7.0)).collect();
        wm_gather::scatter(&mut mem, &layout, Ids::I64(&ids), bytemuck::cast_slice(&src), DType::F32)?;
        let g2 = generations(world, &mem)?;
        ensure!(moved(&g1, &g2) == [1], "{ty}: a scatter into a row of rank 1 moved the generations of ranks {:?}", moved(&g1, &g2));

        // A scatter with a bad id on the last rank, a write past the end:
        // refused, nothing moved.
        let bad: Vec<i64> = if me == n - 1 { vec![target, rows as i64] } else { Vec::new() };
        let src: Vec<f32> = bad.iter().flat_map(|_| row(9.0)).collect();
        let refused = wm_gather::scatter(&mut mem, &layout, Ids::I64(&bad), bytemuck::cast_slice(&src), DType::F32);
        if ty.is_mapped() && me != n - 1 {
            // Not collective: the other ranks scattered nothing.
            refused?;
        } else {
            expect_err(refused, &[&format!("id {rows}")], &format!("{ty}: a scatter with a bad id"))?;
        }
        expect_err(mem.write_rows(rows - 1, &vec![0u8; 2 * cols * 4]), &["out of range"], &format!("{ty}: a write past the end"))?;
        let g3 = generations(world, &mem)?;
        ensure!(g3 == g2, "{ty}: refused writes moved the generations of ranks {:?}", moved(&g2, &g3));

        if ty.is_mapped() {
            // Rank 1 writes a row of rank 0 through the mapping: rank 0's
            // generation moves, on every rank's view of it.
            if me == 1 {
                mem.write_rows(p.offset(0), bytemuck::cast_slice(&row(3.0)))?;
            }
            let g4 = generations(world, &mem)?;
            ensure!(moved(&g3, &g4) == [0], "{ty}: rank 1 writing a row of rank 0 moved the generations of ranks {:?}", moved(&g3, &g4));
        } else {
            // A run of two rows, one of this rank's and one of its
            // neighbour's: this rank cannot reach the neighbour's, so
            // nothing is written — not even its own row — and nothing moves.
            let first = if me + 1 < n { own.end - 1 } else { own.start - 1 };
            let before = every_row(&mem, &layout)?;
            expect_err(
                mem.write_rows(first, &vec![0u8; 2 * cols * 4]),
                &["maps only a rank's own rows"],
                &format!("{ty}: a write into a neighbour's rows"),
            )?;
            ensure!(every_row(&mem, &layout)? == before, "{ty}: a refused write past this rank's rows wrote its own row");
            let g4 = generations(world, &mem)?;
            ensure!(g4 == g3, "{ty}: a refused write moved the generations of ranks {:?}", moved(&g3, &g4));
        }
        let g4 = generations(world, &mem)?;

        // In place, on the last rank.
        if me == n - 1 {
            // SAFETY: no other rank reads or writes these rows until the
            // barrier in `generations`.
            let slice = unsafe { mem.local_bytes_mut() };
            slice.fill(0);
        }
        let g5 = generations(world, &mem)?;
        ensure!(
            moved(&g4, &g5) == [n - 1],
            "{ty}: an in-place write on rank {} moved the generations of ranks {:?}",
            n - 1,
            moved(&g4, &g5)
        );

        // A load writes every rank's rows.
        let format = wholemem::files::RowFormat::vector(DType::F32, cols);
        let dir = files.join(format!("generations-{ty}"));
        wholemem::files::store(&mem, &format, &wholemem::files::StoreTarget::NpyDir(dir.clone()))?;
        wholemem::files::load(&mut mem, &format, &wholemem::files::ShardSet::npy_dir(&dir))?;
        let g6 = generations(world, &mem)?;
        ensure!(moved(&g5, &g6) == (0..n).collect::<Vec<_>>(), "{ty}: a load moved the generations of ranks {:?}", moved(&g5, &g6));
        mem.free()?;
        let again = WholeMemory::allocate(world, &req)?;
        ensure!(!serials.contains(&again.serial()), "{ty}: a new table got the number {} of an earlier one {serials:?}", again.serial());
        serials.push(again.serial());
        again.free()?;
        if me == 0 {
            println!("case generations {ty}: every write moved the generations of the ranks whose rows it wrote, and only those");
        }
    }
    Ok(())
}

// ------------------------------------------------------------- table identity

/// A cache whose table was freed, handed a new table of the same shape
/// (which the allocator likely placed where the old one was): refused on
/// every rank, naming the tables; a cache of the new table then works.
fn reused_table(world: &Comm) -> Result<()> {
    ensure!(nodes(world) >= 2, "the reused-table scenario needs ranks on several (simulated) nodes");
    let me = world.rank();
    let (rows, cols) = (2048, 16);
    let layout = RowLayout::new(DType::F32, cols, 0)?;
    for ty in collective_types(world) {
        let req = AllocRequest { ty, loc: Location::Host, total: rows * cols * 4, granularity: cols * 4, partition: None };
        let mut version = vec![0u32; rows];
        let mem = model_table(world, ty, rows, cols)?;
        let own = mem.local_rows();
        let mut cache = checked_cache(&mem, cols, 0.5)?;
        let ids: Vec<i64> = (0..rows as i64).step_by(5).collect();
        read_checked(&mut cache, &mem, &ids, &version, &format!("{ty}: the first table"))?;
        let old_place = mem.rank_ptr(me).map(|p| p as usize);
        mem.free()?;

        let mut fresh = WholeMemory::allocate(world, &req)?;
        version.fill(1);
        fresh.write_rows(own.start, &model_rows(own.clone(), cols, &version))?;
        world.barrier()?;
        let same_place = world.allgather_value(u8::from(fresh.rank_ptr(me).map(|p| p as usize) == old_place))?;
        if me == 0 {
            let k = same_place.iter().filter(|&&s| s == 1).count();
            println!("case reused-table {ty}: the new table took the freed one's place on {k} of {} ranks", same_place.len());
        }
        let mut out = vec![0u8; ids.len() * cols * 4];
        expect_err(
            cache.gather(&fresh, Ids::I64(&ids), &mut out, DType::F32),
            &["another table"],
            &format!("{ty}: a cached gather of a new table through the cache of a freed one"),
        )?;
        let src = vec![0u8; cols * 4];
        expect_err(
            cache.scatter(&mut fresh, Ids::I64(&[0]), &src, DType::F32),
            &["another table"],
            &format!("{ty}: a cached scatter into a new table through the cache of a freed one"),
        )?;
        cache.free()?;
        let mut cache = NodeCache::new(&fresh, &layout, 0.5)?;
        // Every call through the cache: the checks count its hits.
        cache.set_bypass(Bypass::Off);
        read_checked(&mut cache, &fresh, &ids, &version, &format!("{ty}: the new table's own cache"))?;
        cache.free()?;
        fresh.free()?;
    }
    Ok(())
}

// ------------------------------------------------------------- device cache

/// Two embeddings of the same host table type and initial values, one with
/// a device cache of its rows and state: after every step of the same
/// batches, weights and every state slot agree to the bit, the cache held
/// rows and wrote back what it updated, and bad ratios are refused.
fn device_case<T: EmbeddingElement + FromF64>(world: &Comm, ty: MemoryType, ratio: f64) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, dim) = (700, 8);
    let case = format!("device cache {ty} {} ratio {ratio}", T::DTYPE);
    let make = || -> Result<Embedding<T>> {
        let mut e = Embedding::<T>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::adam()))?;
        e.init(Init::Normal { mean: 0.0, std: 0.1 }, 5)?;
        Ok(e)
    };
    let (mut cached, mut plain) = (make()?, make()?);
    expect_err(cached.enable_device_cache(0.0), &["cache ratio 0"], "a device cache of ratio 0")?;
    cached.enable_device_cache(ratio).with_context(|| case.clone())?;
    let mut hrng = Rng::new(&[23, rows as u64]);
    let hot: Vec<usize> = (0..16).map(|_| hrng.below(rows as u64) as usize).collect();
    let all: Vec<i64> = (0..rows as i64).collect();
    for step in 0..8u64 {
        let ids = batch(rows, &hot, me, step, n);
        let grads: Vec<f32> = (0..ids.len() * dim).map(|k| ((k as u64 * 29 + step * 5 + me as u64) % 11) as f32 * 0.02 - 0.1).collect();
        cached.apply_gradients(&ids, &grads, 0.05)?;
        plain.apply_gradients(&ids, &grads, 0.05)?;
        if step == 5 {
            // A loan of the table (a rewrite of one rank's rows, on both).
            for e in [&mut cached, &mut plain] {
                if me == n - 1 {
                    let own = e.table().local_rows();
                    let vals: Vec<T> = own.clone().flat_map(|r| (0..dim).map(move |c| T::from_f64((r + c) as f64 * 0.01))).collect();
                    e.table_mut().write_local(&vals)?;
                }
            }
            world.barrier()?;
        }
        let (mut a, mut b) = (vec![0f32; rows * dim], vec![0f32; rows * dim]);
        cached.gather(&all, &mut a)?;
        plain.gather(&all, &mut b)?;
        ensure!(a == b, "{case}: weights differ after step {step}");
        for slot in cached.optimizer().map(|o| o.state_slots(dim)).unwrap_or_default() {
            let (mut a, mut b) = (vec![0f32; rows * slot.cols], vec![0f32; rows * slot.cols]);
            cached.gather_state(slot.name, &all, &mut a)?;
            plain.gather_state(slot.name, &all, &mut b)?;
            ensure!(a == b, "{case}: state {} differs after step {step}", slot.name);
        }
    }
    let s = cached.device_cache_stats().context("the embedding has its device cache")?;
    ensure!(s.lookups > 0 && s.hits > 0 && s.fills > 0 && s.writebacks > 0, "{case}: implausible statistics {s:?}");
    if me == 0 {
        println!(
            "case {case}: lookups {} hits {} fills {} evictions {} writebacks {}",
            s.lookups, s.hits, s.fills, s.evictions, s.writebacks
        );
    }
    cached.free()?;
    plain.free()?;
    Ok(())
}

fn device(world: &Comm) -> Result<()> {
    if let Err(why) = wholemem::device::status() {
        for ty in [MemoryType::Distributed, MemoryType::Chunked] {
            wm_tests::skip(world.as_ref(), ty, Location::Device, &format!("device cache of host {ty} rows"), &why)
                .map_err(anyhow::Error::msg)?;
        }
        return Ok(());
    }
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            println!("skip host {ty}: {reason}");
            continue;
        }
        device_case::<f32>(world, ty, 0.1)?;
        device_case::<bf16>(world, ty, 1.0)?;
    }
    Ok(())
}
