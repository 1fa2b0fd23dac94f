//! One rank of a multi-process cache scenario: `wm-test-cache SCENARIO`.
//! Started by `tests/tests/cache.rs` through the harness (or by hand under
//! `wm-run --node-size K`). Every check runs on every rank; the first wrong
//! result exits non-zero naming the rank, the case and what differed.
//!
//! Scenarios: `node` (the node cache of remote rows on every collective
//! type), `embedding` (an embedding with a node cache, trained), `bad-ratio`
//! (refusals on every rank), `device` (an embedding with a device cache of
//! its host rows, trained beside one without: on a GPU only; elsewhere it
//! prints why it skips, and fails under `WM_REQUIRE_GPU=1`).
//!
//! The node cache is checked two ways after every cached gather: against
//! an uncached gather of the same ids (byte for byte), and against this
//! program's own model of the table (each row's value is a function of
//! row, column and the row's version, and every rank knows every write's
//! rows and version, so every rank knows what every row holds).

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use half::bf16;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory, query};
use wm_comm::{CommExt, Communicator};
use wm_embedding::{Embedding, EmbeddingElement, Init, Optimizer};
use wm_gather::cache::NodeCache;
use wm_gather::{DType, Ids, RowLayout};
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().cloned().unwrap_or_default();
    let result = wm_comm::init().context("bootstrap").and_then(|world| match scenario.as_str() {
        "node" => node_cache(&world),
        "embedding" => embedding(&world),
        "bad-ratio" => bad_ratio(&world),
        "device" => device(&world),
        other => bail!("unknown scenario {other:?}"),
    });
    if let Err(e) = result {
        eprintln!("FAILED: {e:#}");
        std::process::exit(1);
    }
    println!("ok");
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

/// The rows rank `rank` writes in round `round`: its share of the hot rows
/// and a few others, never a row another rank writes in the same round.
fn writes(rows: usize, hot: &[usize], rank: usize, round: u64, world: usize) -> Vec<i64> {
    let mut rng = Rng::new(&[13, rank as u64, round]);
    let mut v: Vec<usize> = hot.iter().copied().filter(|&r| r % world == rank).collect();
    v.extend((0..20).map(|_| rng.below(rows as u64) as usize).filter(|&r| r % world == rank));
    v.iter().map(|&r| r as i64).collect()
}

