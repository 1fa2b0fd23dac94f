//! Loading a table from sharded files, and storing it back.
//!
//! A table is loaded from a directory of `shard_0000.npy, shard_0001.npy, …`
//! or from an explicit list of `.npy` or raw files ([`ShardSet`]). The files
//! are stacked along the first axis: file `i` holds the rows after those of
//! files `0..i`, and files may hold different numbers of rows (zero
//! included). Every rank reads only the rows of its own partition, from
//! whichever files overlap it, with several threads and positioned reads
//! straight into its portion of the table.
//!
//! [`load`] and [`store`] are collective: every rank of the table's
//! communicator calls them with the same arguments. Each step ends with every
//! rank learning every other rank's outcome, so a problem found anywhere is
//! an error on every rank, and the ranks can go on (load again, free).
//!
//! ```no_run
//! use wholemem::files::{ShardSet, StoreTarget};
//! use wholemem::{Location, MemoryType, WholeTensor};
//! let world = wm_comm::init()?;
//! let mut t = WholeTensor::<f32>::matrix(&world, MemoryType::Chunked, Location::Host, 1_000_000, 128, None)?;
//! t.load(&ShardSet::npy_dir("/data/features"))?;
//! t.store(&StoreTarget::NpyDir("/data/features-copy".into()))?;
//! t.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod layout;
pub mod npy;

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use wm_comm::Communicator;

pub use layout::{Layout, Piece, ShardFile};

use crate::CommonError;
use crate::agree::{Rule, agree};
use crate::error::ShardProblem;
use crate::handle::WholeMemory;
use crate::tensor::WholeTensor;
use crate::types::Location;
use crate::{DType, Element, Error, Result};

impl DType {
    /// The NPY `descr` numpy writes for this type; `None` for bf16 (numpy
    /// has no such type: bf16 tables go to raw files).
    pub fn npy_descr(self) -> Option<&'static str> {
        match self {
            Self::F16 => Some("<f2"),
            Self::Bf16 => None,
            Self::F32 => Some("<f4"),
            Self::F64 => Some("<f8"),
            Self::I8 => Some("|i1"),
            Self::I16 => Some("<i2"),
            Self::I32 => Some("<i4"),
            Self::I64 => Some("<i8"),
        }
    }
}

/// What one row of a table is in a file: its element type and shape (the
/// dimensions after the first; empty for a one-dimensional table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFormat {
    /// The element type.
    pub elem: DType,
    /// The shape of one row.
    pub shape: Vec<u64>,
}

impl RowFormat {
    /// Rows of `cols` elements of `elem`.
    pub fn vector(elem: DType, cols: usize) -> Self {
        Self { elem, shape: vec![cols as u64] }
    }

    /// Bytes per row; `usize::MAX` for a shape whose size does not fit in
    /// a `usize` (no table has rows that large, so every check against a
    /// table refuses it).
    pub fn row_bytes(&self) -> usize {
        self.shape
            .iter()
            .try_fold(self.elem.size() as u64, |a, &d| a.checked_mul(d))
            .and_then(|b| usize::try_from(b).ok())
            .unwrap_or(usize::MAX)
    }
}

/// Whether files are NPY or raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// NPY files: element type and shape from each header.
    Npy,
    /// Raw little-endian rows, C order, no header: the element type and row
    /// shape are the table's, the row count is the file size over the row
    /// size.
    Raw,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Dir(PathBuf),
    Files(Vec<PathBuf>),
}

/// The files a table is loaded from, stacked along the first axis in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSet {
    source: Source,
    kind: FileKind,
}

impl ShardSet {
    /// `dir/shard_0000.npy, dir/shard_0001.npy, …`: every file named
    /// `shard_<digits>.npy`, numbered from 0 without gaps (what
    /// [`StoreTarget::NpyDir`] writes). Other files in the directory are
    /// ignored.
    pub fn npy_dir(dir: impl Into<PathBuf>) -> Self {
        Self { source: Source::Dir(dir.into()), kind: FileKind::Npy }
    }

