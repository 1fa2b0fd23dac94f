//! `wm-bench load`: load a table from sharded files with every rank
//! reading its own rows in parallel, against one process reading the same
//! files sequentially.
//!
//! First the ranks write `--write-shards N` files of known content (the
//! table holds [`values::at`] of row and column), with deliberately uneven
//! rows per shard, into `--dir` (default: a fresh directory under the
//! system's temporary directory, removed afterwards). The files are synced
//! (so no writeback runs during the timed loads) and stay in the page
//! cache, so the figures are of reading cached files: memory copies out of
//! the page cache, not disk bandwidth. Then, `--iters` times: every
//! rank loads its rows ([`wholemem::files::load`], timed from a barrier to
//! the end of the call, layout discovery and agreement included), and rank
//! 0 alone, while the others wait, runs the baseline: the same files read
//! with plain sequential `read` calls into one buffer of the table's size,
//! headers included. The last load and the last baseline are verified row
//! by row.
//!
//! Figures are decimal GB/s of table bytes: per rank (its rows over its
//! time), all ranks (the table over the slowest rank's time, per
//! iteration), the baseline, and `ratio = all ranks / baseline`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use wholemem::agree::{Rule, agree};
use wholemem::files::npy::Header;
use wholemem::files::{RowFormat, ShardSet};
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator};
use wm_gather::DType;

use crate::ranks::{RankArgs, Started};
use crate::report::{self, Speeds, Spread};
use crate::shape::ShapeArgs;
use crate::values;

/// The options of `wm-bench load`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("rows", |r| r.help("Rows in the table [default: a 512 MiB table]")),
    mut_arg("dtype", |d| d.help("The table's element type (bf16 needs --format raw: numpy has no bf16)")),
)]
pub struct LoadArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "chunked")]
    pub ty: MemoryType,
    /// Location: host (device memory cannot be loaded yet).
    #[arg(long, default_value = "host")]
    pub location: Location,
    /// The local ranks to start without a launcher.
    #[command(flatten)]
    pub ranks: RankArgs,
    /// The table's shape.
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// Timed loads.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Write this many shards (rows per shard deliberately uneven) before loading.
    #[arg(long, default_value_t = 8)]
    pub write_shards: usize,
    /// Directory of the shards; kept afterwards [default: a fresh directory under the system's
    /// temporary directory, removed afterwards].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Do not write: load the --write-shards files an earlier run left in --dir (same --rows,
    /// --dim, --dtype, --format).
    #[arg(long, requires = "dir")]
    pub reuse: bool,
    /// File format.
    #[arg(long, value_enum, default_value = "npy")]
    pub format: Format,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The shards' file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `shard_NNNN.npy`.
    Npy,
    /// `shard_NNNN.bin`, raw rows.
    Raw,
}

const DEFAULT_TABLE_BYTES: usize = 512 << 20;

/// Runs `wm-bench load`: starts `--ranks` local ranks when no launcher did,
/// then benchmarks. Returns the exit code (3 when verification failed).
///
/// # Errors
/// Bad options, files that cannot be written, a failed load.
pub fn start(a: &LoadArgs) -> Result<i32> {
    ensure!(a.shape.dim > 0 && a.iters > 0 && a.write_shards > 0, "--dim, --iters and --write-shards must be positive");
    if a.shape.dtype == DType::Bf16 && a.format == Format::Npy {
        bail!("--dtype bf16 needs --format raw: numpy has no bf16 element type");
    }
    match a.ranks.start()? {
        Started::Launched(code) => Ok(code),
        Started::Rank(world) => bench(&world, a),
    }
}

/// Rows per shard: uneven on purpose (weights 1, 2, 3, 1, 2, 3, …), all of
/// `rows` in all.
pub fn shard_rows(rows: usize, shards: usize) -> Vec<usize> {
    let weights: Vec<usize> = (0..shards).map(|i| 1 + i % 3).collect();
    let total: usize = weights.iter().sum();
    let mut counts: Vec<usize> = weights.iter().map(|w| rows * w / total).collect();
    let short = rows - counts.iter().sum::<usize>();
    *counts.last_mut().expect("at least one shard") += short;
    counts
}

