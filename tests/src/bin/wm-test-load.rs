//! One rank of a multi-process file loading scenario. Started by the
//! harness in `wm_tests` (or by hand under `wm-run`):
//! `wm-test-load SCENARIO DIR`, where DIR is an empty directory every rank
//! can reach. Rank 0 writes the files (with a small NPY writer of its own,
//! not the library's); every rank loads and checks its own rows, so every
//! row is checked by its owner. The first wrong result exits non-zero with a
//! message naming the rank and what differed.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use wholemem::files::{RowFormat, ShardSet, StoreTarget};
use wholemem::{DType, Element};
use wholemem::{Location, MemoryType, ShardProblem, TensorDesc, WholeTensor, query};
use wm_comm::Communicator;

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| {
        let dir = PathBuf::from(rest.first().context("usage: wm-test-load SCENARIO DIR")?);
        ensure!(dir.is_dir(), "{} is not a directory", dir.display());
        match scenario {
            "layouts" => layouts(world, &dir),
            "round-trip" => match rest.get(1).map(String::as_str) {
                None | Some("host") => round_trip(world, &dir, Location::Host),
                Some("device") => round_trip(world, &dir, Location::Device),
                Some(other) => bail!("unknown location {other:?}; expected host or device"),
            },
            "malformed" => malformed(world, &dir),
            other => bail!("unknown scenario {other:?}"),
        }
    });
}

// ------------------------------------------------------------- test values

/// An element type of the tests: exact conversion from small integers.
trait TestElem: Element + PartialEq + std::fmt::Debug {
    /// Values stay below this, so the type holds them exactly.
    const RANGE: usize;
    fn of(v: f64) -> Self;
}

macro_rules! test_elem {
    ($($t:ty, $range:expr, $conv:expr);*) => { $(impl TestElem for $t {
        const RANGE: usize = $range;
        fn of(v: f64) -> Self { $conv(v) }
    })* };
}
test_elem!(
    f32, 1_000_003, |v| v as f32;
    f64, 1_000_003, |v| v;
    half::f16, 2039, half::f16::from_f64;
    half::bf16, 251, half::bf16::from_f64;
    i8, 251, |v: f64| v as i8;
    i16, 32_749, |v: f64| v as i16;
    i32, 1_000_003, |v: f64| v as i32;
    i64, 1_000_003, |v: f64| v as i64
);

/// The value at (row, element of the row): depends on both, so a shifted
/// row or a permuted column fails.
fn value<T: TestElem>(row: usize, col: usize) -> T {
    let m = T::RANGE;
    T::of(((row.wrapping_mul(131) + col.wrapping_mul(7) + 3) % m) as f64 - (m / 2) as f64)
}

/// Rows `rows` of a table with `per_row` elements per row, as bytes.
fn rows_bytes<T: TestElem>(rows: std::ops::Range<usize>, per_row: usize) -> Vec<u8> {
    let v: Vec<T> = rows.flat_map(|r| (0..per_row).map(move |c| value::<T>(r, c))).collect();
    bytemuck::cast_slice(&v).to_vec()
}

// ------------------------------------------------------------- file writing

/// An NPY header written here from the format description, independently
/// of `wholemem::files::npy`.
fn npy_header(descr: &str, fortran: bool, shape: &[usize]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = if shape.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let fortran = if fortran { "True" } else { "False" };
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}").into_bytes();
    while (10 + dict.len() + 1) % 64 != 0 {
        dict.push(b' ');
    }
    dict.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(&dict);
    out
}

fn write_file(path: &Path, parts: &[&[u8]]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    for p in parts {
        f.write_all(p)?;
    }
    Ok(())
}

