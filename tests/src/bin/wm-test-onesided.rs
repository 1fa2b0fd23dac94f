//! One-sided reads with real processes: `wm-test-onesided SCENARIO …`.
//!
//! Rank scenarios (started by the harness, `wm-run` or `mpirun`):
//! - `reads [METHOD]` — every host type the world supports; f32, f64 and
//!   i32 tables with zero-row ranks; i32 and i64 ids with repeats; every
//!   output type a table converts to; `get` across owners; bad ids (an
//!   error naming the id, then a good read), bad buffers, refused
//!   conversions; one reader used by several threads at once.
//! - `busy [METHOD]` — rank 0 reads while every other rank is busy in
//!   collectives of its own and then waits in a barrier: the owners take
//!   no part.
//! - `mirror LOCATION [METHOD]` — tables served through a host mirror:
//!   device tables (`device`, where a GPU is), or host tables forced
//!   through one (`host`): every type the world supports, zero-row ranks;
//!   `publish` refused naming `publish_from`; readers see the snapshot,
//!   not writes made after it, until `publish_from`; a memory of another
//!   shape refused; an error after free.
//! - `fork [METHOD]` — every rank reads, then forks a child (no exec)
//!   that tries the parent's reader: every call must fail with `Forked`
//!   naming `Reader::reopen()`; the child then reopens and reads on its
//!   own, and exits with a status the parent checks; the parent reads on
//!   through its own reader.
//! - `job DIR NAME ROUNDS METHOD TYPE MODE [mirror]` — the job an outside
//!   reader joins: writes epoch `e`'s values, publishes, and waits for the
//!   reader (files in `DIR`) before the next; then `free` (frees and
//!   waits) or `hold` (waits to be killed). With `mirror`, the table is
//!   served through a host mirror and published with `publish_from`.
//!
//! Other processes (not ranks):
//! - `reader DIR NAME ROUNDS METHOD MODE` — joins through the rendezvous
//!   the job wrote to `DIR`, checks `info`, reads every epoch from several
//!   threads, starts a `child` (fork/exec) that joins and reads on its own,
//!   refuses a wrong key; then sees the table gone after the job frees it
//!   (`free`) or after it kills the job's ranks with SIGKILL (`hold`).
//! - `child DIR NAME EPOCH [JOIN_TIMEOUT_S]` — the loader worker: joins
//!   and reads.
//! - `impostor DIR MODE` — a fake read server that breaks the protocol one
//!   way, publishing a record for it in `DIR` (the job's key from
//!   `WM_JOB_KEY`): `stale` answers a connection's second request with
//!   its first answer again (same length, same status, another request's
//!   rows), then expects the reader to close that connection and serves a
//!   new one honestly; `refuse` answers the first request with an error
//!   and expects the next ones on the same connection.
//! - `impostor-reader DIR MODE` — the reader that meets it: for `stale`,
//!   the stale answer must be `Malformed` naming both request ids, never
//!   rows, and the next read must work; for `refuse`, the error answer is
//!   `PeerFailed` and the next reads work.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wm_comm::session::Sealed;

use anyhow::{Context, Result, bail, ensure};
use wholemem::CommonError;
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory, query};
use wm_comm::{Communicator, JobKey, Rendezvous};
use wm_gather::{DType, Ids};
use wm_onesided::{Error as OErr, Method, Options, Reader, Table};
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let scenario = args.first().cloned().unwrap_or_default();
    let rest = &args[1.min(args.len())..];
    let result = match scenario.as_str() {
        "reads" => method(rest.first()).and_then(|m| rank(|w| reads(w, m))),
        "busy" => method(rest.first()).and_then(|m| rank(|w| busy(w, m))),
        "fork" => method(rest.first()).and_then(|m| rank(|w| fork(w, m))),
        "mirror" => method(rest.get(1)).and_then(|m| rank(|w| mirror(w, rest.first().map(String::as_str), m))),
        "job" => rank(|w| job(w, rest)),
        "reader" => outside_reader(rest),
        "child" => child(rest),
        "impostor" => impostor(rest),
        "impostor-reader" => impostor_reader(rest),
        "relay" => relay(rest),
        "relay-reader" => relay_reader(rest),
        other => Err(anyhow::anyhow!("unknown scenario {other:?}")),
    };
    wm_tests::exit_with(result);
}

fn rank(f: impl FnOnce(&Comm) -> Result<()>) -> Result<()> {
    let world = wm_comm::init().context("bootstrap")?;
    f(&world)
}

/// `auto` (or nothing) for automatic, else a method name.
fn method(arg: Option<&String>) -> Result<Option<Method>> {
    match arg.map(String::as_str) {
        None | Some("auto") => Ok(None),
        Some(m) => Ok(Some(m.parse()?)),
    }
}

// ------------------------------------------------------------------ values

/// The value at (row, col) after `epoch` publishes: depends on all three.
fn value(row: usize, col: usize, epoch: u64) -> f64 {
    ((row * 37 + col * 3 + epoch as usize * 1009) % 8191) as f64 - 4000.0
}

/// The bytes a correct read of `row` produces: the table's element, then
/// converted to `out` (the half crate rounds, ints cast).
fn expected(row: usize, cols: usize, epoch: u64, table: DType, out: DType) -> Vec<u8> {
    let mut b = vec![0u8; cols * out.size()];
    let mut stored = [0u8; 8];
    for c in 0..cols {
        table.write_f64(&mut stored[..table.size()], value(row, c, epoch));
        out.write_f64(&mut b[c * out.size()..][..out.size()], table.read_f64(&stored[..table.size()]));
    }
    b
}

/// Writes this rank's rows for `epoch`.
fn fill(mem: &mut WholeMemory, cols: usize, dtype: DType, epoch: u64) -> Result<()> {
    let own = mem.local_rows();
    let mut bytes = vec![0u8; own.len() * cols * dtype.size()];
    for (i, r) in own.clone().enumerate() {
        for c in 0..cols {
            dtype.write_f64(&mut bytes[(i * cols + c) * dtype.size()..][..dtype.size()], value(r, c, epoch));
        }
    }
    mem.write_local(&bytes)?;
    Ok(())
}

/// Checks `out` (rows `ids` read as `out_dt`) against the values of `epoch`.
fn verify(out: &[u8], ids: &[usize], cols: usize, epoch: u64, table: DType, out_dt: DType, ctx: &str) -> Result<()> {
    let rb = cols * out_dt.size();
    ensure!(out.len() == ids.len() * rb, "{ctx}: {} output bytes for {} rows", out.len(), ids.len());
    for (i, &id) in ids.iter().enumerate() {
        let want = expected(id, cols, epoch, table, out_dt);
        if out[i * rb..(i + 1) * rb] != want[..] {
            bail!("{ctx}: output row {i} (id {id}) is wrong: got {:?}…, want {:?}…", &out[i * rb..][..rb.min(16)], &want[..rb.min(16)]);
        }
    }
    Ok(())
}

