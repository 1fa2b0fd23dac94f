//! `wm-bench get`: one-sided reads (`wm-onesided`) of batches of random
//! rows of a table spread over the ranks, every value verified, reported
//! as per-reader GB/s (decimal, output bytes) beside a baseline measured in
//! the same run: the same batches gathered by plain single-threaded code
//! from a private table of the same shape. As in `wm-bench gather`, the
//! baseline batches interleave with the timed ones (rank 0 runs one alone
//! after each batch while the others wait).
//!
//! Only `--readers` ranks read (all by default); the others serve their
//! rows without taking part. `--node-size` poses as several nodes, so that
//! reads between "nodes" take the cross-node transports on one machine.
//! `--publish NAME` keeps a table published for readers outside the job
//! (`--hold-s` seconds); `--join RENDEZVOUS --table NAME` is such a reader.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::ValueEnum;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator, Rendezvous};
use wm_gather::{DType, Ids};
use wm_onesided::{Method, Options, Profile, Reader, Table};

use crate::baseline::Baseline;
use crate::ids::Rng;
use crate::moves::{BaselinePages, DEFAULT_TABLE_BYTES, Op};
use crate::ranks::{RankArgs, Started};
use crate::report::{self, Speeds, Spread};
use crate::shape::{BatchArgs, IdType, ShapeArgs};
use crate::values;

/// The transport of one-sided reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MethodArg {
    /// Shared memory within a node; libfabric across nodes where built with it and a provider is named; else sockets.
    Auto,
    /// The owners' portions mapped read-only (same node).
    Shm,
    /// libfabric RMA reads (the `fabric` feature).
    Fabric,
    /// MPI RMA windows (the `mpi` feature, under mpirun).
    Mpi,
    /// The owners' read servers.
    Socket,
}

impl MethodArg {
    fn method(self) -> Option<Method> {
        match self {
            MethodArg::Auto => None,
            MethodArg::Shm => Some(Method::Shm),
            MethodArg::Fabric => Some(Method::Fabric),
            MethodArg::Mpi => Some(Method::Mpi),
            MethodArg::Socket => Some(Method::Socket),
        }
    }
}

/// The options of `wm-bench get`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    mut_arg("batch", |b| b.default_value("8192").help("Ids per batch, per reader")),
    mut_arg("warmup", |w| w.help("Untimed batches first")),
)]
pub struct GetArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "distributed")]
    pub(crate) ty: MemoryType,
    /// The local ranks to start without a launcher.
    #[command(flatten)]
    pub(crate) ranks: RankArgs,
    /// The table's shape.
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// The output's element type [default: --dtype].
    #[arg(long)]
    pub(crate) out_dtype: Option<DType>,
    /// The batches of ids.
    #[command(flatten)]
    pub(crate) batches: BatchArgs,
    /// Transport of the reads (`WM_ONE_SIDED` where not given).
    #[arg(long, value_enum)]
    pub(crate) method: Option<MethodArg>,
    /// Ranks that read (ranks 0..N); the others only serve [default: every rank].
    #[arg(long)]
    pub(crate) readers: Option<usize>,
    /// Read into a destination registered once (`register_recv`) rather than a plain buffer.
    #[arg(long)]
    pub(crate) registered: bool,
    /// Print the readers' profile (calls, rows, bytes, time waiting for locks, registering, posting, waiting).
    #[arg(long)]
    pub(crate) profile: bool,
    /// Publish the table under this name for readers outside the job, and keep serving for --hold-s seconds.
    #[arg(long, conflicts_with = "join")]
    pub(crate) publish: Option<String>,
    /// How long --publish keeps the table.
    #[arg(long, default_value_t = 600.0)]
    pub(crate) hold_s: f64,
    /// Where --publish makes the table joinable (`dir:/path` or `host:port`) [default: the job's rendezvous].
    #[arg(long, requires = "publish")]
    pub(crate) publish_at: Option<String>,
    /// Read from outside a job: the job's rendezvous (`dir:/path` or `host:port`), with --table.
    #[arg(long, requires = "table")]
    pub(crate) join: Option<String>,
    /// The published table to read with --join.
    #[arg(long, requires = "join")]
    pub(crate) table: Option<String>,
    /// Pages of the baseline's private table: `default` (what plain code gets: on most systems small pages) or
    /// `huge` (transparent huge pages asked for with madvise), to see how much of a ratio is the table's huge pages.
    #[arg(long, value_enum, default_value = "default")]
    pub(crate) baseline_pages: BaselinePages,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

impl GetArgs {
    fn huge_baseline(&self) -> bool {
        self.baseline_pages == BaselinePages::Huge
    }