    /// These NPY files, in this order.
    pub fn npy_files(files: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        Self { source: Source::Files(files.into_iter().map(Into::into).collect()), kind: FileKind::Npy }
    }

    /// These raw files, in this order.
    pub fn raw_files(files: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        Self { source: Source::Files(files.into_iter().map(Into::into).collect()), kind: FileKind::Raw }
    }

    /// NPY or raw.
    pub fn kind(&self) -> FileKind {
        self.kind
    }

    /// Reads the headers (or sizes) of the files, on this rank alone, and
    /// says what they hold. `row` gives raw files their element type and
    /// row shape; NPY files are not checked against it here.
    ///
    /// # Errors
    /// [`Error::Shards`] naming the file or directory and the
    /// [`ShardProblem`]; [`Error::Os`] when a file cannot be opened or read;
    /// [`crate::CommonError::InvalidArgument`] for an empty list of files or rows of 0
    /// bytes.
    pub fn discover(&self, row: &RowFormat) -> Result<Layout> {
        if row.row_bytes() == 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!("rows of shape {:?} have no bytes", row.shape))));
        }
        layout::discover(self, row)
    }

    /// The path errors about the whole set name: the directory, or the
    /// first file.
    fn place(&self) -> &Path {
        match &self.source {
            Source::Dir(d) => d,
            Source::Files(f) => f.first().map_or(Path::new(""), PathBuf::as_path),
        }
    }
}

/// Where [`store`] writes a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreTarget {
    /// One NPY file per rank, `shard_NNNN.npy` numbered by rank, holding
    /// that rank's rows (a rank without rows writes a file of 0 rows). The
    /// directory is created if needed; `shard_*.npy` files already there
    /// that this store does not write are removed, so the directory then
    /// holds exactly this table.
    NpyDir(PathBuf),
    /// One raw file holding every row in order, each rank writing its rows
    /// at their offset. Created or truncated.
    RawFile(PathBuf),
}

/// What one rank did in a [`load`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// Bytes this rank read into its rows.
    pub bytes: u64,
    /// Files this rank read from.
    pub files: usize,
    /// Threads it read with.
    pub threads: usize,
}

/// Per thread, at least this many bytes, so small loads use fewer threads.
const MIN_BYTES_PER_THREAD: usize = 1 << 20;

/// Fills `mem` from `shards`. Collective: every rank calls it with the same
/// arguments; each reads only its own rows.
///
/// The steps: every rank discovers the layout (headers or sizes) and checks
/// it against the table; every rank learns whether all succeeded; every rank
/// learns every other rank's layout and compares it with rank 0's; then each
/// reads its rows, with [`threads`] threads, and all learn whether all
/// succeeded.
///
/// # Errors
/// On every rank, when any rank fails: the failing rank gets its own error,
/// the others [`crate::CommonError::PeerFailed`] naming it and quoting the error.
/// - [`Error::Shards`] for unusable files: a missing directory, no shards, a
///   gap in the numbering, files that are not NPY, big-endian or unsupported
///   element types, Fortran order, a file size that does not match, files
///   that differ in element type or row shape, an element type or row shape
///   other than the table's, a total row count other than the table's, a
///   raw file that is not a whole number of rows, or ranks that see
///   different layouts ([`ShardProblem::LayoutDiffers`]).
/// - [`crate::CommonError::InvalidArgument`] when `row` does not fit the table's row size.
/// - [`Error::Os`] for a file that cannot be opened or read.
/// - [`Error::Comm`] when a peer is lost.
pub fn load(mem: &mut WholeMemory, row: &RowFormat, shards: &ShardSet) -> Result<Loaded> {
    let comm = mem.comm().clone();
    let discovered = check_row_format(mem, row).and_then(|()| {
        let layout = shards.discover(row)?;
        layout.check_table(row, mem.rows(), shards.place())?;
        Ok(layout)
    });
    let layout = agree(comm.as_ref(), discovered, Rule::OwnFirst)?;
    same_layout(comm.as_ref(), &layout, shards.place())?;
    let n = threads(mem);
    let read = read_local(mem, &layout, n);
    agree(comm.as_ref(), read, Rule::OwnFirst)
}