/// Writes `counts[i]` rows to `dir/shard_000i.npy` (or `.bin`, raw),
/// stacked: file i holds the rows after those of files 0..i. Returns the
/// paths.
fn write_shards<T: TestElem>(dir: &Path, counts: &[usize], row_shape: &[usize], raw: bool) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let per_row: usize = row_shape.iter().product();
    let descr = T::DTYPE.npy_descr().unwrap_or("<V2");
    let mut first = 0;
    let mut paths = Vec::new();
    for (i, &c) in counts.iter().enumerate() {
        let data = rows_bytes::<T>(first..first + c, per_row);
        let path = dir.join(format!("shard_{i:04}.{}", if raw { "bin" } else { "npy" }));
        if raw {
            write_file(&path, &[&data])?;
        } else {
            let mut shape = vec![c];
            shape.extend_from_slice(row_shape);
            write_file(&path, &[&npy_header(descr, false, &shape), &data])?;
        }
        paths.push(path);
        first += c;
    }
    Ok(paths)
}

/// Checks that this rank's rows hold `value` of their global row.
fn check_local<T: TestElem>(t: &WholeTensor<T>, what: &str, me: usize) -> Result<()> {
    let per_row = t.row_stride();
    let first = t.local_rows().start;
    // Through read_rows, so device tables are checked the same way.
    let mut held = vec![T::zeroed(); t.local_rows().len() * per_row];
    t.memory().read_rows(first, bytemuck::cast_slice_mut(&mut held))?;
    for (i, row) in held.chunks(per_row.max(1)).enumerate() {
        for (c, v) in row.iter().enumerate() {
            let want = value::<T>(first + i, c);
            ensure!(*v == want, "{what}: rank {me} holds {v:?} at row {}, element {c}; expected {want:?}", first + i);
        }
    }
    Ok(())
}

/// Rows split into `k` uneven, non-empty-where-possible pieces.
fn uneven(rows: usize, k: usize, salt: usize) -> Vec<usize> {
    let weights: Vec<usize> = (0..k).map(|i| 1 + (i * 7 + salt) % 5).collect();
    let total: usize = weights.iter().sum();
    let mut counts: Vec<usize> = weights.iter().map(|w| rows * w / total).collect();
    let short = rows - counts.iter().sum::<usize>();
    counts[0] += short;
    counts
}

/// A partition in which rank 0 and every other rank hold nothing.
fn zero_row_partition(rows: usize, n: usize) -> Vec<usize> {
    let holders: Vec<usize> = (0..n).filter(|r| n == 1 || r % 2 == 1).collect();
    let mut p = vec![0; n];
    for i in 0..rows {
        p[holders[i % holders.len()]] += 1;
    }
    p
}

/// Rank 0 runs `f` (file writing); everyone learns whether it worked.
fn on_rank0(world: &Comm, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let mine = if world.rank() == 0 { f().map_err(|e| format!("{e:#}")) } else { Ok(()) };
    let msg = mine.clone().err().unwrap_or_default();
    let all = world.allgatherv(msg.as_bytes())?;
    if let Some(m) = all.iter().find(|m| !m.is_empty()) {
        bail!("rank 0 could not write the files: {}", String::from_utf8_lossy(m));
    }
    Ok(())
}

// ----------------------------------------------------------------- layouts

/// One layout case: rows per file, the table's partition, file kind.
struct Case {
    name: String,
    counts: Vec<usize>,
    partition: Option<Vec<usize>>,
    raw: bool,
}

fn cases(n: usize) -> Vec<Case> {
    let case = |name: &str, counts: Vec<usize>, partition: Option<Vec<usize>>, raw| Case { name: name.into(), counts, partition, raw };
    let rows = 60 * n + 37;
    vec![
        // Equal shards, one per rank when the rows divide.
        case("equal", vec![60; 4], None, false),
        // One shard holds nearly every row: it spans several ranks' partitions.
        case("one-big-shard", vec![3, rows - 10, 0, 7], None, false),
        // Many small, uneven shards (some empty): each rank's partition spans several.
        case("many-small", (0..29).map(|i| [0, 1, 5, 13, 2][i % 5] + i % 3).collect(), None, false),
        // Ranks without rows, and files without rows.
        case(
            "zero-row-ranks",
            {
                let mut c = uneven(rows, 6, 1);
                c.insert(2, 0);
                c.push(0);
                c
            },
            Some(zero_row_partition(rows, n)),
            false,
        ),
        // Raw files of uneven size.
        case("raw", uneven(rows, 5, 3), None, true),
    ]
}