    fn options(&self) -> Result<Options> {
        let publish_at = self.publish_at.as_deref().map(Rendezvous::parse).transpose()?;
        Ok(Options {
            method: self.method.and_then(MethodArg::method),
            profile: self.profile.then_some(true),
            publish_at,
            ..Options::default()
        })
    }
}

/// Runs `wm-bench get`: an outside reader with `--join`, else starts
/// `--ranks` local ranks when no launcher did, then benchmarks. Returns the
/// exit code (3 when verification failed).
///
/// # Errors
/// Bad options, a failed read, a lost peer.
pub fn start(a: &GetArgs) -> Result<i32> {
    ensure!(a.shape.dim > 0 && a.batches.batch > 0 && a.batches.iters > 0, "--dim, --batch and --iters must be positive");
    a.shape.dtype.check_conversion(a.out_dtype.unwrap_or(a.shape.dtype))?;
    if let Some(m) = a.method.and_then(MethodArg::method)
        && let Err(why) = wm_onesided::available(m)
    {
        bail!("--method {m}: {why}");
    }
    if let (Some(at), Some(name)) = (&a.join, &a.table) {
        return outside(a, &Rendezvous::parse(at)?, name);
    }
    match a.ranks.start()? {
        Started::Launched(code) => Ok(code),
        Started::Rank(world) => match &a.publish {
            Some(name) => publish(&world, a, name),
            None => bench(&world, a),
        },
    }
}

fn table_rows(a: &GetArgs) -> Result<usize> {
    let rows = a.shape.rows_or(DEFAULT_TABLE_BYTES)?;
    if a.batches.ids == IdType::I32 && rows > i32::MAX as usize {
        bail!("--ids i32 cannot address {rows} rows");
    }
    Ok(rows)
}

fn allocate(world: &Arc<dyn Communicator>, a: &GetArgs, rows: usize) -> Result<WholeMemory> {
    if let Some(reason) = wholemem::query(world.as_ref(), a.ty, Location::Host).reason() {
        bail!("host {} memory on {} ranks: {reason}", a.ty, world.size());
    }
    let row_bytes = a.shape.row_bytes();
    let req = AllocRequest { ty: a.ty, loc: Location::Host, total: rows * row_bytes, granularity: row_bytes, partition: None };
    let mut mem = WholeMemory::allocate(world, &req)?;
    values::fill(&mut mem, a.shape.dim, a.shape.dtype)?;
    Ok(mem)
}

/// What one reader measured.
struct Measured {
    seconds: f64,
    bytes: f64,
    wrong: u64,
}

/// Reads `a.batches.warmup + a.batches.iters` batches with `reader`, verifying each; between
/// batches `between(b)` runs (barriers and the baseline in a job).
fn read_batches(
    reader: &Reader,
    a: &GetArgs,
    seed_rank: usize,
    rows: usize,
    mut between: impl FnMut(usize, &[i64]) -> Result<()>,
) -> Result<Measured> {
    let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
    let buf_row = a.shape.dim * out_dt.size();
    let mut plain = Vec::new();
    let mut registered = None;
    if a.registered {
        registered = Some(reader.register_recv(a.batches.batch * buf_row)?);
    } else {
        plain = vec![0u8; a.batches.batch * buf_row];
    }
    let mut expect = vec![0u8; buf_row];
    let (mut seconds, mut wrong) = (0.0f64, 0u64);
    let progress = seed_rank == 0 && std::io::stderr().is_terminal() && !a.json;
    for b in 0..a.batches.warmup + a.batches.iters {
        let mut rng = Rng::new(a.batches.seed, seed_rank, b);
        let ids: Vec<i64> = (0..a.batches.batch).map(|_| rng.below(rows as u64) as i64).collect();
        let narrow: Vec<i32> = if a.batches.ids == IdType::I32 { ids.iter().map(|&x| x as i32).collect() } else { Vec::new() };
        let id_arg = if a.batches.ids == IdType::I32 { Ids::I32(&narrow) } else { Ids::I64(&ids) };
        let buf: &mut [u8] = match registered.as_mut() {
            Some(r) => &mut r[..],
            None => &mut plain[..],
        };
        let t0 = Instant::now();
        reader.get_batch(id_arg, buf, out_dt)?;
        let dt = t0.elapsed().as_secs_f64();
        if b >= a.batches.warmup {
            seconds += dt;
        }
        for (i, &id) in ids.iter().enumerate() {
            values::row(id as usize, a.shape.dim, a.shape.dtype, out_dt, &mut expect);
            wrong += u64::from(buf[i * buf_row..][..buf_row] != expect[..]);
        }
        between(b, &ids)?;
        if progress {
            eprint!("\rget batch {}/{}", b + 1, a.batches.warmup + a.batches.iters);
        }
    }
    if progress {
        eprintln!();
    }
    Ok(Measured { seconds, bytes: (a.batches.iters * a.batches.batch * buf_row) as f64, wrong })
}