/// Writes `mem` to `target`. Collective: every rank calls it with the same
/// arguments and writes its own rows. Loading the result with
/// [`ShardSet::npy_dir`] (or [`ShardSet::raw_files`] with the one file)
/// gives the same table back.
///
/// # Errors
/// On every rank, when any rank fails (as for [`load`]):
/// [`Error::Unsupported`] for a bf16 table to NPY files (numpy has no bf16:
/// use [`StoreTarget::RawFile`]);
/// [`crate::CommonError::InvalidArgument`] when `row` does not fit the table's row size;
/// [`Error::Os`] when a file or directory cannot be written.
pub fn store(mem: &WholeMemory, row: &RowFormat, target: &StoreTarget) -> Result<()> {
    let comm = mem.comm().clone();
    let checked = check_row_format(mem, row).and_then(|()| {
        if matches!(target, StoreTarget::NpyDir(_)) && row.elem.npy_descr().is_none() {
            return Err(Error::Unsupported {
                what: format!("storing a {} table as NPY files", row.elem),
                reason: "numpy has no bf16 element type; store it to a raw file".into(),
            });
        }
        Ok(())
    });
    agree(comm.as_ref(), checked, Rule::OwnFirst)?;
    let prepared = if comm.rank() == 0 { prepare(target, comm.size(), mem.total_bytes()) } else { Ok(()) };
    agree(comm.as_ref(), prepared, Rule::OwnFirst)?;
    let written = write_local(mem, row, target, threads(mem));
    agree(comm.as_ref(), written, Rule::OwnFirst)
}

/// Threads one rank reads or writes files with: the table's
/// [`WholeMemory::copy_threads`].
pub fn threads(mem: &WholeMemory) -> usize {
    mem.copy_threads()
}

impl<T: Element> WholeTensor<T> {
    /// What one row of this tensor is in a file.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when rows are not dense (a row stride
    /// larger than a row, or inner strides that are not row-major): files
    /// hold dense rows.
    pub fn row_format(&self) -> Result<RowFormat> {
        let d = self.desc();
        let shape: Vec<u64> = d.sizes()[1..].iter().map(|&s| s as u64).collect();
        let mut dense = 1usize;
        for (&size, &stride) in d.sizes()[1..].iter().zip(&d.strides()[1..]).rev() {
            if stride != dense && size > 1 {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "files hold dense row-major rows; this tensor's strides {:?} for sizes {:?} are not",
                    d.strides(),
                    d.sizes()
                ))));
            }
            dense *= size;
        }
        if d.row_stride() != dense {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "files hold dense rows of {dense} elements; this tensor's rows are {} elements apart",
                d.row_stride()
            ))));
        }
        Ok(RowFormat { elem: T::DTYPE, shape })
    }

    /// Fills the tensor from `shards`: [`load`] with this tensor's
    /// [`row_format`](Self::row_format). Collective.
    ///
    /// # Errors
    /// As [`load`] and [`row_format`](Self::row_format).
    pub fn load(&mut self, shards: &ShardSet) -> Result<Loaded> {
        let row = self.row_format()?;
        load(self.memory_mut(), &row, shards)
    }

    /// Writes the tensor to `target`: [`store`] with this tensor's
    /// [`row_format`](Self::row_format). Collective.
    ///
    /// # Errors
    /// As [`store`] and [`row_format`](Self::row_format).
    pub fn store(&self, target: &StoreTarget) -> Result<()> {
        let row = self.row_format()?;
        store(self.memory(), &row, target)
    }
}