/// Loads every case into a `T` table of `row_shape` rows of memory type
/// `ty`, and checks every rank's rows.
fn load_cases<T: TestElem>(world: &Comm, ty: MemoryType, dir: &Path, row_shape: &[usize]) -> Result<()> {
    let me = world.rank();
    for (k, case) in cases(world.size()).into_iter().enumerate() {
        let rows: usize = case.counts.iter().sum();
        let what = format!("{ty} {} {:?} case {}", T::DTYPE, row_shape, case.name);
        let sub = dir.join(format!("{ty}-{}-{k}-{}", T::DTYPE, row_shape.len()));
        let mut paths = Vec::new();
        on_rank0(world, || {
            paths = write_shards::<T>(&sub, &case.counts, row_shape, case.raw)?;
            Ok(())
        })?;
        if paths.is_empty() {
            // Ranks other than 0 name the files the same way.
            let ext = if case.raw { "bin" } else { "npy" };
            paths = (0..case.counts.len()).map(|i| sub.join(format!("shard_{i:04}.{ext}"))).collect();
        }
        let mut sizes = vec![rows];
        sizes.extend_from_slice(row_shape);
        let mut strides = vec![0; sizes.len()];
        let mut s = 1;
        for d in (0..sizes.len()).rev() {
            strides[d] = s;
            s *= if d == 0 { 1 } else { sizes[d] };
        }
        let desc = TensorDesc::new(&sizes, &strides, 0)?;
        let mut t = WholeTensor::<T>::allocate(world, ty, Location::Host, desc, case.partition.as_deref()).context(what.clone())?;
        let set = if case.raw {
            ShardSet::raw_files(&paths)
        } else if k % 2 == 0 {
            ShardSet::npy_dir(&sub)
        } else {
            ShardSet::npy_files(&paths)
        };
        let loaded = t.load(&set).context(what.clone())?;
        let row_bytes = std::mem::size_of::<T>() * row_shape.iter().product::<usize>();
        ensure!(loaded.bytes == (t.local_rows().len() * row_bytes) as u64, "{what}: rank {me} loaded {} bytes", loaded.bytes);
        let overlapping = {
            let mut first = 0;
            let mine = t.local_rows();
            case.counts
                .iter()
                .filter(|&&c| {
                    let r = first..first + c;
                    first += c;
                    c > 0 && !mine.is_empty() && r.start < mine.end && mine.start < r.end
                })
                .count()
        };
        ensure!(loaded.files == overlapping, "{what}: rank {me} read {} files, its rows overlap {overlapping}", loaded.files);
        check_local(&t, &what, me)?;
        if ty.is_mapped() {
            // Every rank sees every row through the mapping.
            world.barrier()?;
            let mut buf = vec![T::of(0.0); t.row_stride()];
            for r in [0, rows / 2, rows - 1] {
                t.read_row(r, &mut buf)?;
                let want: Vec<T> = (0..t.row_stride()).map(|c| value::<T>(r, c)).collect();
                ensure!(buf == want, "{what}: rank {me} reads row {r} through the mapping as {buf:?}");
            }
        }
        t.free()?;
    }
    Ok(())
}

fn layouts(world: &Comm, dir: &Path) -> Result<()> {
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            wm_tests::skip(world.as_ref(), ty, Location::Host, &ty.to_string(), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        load_cases::<f32>(world, ty, dir, &[7])?;
    }
    // Every element type and row shape, on one type that works anywhere.
    let ty = MemoryType::Distributed;
    load_cases::<f64>(world, ty, dir, &[3])?;
    load_cases::<half::f16>(world, ty, dir, &[2, 3])?;
    load_cases::<i8>(world, ty, dir, &[5])?;
    load_cases::<i16>(world, ty, dir, &[4])?;
    load_cases::<i32>(world, ty, dir, &[1])?;
    load_cases::<i64>(world, ty, dir, &[])?;
    bf16_raw(world, dir)?;
    Ok(())
}