/// The benchmark proper, on every rank.
fn bench(world: &Arc<dyn Communicator>, a: &GetArgs) -> Result<i32> {
    let (me, n) = (world.rank(), world.size());
    let readers = a.readers.unwrap_or(n);
    ensure!((1..=n).contains(&readers), "--readers {readers}: between 1 and the {n} ranks");
    let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
    let rows = table_rows(a)?;
    let mem = allocate(world, a, rows)?;
    let huge_pages = mem.huge_page_bytes() as f64 / mem.mapped_bytes().max(1) as f64;
    let table = Table::new(&mem, "wm-bench-get", a.shape.dtype, &a.options()?)?;
    table.publish()?;
    let reader = if me < readers { Some(table.reader()?) } else { None };
    let mut base =
        (me == 0).then(|| Baseline::with(Op::Gather, rows, a.shape.dim, a.shape.dtype, out_dt, a.batches.batch, a.huge_baseline()));
    world.barrier()?;
    let measured = match &reader {
        Some(r) => read_batches(r, a, me, rows, |b, ids| {
            world.barrier()?;
            if let Some(base) = &mut base {
                base.batch(ids, b >= a.batches.warmup);
            }
            Ok(())
        })?,
        None => {
            // Serve only: meet the readers at their barriers.
            for _ in 0..a.batches.warmup + a.batches.iters {
                world.barrier()?;
            }
            Measured { seconds: 0.0, bytes: 0.0, wrong: 0 }
        }
    };
    let stats = world.allgather_pod(&[measured.bytes / measured.seconds.max(1e-12) / 1e9, measured.seconds, measured.wrong as f64])?;
    let profile = reader.as_ref().and_then(Reader::profile);
    let methods = reader.as_ref().map_or(String::new(), Reader::method_names);
    let baseline = base.as_ref().map_or(0.0, Baseline::gbps);
    let baseline_huge = base.as_ref().map_or(0.0, Baseline::huge_fraction);
    drop(base);
    let nodes = wm_topology::NodeLayout::of(world.nodes()).nodes;
    drop(reader);
    world.barrier()?;
    table.free()?;
    mem.free()?;
    let per_reader: Vec<f64> = stats.chunks(3).take(readers).map(|s| s[0]).collect();
    let slowest = stats.chunks(3).map(|s| s[1]).fold(0.0f64, f64::max);
    let wrong_total: f64 = stats.chunks(3).map(|s| s[2]).sum();
    let verified = wrong_total == 0.0;
    if me == 0 {
        let s = Spread::of(&per_reader);
        let total = measured.bytes * readers as f64 / slowest.max(1e-12) / 1e9;
        let ratio = s.median / baseline;
        let ctx = Report { a, rows, ranks: n, nodes: Some(nodes), readers, methods: &methods, profile, huge_pages: Some(huge_pages) };
        ctx.print(&Speeds { per_rank: s, total, baseline, ratio }, verified, wrong_total, baseline_huge);
    }
    Ok(if verified { 0 } else { 3 })
}

/// What the report says beside the speeds.
struct Report<'a> {
    a: &'a GetArgs,
    rows: usize,
    ranks: usize,
    nodes: Option<usize>,
    readers: usize,
    methods: &'a str,
    profile: Option<Profile>,
    /// Of the table rank 0 maps (unknown from outside the job).
    huge_pages: Option<f64>,
}