/// Every rank compares every rank's layout with rank 0's; a difference is
/// the same error on every rank, naming the rank and the first difference.
fn same_layout(comm: &dyn Communicator, layout: &Layout, place: &Path) -> Result<()> {
    let mine = layout.canonical();
    let all = comm.allgatherv(mine.as_bytes())?;
    let reference = String::from_utf8_lossy(&all[0]);
    for (r, other) in all.iter().enumerate().skip(1) {
        let other = String::from_utf8_lossy(other);
        if other != reference {
            let ranks = comm.world_ranks();
            let (theirs, its) = layout::first_difference(&reference, &other);
            let detail = format!("{its:?} where rank {} sees {theirs:?}", ranks[0]);
            return Err(Error::shards(place, ShardProblem::LayoutDiffers { rank: ranks[r], reference: ranks[0], detail }));
        }
    }
    Ok(())
}

fn check_row_format(mem: &WholeMemory, row: &RowFormat) -> Result<()> {
    if row.row_bytes() != mem.granularity() {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "rows of {:?} {} elements are {} bytes, the table's rows {} bytes",
            row.shape,
            row.elem,
            row.row_bytes(),
            mem.granularity()
        ))));
    }
    Ok(())
}

/// Where a rank's rows are read into or written from: the table itself
/// (host memory), or a host buffer copied to or from the GPU in one piece
/// (device memory, which has no host view).
struct Staging {
    buf: Vec<u8>,
}

impl Staging {
    fn for_device(mem: &WholeMemory) -> Option<Self> {
        (mem.location() == Location::Device).then(|| Self { buf: vec![0u8; mem.local_rows().len() * mem.granularity()] })
    }
}

/// This rank's rows as bytes to load into: the one place that knows where
/// the local rows live. With `staging`, its buffer, to be written to the
/// device afterwards ([`finish_destination`]).
///
/// # Safety
/// As [`WholeMemory::local_bytes_for_io`]: the slice only goes to
/// positioned reads, which store into it; no Rust code touches its contents.
#[allow(unsafe_code)]
unsafe fn local_destination<'a>(mem: &'a mut WholeMemory, staging: &'a mut Option<Staging>) -> Result<&'a mut [u8]> {
    Ok(match staging {
        Some(s) => &mut s.buf,
        // SAFETY: the caller's contract is that of `local_bytes_for_io`.
        None => unsafe { mem.local_bytes_for_io() },
    })
}

/// Copies a staged load to the device.
fn finish_destination(mem: &mut WholeMemory, staging: Option<Staging>) -> Result<()> {
    match staging {
        Some(s) => mem.write_rows(mem.local_rows().start, &s.buf),
        None => Ok(()),
    }
}

/// This rank's rows as bytes to store, the counterpart of
/// [`local_destination`]: device rows are first copied into `staging`.
///
/// # Safety
/// As [`WholeMemory::local_bytes_for_output`]: the slice only goes to
/// positioned writes, which read it; no Rust code reads its contents.
#[allow(unsafe_code)]
unsafe fn local_source<'a>(mem: &'a WholeMemory, staging: &'a mut Option<Staging>) -> Result<&'a [u8]> {
    Ok(match staging {
        Some(s) => {
            mem.read_rows(mem.local_rows().start, &mut s.buf)?;
            &s.buf
        }
        // SAFETY: the caller's contract is that of `local_bytes_for_output`.
        None => unsafe { mem.local_bytes_for_output() },
    })
}

/// Splits `rows` rows of `row_bytes` each over at most `threads` threads,
/// at least [`MIN_BYTES_PER_THREAD`] each: rows per thread.
fn rows_per_thread(rows: usize, row_bytes: usize, threads: usize) -> usize {
    let by_size = (rows * row_bytes / MIN_BYTES_PER_THREAD).max(1);
    rows.div_ceil(threads.min(by_size).max(1)).max(1)
}