/// bf16 tables load from raw files (numpy has no bf16).
fn bf16_raw(world: &Comm, dir: &Path) -> Result<()> {
    let rows = 50 * world.size() + 3;
    let sub = dir.join("bf16");
    let counts = uneven(rows, 3, 2);
    let mut paths: Vec<PathBuf> = (0..3).map(|i| sub.join(format!("shard_{i:04}.bin"))).collect();
    on_rank0(world, || {
        paths = write_shards::<half::bf16>(&sub, &counts, &[9], true)?;
        Ok(())
    })?;
    // What ml_dtypes saves for bf16 (an anonymous '<V2') names no element type.
    let npy = dir.join("bf16-npy");
    on_rank0(world, || write_shards::<half::bf16>(&npy, &counts, &[9], false).map(|_| ()))?;
    let mut t = WholeTensor::<half::bf16>::matrix(world, MemoryType::Distributed, Location::Host, rows, 9, None)?;
    let err = t.load(&ShardSet::npy_dir(&npy)).expect_err("'<V2' is no element type");
    ensure!(err.to_string().contains("shard_0000.npy: element type '<V2' is not one a table holds"), "{err}");
    t.load(&ShardSet::raw_files(&paths))?;
    check_local(&t, "bf16 raw", world.rank())?;
    t.free()?;
    Ok(())
}

// -------------------------------------------------------------- round-trip

fn fill<T: TestElem>(t: &mut WholeTensor<T>) -> Result<()> {
    let per_row = t.row_stride();
    let first = t.local_rows().start;
    // Through write_rows, so device tables fill the same way.
    let mut rows = vec![T::zeroed(); t.local_rows().len() * per_row];
    for (i, row) in rows.chunks_mut(per_row.max(1)).enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = value::<T>(first + i, c);
        }
    }
    t.memory_mut().write_rows(first, bytemuck::cast_slice(&rows))?;
    Ok(())
}