fn shard_path(dir: &Path, i: usize, format: Format) -> PathBuf {
    dir.join(format!("shard_{i:04}.{}", if format == Format::Npy { "npy" } else { "bin" }))
}

/// Writes shard `i`: rows `first..first + count` of the known table.
fn write_shard(path: &Path, first: usize, count: usize, dim: usize, dtype: DType, format: Format) -> Result<()> {
    let mut f = std::io::BufWriter::with_capacity(8 << 20, File::create(path).with_context(|| format!("creating {}", path.display()))?);
    if format == Format::Npy {
        let descr = dtype.npy_descr().context("no NPY element type")?;
        f.write_all(&Header::new(descr, &[count as u64, dim as u64]).to_bytes())?;
    }
    let es = dtype.size();
    let mut row = vec![0u8; dim * es];
    for r in first..first + count {
        for c in 0..dim {
            dtype.write_f64(&mut row[c * es..][..es], values::at(r, c, dtype));
        }
        f.write_all(&row)?;
    }
    // Flushed to disk now, so that background writeback does not compete
    // with the timed loads; the pages stay in the page cache.
    f.into_inner().map_err(|e| e.into_error())?.sync_data().with_context(|| format!("syncing {}", path.display()))?;
    Ok(())
}

/// Rows of `buf` (starting at global row `first`) that differ from the
/// known table.
fn wrong_rows(buf: &[u8], first: usize, dim: usize, dtype: DType) -> u64 {
    let rb = dim * dtype.size();
    let mut expect = vec![0u8; rb];
    let mut wrong = 0;
    for (i, row) in buf.chunks(rb).enumerate() {
        values::row(first + i, dim, dtype, dtype, &mut expect);
        wrong += u64::from(row != expect.as_slice());
    }
    wrong
}

/// Removes the shard directory on drop (when the benchmark made it).
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(d) = &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Every rank learns whether every rank succeeded; the lowest failing
/// rank's error is the error everywhere ([`wholemem::agree::agree`]).
fn all_ok(world: &Arc<dyn Communicator>, r: Result<()>) -> Result<()> {
    let mine = r.map_err(|e| wholemem::Error::from(wholemem::CommonError::InvalidArgument(format!("{e:#}"))));
    Ok(agree(world.as_ref(), mine, Rule::Lowest)?)
}

/// The shards' directory: `--dir`, or rank 0's fresh one, told to the
/// others. Collective.
fn shard_dir(world: &dyn Communicator, a: &LoadArgs) -> Result<PathBuf> {
    let mut dir_bytes = match &a.dir {
        Some(d) => d.to_string_lossy().into_owned().into_bytes(),
        None if world.rank() == 0 => {
            let d = std::env::temp_dir().join(format!("wm-bench-load.{}", std::process::id()));
            d.to_string_lossy().into_owned().into_bytes()
        }
        None => Vec::new(),
    };
    world.broadcast(0, &mut dir_bytes)?;
    Ok(PathBuf::from(String::from_utf8(dir_bytes).context("the shard directory is not UTF-8")?))
}

/// Makes `dir` (rank 0) and writes the shards, shard i by rank i % ranks.
/// Collective.
fn write_shards(world: &Arc<dyn Communicator>, a: &LoadArgs, dir: &Path, paths: &[PathBuf], counts: &[usize]) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let made = if me == 0 { std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display())) } else { Ok(()) };
    all_ok(world, made)?;
    let wrote = (me..counts.len()).step_by(n).try_for_each(|i| {
        let first: usize = counts[..i].iter().sum();
        write_shard(&paths[i], first, counts[i], a.shape.dim, a.shape.dtype, a.format)
    });
    all_ok(world, wrote)
}

