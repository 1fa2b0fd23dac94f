//! `wm-bench gather --cache-ratio R` and `wm-bench gather --embedding`:
//! every timed batch is gathered twice, interleaved and in alternating
//! order — once by the path under test (a node cache of `R` of the table,
//! through `wm_gather` or through `wm_embedding::Embedding`) and once by
//! the plain uncached `wm_gather::gather` of the same table — both
//! verified, beside the usual single-threaded baseline on rank 0. The
//! warm-up batches before them go through the path under test only: they
//! warm the cache, as the batches before any measurement of a long job
//! would.
//!
//! Besides both speeds and their ratio it reports the cache's hit rate
//! over the timed batches and the hit rate of the best static choice for
//! the same id stream: the cache's capacity filled with the rows the node
//! asked most often in those batches (its ranks' remote ids counted
//! together) — an oracle no cache of that size can beat on that stream,
//! since it never misses a row the first time. How many of the timed
//! lookups asked for a row for the first time (on this rank, since the
//! run began) is reported too: no online cache hits those.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail, ensure};
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator};
use wm_embedding::{Embedding, EmbeddingElement};
use wm_gather::cache::{CacheStats, NodeCache};
use wm_gather::{DType, Ids, RowLayout};

use crate::baseline::Baseline;
use crate::ids::IdDist;
use crate::moves::{Ageing, DEFAULT_TABLE_BYTES, MoveArgs, Op, batch_ids};
use crate::report::{self, CacheFigures, Spread};
use crate::sched::Sched;
use crate::values;

/// Checks the options of a cached (or embedding) run before any rank
/// starts, so a bad ratio is one clear error.
///
/// # Errors
/// A ratio outside (0, 1], device output, a memory type or element type
/// the path cannot take.
pub(crate) fn check(a: &MoveArgs) -> Result<()> {
    if let Some(Ageing::Every(f)) = a.cache_ageing {
        // The library's own check, before any rank starts.
        ensure!(f.is_finite() && f > 0.0, "--cache-ageing {f}: counts are halved after a positive number of accesses per slot");
    }
    ensure!(!(a.embedding && a.cache_ageing.is_some()), "--cache-ageing: the embedding path keeps its node cache's default ageing");
    if let Some(r) = a.cache_ratio {
        wm_gather::cache::check_ratio(r)?;
        ensure!(
            matches!(a.ty, MemoryType::Distributed | MemoryType::Hierarchy),
            "--cache-ratio: a node cache is for distributed and hierarchy tables across nodes, not {} memory",
            a.ty
        );
    }
    ensure!(a.location == Location::Host && !a.device_out(), "--cache-ratio and --embedding gather host tables into host memory");
    if a.embedding {
        ensure!(
            matches!(a.shape.dtype, DType::F32 | DType::F16 | DType::Bf16),
            "--embedding: embeddings are f32, f16 or bf16, not {}",
            a.shape.dtype
        );
        ensure!(a.out_dtype.is_none_or(|d| d == DType::F32), "--embedding gathers into f32");
    }
    Ok(())
}

/// The path under test, and the plain gather of the same table.
trait Path {
    fn mem(&self) -> &WholeMemory;
    /// Seconds of one gather by the path under test.
    fn timed(&mut self, ids: &[i64], out: &mut [u8], out_dt: DType) -> Result<f64>;
    /// The cache: its statistics, its slots and the rows it may hold.
    fn cache(&self) -> Option<(CacheStats, usize, usize)>;
    /// Cached calls that took the uncached path (where the path knows).
    fn bypassed(&self) -> Option<u64> {
        None
    }
    fn free(self: Box<Self>) -> Result<()>;
}

/// `wm_gather` through a [`NodeCache`].
struct TablePath {
    mem: WholeMemory,
    cache: NodeCache,
}

impl Path for TablePath {
    fn mem(&self) -> &WholeMemory {
        &self.mem
    }

    fn timed(&mut self, ids: &[i64], out: &mut [u8], out_dt: DType) -> Result<f64> {
        let t0 = Instant::now();
        self.cache.gather(&self.mem, Ids::I64(ids), out, out_dt)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    fn cache(&self) -> Option<(CacheStats, usize, usize)> {
        Some((self.cache.stats(), self.cache.capacity(), self.cache.remote_rows()))
    }

    fn bypassed(&self) -> Option<u64> {
        Some(self.cache.bypassed_calls())
    }

    fn free(self: Box<Self>) -> Result<()> {
        let Self { mem, cache } = *self;
        cache.free()?;
        mem.free()?;
        Ok(())
    }
}

/// `Embedding::gather`, with its node cache when one is asked for.
struct EmbeddingPath<T: EmbeddingElement> {
    emb: Embedding<T>,
    rows: Vec<f32>,
}

impl<T: EmbeddingElement> Path for EmbeddingPath<T> {
    fn mem(&self) -> &WholeMemory {
        self.emb.table().memory()
    }