/// Stores a table of a zero-row partition, then loads it into tables of
/// other partitions and types; NPY directories and one raw file.
fn round_trip(world: &Comm, dir: &Path, loc: Location) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    for ty in MemoryType::ALL {
        if let Some(reason) = query(world.as_ref(), ty, loc).reason() {
            wm_tests::skip(world.as_ref(), ty, loc, &format!("{loc} {ty}"), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        let rows = 1000 + 17 * n;
        let what = format!("{loc} {ty} round trip");
        let store_part = zero_row_partition(rows, n);
        let mut t = WholeTensor::<f32>::matrix(world, ty, loc, rows, 5, Some(&store_part))?;
        fill(&mut t)?;
        let npy_dir = dir.join(format!("{ty}-npy"));
        // Leftovers of an earlier, larger store, and a file that is not a shard.
        on_rank0(world, || {
            std::fs::create_dir_all(&npy_dir)?;
            write_file(&npy_dir.join("shard_0099.npy"), &[b"stale"])?;
            write_file(&npy_dir.join("shard_1.npy"), &[b"stale"])?;
            write_file(&npy_dir.join("notes.txt"), &[b"kept"])?;
            Ok(())
        })?;
        world.barrier()?;
        t.store(&StoreTarget::NpyDir(npy_dir.clone())).context(what.clone())?;
        // One file per rank, each with that rank's rows (0-row files too).
        let mut names: Vec<String> =
            std::fs::read_dir(&npy_dir)?.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())).collect::<Result<_, _>>()?;
        names.sort();
        let mut want: Vec<String> = (0..n).map(|r| format!("shard_{r:04}.npy")).collect();
        want.push("notes.txt".into());
        want.sort();
        ensure!(names == want, "{what}: the directory holds {names:?}, expected {want:?}");
        for (r, &count) in store_part.iter().enumerate() {
            let bytes = std::fs::read(npy_dir.join(format!("shard_{r:04}.npy")))?;
            let header = npy_header("<f4", false, &[count, 5]);
            ensure!(bytes.len() == header.len() + count * 20, "{what}: shard {r} has {} bytes", bytes.len());
            ensure!(bytes[..header.len()] == header[..], "{what}: shard {r}'s header differs from numpy's");
            let first: usize = store_part[..r].iter().sum();
            ensure!(bytes[header.len()..] == rows_bytes::<f32>(first..first + count, 5)[..], "{what}: shard {r}'s data");
        }
        let raw = dir.join(format!("{ty}.raw"));
        t.store(&StoreTarget::RawFile(raw.clone())).context(what.clone())?;
        ensure!(std::fs::read(&raw)? == rows_bytes::<f32>(0..rows, 5), "{what}: the raw file");
        t.free()?;

        // Back into tables of other partitions.
        let reversed: Vec<usize> = store_part.iter().rev().copied().collect();
        for (pname, partition) in [("even", None), ("reversed", Some(reversed))] {
            let mut back = WholeTensor::<f32>::matrix(world, ty, loc, rows, 5, partition.as_deref())?;
            back.load(&ShardSet::npy_dir(&npy_dir)).context(format!("{what}: npy into {pname}"))?;
            check_local(&back, &format!("{what}: npy into {pname}"), me)?;
            let zeros = vec![0u8; back.local_rows().len() * back.memory().granularity()];
            let first = back.local_rows().start;
            back.memory_mut().write_rows(first, &zeros)?;
            back.load(&ShardSet::raw_files([&raw])).context(format!("{what}: raw into {pname}"))?;
            check_local(&back, &format!("{what}: raw into {pname}"), me)?;
            back.free()?;
        }
    }

    if loc == Location::Device {
        // The element types and layouts below are the host path's business.
        return Ok(());
    }
    // Other element types and shapes.
    round_trip_typed::<i8>(world, dir, &[3, 2])?;
    round_trip_typed::<half::f16>(world, dir, &[])?;
    round_trip_typed::<i64>(world, dir, &[4])?;

    // bf16: not to NPY (on every rank), but through a raw file.
    let rows = 77 * n;
    let mut t = WholeTensor::<half::bf16>::matrix(world, MemoryType::Distributed, Location::Host, rows, 6, None)?;
    fill(&mut t)?;
    let err = t.store(&StoreTarget::NpyDir(dir.join("bf16"))).expect_err("bf16 cannot be NPY");
    ensure!(matches!(err, wholemem::Error::Unsupported { .. }) && err.to_string().contains("numpy has no bf16"), "{err}");
    let raw = dir.join("bf16.raw");
    t.store(&StoreTarget::RawFile(raw.clone()))?;
    t.write_local(&vec![half::bf16::ZERO; t.local_rows().len() * t.row_stride()])?;
    t.load(&ShardSet::raw_files([&raw]))?;
    check_local(&t, "bf16 raw round trip", me)?;
    t.free()?;
    Ok(())
}

fn round_trip_typed<T: TestElem>(world: &Comm, dir: &Path, row_shape: &[usize]) -> Result<()> {
    let n = world.size();
    let rows = 123 * n + 1;
    let mut sizes = vec![rows];
    sizes.extend_from_slice(row_shape);
    let per_row: usize = row_shape.iter().product();
    let mut strides: Vec<usize> = Vec::new();
    let mut s = per_row;
    strides.push(s);
    for d in row_shape {
        s /= d;
        strides.push(s);
    }
    let desc = TensorDesc::new(&sizes, &strides, 0)?;
    let what = format!("{} {row_shape:?} round trip", T::DTYPE);
    let mut t = WholeTensor::<T>::allocate(world, MemoryType::Hierarchy, Location::Host, desc.clone(), Some(&uneven(rows, n, 4)))?;
    fill(&mut t)?;
    let sub = dir.join(format!("typed-{}", T::DTYPE));
    t.store(&StoreTarget::NpyDir(sub.clone())).context(what.clone())?;
    t.free()?;
    let mut back = WholeTensor::<T>::allocate(world, MemoryType::Distributed, Location::Host, desc, None)?;
    back.load(&ShardSet::npy_dir(&sub)).context(what.clone())?;
    check_local(&back, &what, world.rank())?;
    back.free()?;
    Ok(())
}

// --------------------------------------------------------------- malformed