fn allocate(world: &Comm, ty: MemoryType, rows: usize, cols: usize, dtype: DType, partition: Option<Vec<usize>>) -> Result<WholeMemory> {
    allocate_at(world, ty, Location::Host, rows, cols, dtype, partition)
}

fn allocate_at(
    world: &Comm,
    ty: MemoryType,
    loc: Location,
    rows: usize,
    cols: usize,
    dtype: DType,
    partition: Option<Vec<usize>>,
) -> Result<WholeMemory> {
    let g = cols * dtype.size();
    let req = AllocRequest { ty, loc, total: rows * g, granularity: g, partition };
    Ok(WholeMemory::allocate(world, &req)?)
}

/// The method a reader should have chosen for owner `r`.
fn expected_method(world: &Comm, forced: Option<Method>, r: usize) -> Method {
    match forced {
        Some(m) => m,
        None if world.same_node(r, world.rank()) => Method::Shm,
        None if cfg!(feature = "fabric") && std::env::var_os("WM_FABRIC_PROVIDER").is_some() => Method::Fabric,
        None => Method::Socket,
    }
}

// ------------------------------------------------------------------ reads

fn reads(world: &Comm, forced: Option<Method>) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let mut rng = Rng::new(&[0x0e5, n as u64]);
    let mut own = Rng::new(&[0xbeef, me as u64]);
    let opts = Options { method: forced, ..Options::default() };
    let mut case = 0;
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            println!("skip host {ty}: {reason}");
            continue;
        }
        if forced == Some(Method::Shm) && (0..n).any(|r| !world.same_node(r, me)) {
            println!("skip host {ty} with shm: ranks on other nodes");
            continue;
        }
        for (dtype, cols, outs) in [
            (DType::F32, 7usize, &[DType::F32, DType::F16, DType::Bf16, DType::F64][..]),
            (DType::F64, 1, &[DType::F64, DType::F32][..]),
            (DType::I32, 33, &[DType::I32, DType::I64, DType::I8][..]),
        ] {
            case += 1;
            let rows = 300 + rng.below(900) as usize;
            // A partition in which rank 1 (every other case) and sometimes
            // the last rank own nothing.
            let partition: Option<Vec<usize>> = (n > 1).then(|| {
                let mut p = vec![0usize; n];
                for _ in 0..rows {
                    let r = rng.below(n as u64) as usize;
                    p[if (case % 2 == 1 && r == 1) || (case % 3 == 0 && r == n - 1 && n > 2) { 0 } else { r }] += 1;
                }
                p
            });
            let ctx = format!("{ty} {dtype}x{cols} rows={rows} partition={partition:?} method={forced:?}");
            let mut mem = allocate(world, ty, rows, cols, dtype, partition).context(ctx.clone())?;
            fill(&mut mem, cols, dtype, 1)?;
            let name = format!("reads-{case}");
            let table = Table::new(&mem, &name, dtype, &opts).context(ctx.clone())?;
            table.publish()?;
            let reader = table.reader().context(ctx.clone())?;
            let counts = reader.info().counts;
            for (r, &m) in reader.methods().iter().enumerate().filter(|&(r, _)| counts[r] > 0) {
                let want = expected_method(world, forced, r);
                ensure!(m == want, "{ctx}: owner {r} is read by {m}, expected {want}");
            }
            let info = reader.info();
            ensure!((info.rows, info.cols, info.dtype, info.name.as_str()) == (rows, cols, dtype, name.as_str()), "{ctx}: info {info:?}");

            let c = ReadCase { reader: &reader, ctx: &ctx, rows, cols, dtype };
            c.random_reads(&mut own, outs)?;
            c.range_reads(&mut own)?;
            let mut one = vec![0u8; cols * dtype.size()];
            c.bad_reads(&mut one)?;
            c.threaded_reads(me)?;
            if me == 0 {
                println!("{ctx}: verified, read by {}", reader.method_names());
            }
            // Nobody frees while others read.
            world.barrier()?;
            table.free().context(ctx.clone())?;
            match reader.get_batch(Ids::I64(&[0]), &mut one, dtype) {
                Err(OErr::Gone { .. }) => {}
                other => bail!("{ctx}: a read after free gave {other:?}"),
            }
            mem.free()?;
        }
    }
    Ok(())
}

/// One table of the `reads` scenario, read through `reader`; `ctx` names
/// the case in errors.
struct ReadCase<'a> {
    reader: &'a Reader,
    ctx: &'a str,
    rows: usize,
    cols: usize,
    dtype: DType,
}