/// Runs `f(first_row, chunk)` on `threads` threads over consecutive chunks
/// of `buf` (whole rows each); the first error wins.
fn in_parallel<B, F>(buf: B, rows: Range<usize>, row_bytes: usize, threads: usize, f: F) -> Result<usize>
where
    B: SplitRows,
    F: Fn(usize, B) -> Result<()> + Sync,
{
    let per = rows_per_thread(rows.len(), row_bytes, threads);
    let chunks = buf.split(per * row_bytes);
    let used = chunks.len();
    if used <= 1 {
        for c in chunks {
            f(rows.start, c)?;
        }
        return Ok(1);
    }
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = chunks.into_iter().enumerate().map(|(i, c)| s.spawn(move || f(rows.start + i * per, c))).collect();
        let mut first = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            if first.is_ok() {
                first = r;
            }
        }
        first
    })?;
    Ok(used)
}

/// A byte buffer that splits into chunks for the threads.
trait SplitRows: Sized + Send {
    fn split(self, chunk: usize) -> Vec<Self>;
    fn len(&self) -> usize;
}

impl SplitRows for &mut [u8] {
    fn split(self, chunk: usize) -> Vec<Self> {
        self.chunks_mut(chunk.max(1)).collect()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

impl SplitRows for &[u8] {
    fn split(self, chunk: usize) -> Vec<Self> {
        self.chunks(chunk.max(1)).collect()
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Reads this rank's rows from the files that hold them, with positioned
/// reads straight into the table.
// Takes the table's rows through the unsafe `local_destination`.
#[allow(unsafe_code)]
fn read_local(mem: &mut WholeMemory, layout: &Layout, threads: usize) -> Result<Loaded> {
    let rows = mem.local_rows();
    let rb = layout.row_bytes() as usize;
    let pieces = layout.pieces(rows.start as u64..rows.end as u64);
    let mut files: Vec<Option<File>> = (0..layout.files().len()).map(|_| None).collect();
    for p in &pieces {
        if files[p.file].is_none() {
            files[p.file] = Some(layout::open(&layout.files()[p.file].path)?);
        }
    }
    let mut staging = Staging::for_device(mem);
    // SAFETY: `dst` is split into chunks whose parts go to `read_exact_at`
    // only (below); only their lengths are read here, and all of them are
    // gone before `finish_destination`.
    let dst = unsafe { local_destination(mem, &mut staging) }?;
    debug_assert_eq!(dst.len(), rows.len() * rb);
    let bytes = dst.len() as u64;
    let used = in_parallel(dst, rows, rb, threads, |first, chunk: &mut [u8]| {
        let n = (chunk.len() / rb) as u64;
        for p in layout.pieces(first as u64..first as u64 + n) {
            let f = &layout.files()[p.file];
            let dest = &mut chunk[p.dest_row as usize * rb..][..(p.file_rows.end - p.file_rows.start) as usize * rb];
            let file = files[p.file].as_ref().expect("every file of a piece was opened");
            file.read_exact_at(dest, f.data_offset + p.file_rows.start * rb as u64)
                .map_err(|e| Error::os(format!("reading rows {}..{} of {}", p.file_rows.start, p.file_rows.end, f.path.display()), e))?;
        }
        Ok(())
    })?;
    finish_destination(mem, staging)?;
    Ok(Loaded { bytes, files: files.iter().filter(|f| f.is_some()).count(), threads: used })
}

/// Rank 0's part before anyone writes: the directory made and cleared of
/// other shard files, or the raw file created at its full size.
fn prepare(target: &StoreTarget, world: usize, total: usize) -> Result<()> {
    match target {
        StoreTarget::NpyDir(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::os(format!("creating {}", dir.display()), e))?;
            let keep: Vec<String> = (0..world as u64).map(layout::shard_name).collect();
            let listing = std::fs::read_dir(dir).map_err(|e| Error::os(format!("listing {}", dir.display()), e))?;
            for e in listing {
                let e = e.map_err(|e| Error::os(format!("listing {}", dir.display()), e))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if layout::is_shard_name(&name) && !keep.contains(&name) {
                    let p = e.path();
                    std::fs::remove_file(&p).map_err(|e| Error::os(format!("removing the old shard {}", p.display()), e))?;
                }
            }
            Ok(())
        }
        StoreTarget::RawFile(path) => {
            let f = File::create(path).map_err(|e| Error::os(format!("creating {}", path.display()), e))?;
            f.set_len(total as u64).map_err(|e| Error::os(format!("sizing {} to {total} bytes", path.display()), e))
        }
    }
}

/// Writes this rank's rows: its own NPY file, or its range of the raw file.
// Takes the table's rows through the unsafe `local_source`.
#[allow(unsafe_code)]
fn write_local(mem: &WholeMemory, row: &RowFormat, target: &StoreTarget, threads: usize) -> Result<()> {
    let rows = mem.local_rows();
    let rb = row.row_bytes();
    let mut staging = Staging::for_device(mem);
    // SAFETY: `src` is split into chunks that go to `write_all_at` only
    // (below); only their lengths are read here.
    let src = unsafe { local_source(mem, &mut staging) }?;
    let (path, file, base) = match target {
        StoreTarget::NpyDir(dir) => {
            let path = dir.join(layout::shard_name(mem.comm().rank() as u64));
            let mut shape = vec![rows.len() as u64];
            shape.extend_from_slice(&row.shape);
            let header = npy::Header::new(row.elem.npy_descr().expect("checked before"), &shape).to_bytes();
            let file = File::create(&path).map_err(|e| Error::os(format!("creating {}", path.display()), e))?;
            file.write_all_at(&header, 0).map_err(|e| Error::os(format!("writing the header of {}", path.display()), e))?;
            file.set_len((header.len() + src.len()) as u64)
                .map_err(|e| Error::os(format!("sizing {} to {} bytes", path.display(), header.len() + src.len()), e))?;
            (path, file, header.len() as u64)
        }
        StoreTarget::RawFile(path) => {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Error::os(format!("opening {} to write", path.display()), e))?;
            (path.clone(), file, (rows.start * rb) as u64)
        }
    };
    let start = rows.start;
    in_parallel(src, rows, rb, threads, |first, chunk: &[u8]| {
        let at = base + ((first - start) * rb) as u64;
        file.write_all_at(chunk, at)
            .map_err(|e| Error::os(format!("writing rows {}..{} to {}", first, first + chunk.len() / rb, path.display()), e))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_types_name_and_size() {
        for t in DType::ALL {
            assert_eq!(t.name().parse::<DType>().unwrap(), t);
            if let Some(d) = t.npy_descr() {
                assert_eq!(npy::element_type(d).unwrap(), t);
                assert_eq!(d[2..].parse::<usize>().unwrap(), t.size());
            }
        }
        assert!("u8".parse::<DType>().unwrap_err().contains("\"u8\""));
        assert_eq!(<half::bf16 as Element>::DTYPE.size(), 2);
        assert_eq!(<i64 as Element>::DTYPE, DType::I64);
    }

    #[test]
    fn threads_get_whole_rows_and_enough_bytes() {
        // Small loads use one thread; large ones split evenly.
        assert_eq!(rows_per_thread(100, 16, 8), 100);
        assert_eq!(rows_per_thread(1 << 20, 16, 4), 1 << 18);
        assert_eq!(rows_per_thread(10, 1 << 20, 4), 3);
        assert_eq!(rows_per_thread(0, 16, 4), 1);
    }

    #[test]
    fn parallel_chunks_start_at_their_rows() {
        let mut buf = vec![0u8; 10 * (1 << 20)];
        let seen = std::sync::Mutex::new(Vec::new());
        let used = in_parallel(buf.as_mut_slice(), 5..15, 1 << 20, 4, |first, chunk: &mut [u8]| {
            chunk.fill(first as u8);
            seen.lock().unwrap().push((first, chunk.len() >> 20));
            Ok(())
        })
        .unwrap();
        assert_eq!(used, 4);
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, vec![(5, 3), (8, 3), (11, 3), (14, 1)]);
        for (i, row) in buf.chunks(1 << 20).enumerate() {
            assert!(row.iter().all(|&b| b as usize == 5 + (i / 3) * 3), "row {i}");
        }
    }
}