/// Writes a good directory: 3 uneven f32 shards of `rows` rows of 7.
fn good_dir(dir: &Path, rows: usize) -> Result<PathBuf> {
    let good = dir.join("good");
    write_shards::<f32>(&good, &uneven(rows, 3, 0), &[7], false)?;
    Ok(good)
}

/// What rank 0 writes into a case's directory.
type Setup = Box<dyn Fn(&Path) -> Result<()>>;
/// What rank `r` loads from a case's directory.
type SetFor = Box<dyn Fn(&Path, usize) -> ShardSet>;

/// One malformed case: what rank 0 writes, what each rank loads, and what
/// every rank's error must say.
struct Bad {
    name: &'static str,
    setup: Setup,
    set: SetFor,
    needles: Vec<String>,
}

impl Bad {
    /// A case that loads the NPY shards of its directory, whose error must
    /// name `needle`.
    fn in_dir(name: &'static str, setup: impl Fn(&Path) -> Result<()> + 'static, needle: impl Into<String>) -> Self {
        Self { name, setup: Box::new(setup), set: Box::new(|d, _| ShardSet::npy_dir(d)), needles: vec![needle.into()] }
    }
}

/// Writes shard `i` of `counts` (f32 rows of `cols`, or f64 for `<f8`),
/// with `descr` and `fortran` in its header and `extra` bytes after the data.
fn shard_file(d: &Path, counts: &[usize], i: usize, descr: &str, fortran: bool, cols: usize, extra: &[u8]) -> Result<()> {
    let first: usize = counts[..i].iter().sum();
    let c = counts[i];
    let data = if descr == "<f8" { rows_bytes::<f64>(first..first + c, cols) } else { rows_bytes::<f32>(first..first + c, cols) };
    write_file(&d.join(format!("shard_{i:04}.npy")), &[&npy_header(descr, fortran, &[c, cols]), &data, extra])
}

/// Writes good f32 shards of `counts`, except shard `bad`, which `f` writes.
fn shards_but(d: &Path, counts: &[usize], bad: usize, f: impl Fn(&Path, usize) -> Result<()>) -> Result<()> {
    std::fs::create_dir_all(d)?;
    for i in 0..counts.len() {
        if i == bad { f(d, i)? } else { shard_file(d, counts, i, "<f4", false, 7, &[])? }
    }
    Ok(())
}

/// Good f32 shards of `counts` but shard `bad`, written as [`shard_file`]
/// writes it with `descr`, `fortran`, `cols` and `extra`.
fn odd_shard(
    counts: &'static [usize],
    bad: usize,
    descr: &'static str,
    fortran: bool,
    cols: usize,
    extra: &'static [u8],
) -> impl Fn(&Path) -> Result<()> {
    move |d| shards_but(d, counts, bad, |d, i| shard_file(d, counts, i, descr, fortran, cols, extra))
}

/// The cases of a directory as a whole: missing, empty, numbered wrong.
fn directory_cases(counts: &'static [usize]) -> Vec<Bad> {
    let all_good = move |d: &Path| shards_but(d, counts, usize::MAX, |_, _| Ok(()));
    vec![
        Bad {
            name: "missing directory",
            setup: Box::new(|_| Ok(())),
            set: Box::new(|d, _| ShardSet::npy_dir(d.join("nope"))),
            needles: vec!["nope: the shard directory does not exist".into()],
        },
        Bad::in_dir(
            "no shards",
            |d| {
                std::fs::create_dir_all(d)?;
                write_file(&d.join("readme.txt"), &[b"no shards here"])
            },
            "no shard files",
        ),
        Bad::in_dir(
            "gap",
            move |d| {
                all_good(d)?;
                std::fs::rename(d.join("shard_0002.npy"), d.join("shard_0003.npy"))?;
                Ok(())
            },
            "gap: shard_0002.npy is missing (the next file is shard_0003.npy)",
        ),
        Bad::in_dir(
            "duplicate number",
            move |d| {
                all_good(d)?;
                std::fs::copy(d.join("shard_0001.npy"), d.join("shard_1.npy"))?;
                Ok(())
            },
            "shard_0001.npy and shard_1.npy both have shard number 1",
        ),
    ]
}