impl ReadCase<'_> {
    /// Random ids with repeats, both id types, every output type in `outs`.
    fn random_reads(&self, own: &mut Rng, outs: &[DType]) -> Result<()> {
        let (reader, ctx, rows, cols, dtype) = (self.reader, self.ctx, self.rows, self.cols, self.dtype);
        for &out_dt in outs {
            for wide in [false, true] {
                let count = own.below(700) as usize + 1;
                let mut ids: Vec<usize> = (0..count).map(|_| own.below(rows as u64) as usize).collect();
                ids.extend_from_within(..count / 4);
                let mut out = vec![0u8; ids.len() * cols * out_dt.size()];
                if wide {
                    let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
                    reader.get_batch(Ids::I64(&v), &mut out, out_dt)
                } else {
                    let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                    reader.get_batch(Ids::I32(&v), &mut out, out_dt)
                }
                .with_context(|| format!("{ctx}: get_batch -> {out_dt}"))?;
                verify(&out, &ids, cols, 1, dtype, out_dt, &format!("{ctx} get_batch -> {out_dt} wide={wide}"))?;
            }
        }
        Ok(())
    }

    /// A range across owners, and the very last row.
    fn range_reads(&self, own: &mut Rng) -> Result<()> {
        let (reader, ctx, rows, cols, dtype) = (self.reader, self.ctx, self.rows, self.cols, self.dtype);
        let start = own.below(rows as u64 / 2) as usize;
        let len = rows - start;
        let mut out = vec![0u8; len * cols * dtype.size()];
        reader.get(start, len, &mut out, dtype).context(ctx.to_owned())?;
        verify(&out, &(start..rows).collect::<Vec<_>>(), cols, 1, dtype, dtype, &format!("{ctx} get({start}, {len})"))?;
        reader.get(rows - 1, 1, &mut out[..cols * dtype.size()], dtype)?;
        Ok(())
    }

    /// Bad input: an error naming the value, then a good read into `one`
    /// (a row's bytes).
    fn bad_reads(&self, one: &mut [u8]) -> Result<()> {
        let (reader, ctx, rows, cols, dtype) = (self.reader, self.ctx, self.rows, self.cols, self.dtype);
        for bad in [-1i64, rows as i64, i64::MAX] {
            match reader.get_batch(Ids::I64(&[0, bad]), &mut vec![0u8; 2 * cols * dtype.size()], dtype) {
                Err(OErr::IndexOutOfRange { index, position: 1, .. }) if index == bad => {}
                other => bail!("{ctx}: id {bad} gave {other:?}"),
            }
        }
        match reader.get(rows - 1, 2, &mut vec![0u8; 2 * cols * dtype.size()], dtype) {
            Err(e @ OErr::IndexOutOfRange { .. }) => ensure!(e.to_string().contains(&rows.to_string()), "{ctx}: {e}"),
            other => bail!("{ctx}: a range past the end gave {other:?}"),
        }
        let e = reader.get_batch(Ids::I64(&[0, 1]), one, dtype).expect_err("a short buffer");
        ensure!(e.to_string().contains(&format!("the output has {} bytes", one.len())), "{ctx}: {e}");
        let wrong_kind = if dtype.is_float() { DType::I32 } else { DType::F32 };
        let e = reader.get_batch(Ids::I64(&[0]), &mut vec![0u8; cols * wrong_kind.size()], wrong_kind).expect_err("float <-> int");
        ensure!(e.to_string().contains("float") || e.to_string().contains("integer"), "{ctx}: {e}");
        let last = rows - 1;
        reader.get_batch(Ids::I64(&[last as i64]), one, dtype)?;
        verify(one, &[last], cols, 1, dtype, dtype, &format!("{ctx} after bad input"))
    }

    /// One reader, several threads at once (clones share it); `me` seeds
    /// their ids.
    fn threaded_reads(&self, me: usize) -> Result<()> {
        let (reader, rows, cols, dtype) = (self.reader, self.rows, self.cols, self.dtype);
        std::thread::scope(|s| -> Result<()> {
            let hs: Vec<_> = (0..3u64)
                .map(|t| {
                    let r = reader.clone();
                    let ctx = self.ctx.to_owned();
                    s.spawn(move || -> Result<()> {
                        let mut g = Rng::new(&[t, me as u64, 77]);
                        for _ in 0..5 {
                            let ids: Vec<usize> = (0..200).map(|_| g.below(rows as u64) as usize).collect();
                            let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
                            let mut out = vec![0u8; ids.len() * cols * dtype.size()];
                            r.get_batch(Ids::I64(&v), &mut out, dtype)?;
                            verify(&out, &ids, cols, 1, dtype, dtype, &format!("{ctx} thread {t}"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().map_err(|_| anyhow::anyhow!("a reader thread panicked"))??;
            }
            Ok(())
        })
    }
}

// ------------------------------------------------------------------ mirror

/// Reads `ids` (i32 ids) and every row (`get`, converted to f64) and checks
/// them against `epoch`'s values.
fn read_epoch(reader: &Reader, rows: usize, cols: usize, epoch: u64, ids: &[usize], ctx: &str) -> Result<()> {
    let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
    let mut out = vec![0u8; ids.len() * cols * 4];
    reader.get_batch(Ids::I32(&v), &mut out, DType::F32).with_context(|| format!("{ctx}: get_batch"))?;
    verify(&out, ids, cols, epoch, DType::F32, DType::F32, &format!("{ctx}: get_batch"))?;
    let mut all = vec![0u8; rows * cols * 8];
    reader.get(0, rows, &mut all, DType::F64).with_context(|| format!("{ctx}: get"))?;
    verify(&all, &(0..rows).collect::<Vec<_>>(), cols, epoch, DType::F32, DType::F64, &format!("{ctx}: get"))
}

/// Tables served through a host mirror (device tables, or host tables
/// forced through one): the snapshot rule, `publish_from`, the refusals.
fn mirror(world: &Comm, loc: Option<&str>, forced: Option<Method>) -> Result<()> {
    let loc = match loc {
        Some("host") => Location::Host,
        Some("device") => Location::Device,
        other => bail!("mirror LOCATION [METHOD]: location {other:?}, expected host or device"),
    };
    let (me, n) = (world.rank(), world.size());
    let cols = 12;
    let mut rng = Rng::new(&[0x313, n as u64]);
    let opts = Options { method: forced, force_mirror: loc == Location::Host, ..Options::default() };
    for ty in MemoryType::ALL {
        let what = format!("{loc} {ty}");
        if let Some(reason) = query(world.as_ref(), ty, loc).reason() {
            wm_tests::skip(world.as_ref(), ty, loc, &what, reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        if forced == Some(Method::Shm) && (0..n).any(|r| !world.same_node(r, me)) {
            println!("skip {what} with shm: ranks on other nodes");
            continue;
        }
        let rows = 200 + rng.below(400) as usize;
        // Rank 1 owns nothing.
        let partition: Option<Vec<usize>> = (n > 1).then(|| {
            let mut p = vec![rows / (n - 1); n];
            p[1] = 0;
            p[0] += rows - rows / (n - 1) * (n - 1);
            p
        });
        let ctx = format!("mirror of {what} rows={rows} partition={partition:?} method={forced:?}");
        let mut mem = allocate_at(world, ty, loc, rows, cols, DType::F32, partition.clone()).context(ctx.clone())?;
        fill(&mut mem, cols, DType::F32, 1)?;
        let name = format!("mirror-{ty}");
        let table = Table::new(&mem, &name, DType::F32, &opts).context(ctx.clone())?;
        ensure!(table.is_mirrored(), "{ctx}: the table is not served through a mirror");
        // publish() would publish a stale copy: refused, naming publish_from.
        match table.publish() {
            Err(e @ OErr::Unsupported { .. }) => ensure!(e.to_string().contains("publish_from"), "{ctx}: {e}"),
            other => bail!("{ctx}: publish() of a mirrored table gave {other:?}"),
        }
        table.publish_from(&mem).context(ctx.clone())?;
        let reader = table.reader()?;
        let info = reader.info();
        ensure!((info.rows, info.cols, info.location, info.memory_type) == (rows, cols, loc, ty), "{ctx}: info {info:?}");
        for (r, &m) in reader.methods().iter().enumerate().filter(|&(r, _)| info.counts[r] > 0) {
            let want = expected_method(world, forced, r);
            ensure!(m == want, "{ctx}: owner {r} is read by {m}, expected {want}");
        }
        let mut own = Rng::new(&[0x99, me as u64, rows as u64]);
        let mut ids: Vec<usize> = (0..300).map(|_| own.below(rows as u64) as usize).collect();
        ids.extend_from_within(..50);
        read_epoch(&reader, rows, cols, 1, &ids, &format!("{ctx} epoch 1"))?;

        // Writes after the snapshot stay unseen until publish_from.
        world.barrier()?;
        fill(&mut mem, cols, DType::F32, 2)?;
        world.barrier()?;
        read_epoch(&reader, rows, cols, 1, &ids, &format!("{ctx} written, not published"))?;
        world.barrier()?;
        table.publish_from(&mem).context(ctx.clone())?;
        read_epoch(&reader, rows, cols, 2, &ids, &format!("{ctx} epoch 2"))?;
        ensure!(table.epoch() == 2 && reader.epoch()? == 2, "{ctx}: epochs {} and {}", table.epoch(), reader.epoch()?);

        // Memory of another shape: one error on every rank (the lowest
        // failing rank's, naming the size), the table usable.
        let other = allocate_at(world, MemoryType::Distributed, Location::Host, rows + 1, cols, DType::F32, None)?;
        match table.publish_from(&other) {
            Err(e @ (OErr::Common(CommonError::InvalidArgument(_)) | OErr::Common(CommonError::PeerFailed { .. }))) => {
                ensure!(e.to_string().contains(&format!("{} rows", rows + 1)), "{ctx}: {e}")
            }
            other => bail!("{ctx}: publish_from with {} rows gave {other:?}", rows + 1),
        }
        other.free()?;
        ensure!(table.epoch() == 2, "{ctx}: a refused publish_from moved the epoch to {}", table.epoch());
        read_epoch(&reader, rows, cols, 2, &ids, &format!("{ctx} after a refused publish_from"))?;
        if me == 0 {
            println!("{ctx}: verified snapshot and publish_from, read by {}", reader.method_names());
        }
        world.barrier()?;
        table.free().context(ctx.clone())?;
        match reader.get_batch(Ids::I64(&[0]), &mut vec![0u8; cols * 4], DType::F32) {
            Err(OErr::Gone { .. }) => {}
            other => bail!("{ctx}: a read after free gave {other:?}"),
        }
        // A host table served in place: publish_from is publish.
        if loc == Location::Host {
            let table = Table::new(&mem, &name, DType::F32, &Options { method: forced, ..Options::default() })?;
            ensure!(!table.is_mirrored(), "{ctx}: a host table is mirrored without being asked");
            table.publish_from(&mem)?;
            let reader = table.reader()?;
            read_epoch(&reader, rows, cols, 2, &ids, &format!("{ctx} in place"))?;
            world.barrier()?;
            fill(&mut mem, cols, DType::F32, 3)?;
            table.publish_from(&mem)?;
            read_epoch(&reader, rows, cols, 3, &ids, &format!("{ctx} in place, epoch 3"))?;
            world.barrier()?;
            table.free()?;
        }
        mem.free()?;
    }
    Ok(())
}

// ------------------------------------------------------------------ busy

/// Rank 0 reads while the others run collectives among themselves and
/// then wait in a barrier; none of them serves a read by calling anything.
fn busy(world: &Comm, forced: Option<Method>) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (4000usize, 16usize);
    let mut mem = allocate(world, MemoryType::Distributed, rows, cols, DType::F32, None)?;
    fill(&mut mem, cols, DType::F32, 3)?;
    let table = Table::new(&mem, "busy", DType::F32, &Options { method: forced, ..Options::default() })?;
    for _ in 0..3 {
        table.publish()?;
    }
    ensure!(table.epoch() == 3, "epoch {}", table.epoch());
    let others = world.split(u32::from(me != 0), me as u32)?;
    if me == 0 {
        let reader = table.reader()?;
        let mut g = Rng::new(&[5]);
        for b in 0..40 {
            let ids: Vec<usize> = (0..2000).map(|_| g.below(rows as u64) as usize).collect();
            let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
            let mut out = vec![0u8; ids.len() * cols * 4];
            reader.get_batch(Ids::I64(&v), &mut out, DType::F32)?;
            verify(&out, &ids, cols, 3, DType::F32, DType::F32, &format!("busy batch {b}"))?;
        }
        ensure!(reader.epoch()? == 3, "the servers say epoch {}", reader.epoch()?);
        println!("rank 0 read 40 batches from {n} owners by {}", reader.method_names());
    } else {
        for i in 0..200u64 {
            let got = wm_comm::CommExt::allgather_value(others.as_ref(), i)?;
            ensure!(got.iter().all(|&x| x == i), "allgather {i}: {got:?}");
        }
    }
    world.barrier()?;
    table.free()?;
    mem.free()?;
    Ok(())
}

// ------------------------------------------------------------------ fork

/// Every rank reads (so its reader holds connections, mappings and
/// endpoints), forks, and checks that the child cannot use them.
fn fork(world: &Comm, forced: Option<Method>) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let (rows, cols) = (300 * n + 7, 8usize);
    let mut mem = allocate(world, MemoryType::Distributed, rows, cols, DType::F32, None)?;
    fill(&mut mem, cols, DType::F32, 1)?;
    let table = Table::new(&mem, "fork", DType::F32, &Options { method: forced, ..Options::default() })?;
    table.publish()?;
    let reader = table.reader()?;
    let mut g = Rng::new(&[0xf0, me as u64]);
    let ids: Vec<usize> = (0..400).map(|_| g.below(rows as u64) as usize).collect();
    read_epoch(&reader, rows, cols, 1, &ids, "the parent, before the fork")?;
    // SAFETY: the child runs only `in_child` (reads through this process's
    // copies of the reader, prints) and leaves by `_exit`, running no
    // destructor of the parent's objects (the table, the communicator).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let code = match in_child(&reader, rows, cols, &ids) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("FAILED in rank {me}'s forked child: {e:#}");
                1
            }
        };
        // SAFETY: ends the child at once; nothing of the parent's is
        // dropped or flushed twice.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        // SAFETY: `pid` is this process's child; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        ensure!(e.kind() == std::io::ErrorKind::Interrupted, "waitpid({pid}): {e}");
    }
    ensure!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "rank {me}'s forked child ended with wait status {status:#x} (see its FAILED line)"
    );
    // The child touched nothing of the parent's: its reader reads on.
    read_epoch(&reader, rows, cols, 1, &ids, "the parent, after its child exited")?;
    if me == 0 {
        println!("forked children were refused the parents' readers and read through their own ({})", reader.method_names());
    }
    world.barrier()?;
    table.free()?;
    mem.free()?;
    Ok(())
}

/// The forked child: every call through the parent's reader is refused,
/// naming what to do; a reopened reader reads.
fn in_child(reader: &Reader, rows: usize, cols: usize, ids: &[usize]) -> Result<()> {
    let refused = |what: &str, r: std::result::Result<(), OErr>| -> Result<()> {
        match r {
            Err(e @ OErr::Forked { .. }) => {
                ensure!(e.to_string().contains("Reader::reopen()"), "{what}: the error does not say what to do: {e}");
                Ok(())
            }
            Ok(()) => bail!("{what} through the parent's reader worked in a forked child, on the parent's connections"),
            Err(e) => bail!("{what} through the parent's reader in a forked child gave {e:?}, not Forked"),
        }
    };
    let mut one = vec![0u8; cols * 4];
    refused("get_batch", reader.get_batch(Ids::I64(&[ids[0] as i64]), &mut one, DType::F32))?;
    refused("get", reader.get(rows - 1, 1, &mut one, DType::F32))?;
    refused("epoch", reader.epoch().map(drop))?;
    refused("register_recv", reader.register_recv(one.len()).map(drop))?;
    let own = reader.reopen().context("reopening in the child")?;
    read_epoch(&own, rows, cols, 1, ids, "the child's own reader")?;
    ensure!(own.epoch()? == 1, "the child's reader sees epoch {}", own.epoch()?);
    Ok(())
}

// ------------------------------------------------------------------ outside

fn touch(p: &Path) -> Result<()> {
    std::fs::write(p, b"").with_context(|| format!("writing {}", p.display()))
}

fn wait_file(p: &Path, secs: u64) -> Result<()> {
    let start = Instant::now();
    while !p.exists() {
        ensure!(start.elapsed() < Duration::from_secs(secs), "waited {secs} s for {}", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

const OUT_COLS: usize = 24;

/// The publishing job.
fn job(world: &Comm, rest: &[String]) -> Result<()> {
    let (dir, name, rounds, m, ty, mode, mirrored) = match rest {
        [d, n, r, m, t, o] => (d, n, r, m, t, o, false),
        [d, n, r, m, t, o, x] if x == "mirror" => (d, n, r, m, t, o, true),
        _ => bail!("job DIR NAME ROUNDS METHOD TYPE MODE [mirror]"),
    };
    let dir = PathBuf::from(dir);
    let rounds: u64 = rounds.parse()?;
    let forced = method(Some(m))?;
    let ty: MemoryType = ty.parse().map_err(anyhow::Error::msg)?;
    let me = world.rank();
    if me == 0 {
        // Where an outside reader meets this job: the rendezvous, with the
        // port rank 0 picked where it was 0.
        let mut at = std::env::var("WM_RENDEZVOUS")?;
        if let Some(host) = at.strip_suffix(":0") {
            let port = std::fs::read_to_string(std::env::var("WM_RENDEZVOUS_PORT_FILE")?)?;
            at = format!("{host}:{}", port.trim());
        }
        std::fs::write(dir.join("rendezvous"), at)?;
    }
    let rows = 3000;
    let mut mem = allocate(world, ty, rows, OUT_COLS, DType::F32, None)?;
    let table = Table::new(&mem, name, DType::F32, &Options { method: forced, force_mirror: mirrored, ..Options::default() })?;
    ensure!(table.is_mirrored() == mirrored, "mirrored: {}", table.is_mirrored());
    for e in 1..=rounds {
        fill(&mut mem, OUT_COLS, DType::F32, e)?;
        if mirrored {
            table.publish_from(&mem)?;
        } else {
            table.publish()?;
        }
        if me == 0 {
            touch(&dir.join(format!("published-{e}")))?;
            wait_file(&dir.join(format!("read-{e}")), 120)?;
        }
        world.barrier()?;
    }
    match mode.as_str() {
        "free" => {
            table.free()?;
            if me == 0 {
                touch(&dir.join("freed"))?;
                wait_file(&dir.join("done"), 120)?;
            }
            world.barrier()?;
            mem.free()?;
            Ok(())
        }
        "hold" => {
            std::fs::write(dir.join(format!("pid-{me}")), std::process::id().to_string())?;
            world.barrier()?;
            if me == 0 {
                touch(&dir.join("holding"))?;
            }
            // The reader kills every rank; nobody gets past this.
            std::thread::sleep(Duration::from_secs(120));
            bail!("rank {me} was not killed")
        }
        other => bail!("unknown mode {other:?}"),
    }
}

/// Every owner's portion this reader process mapped (the `memfd:`
/// mappings in `/proc/self/maps`; it holds no table of its own) refuses
/// to be made writable: the server handed out read-only descriptors, so
/// `mprotect(PROT_WRITE)` on the shared mapping fails with `EACCES`.
/// Returns how many there are.
fn portions_are_read_only() -> Result<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut n = 0;
    for line in maps.lines().filter(|l| l.contains("/memfd:")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (range, perms) = (f[0], f[1]);
        ensure!(perms.starts_with("r-") && perms.ends_with('s'), "a portion is mapped {perms}: {line}");
        let (a, b) = range.split_once('-').context("a maps range")?;
        let (a, b) = (usize::from_str_radix(a, 16)?, usize::from_str_radix(b, 16)?);
        // SAFETY: the range is a whole mapping of this process; asking for
        // write access changes nothing when it is refused, and a success is
        // reported as this test's failure before any write.
        let r = unsafe { libc::mprotect(a as *mut libc::c_void, b - a, libc::PROT_READ | libc::PROT_WRITE) };
        let e = std::io::Error::last_os_error();
        ensure!(r != 0, "a reader could make its mapping of a portion writable: {line}");
        ensure!(e.raw_os_error() == Some(libc::EACCES), "mprotect failed with {e}, not EACCES: {line}");
        n += 1;
    }
    Ok(n)
}

fn read_all(reader: &Reader, epoch: u64, threads: u64) -> Result<()> {
    let info = reader.info();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let r = reader.clone();
                let info = info.clone();
                s.spawn(move || -> Result<()> {
                    let mut g = Rng::new(&[t, epoch]);
                    let ids: Vec<usize> = (0..1500).map(|_| g.below(info.rows as u64) as usize).collect();
                    let v: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
                    let mut out = vec![0u8; ids.len() * info.cols * 4];
                    r.get_batch(Ids::I32(&v), &mut out, DType::F32)?;
                    verify(&out, &ids, info.cols, epoch, DType::F32, DType::F32, &format!("outside thread {t} epoch {epoch}"))?;
                    let mut all = vec![0u8; info.rows * info.cols * 8];
                    r.get(0, info.rows, &mut all, DType::F64)?;
                    verify(
                        &all,
                        &(0..info.rows).collect::<Vec<_>>(),
                        info.cols,
                        epoch,
                        DType::F32,
                        DType::F64,
                        &format!("outside get epoch {epoch}"),
                    )
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("a reader thread panicked"))??;
        }
        Ok(())
    })
}

fn rendezvous_of(dir: &Path) -> Result<Rendezvous> {
    wait_file(&dir.join("rendezvous"), 120)?;
    Ok(Rendezvous::parse(std::fs::read_to_string(dir.join("rendezvous"))?.trim())?)
}

/// The outside reader.
fn outside_reader(rest: &[String]) -> Result<()> {
    let [dir, name, rounds, m, mode] = rest else { bail!("reader DIR NAME ROUNDS METHOD MODE") };
    let dir = PathBuf::from(dir);
    let rounds: u64 = rounds.parse()?;
    let forced = method(Some(m))?;
    let at = rendezvous_of(&dir)?;
    let opts = Options { method: forced, join_timeout: Some(Duration::from_secs(60)), ..Options::default() };
    // A stranger with another key is refused, and told so.
    let stranger = Options { key: Some(JobKey::generate()?), join_timeout: Some(Duration::from_secs(60)), ..opts.clone() };
    wait_file(&dir.join("published-1"), 120)?;
    match Reader::join(&at, name, &stranger) {
        Err(e @ OErr::Refused { .. }) => println!("a wrong key: {e}"),
        other => bail!("a reader with a wrong key got {other:?}"),
    }
    let reader = Reader::join(&at, name, &opts)?;
    let info = reader.info();
    ensure!((info.rows, info.cols, info.dtype, info.name.as_str()) == (3000, OUT_COLS, DType::F32, name.as_str()), "info {info:?}");
    let mapped = portions_are_read_only()?;
    println!("{mapped} portions mapped, none can be made writable");
    println!(
        "joined {name} at {at:?}: {} rows x {} {} over {} ranks, read by {}",
        info.rows,
        info.cols,
        info.dtype,
        info.ranks,
        reader.method_names()
    );
    if let Some(m) = forced {
        ensure!(reader.methods().iter().zip(&info.counts).all(|(&x, &c)| x == m || c == 0), "methods {:?}", reader.methods());
    }
    for e in 1..=rounds {
        wait_file(&dir.join(format!("published-{e}")), 120)?;
        ensure!(reader.epoch()? == e, "epoch {} after publish {e}", reader.epoch()?);
        read_all(&reader, e, 3)?;
        if e == rounds {
            // A loader worker: a process started by fork and exec joins on its own.
            let exe = std::env::current_exe()?;
            let st = std::process::Command::new(exe).args(["child", &dir.to_string_lossy(), name, &e.to_string()]).status()?;
            ensure!(st.success(), "the child reader {st}");
            // And a reopened reader (what a forked child without exec uses).
            read_all(&reader.reopen()?, e, 1)?;
        }
        touch(&dir.join(format!("read-{e}")))?;
    }
    let mut one = vec![0u8; OUT_COLS * 4];
    match mode.as_str() {
        "free" => {
            wait_file(&dir.join("freed"), 120)?;
            match reader.get_batch(Ids::I64(&[5]), &mut one, DType::F32) {
                Err(e @ OErr::Gone { .. }) => println!("after free: {e}"),
                other => bail!("a read after the job freed the table gave {other:?}"),
            }
            let again = Options { join_timeout: Some(Duration::from_millis(300)), ..opts.clone() };
            match Reader::join(&at, name, &again) {
                Err(e @ OErr::NotPublished { .. }) => println!("joining after free: {e}"),
                other => bail!("joining after free gave {other:?}"),
            }
            touch(&dir.join("done"))?;
        }
        "hold" => {
            wait_file(&dir.join("holding"), 120)?;
            let mut killed = 0;
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                if entry.file_name().to_string_lossy().starts_with("pid-") {
                    let pid = std::fs::read_to_string(entry.path())?;
                    let st = std::process::Command::new("kill").args(["-KILL", pid.trim()]).status()?;
                    ensure!(st.success(), "kill -KILL {pid}: {st}");
                    killed += 1;
                }
            }
            ensure!(killed == info.ranks, "killed {killed} of {} ranks", info.ranks);
            // Every later read fails (the kernel closes a dead process's
            // sockets at once); it must not hang or crash.
            let start = Instant::now();
            loop {
                match reader.get_batch(Ids::I64(&[5, 2999]), &mut [0u8; 2 * OUT_COLS * 4], DType::F32) {
                    Err(e) => {
                        println!("after SIGKILL: {e}");
                        ensure!(matches!(e, OErr::Gone { .. }), "a read after the job died gave {e:?}");
                        break;
                    }
                    Ok(()) => {
                        ensure!(start.elapsed() < Duration::from_secs(30), "reads still succeed 30 s after the job was killed");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
        other => bail!("unknown mode {other:?}"),
    }
    Ok(())
}

/// A reader started by the outside reader (fork and exec).
fn child(rest: &[String]) -> Result<()> {
    let (dir, name, epoch, wait) = match rest {
        [d, n, e] => (d, n, e, 30),
        [d, n, e, w] => (d, n, e, w.parse()?),
        _ => bail!("child DIR NAME EPOCH [JOIN_TIMEOUT_S]"),
    };
    let at = rendezvous_of(Path::new(dir))?;
    let reader = Reader::join(&at, name, &Options { join_timeout: Some(Duration::from_secs(wait)), ..Options::default() })?;
    read_all(&reader, epoch.parse()?, 2)?;
    println!("child reader read epoch {epoch}");
    Ok(())
}

// ------------------------------------------------------------------ impostor

/// The impostor's table: one owner of `IMPOSTOR_ROWS` rows of
/// `IMPOSTOR_COLS` f32 values (`value` at epoch 1).
const IMPOSTOR: &str = "impostor";
const IMPOSTOR_ROWS: usize = 64;
const IMPOSTOR_COLS: usize = 4;

/// A fake read server: the handshake as the real one does it (it holds
/// the job's key), then answers of its own making, byte by byte as
/// `onesided/src/wire.rs` lays them out.
fn impostor(rest: &[String]) -> Result<()> {
    let [dir, mode] = rest else { bail!("impostor DIR MODE") };
    let key = JobKey::from_env()?.context("the impostor needs WM_JOB_KEY")?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let nonce = 0x5ca1_ab1e_u64;
    let row_bytes = IMPOSTOR_COLS * 4;
    let record = format!(
        r#"{{"version":2,"name":"{IMPOSTOR}","id":7,"rows":{IMPOSTOR_ROWS},"row_bytes":{row_bytes},"dtype":"f32","cols":{IMPOSTOR_COLS},"memory_type":"distributed","location":"host","counts":[{IMPOSTOR_ROWS}],"epoch":1,"owners":[{{"rank":0,"node_id":"impostor-node","hostname":"impostor","node_overridden":true,"unix_name":"wholemem.onesided.impostor","tcp_addr":"127.0.0.1:{port}","nonce":{nonce},"pieces":[{}],"offset":0,"fabric":null}}]}}"#,
        IMPOSTOR_ROWS * row_bytes
    );
    let stored = Path::new(dir).join(".impostor.stored");
    // Signed with the job's key: this impostor holds it (the tests are
    // about what a key holder's server can do to a reader).
    std::fs::write(&stored, key.sign_record(wm_comm::trust::RecordKind::Table, record.as_bytes()))?;
    std::fs::rename(&stored, Path::new(dir).join(format!("onesided-{IMPOSTOR}.json")))?;
    listener.set_nonblocking(true)?;
    let accept = || -> Result<Sealed<TcpStream>> {
        let start = Instant::now();
        let mut c = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    ensure!(start.elapsed() < Duration::from_secs(60), "no reader connected within 60 s");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        c.set_nonblocking(false)?;
        let (_, session) =
            wm_comm::auth::serve_reader(&mut c, &key, nonce, Instant::now() + Duration::from_secs(30)).map_err(anyhow::Error::msg)?;
        c.set_read_timeout(Some(Duration::from_secs(60)))?;
        // It holds the key: what it sends is sealed like any server's.
        Ok(Sealed::new(c, session))
    };
    match mode.as_str() {
        "stale" => {
            let mut c = accept()?;
            let first = next_read(&mut c)?.context("the reader hung up before its first request")?;
            let answer = rows_answer(0, &first);
            c.write_all(&answer)?;
            let second = next_read(&mut c)?.context("the reader hung up before its second request")?;
            ensure!(second.len() == first.len(), "the reader's second request has {} rows, not {}", second.len(), first.len());
            // The first answer again: the right length and status, the
            // first request's id and rows.
            c.write_all(&answer)?;
            if let Some(more) = next_read(&mut c)? {
                bail!("the reader sent another request ({more:?}) on the connection the stale answer came on");
            }
            println!("impostor: the reader closed the connection the stale answer came on");
            let mut c = accept()?;
            let served = serve_honestly(&mut c, 0)?;
            ensure!(served > 0, "the reader asked nothing on its new connection");
        }
        "refuse" => {
            let mut c = accept()?;
            let first = next_read(&mut c)?.context("the reader hung up before its first request")?;
            let msg = format!("row {} at position 0 is not one of its rows", first[0]);
            let mut answer = header(0, false, msg.len());
            answer.extend_from_slice(msg.as_bytes());
            c.write_all(&answer)?;
            let served = serve_honestly(&mut c, 1)?;
            ensure!(served > 0, "the reader closed the connection after an error answer instead of reading on over it");
            match listener.accept() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                other => bail!("the reader opened a second connection: {other:?}"),
            }
            println!("impostor: the reader read {served} more answers over the connection the error answer came on");
        }
        other => bail!("unknown impostor mode {other:?}"),
    }
    Ok(())
}

/// A response header: request `id`, ok or an error, `bytes` following.
fn header(id: u64, ok: bool, bytes: usize) -> Vec<u8> {
    let mut h = b"WMOR".to_vec();
    h.extend_from_slice(&[u8::from(!ok), 0, 0, 0]);
    h.extend_from_slice(&1u64.to_le_bytes());
    h.extend_from_slice(&(bytes as u64).to_le_bytes());
    h.extend_from_slice(&id.to_le_bytes());
    h
}

/// The answer to request `id` for `rows`: a header and the rows' values.
fn rows_answer(id: u64, rows: &[usize]) -> Vec<u8> {
    let mut a = header(id, true, rows.len() * IMPOSTOR_COLS * 4);
    for &r in rows {
        a.extend_from_slice(&expected(r, IMPOSTOR_COLS, 1, DType::F32, DType::F32));
    }
    a
}

/// The next read request's rows, `None` when the reader hung up.
fn next_read(c: &mut Sealed<TcpStream>) -> Result<Option<Vec<usize>>> {
    let mut h = [0u8; 32];
    match c.read(&mut h[..1]) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    c.read_exact(&mut h[1..])?;
    let word = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
    ensure!(&h[..4] == b"WMOQ" && h[4] == 1, "not a read request: {h:?}");
    let (n, skip, len) = (word(8) as usize, word(16), word(24));
    ensure!(n <= IMPOSTOR_ROWS && skip == 0 && len == (IMPOSTOR_COLS * 4) as u64, "a read of {n} rows of {len} bytes from byte {skip}");
    let mut ids = vec![0u8; n * 8];
    c.read_exact(&mut ids)?;
    Ok(Some(ids.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize).collect()))
}

/// Answers reads correctly, ids from `first`, until the reader hangs up:
/// how many.
fn serve_honestly(c: &mut Sealed<TcpStream>, first: u64) -> Result<u64> {
    let mut id = first;
    while let Some(rows) = next_read(c)? {
        ensure!(rows.iter().all(|&r| r < IMPOSTOR_ROWS), "rows {rows:?}");
        c.write_all(&rows_answer(id, &rows))?;
        id += 1;
    }
    Ok(id - first)
}

/// The reader that meets the impostor.
fn impostor_reader(rest: &[String]) -> Result<()> {
    let [dir, mode] = rest else { bail!("impostor-reader DIR MODE") };
    let at = Rendezvous::parse(&format!("dir:{dir}"))?;
    let reader = Reader::join(&at, IMPOSTOR, &Options { join_timeout: Some(Duration::from_secs(60)), ..Options::default() })?;
    ensure!(reader.method_names() == "socket", "the impostor is read by {}", reader.method_names());
    let read = |ids: &[usize]| -> std::result::Result<Vec<u8>, OErr> {
        let v: Vec<i64> = ids.iter().map(|&x| x as i64).collect();
        let mut out = vec![0u8; ids.len() * IMPOSTOR_COLS * 4];
        reader.get_batch(Ids::I64(&v), &mut out, DType::F32).map(|()| out)
    };
    let check = |ids: &[usize], ctx: &str| -> Result<()> {
        let out = read(ids).with_context(|| format!("{ctx}: get_batch of {ids:?}"))?;
        verify(&out, ids, IMPOSTOR_COLS, 1, DType::F32, DType::F32, ctx)
    };
    match mode.as_str() {
        "stale" => {
            check(&[1, 2], "the first read")?;
            match read(&[5, 6]) {
                Err(e @ OErr::Malformed { .. }) => {
                    ensure!(e.to_string().contains("the answer to request 0 where the answer to request 1 was due"), "{e}");
                    println!("a stale answer: {e}");
                }
                Ok(out) => {
                    let earlier = verify(&out, &[1, 2], IMPOSTOR_COLS, 1, DType::F32, DType::F32, "").is_ok();
                    bail!(
                        "get_batch of ids [5, 6] returned rows{}: an answer to another request taken for this one's",
                        if earlier { " 1 and 2, the first request's" } else { "" }
                    )
                }
                Err(e) => bail!("the stale answer gave {e:?}, not Malformed"),
            }
            check(&[5, 6, 63], "the read after the stale answer (a new connection)")?;
        }
        "refuse" => {
            match read(&[3]) {
                Err(e @ OErr::Common(CommonError::PeerFailed { .. })) if e.to_string().contains("row 3 at position 0") => {
                    println!("an error answer: {e}")
                }
                other => bail!("the error answer gave {other:?}"),
            }
            check(&[3, 4], "the read after the error answer")?;
            check(&[0, 63, 0], "the next read")?;
        }
        other => bail!("unknown impostor mode {other:?}"),
    }
    Ok(())
}

// ------------------------------------------------------------------ relay

/// Rows each read through the relay asks for.
const RELAY_ROWS: usize = 200;
/// Bytes the server sends before the handshake ends: its hello and proof.
const HANDSHAKE_TO_READER: usize = 40 + 32;

/// A relay that holds no key: it plants a record of the job's table
/// (`NAME-relayed`) whose only owner is itself, and forwards every byte
/// between the reader and the real read server, capturing what the server
/// sends. With `FLIP` it flips one random bit of each connection's answer
/// (past the handshake) once the reader has joined.
fn relay(rest: &[String]) -> Result<()> {
    let [dir, name, flip] = rest else { bail!("relay DIR NAME clean|flip") };
    let dir = PathBuf::from(dir);
    let flipping = flip == "flip";
    let Rendezvous::Dir(rdv) = rendezvous_of(&dir)? else { bail!("the relay test needs a dir: rendezvous") };
    wait_file(&dir.join("published-1"), 120)?;
    // Records are signed with the job key, so planting one takes the key
    // (WM_TEST_RECORD_KEY). The relay stands for an attacker on the path
    // who redirects the reader's connection without one: the key signs the
    // record and is never used for the channel.
    let record_key = JobKey::from_hex(&std::env::var("WM_TEST_RECORD_KEY")?, "WM_TEST_RECORD_KEY")?;
    let real = std::fs::read(rdv.join(format!("onesided-{name}.json")))?;
    let body = record_key.open_record(wm_comm::trust::RecordKind::Table, &real).map_err(|e| anyhow::anyhow!("the job's record: {e}"))?;
    let mut record: serde_json::Value = serde_json::from_slice(body)?;
    let server: std::net::SocketAddr = record["owners"][0]["tcp_addr"].as_str().context("no tcp_addr")?.parse()?;
    let row_bytes = record["row_bytes"].as_u64().context("no row_bytes")? as usize;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let relayed = format!("{name}-relayed");
    record["name"] = relayed.clone().into();
    record["owners"][0]["tcp_addr"] = listener.local_addr()?.to_string().into();
    record["owners"][0]["node_id"] = "the-relay's-node".into();
    record["owners"][0]["unix_name"] = "wholemem.onesided.relay-none".into();
    let stored = rdv.join(".relayed.stored");
    std::fs::write(&stored, record_key.sign_record(wm_comm::trust::RecordKind::Table, &serde_json::to_vec(&record)?))?;
    std::fs::rename(&stored, rdv.join(format!("onesided-{relayed}.json")))?;
    listener.set_nonblocking(true)?;
    // What one answer of RELAY_ROWS rows is on the wire: a record of its
    // header and rows.
    let answer = wm_comm::session::PREFIX + 32 + RELAY_ROWS * row_bytes + wm_comm::session::TAG;
    let captured = Arc::new(Mutex::new(Vec::<u8>::new()));
    let flips = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut conns = 0u64;
    let mut pumps = Vec::new();
    while !dir.join("relay-done").exists() {
        let c = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        c.set_nonblocking(false)?;
        conns += 1;
        let s = TcpStream::connect(server)?;
        // One bit of this connection's answer, once the reader has joined.
        let flip_at = (flipping && dir.join("joined").exists()).then(|| {
            let mut g = Rng::new(&[conns, 0x5eed]);
            (HANDSHAKE_TO_READER + g.below(answer as u64) as usize, 1u8 << g.below(8))
        });
        let (c2, s2) = (c.try_clone()?, s.try_clone()?);
        pumps.push(std::thread::spawn(move || pump(c2, s2, None, None)));
        let (cap, n) = (captured.clone(), flips.clone());
        pumps.push(std::thread::spawn(move || pump(s, c, flip_at.map(|f| (f, n)), Some(cap))));
    }
    let captured = captured.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // A row's bytes as the job wrote them (epoch 1), looked for in all the
    // relay saw.
    let cols = record["cols"].as_u64().context("no cols")? as usize;
    let seen = (0..RELAY_ROWS).filter(|&r| {
        let row = expected(r, cols, 1, DType::F32, DType::F32);
        captured.windows(row.len()).any(|w| w == row)
    });
    println!(
        "relay: {conns} connections, {} flips, {} bytes captured, plain rows seen: {}",
        flips.load(std::sync::atomic::Ordering::SeqCst),
        captured.len(),
        seen.count()
    );
    Ok(())
}

/// Copies `from` to `to` until either closes; flips the bit `(at, mask)`
/// (counting it) and keeps a copy of what passed when asked.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    flip: Option<((usize, u8), Arc<std::sync::atomic::AtomicUsize>)>,
    capture: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut passed = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(((at, mask), count)) = &flip
            && (passed..passed + n).contains(at)
        {
            buf[at - passed] ^= mask;
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        passed += n;
        if let Some(c) = &capture {
            c.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&buf[..n]);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// The reader behind the relay: joins the planted record, then reads
/// `RUNS` times; every read is either refused with an authentication
/// error or returns exactly the job's rows.
fn relay_reader(rest: &[String]) -> Result<()> {
    let [dir, name, runs] = rest else { bail!("relay-reader DIR NAME RUNS") };
    let dir = PathBuf::from(dir);
    let runs: usize = runs.parse()?;
    let at = rendezvous_of(&dir)?;
    wait_file(&dir.join("published-1"), 120)?;
    let opts = Options { method: Some(Method::Socket), join_timeout: Some(Duration::from_secs(60)), ..Options::default() };
    let reader = Reader::join(&at, &format!("{name}-relayed"), &opts)?;
    touch(&dir.join("joined"))?;
    let cols = reader.info().cols;
    let ids: Vec<usize> = (0..RELAY_ROWS).collect();
    let (mut ok, mut detected) = (0, 0);
    for run in 0..runs {
        let mut out = vec![0u8; RELAY_ROWS * cols * 4];
        match reader.get(0, RELAY_ROWS, &mut out, DType::F32) {
            Ok(()) => {
                verify(&out, &ids, cols, 1, DType::F32, DType::F32, &format!("read {run} through the relay"))?;
                ok += 1;
            }
            Err(e) => {
                let text = e.to_string();
                ensure!(text.contains("authentication failed"), "read {run} through the relay failed, but not by authentication: {text}");
                if detected == 0 {
                    println!("first detection: {text}");
                }
                detected += 1;
            }
        }
    }
    println!("relay-reader: {runs} reads, {ok} verified, {detected} refused by authentication, 0 wrong rows");
    touch(&dir.join("relay-done"))?;
    touch(&dir.join("read-1"))?;
    wait_file(&dir.join("freed"), 120)?;
    touch(&dir.join("done"))?;
    Ok(())
}