/// One node-cache case: a table, a cache, rounds of gathers checked
/// against an uncached gather and the model, writes by every path.
fn node_case(world: &Comm, ty: MemoryType, dt: DType, ratio: f64, layout_cols: Option<(usize, usize)>) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let cols = 6;
    let rows = 1000 + 37 * n;
    let case = format!("{ty} {dt} ratio {ratio} layout {layout_cols:?}");
    // A random partition (the same on every rank), one rank without rows.
    let mut prng = Rng::new(&[7, n as u64, rows as u64]);
    let mut counts: Vec<usize> = (0..n).map(|_| 1 + prng.below(3) as usize).collect();
    counts[n / 2] = 0;
    let sum: usize = counts.iter().sum();
    let mut partition: Vec<usize> = counts.iter().map(|c| c * rows / sum).collect();
    let given: usize = partition.iter().sum();
    partition[0] += rows - given;
    let rb = cols * dt.size();
    let req = AllocRequest { ty, loc: Location::Host, total: rows * rb, granularity: rb, partition: Some(partition.clone()) };
    let mut mem = WholeMemory::allocate(world, &req).with_context(|| format!("allocating {case}"))?;
    let mut version = vec![0u32; rows];
    let own = mem.local_rows();
    let init: Vec<f32> = own.clone().flat_map(|r| (0..cols).map(move |c| value(r, c, 0))).collect();
    mem.write_rows(own.start, &encode(dt, &init))?;
    world.barrier()?;

    let (first, width) = layout_cols.unwrap_or((0, cols));
    let layout = RowLayout::new(dt, width, first)?;
    let mut cache = NodeCache::new(&mem, &layout, ratio).with_context(|| format!("a node cache for {case}"))?;
    // Hot rows: the same on every rank.
    let mut hrng = Rng::new(&[17, rows as u64]);
    let hot: Vec<usize> = (0..24).map(|_| hrng.below(rows as u64) as usize).collect();

    for round in 0..12u64 {
        let ids = batch(rows, &hot, me, round, n);
        let out_dt = if round % 3 == 2 { DType::Bf16 } else { DType::F32 };
        let narrow: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
        let id_arg = || if round % 2 == 0 { Ids::I32(&narrow) } else { Ids::I64(&ids) };
        let mut cached = vec![0u8; ids.len() * width * out_dt.size()];
        cache.gather(&mem, id_arg(), &mut cached, out_dt).with_context(|| format!("{case}: cached gather, round {round}"))?;
        let mut plain = vec![0u8; cached.len()];
        wm_gather::gather(&mem, &layout, id_arg(), &mut plain, out_dt)?;
        if cached != plain {
            let k = (0..ids.len()).find(|&k| {
                cached[k * width * out_dt.size()..][..width * out_dt.size()] != plain[k * width * out_dt.size()..][..width * out_dt.size()]
            });
            bail!("{case}, round {round}: the cached gather differs from the uncached one first at id {:?}", k.map(|k| ids[k]));
        }
        let got = decode(out_dt, &cached);
        for (k, &id) in ids.iter().enumerate() {
            let row = id as usize;
            for c in 0..width {
                let want = stored(out_dt, stored(dt, value(row, first + c, version[row])));
                ensure!(
                    got[k * width + c] == want,
                    "{case}, round {round}: row {row} column {} holds {} instead of {want} (version {})",
                    first + c,
                    got[k * width + c],
                    version[row]
                );
            }
        }

        // Writes, each path in turn, by every rank (ranks of every node).
        let v = round as u32 + 1;
        match round % 4 {
            1 | 2 => {
                let mine = writes(rows, &hot, me, round, n);
                let vals: Vec<f32> = mine.iter().flat_map(|&r| (0..width).map(move |c| value(r as usize, first + c, v))).collect();
                if round % 4 == 1 {
                    cache.scatter(&mut mem, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                } else {
                    wm_gather::scatter(&mut mem, &layout, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                    cache.invalidate(Ids::I64(&mine))?;
                }
                if layout_cols.is_some() {
                    // Only the layout's columns changed: the model keeps
                    // whole rows, so the others are written alike here.
                    let whole = RowLayout::new(dt, cols, 0)?;
                    let vals: Vec<f32> = mine.iter().flat_map(|&r| (0..cols).map(move |c| value(r as usize, c, v))).collect();
                    wm_gather::scatter(&mut mem, &whole, Ids::I64(&mine), bytemuck::cast_slice(&vals), DType::F32)?;
                    cache.invalidate(Ids::I64(&mine))?;
                }
                for r in 0..n {
                    for row in writes(rows, &hot, r, round, n) {
                        version[row as usize] = v;
                    }
                }
            }
            3 => {
                // The last rank rewrites all its rows in place; every rank
                // then empties the cache.
                let last = n - 1;
                if me == last {
                    let vals: Vec<f32> = own.clone().flat_map(|r| (0..cols).map(move |c| value(r, c, v))).collect();
                    mem.write_local(&encode(dt, &vals))?;
                }
                cache.clear()?;
                for row in mem.partition().range(last) {
                    version[row] = v;
                }
            }
            _ => {}
        }
    }

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
        let ids: Vec<i64> = hot.iter().map(|&h| h as i64).collect();
        let mut out = vec![0u8; ids.len() * width * 4];
        cache.gather(&mem, Ids::I64(&ids), &mut out, DType::F32)?;
        let before = cache.stats();
        cache.gather(&mem, Ids::I64(&ids), &mut out, DType::F32)?;
        let d = cache.stats().since(&before);
        ensure!(d.lookups > 0 && d.hits == d.lookups, "{case}: rows read twice missed the second time: {d:?}");
    }
    let s = cache.stats();
    // Fills and evictions are the node's: the same on every rank of it.
    let local = world.local();
    let node_stats = local.allgather_pod(&[s.fills, s.evictions, cache.cached_rows() as u64])?;
    ensure!(node_stats.chunks(3).all(|c| c == &node_stats[..3]), "{case}: the ranks of a node disagree about their cache: {node_stats:?}");
    if me == 0 {
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
    cache.free()?;
    mem.free()?;
    Ok(())
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
    let mut x = vec![0f32; ids.len() * cols];
    emb.gather(&ids, &mut x)?;
    emb.free()?;
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