/// The cases of files that do not agree with each other or with the table,
/// or are not what they claim to be.
fn file_cases(rows: usize, counts: &'static [usize]) -> Vec<Bad> {
    vec![
        Bad::in_dir(
            "element types differ between files",
            odd_shard(counts, 1, "<f8", false, 7, &[]),
            "shard_0001.npy: element type f64 differs from f32 in shard_0000.npy",
        ),
        Bad::in_dir(
            "row shapes differ between files",
            odd_shard(counts, 2, "<f4", false, 6, &[]),
            "shard_0002.npy: row shape [6] differs from [7] in shard_0000.npy",
        ),
        Bad::in_dir("fortran order", odd_shard(counts, 1, "<f4", true, 7, &[]), "shard_0001.npy: the array is in Fortran"),
        Bad::in_dir(
            "element type not the table's",
            move |d| write_shards::<f64>(d, counts, &[7], false).map(|_| ()),
            "shard_0000.npy: the file holds f64 elements but the table holds f32",
        ),
        Bad::in_dir(
            "row shape not the table's",
            move |d| write_shards::<f32>(d, &[rows], &[8], false).map(|_| ()),
            "rows of shape [8] in the file, [7] in the table",
        ),
        Bad::in_dir(
            "total rows",
            move |d| write_shards::<f32>(d, &[5, rows - 6], &[7], false).map(|_| ()),
            format!("the files hold {} rows in all, the table has {rows}", rows - 1),
        ),
        Bad::in_dir("big-endian", odd_shard(counts, 0, ">f4", false, 7, &[]), "shard_0000.npy: big-endian data ('>f4')"),
        Bad::in_dir(
            "unsupported element type",
            odd_shard(counts, 2, "<u4", false, 7, &[]),
            "shard_0002.npy: element type '<u4' is not one a table holds",
        ),
        Bad::in_dir(
            "file longer than its header says",
            odd_shard(counts, 1, "<f4", false, 7, &[1, 2, 3]),
            format!("shard_0001.npy: the header describes {} bytes", npy_header("<f4", false, &[counts[1], 7]).len() + counts[1] * 28),
        ),
        Bad::in_dir(
            "not NPY",
            move |d| shards_but(d, counts, 0, |d, i| write_file(&d.join(format!("shard_{i:04}.npy")), &[b"PK\x03\x04 not an array"])),
            "shard_0000.npy: not a valid NPY file: it does not start with the NPY magic",
        ),
        Bad {
            name: "raw size",
            setup: Box::new(move |d| {
                std::fs::create_dir_all(d)?;
                write_file(&d.join("a.bin"), &[&rows_bytes::<f32>(0..10, 7)])?;
                write_file(&d.join("b.bin"), &[&rows_bytes::<f32>(10..rows, 7), &[0; 5]])
            }),
            set: Box::new(|d, _| ShardSet::raw_files([d.join("a.bin"), d.join("b.bin")])),
            needles: vec![format!("b.bin: its size, {} bytes, is not a multiple of the row size, 28 bytes", (rows - 10) * 28 + 5)],
        },
    ]
}

/// The cases where the last of `n` ranks (more than one) sees other files
/// than the rest.
fn rank_cases(rows: usize, counts: &'static [usize], n: usize) -> Vec<Bad> {
    vec![
        // The last rank alone passes another directory: same rows, split differently.
        Bad {
            name: "ranks see different layouts",
            setup: Box::new(move |d| {
                write_shards::<f32>(&d.join("a"), counts, &[7], false)?;
                write_shards::<f32>(&d.join("b"), &[rows - 1, 1], &[7], false).map(|_| ())
            }),
            set: Box::new(move |d, r| ShardSet::npy_dir(d.join(if r == n - 1 { "b" } else { "a" }))),
            needles: vec![format!(
                "rank {} sees a different layout from rank 0: \"shard_0000.npy: {} rows from byte 128\" where rank 0 sees \"shard_0000.npy: {} rows",
                n - 1,
                rows - 1,
                counts[0]
            )],
        },
        // The last rank alone cannot discover: every rank fails, naming it.
        Bad {
            name: "one rank's directory is missing",
            setup: Box::new(move |d| write_shards::<f32>(d, counts, &[7], false).map(|_| ())),
            set: Box::new(move |d, r| ShardSet::npy_dir(if r == n - 1 { d.join("gone") } else { d.to_path_buf() })),
            needles: vec!["gone: the shard directory does not exist".into()],
        },
    ]
}