impl Report<'_> {
    fn print(&self, sp: &Speeds, verified: bool, wrong: f64, baseline_huge: f64) {
        let a = self.a;
        let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
        if a.json {
            let j = serde_json::json!({
                "op": "get", "type": a.ty.name(), "location": "host", "out_location": "host", "ranks": self.ranks, "nodes": self.nodes,
                "rows": self.rows, "dim": a.shape.dim, "dtype": a.shape.dtype.name(), "out_dtype": out_dt.name(),
                "ids": if a.batches.ids == IdType::I32 { "i32" } else { "i64" }, "batch": a.batches.batch, "iters": a.batches.iters,
                "method": self.methods, "readers": self.readers, "registered": a.registered,
                "gbps_per_rank": sp.per_rank, "gbps_total": sp.total, "baseline_gbps": sp.baseline, "ratio": sp.ratio,
                "verified": verified, "huge_pages": self.huge_pages, "baseline_huge_pages": baseline_huge, "profile": self.profile,
            });
            report::json_line(&j);
            return;
        }
        println!(
            "get (one-sided) from host {} memory: {} ranks{}, {} reader(s) by {}, {} rows x {} {} ({:.2} GiB), batches of {} ids -> {}, {} timed",
            a.ty,
            self.ranks,
            self.nodes.map_or(" (joined from outside the job)".to_owned(), |n| format!(" on {n} node(s)")),
            self.readers,
            self.methods,
            self.rows,
            a.shape.dim,
            a.shape.dtype,
            (self.rows * a.shape.dim * a.shape.dtype.size()) as f64 / (1u64 << 30) as f64,
            a.batches.batch,
            out_dt,
            a.batches.iters
        );
        sp.print("one process, one thread, private table", "per-reader median / baseline");
        if let Some(h) = self.huge_pages {
            println!("  huge pages      {:.0}% of the table rank 0 maps, {:.0}% of the baseline's", h * 100.0, baseline_huge * 100.0);
        }
        report::print_verified(wrong);
        if let Some(p) = &self.profile {
            print_profile(p);
        }
    }
}

fn print_profile(p: &Profile) {
    println!(
        "  profile (rank 0) calls {}  rows {}  bytes {}  lock wait {:.4} s  registration {:.4} s ({} misses)  posting {:.4} s  waiting {:.4} s  copying {:.4} s",
        p.calls, p.rows, p.bytes, p.lock_wait_s, p.mr_s, p.mr_misses, p.post_s, p.wait_s, p.copy_s
    );
}

/// `--publish NAME`: fill, publish, keep serving for `--hold-s` seconds.
fn publish(world: &Arc<dyn Communicator>, a: &GetArgs, name: &str) -> Result<i32> {
    let rows = table_rows(a)?;
    let mem = allocate(world, a, rows)?;
    let table = Table::new(&mem, name, a.shape.dtype, &a.options()?)?;
    table.publish()?;
    if world.rank() == 0 {
        match table.published_at() {
            Some(at) => {
                let at = match at {
                    Rendezvous::Dir(d) => format!("dir:{}", d.display()),
                    Rendezvous::Tcp(a) => a.clone(),
                };
                let line = format!(
                    "published {name}: {rows} rows x {} {}; read it with: wm-bench get --join {at} --table {name}",
                    a.shape.dim, a.shape.dtype
                );
                println!("{}", wm_comm::launch::untagged(&line));
            }
            None => bail!("nowhere to publish {name}: set WM_RENDEZVOUS (dir:/path or host:port)"),
        }
    }
    let hold = wm_topology::env::seconds("--hold-s", &a.hold_s.to_string(), true).map_err(anyhow::Error::msg)?;
    std::thread::sleep(hold.min(Duration::from_secs(1 << 30)));
    world.barrier()?;
    table.free()?;
    mem.free()?;
    Ok(0)
}

/// `--join RENDEZVOUS --table NAME`: a reader outside the job.
fn outside(a: &GetArgs, at: &Rendezvous, name: &str) -> Result<i32> {
    let mut opts = a.options()?;
    opts.join_timeout = Some(Duration::from_secs(60));
    let reader = Reader::join(at, name, &opts).with_context(|| format!("joining {name}"))?;
    let info = reader.info();
    // The table's shape and type are the job's: verify against them.
    let mut a = a.clone();
    a.ty = info.memory_type;
    a.shape.dim = info.cols;
    a.shape.dtype = info.dtype;
    a.shape.dtype.check_conversion(a.out_dtype.unwrap_or(a.shape.dtype))?;
    let a = &a;
    let out_dt = a.out_dtype.unwrap_or(a.shape.dtype);
    let mut base = Baseline::with(Op::Gather, info.rows, info.cols, info.dtype, out_dt, a.batches.batch, a.huge_baseline());
    let m = read_batches(&reader, a, 0, info.rows, |b, ids| {
        base.batch(ids, b >= a.batches.warmup);
        Ok(())
    })?;
    let gbps = m.bytes / m.seconds.max(1e-12) / 1e9;
    let baseline = base.gbps();
    let verified = m.wrong == 0;
    let methods = reader.method_names();
    let report = Report {
        a,
        rows: info.rows,
        ranks: info.ranks,
        nodes: None,
        readers: 1,
        methods: &methods,
        profile: reader.profile(),
        huge_pages: None,
    };
    report.print(
        &Speeds { per_rank: Spread::of(&[gbps]), total: gbps, baseline, ratio: gbps / baseline },
        verified,
        m.wrong as f64,
        base.huge_fraction(),
    );
    Ok(if verified { 0 } else { 3 })
}