/// The benchmark proper, on every rank.
///
/// # Errors
/// Files that cannot be written or read, a failed load, a lost peer.
pub fn bench(world: &Arc<dyn Communicator>, a: &LoadArgs) -> Result<i32> {
    let (me, n) = (world.rank(), world.size());
    let elem = a.shape.dtype;
    let row_bytes = a.shape.row_bytes();
    let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
    let counts = shard_rows(rows, a.write_shards);

    let dir = shard_dir(world.as_ref(), a)?;
    let _cleanup = Cleanup((me == 0 && a.dir.is_none()).then(|| dir.clone()));
    let paths: Vec<PathBuf> = (0..counts.len()).map(|i| shard_path(&dir, i, a.format)).collect();
    if !a.reuse {
        write_shards(world, a, &dir, &paths, &counts)?;
    }

    if let Some(reason) = wholemem::query(world.as_ref(), a.ty, a.location).reason() {
        bail!("{} {} memory on {n} ranks: {reason}", a.location, a.ty);
    }
    let req = AllocRequest { ty: a.ty, loc: a.location, total: rows * row_bytes, granularity: row_bytes, partition: None };
    let mut mem = WholeMemory::allocate(world, &req)?;
    let format = RowFormat::vector(elem, a.shape.dim);
    let set = match a.format {
        Format::Npy => ShardSet::npy_dir(&dir),
        Format::Raw => ShardSet::raw_files(&paths),
    };
    let mut baseline = if me == 0 { Some(Baseline::new(rows * row_bytes)) } else { None };

    // One untimed load first (it also reads the files into the page cache
    // when they come from an earlier run).
    let mut loaded = wholemem::files::load(&mut mem, &format, &set)?;
    let mut times = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
        // Poison the rows, so the verified last load must have written them all.
        mem.write_local(&vec![0xA5; mem.local_rows().len() * row_bytes])?;
        world.barrier()?;
        let t0 = Instant::now();
        loaded = wholemem::files::load(&mut mem, &format, &set)?;
        times.push(t0.elapsed().as_secs_f64());
        world.barrier()?;
        if let Some(b) = &mut baseline {
            b.run(&paths, a.format)?;
        }
    }
    let first = mem.local_rows().start;
    let mut rows_read = vec![0u8; mem.local_rows().len() * row_bytes];
    mem.read_local(&mut rows_read)?;
    let wrong = wrong_rows(&rows_read, first, a.shape.dim, a.shape.dtype);
    let base_wrong = baseline.as_ref().map_or(0, |b| wrong_rows(&b.buf, 0, a.shape.dim, a.shape.dtype));
    let local_bytes = loaded.bytes as f64;
    let mut mine = times.clone();
    mine.extend([local_bytes, wrong as f64, loaded.threads as f64]);
    let all = world.allgather_pod(&mine)?;
    let nodes = wm_topology::NodeLayout::of(world.nodes()).nodes;
    mem.free()?;
    if me != 0 {
        return Ok(if all.chunks(a.iters + 3).all(|r| r[a.iters + 1] == 0.0) { 0 } else { 3 });
    }
    let per_rank: Vec<&[f64]> = all.chunks(a.iters + 3).collect();
    let gbps: Vec<f64> = per_rank.iter().map(|r| a.iters as f64 * r[a.iters] / r[..a.iters].iter().sum::<f64>().max(1e-12) / 1e9).collect();
    let slowest: f64 = (0..a.iters).map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max)).sum();
    let table_bytes = (rows * row_bytes) as f64;
    let total = a.iters as f64 * table_bytes / slowest.max(1e-12) / 1e9;
    let base = baseline.as_ref().map_or(0.0, Baseline::gbps);
    let ratio = total / base;
    let wrong_total: f64 = per_rank.iter().map(|r| r[a.iters + 1]).sum::<f64>() + base_wrong as f64;
    let verified = wrong_total == 0.0;
    let threads: Vec<usize> = per_rank.iter().map(|r| r[a.iters + 2] as usize).collect();
    let speeds = Speeds { per_rank: Spread::of(&gbps), total, baseline: base, ratio };
    LoadReport { ranks: n, nodes, rows, counts: &counts, threads, speeds, wrong_total, dir: &dir }.print(a);
    Ok(if verified { 0 } else { 3 })
}