fn malformed(world: &Comm, dir: &Path) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let rows = 40 * n + 11;
    // Shared by the case closures; a test program may leak it.
    let counts: &'static [usize] = Box::leak(uneven(rows, 3, 0).into_boxed_slice());
    let mut cases = directory_cases(counts);
    cases.extend(file_cases(rows, counts));
    if n > 1 {
        cases.extend(rank_cases(rows, counts, n));
    }
    let mut good = PathBuf::new();
    on_rank0(world, || {
        good = good_dir(dir, rows)?;
        Ok(())
    })?;
    let good = if me == 0 { good } else { dir.join("good") };
    for ty in [MemoryType::Distributed, MemoryType::Chunked] {
        if let Some(reason) = query(world.as_ref(), ty, Location::Host).reason() {
            wm_tests::skip(world.as_ref(), ty, Location::Host, &ty.to_string(), reason).map_err(anyhow::Error::msg)?;
            continue;
        }
        let mut t = WholeTensor::<f32>::matrix(world, ty, Location::Host, rows, 7, None)?;
        for (k, case) in cases.iter().enumerate() {
            run_case(world, &mut t, ty, case, &dir.join(format!("{ty}-bad-{k}")), &good)?;
        }
        // The error variants carry the values.
        let err = t.load(&ShardSet::npy_dir(dir.join("absent"))).expect_err("missing");
        ensure!(matches!(err, wholemem::Error::Shards { problem: ShardProblem::MissingDirectory, .. }), "{err:?}");
        // A row format that does not fit the table.
        let wrong = RowFormat::vector(DType::F32, 6);
        let err = wholemem::files::load(t.memory_mut(), &wrong, &ShardSet::npy_dir(&good)).expect_err("6 columns in a 7-column table");
        ensure!(err.to_string().contains("are 24 bytes, the table's rows 28 bytes"), "{err}");
        t.free()?;
    }
    // Rows with padding cannot be loaded.
    let mut padded =
        WholeTensor::<f32>::allocate(world, MemoryType::Distributed, Location::Host, TensorDesc::matrix_with_stride(rows, 7, 8)?, None)?;
    let err = padded.load(&ShardSet::npy_dir(&good)).expect_err("padded rows");
    ensure!(err.to_string().contains("rows are 8 elements apart"), "{err}");
    padded.free()?;
    Ok(())
}

/// One malformed case on a `ty` table: rank 0 writes `sub`, every rank's
/// load must fail naming the case's needles, and the same table then loads
/// the `good` directory.
fn run_case(world: &Comm, t: &mut WholeTensor<f32>, ty: MemoryType, case: &Bad, sub: &Path, good: &Path) -> Result<()> {
    let me = world.rank();
    on_rank0(world, || (case.setup)(sub).with_context(|| format!("setting up {:?}", case.name)))?;
    t.write_local(&vec![-1.0; t.local_rows().len() * t.row_stride()])?;
    let err = t.load(&(case.set)(sub, me)).err().with_context(|| format!("{ty} {:?}: the load must fail on rank {me}", case.name))?;
    let s = err.to_string();
    for needle in &case.needles {
        ensure!(s.contains(needle.as_str()), "{ty} {:?}: rank {me}'s error {s:?} does not contain {needle:?}", case.name);
    }
    if me == 0 && ty == MemoryType::Distributed {
        println!("{}: {s}", case.name);
    }
    // The same processes load a good directory next.
    t.load(&ShardSet::npy_dir(good)).with_context(|| format!("{ty}: the load after {:?}", case.name))?;
    check_local(t, &format!("{ty}: the load after {:?}", case.name), me)
}