    fn timed(&mut self, ids: &[i64], out: &mut [u8], _out_dt: DType) -> Result<f64> {
        self.rows.resize(ids.len() * self.emb.dim(), 0.0);
        let t0 = Instant::now();
        self.emb.gather(ids, &mut self.rows)?;
        let dt = t0.elapsed().as_secs_f64();
        out.copy_from_slice(bytemuck::cast_slice(&self.rows));
        Ok(dt)
    }

    fn cache(&self) -> Option<(CacheStats, usize, usize)> {
        let stats = self.emb.node_cache_stats()?;
        let (_, capacity, remote) = self.emb.node_cache_rows()?;
        Some((stats, capacity, remote))
    }

    fn free(self: Box<Self>) -> Result<()> {
        self.emb.free()?;
        Ok(())
    }
}

fn embedding_path<T: EmbeddingElement>(world: &Arc<dyn Communicator>, a: &MoveArgs, rows: usize) -> Result<Box<dyn Path>> {
    let mut emb = Embedding::<T>::allocate(world, a.ty, a.location, rows, a.shape.dim, None, None)?;
    values::fill(emb.table_mut().memory_mut(), a.shape.dim, a.shape.dtype)?;
    world.barrier()?;
    if let Some(r) = a.cache_ratio {
        emb.enable_node_cache(r)?;
        emb.set_node_cache_bypass(a.cache_bypass.mode());
    }
    Ok(Box::new(EmbeddingPath { emb, rows: Vec::new() }))
}

/// The rows the node asked most often, filling `capacity` slots: the hits
/// of the best static choice, over `total` lookups. Collective over the
/// node's ranks (`local`), each passing its own counts.
fn best_static(local: &dyn Communicator, counts: &HashMap<u64, u64>, capacity: usize) -> Result<(u64, u64)> {
    let mine: Vec<u64> = counts.iter().flat_map(|(&id, &c)| [id, c]).collect();
    let all = local.allgatherv_pod(&mine)?;
    let mut merged: HashMap<u64, u64> = HashMap::new();
    for rank_counts in &all {
        for pair in rank_counts.chunks_exact(2) {
            *merged.entry(pair[0]).or_default() += pair[1];
        }
    }
    let mut freq: Vec<u64> = merged.into_values().collect();
    let total = freq.iter().sum();
    freq.sort_unstable_by(|a, b| b.cmp(a));
    Ok((freq.iter().take(capacity).sum(), total))
}

/// The rows a static cache of `capacity` slots would hold if it knew the
/// ids' distribution: the remote rows (`remote`) most likely to be asked,
/// by the distribution's own probabilities — Zipf ranks in order, mapped to
/// rows as the ids are (for uniform ids every row is as likely: the first
/// remote rows in table order), in hot-set phase `phase` (`--id-drift`). A
/// table-sized bitmap.
fn likeliest(dist: IdDist, rows: usize, capacity: usize, phase: u64, remote: impl Fn(i64) -> bool) -> Vec<bool> {
    let mut held = vec![false; rows];
    let mut n = 0;
    let a = crate::ids::spread(rows as u64);
    for k in 1..=rows as u64 {
        if n >= capacity {
            break;
        }
        let row = match dist {
            IdDist::Zipf(_) => crate::ids::row_of_rank(crate::ids::drifted(k, rows as u64, phase), rows as u64, a),
            IdDist::Uniform => k - 1,
        };
        if remote(row as i64) {
            held[row as usize] = true;
            n += 1;
        }
    }
    held
}

/// The cached run, on every rank: the path under test, the batches through
/// it and through the plain gather, every rank's figures, rank 0's report.
///
/// # Errors
/// Bad options, an unsupported table, a failed gather, a lost peer.
pub(crate) fn bench(world: &Arc<dyn Communicator>, a: &MoveArgs) -> Result<i32> {
    let (me, n) = (world.rank(), world.size());
    let out_dt = a.out_dtype.unwrap_or(if a.embedding { DType::F32 } else { a.shape.dtype });
    let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
    if let Some(reason) = wholemem::query(world.as_ref(), a.ty, a.location).reason() {
        bail!("{} {} memory on {n} ranks: {reason}", a.location, a.ty);
    }
    let run = Run { a, rows, out_dt, layout: RowLayout::new(a.shape.dtype, a.shape.dim, 0)? };
    let mut path = run.open_path(world)?;
    let placement = wm_topology::NodeLayout::of(world.nodes());
    let p = path.mem().partition().clone();
    let remote = |id: i64| placement.node[p.owner(id as usize)] != placement.node[me];
    let mut base = if me == 0 { Some(Baseline::new(Op::Gather, a, rows, out_dt)) } else { None };
    let seen = run.batches(world.as_ref(), path.as_mut(), base.as_mut(), &remote)?;

    let phases = if a.profile { Some(report::Phases::gather(world.as_ref(), &seen.profile)?) } else { None };
    let cache = path.cache();
    let bypassed = path.bypassed();
    let mine = run.rank_figures(world.as_ref(), &seen, cache, &remote)?;
    let all = world.allgather_pod(&mine)?;
    let baseline = base.as_ref().map_or(0.0, Baseline::gbps);
    drop(base);
    path.free()?;

    let wrong_total: f64 = all.chunks(mine.len()).map(|c| c[2]).sum();
    let verified = wrong_total == 0.0;
    if me == 0 {
        let figures = run.cache_figures(&all, mine.len(), &placement, cache, baseline);
        let nodes = placement.nodes;
        if a.json {
            run.print_json(&figures, n, nodes, verified, bypassed, phases.as_ref());
        } else {
            run.print_text(&figures, n, nodes, bypassed, wrong_total, phases.as_ref());
        }
    }
    Ok(if verified { 0 } else { 3 })
}

/// What every phase of a cached run shares.
struct Run<'a> {
    a: &'a MoveArgs,
    rows: usize,
    /// The output's element type.
    out_dt: DType,
    layout: RowLayout,
}