/// What rank 0 reports of a load run.
struct LoadReport<'a> {
    ranks: usize,
    nodes: usize,
    rows: usize,
    /// Rows per shard.
    counts: &'a [usize],
    threads: Vec<usize>,
    speeds: Speeds,
    wrong_total: f64,
    dir: &'a Path,
}

impl LoadReport<'_> {
    /// As one JSON line with `--json`, else as text.
    fn print(&self, a: &LoadArgs) {
        let (n, nodes, rows, counts, threads) = (self.ranks, self.nodes, self.rows, self.counts, &self.threads);
        let (s, total, base, ratio) = (self.speeds.per_rank, self.speeds.total, self.speeds.baseline, self.speeds.ratio);
        if a.json {
            let j = serde_json::json!({
                "op": "load", "type": a.ty.name(), "location": a.location.name(), "ranks": n, "nodes": nodes,
                "rows": rows, "dim": a.shape.dim, "dtype": a.shape.dtype.name(), "format": if a.format == Format::Npy { "npy" } else { "raw" },
                "shards": counts.len(), "shard_rows": counts, "threads_per_rank": threads, "iters": a.iters,
                "gbps_per_rank": s, "gbps_total": total, "baseline_gbps": base, "ratio": ratio, "verified": self.wrong_total == 0.0,
                "dir": self.dir.display().to_string(),
            });
            report::json_line(&j);
        } else {
            println!(
                "load {} {} memory: {n} ranks on {nodes} node(s), {rows} rows x {} {} ({:.2} GiB) from {} {} shards of {:?} rows, {} timed",
                a.location,
                a.ty,
                a.shape.dim,
                a.shape.dtype,
                (rows * a.shape.row_bytes()) as f64 / (1u64 << 30) as f64,
                counts.len(),
                if a.format == Format::Npy { "NPY" } else { "raw" },
                counts,
                a.iters
            );
            println!("  threads per rank {threads:?}");
            self.speeds.print("one process reading the files in order with plain reads into one buffer", "all ranks / baseline");
            report::print_verified(self.wrong_total);
        }
    }
}

/// The same files read by one process, in order, with plain reads into one
/// buffer of the table's size.
struct Baseline {
    buf: Vec<u8>,
    seconds: f64,
    bytes: f64,
}

impl Baseline {
    fn new(bytes: usize) -> Self {
        // Touched now, so page faults are not timed.
        Self { buf: vec![0x5Au8; bytes], seconds: 0.0, bytes: 0.0 }
    }

    fn run(&mut self, paths: &[PathBuf], format: Format) -> Result<()> {
        let t0 = Instant::now();
        let mut at = 0usize;
        let mut header = Vec::new();
        for p in paths {
            let mut f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
            let len = f.metadata()?.len() as usize;
            let data = if format == Format::Npy {
                // The header is read with the same plain reads, then parsed.
                header.resize(len.min(4096), 0);
                f.read_exact(&mut header)?;
                let parsed = Header::parse(&header).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                let skip = parsed.data_offset as usize;
                let in_header = header.len() - skip;
                self.buf[at..at + in_header].copy_from_slice(&header[skip..]);
                at += in_header;
                len - header.len()
            } else {
                len
            };
            f.read_exact(&mut self.buf[at..at + data]).with_context(|| format!("reading {}", p.display()))?;
            at += data;
        }
        self.seconds += t0.elapsed().as_secs_f64();
        self.bytes += at as f64;
        ensure!(at == self.buf.len(), "the baseline read {at} bytes, the table has {}", self.buf.len());
        Ok(())
    }

    fn gbps(&self) -> f64 {
        self.bytes / self.seconds.max(1e-12) / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_rows_are_uneven_and_add_up() {
        let c = shard_rows(1000, 8);
        assert_eq!(c.iter().sum::<usize>(), 1000);
        assert!(c.iter().any(|&x| x != c[0]), "{c:?}");
        assert_eq!(shard_rows(5, 8).iter().sum::<usize>(), 5);
        assert_eq!(shard_rows(7, 1), vec![7]);
    }
}