/// What the batches saw on one rank.
struct Seen {
    /// Seconds of the timed calls of the path under test, and of the plain
    /// gather.
    secs_test: f64,
    secs_plain: f64,
    /// Rows that came out wrong, by either.
    wrong: u64,
    /// How often the timed batches asked for each remote row.
    counts: HashMap<u64, u64>,
    /// Timed lookups of a remote row this rank had not asked for before.
    first_seen: u64,
    /// The cache's statistics when the timed batches began.
    before: CacheStats,
    /// The path under test's timed calls (`--profile`).
    profile: wm_gather::profile::Profile,
    /// CPU time and wait for a CPU of the timed calls, the path under
    /// test's and the plain gather's (`--profile`, where the kernel says).
    sched: [Option<Sched>; 2],
}

impl Run<'_> {
    /// Allocates and fills the table, behind the path under test. Collective.
    fn open_path(&self, world: &Arc<dyn Communicator>) -> Result<Box<dyn Path>> {
        let (a, rows) = (self.a, self.rows);
        Ok(match (a.embedding, a.shape.dtype) {
            (true, DType::F32) => embedding_path::<f32>(world, a, rows)?,
            (true, DType::F16) => embedding_path::<half::f16>(world, a, rows)?,
            (true, DType::Bf16) => embedding_path::<half::bf16>(world, a, rows)?,
            (true, other) => bail!("--embedding: embeddings are f32, f16 or bf16, not {other}"),
            (false, _) => {
                let ratio = a.cache_ratio.unwrap_or(1.0);
                let row_bytes = a.shape.row_bytes();
                let req = AllocRequest { ty: a.ty, loc: a.location, total: rows * row_bytes, granularity: row_bytes, partition: None };
                let mut mem = WholeMemory::allocate(world, &req)?;
                values::fill(&mut mem, a.shape.dim, a.shape.dtype)?;
                world.barrier()?;
                let mut cache = NodeCache::new(&mem, &self.layout, ratio)?;
                match a.cache_ageing {
                    None => {}
                    Some(Ageing::Off) => cache.set_ageing(None)?,
                    Some(Ageing::Every(f)) => cache.set_ageing(Some(f))?,
                }
                cache.set_bypass(a.cache_bypass.mode());
                Box::new(TablePath { mem, cache })
            }
        })
    }

    /// The warm-up batches through the path under test, then each timed
    /// batch through it and through the plain gather, both checked, and the
    /// baseline's. Collective.
    fn batches(
        &self,
        world: &dyn Communicator,
        path: &mut dyn Path,
        mut base: Option<&mut Baseline>,
        remote: &dyn Fn(i64) -> bool,
    ) -> Result<Seen> {
        let (a, out_dt) = (self.a, self.out_dt);
        let buf_row = a.shape.dim * out_dt.size();
        let mut buf = vec![0u8; a.batches.batch * buf_row];
        let mut expect = vec![0u8; buf_row];
        let progress = world.rank() == 0 && std::io::stderr().is_terminal();
        let mut s = Seen {
            secs_test: 0.0,
            secs_plain: 0.0,
            wrong: 0,
            counts: HashMap::new(),
            first_seen: 0,
            before: CacheStats::default(),
            profile: wm_gather::profile::Profile::default(),
            sched: [Some(Sched::default()); 2],
        };
        let mut seen: std::collections::HashSet<u64> = std::collections::HashSet::new();
        world.barrier()?;
        for b in 0..a.batches.warmup + a.batches.iters {
            let timed = b >= a.batches.warmup;
            if b == a.batches.warmup {
                s.before = path.cache().map(|c| c.0).unwrap_or_default();
            }
            let ids = batch_ids(a, self.rows, world.rank(), b);
            // Alternate which goes first, so neither always finds the other's
            // traffic in the caches of the machine.
            for k in 0..if timed { 2 } else { 1 } {
                let test_turn = !timed || (k == 0) == (b % 2 == 0);
                world.barrier()?;
                let before = (timed && a.profile).then(Sched::now).flatten();
                let dt = if test_turn {
                    self.test_call(path, &ids, &mut buf, timed, &mut s.profile)?
                } else {
                    self.plain_call(path, &ids, &mut buf)?
                };
                if timed && a.profile {
                    let spent = &mut s.sched[usize::from(!test_turn)];
                    match (before, Sched::now(), spent.as_mut()) {
                        (Some(b), Some(after), Some(total)) => total.add(after.since(b)),
                        _ => *spent = None,
                    }
                }
                if timed {
                    if test_turn {
                        s.secs_test += dt;
                    } else {
                        s.secs_plain += dt;
                    }
                }
                for (i, &id) in ids.iter().enumerate() {
                    values::row(id as usize, a.shape.dim, a.shape.dtype, out_dt, &mut expect);
                    s.wrong += u64::from(buf[i * buf_row..][..buf_row] != expect[..]);
                }
            }
            for &id in ids.iter().filter(|&&id| remote(id)) {
                let new = seen.insert(id as u64);
                if timed {
                    *s.counts.entry(id as u64).or_default() += 1;
                    s.first_seen += u64::from(new);
                }
            }
            world.barrier()?;
            if let Some(base) = base.as_deref_mut() {
                base.batch(&ids, timed);
            }
            if progress {
                eprint!("\rgather batch {}/{}", b + 1, a.batches.warmup + a.batches.iters);
            }
        }
        if progress {
            eprintln!();
        }
        Ok(s)
    }

    /// One call of the path under test (only its timed calls profiled).
    /// Seconds.
    fn test_call(
        &self,
        path: &mut dyn Path,
        ids: &[i64],
        buf: &mut [u8],
        timed: bool,
        profile: &mut wm_gather::profile::Profile,
    ) -> Result<f64> {
        if timed && self.a.profile {
            wm_gather::profile::record();
        }
        let dt = path.timed(ids, buf, self.out_dt)?;
        if timed && self.a.profile {
            profile.merge(&wm_gather::profile::take());
        }
        Ok(dt)
    }

    /// One plain uncached gather of the same table. Seconds.
    fn plain_call(&self, path: &dyn Path, ids: &[i64], buf: &mut [u8]) -> Result<f64> {
        let t0 = Instant::now();
        wm_gather::gather(path.mem(), &self.layout, Ids::I64(ids), buf, self.out_dt)?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// This rank's figures, in the order `cache_figures` reads them: the
    /// node's hit rate over the timed batches and the best static choice's
    /// for the same ids. Collective over each node's ranks.
    fn rank_figures(
        &self,
        world: &dyn Communicator,
        s: &Seen,
        cache: Option<(CacheStats, usize, usize)>,
        remote: &dyn Fn(i64) -> bool,
    ) -> Result<[f64; 18]> {
        let a = self.a;
        let window = cache.map(|c| c.0.since(&s.before)).unwrap_or_default();
        let local = world.local();
        // The static choice by the distribution's own probabilities (with
        // --id-drift: the hot set of the first timed batch).
        let held = likeliest(a.id_dist, self.rows, cache.map_or(0, |c| c.1), a.phase(a.batches.warmup), remote);
        let true_hits: u64 = s.counts.iter().filter(|(id, _)| held[**id as usize]).map(|(_, c)| c).sum();
        let true_node = local.allgather_pod(&[true_hits])?.iter().sum::<u64>();
        let node = local.allgather_pod(&[window.lookups, window.hits])?;
        let (node_lookups, node_hits) = node.chunks(2).fold((0, 0), |(l, h), c| (l + c[0], h + c[1]));
        let capacity = cache.map_or(0, |c| c.1);
        let (best_hits, best_total) = best_static(local.as_ref(), &s.counts, capacity)?;
        let rate = |h: u64, t: u64| if t == 0 { 0.0 } else { h as f64 / t as f64 };
        let gbps = |secs: f64| self.bytes() / secs.max(1e-12) / 1e9;
        let totals = cache.map(|c| c.0).unwrap_or_default();
        // Milliseconds a timed call (-1: not measured).
        let per_call = |ns: Option<u64>| ns.map_or(-1.0, |ns| ns as f64 / 1e6 / a.batches.iters.max(1) as f64);
        let [test, plain] = s.sched;
        Ok([
            gbps(s.secs_test),
            gbps(s.secs_plain),
            s.wrong as f64,
            rate(node_hits, node_lookups),
            rate(best_hits, best_total),
            totals.lookups as f64,
            totals.hits as f64,
            totals.fills as f64,
            totals.evictions as f64,
            totals.writebacks as f64,
            s.secs_test,
            s.secs_plain,
            rate(s.first_seen, s.counts.values().sum()),
            rate(true_node, best_total),
            per_call(test.map(|t| t.cpu_ns)),
            per_call(test.map(|t| t.wait_ns)),
            per_call(plain.map(|t| t.cpu_ns)),
            per_call(plain.map(|t| t.wait_ns)),
        ])
    }

    /// Bytes of output of a rank's timed batches.
    fn bytes(&self) -> f64 {
        (self.a.batches.iters * self.a.batches.batch * self.a.shape.dim * self.out_dt.size()) as f64
    }

    /// Every rank's figures (`all`, `width` of them a rank) as rank 0
    /// reports them.
    fn cache_figures(
        &self,
        all: &[f64],
        width: usize,
        placement: &wm_topology::NodeLayout,
        cache: Option<(CacheStats, usize, usize)>,
        baseline: f64,
    ) -> CacheFigures {
        let a = self.a;
        let n = all.len() / width;
        let bytes = self.bytes();
        let col = |i: usize| -> Vec<f64> { all.chunks(width).map(|c| c[i]).collect() };
        let (test, plain) = (Spread::of(&col(0)), Spread::of(&col(1)));
        let slowest = |i: usize| col(i).into_iter().fold(0.0f64, f64::max);
        let per_node = |v: &[f64]| -> f64 { v.iter().enumerate().filter(|(r, _)| placement.local[*r] == 0).map(|(_, x)| x).sum() };
        CacheFigures {
            path: if a.embedding { "embedding" } else { "table" },
            ratio: a.cache_ratio,
            capacity: cache.map_or(0, |c| c.1),
            remote_rows: cache.map_or(0, |c| c.2),
            test,
            test_total: bytes * n as f64 / slowest(10).max(1e-12) / 1e9,
            uncached: plain,
            uncached_total: bytes * n as f64 / slowest(11).max(1e-12) / 1e9,
            speedup: test.median / plain.median,
            baseline,
            hit_rate: Spread::of(&col(3)),
            best_static: Spread::of(&col(4)),
            gap: col(4).iter().zip(col(3)).map(|(b, h)| b - h).fold(f64::MIN, f64::max),
            first_seen: Spread::of(&col(12)),
            likeliest: Spread::of(&col(13)),
            // Every rank measured, or the figures say nothing.
            sched: (a.profile && (14..18).all(|i| col(i).iter().all(|&x| x >= 0.0))).then(|| report::SchedFigures {
                cached_wall: Spread::of(&col(10).iter().map(|s| s * 1e3 / a.batches.iters.max(1) as f64).collect::<Vec<_>>()),
                uncached_wall: Spread::of(&col(11).iter().map(|s| s * 1e3 / a.batches.iters.max(1) as f64).collect::<Vec<_>>()),
                cached_cpu: Spread::of(&col(14)),
                cached_wait: Spread::of(&col(15)),
                uncached_cpu: Spread::of(&col(16)),
                uncached_wait: Spread::of(&col(17)),
            }),
            // Lookups and hits are each rank's, fills and evictions each
            // node's (counted once, at its first rank).
            stats: CacheStats {
                lookups: col(5).iter().sum::<f64>() as u64,
                hits: col(6).iter().sum::<f64>() as u64,
                fills: per_node(&col(7)) as u64,
                evictions: per_node(&col(8)) as u64,
                writebacks: col(9).iter().sum::<f64>() as u64,
            },
        }
    }

    /// The report as one JSON line.
    fn print_json(
        &self,
        figures: &CacheFigures,
        n: usize,
        nodes: usize,
        verified: bool,
        bypassed: Option<u64>,
        phases: Option<&report::Phases>,
    ) {
        let a = self.a;
        let mut j = serde_json::json!({
            "op": "gather", "type": a.ty.name(), "location": a.location.name(), "ranks": n, "nodes": nodes,
            "rows": self.rows, "dim": a.shape.dim, "dtype": a.shape.dtype.name(), "out_dtype": self.out_dt.name(), "batch": a.batches.batch,
            "iters": a.batches.iters, "warmup": a.batches.warmup, "id_dist": a.id_dist.to_string(), "verified": verified,
        });
        if let Some(n) = a.id_drift {
            j["id_drift"] = n.into();
        }
        if let Some(g) = a.cache_ageing {
            j["cache_ageing"] = g.to_string().into();
        }
        if let Some(b) = bypassed {
            j["cache_bypassed_calls"] = b.into();
        }
        figures.extend_json(&mut j);
        if let Some(p) = phases {
            j["profile"] = p.json();
        }
        report::json_line(&j);
    }

    /// The report as text.
    fn print_text(
        &self,
        figures: &CacheFigures,
        n: usize,
        nodes: usize,
        bypassed: Option<u64>,
        wrong_total: f64,
        phases: Option<&report::Phases>,
    ) {
        let a = self.a;
        println!(
            "gather host {} memory through the {} path: {n} ranks on {nodes} node(s), {} rows x {} {} ({:.2} GiB), batches of {} {} ids{} -> {}, {} timed after {} warm-up{}",
            a.ty,
            figures.path,
            self.rows,
            a.shape.dim,
            a.shape.dtype,
            (self.rows * a.shape.row_bytes()) as f64 / (1u64 << 30) as f64,
            a.batches.batch,
            a.id_dist,
            a.id_drift.map(|n| format!(" (hot set moved every {n} batches)")).unwrap_or_default(),
            self.out_dt,
            a.batches.iters,
            a.batches.warmup,
            a.cache_ageing.map(|g| format!(", cache ageing {g}")).unwrap_or_default()
        );
        figures.print();
        if let Some(b) = bypassed {
            println!("cache bypassed (uncached path taken) in {b} of {} cached calls", a.batches.warmup + a.batches.iters);
        }
        report::print_verified(wrong_total);
        if let Some(p) = phases {
            p.print();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_likeliest_rows_are_the_first_zipf_ranks_that_are_remote() {
        let rows = 1000;
        let a = crate::ids::spread(rows as u64);
        // Rows below 500 are this node's.
        let remote = |id: i64| id >= 500;
        let held = likeliest(IdDist::Zipf(1.1), rows, 10, 0, remote);
        assert_eq!(held.iter().filter(|&&h| h).count(), 10);
        let mut want = Vec::new();
        for k in 1..=rows as u64 {
            let r = crate::ids::row_of_rank(k, rows as u64, a) as usize;
            if r >= 500 && want.len() < 10 {
                want.push(r);
            }
        }
        assert!(want.iter().all(|&r| held[r]), "{want:?}");
        // Uniform: every row as likely, the first remote rows in order.
        let held = likeliest(IdDist::Uniform, rows, 3, 0, remote);
        assert_eq!(held.iter().enumerate().filter(|(_, h)| **h).map(|(r, _)| r).collect::<Vec<_>>(), vec![500, 501, 502]);
        // More slots than remote rows: all of them.
        assert_eq!(likeliest(IdDist::Uniform, rows, 5000, 0, remote).iter().filter(|&&h| h).count(), 500);
    }
}
