//! The one error type of the memory layer.

use std::path::PathBuf;

/// What can go wrong when allocating or accessing WholeMemory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The combination cannot work here; the reason says why.
    #[error("{what} is not supported: {reason}")]
    Unsupported {
        /// What was asked for, e.g. "host continuous memory".
        what: String,
        /// Why, naming ranks, nodes or devices.
        reason: String,
    },
    /// An unusable argument, a peer that failed or sent malformed data, a
    /// wait that timed out: the kinds every layer shares.
    #[error(transparent)]
    Common(#[from] CommonError),
    /// A row id outside the table.
    #[error("row {index} is out of range for a table of {rows} rows")]
    IndexOutOfRange {
        /// The bad id.
        index: i64,
        /// Rows in the table.
        rows: usize,
    },
    /// A size computed from values a caller, a file or a peer gave (a
    /// count, a width, an element size) is more than `usize::MAX`; from
    /// [`checked_size`](crate::checked_size).
    #[error("{what} ({}) is more than usize::MAX", crate::size::product_text(factors))]
    SizeOverflow {
        /// What was being sized.
        what: String,
        /// The factors of its size.
        factors: Vec<usize>,
    },
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
    /// A CUDA driver call failed.
    #[error("CUDA: {call} failed: {detail}")]
    Cuda {
        /// The driver entry point.
        call: &'static str,
        /// The driver's error name and description.
        detail: String,
    },
    /// A set of shard files cannot be loaded into this table (or a store
    /// target cannot be written): the file or directory, and what is wrong.
    #[error("{}: {problem}", path.display())]
    Shards {
        /// The file or directory at fault.
        path: PathBuf,
        /// What is wrong with it.
        problem: ShardProblem,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The error kinds every layer of wholemem shares, each crate's error
/// holds them through `#[from]` (its `Common` variant): an unusable
/// argument, a peer of a collective call that failed or sent malformed
/// data, a wait that timed out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommonError {
    /// A caller passed something unusable; the message names the value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Another rank of a collective call failed its part (its checks, a
    /// step of the call); its error, quoted.
    #[error("rank {rank} failed: {detail}")]
    PeerFailed {
        /// The world rank that failed.
        rank: usize,
        /// Its error.
        detail: String,
    },
    /// A peer sent something the protocol cannot have produced: a message
    /// that does not parse, a part of the wrong length, a row it does not
    /// own, a descriptor without its seals. Every rank of the collective
    /// call reports it, naming that peer; rows the call was to write may be
    /// partly written.
    #[error("rank {rank} sent malformed data: {detail}")]
    Malformed {
        /// The world rank that sent it.
        rank: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// A wait that did not end within `WM_TIMEOUT_S` (or a join timeout).
    #[error("{what} timed out after {secs:.1} s (set WM_TIMEOUT_S to change the limit)")]
    Timeout {
        /// What was waited for.
        what: String,
        /// The limit, in seconds.
        secs: f64,
    },
}

/// What is wrong with a set of shard files, as [`Error::Shards`] reports it.
/// Each variant carries the values a caller needs to fix the files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShardProblem {
    /// The directory does not exist.
    #[error("the shard directory does not exist")]
    MissingDirectory,
    /// The path exists but is not a directory.
    #[error("not a directory")]
    NotADirectory,
    /// The directory holds no `shard_NNNN.npy` file.
    #[error("no shard files (shard_0000.npy, shard_0001.npy, ...) in this directory")]
    NoShards,
    /// The numbering `shard_0000.npy, shard_0001.npy, …` has a gap.
    #[error("the shard numbering has a gap: {missing} is missing{}", next.as_ref().map(|n| format!(" (the next file is {n})")).unwrap_or_default())]
    MissingShard {
        /// The first missing file name.
        missing: String,
        /// The file found after the gap.
        next: Option<String>,
    },
    /// Two file names carry the same shard number (`shard_1.npy`, `shard_0001.npy`).
    #[error("{first} and {second} both have shard number {number}")]
    DuplicateShard {
        /// The number.
        number: u64,
        /// One name.
        first: String,
        /// The other.
        second: String,
    },
    /// Not a valid NPY file.
    #[error("not a valid NPY file: {reason}")]
    NotNpy {
        /// What is wrong, e.g. the magic or a header key.
        reason: String,
    },
    /// A big-endian element type.
    #[error("big-endian data ('{descr}') is not supported: wholemem reads little-endian files only")]
    BigEndian {
        /// The `descr` of the header.
        descr: String,
    },
    /// An element type no table holds.
    #[error("element type '{descr}' is not one a table holds (<f2, <f4, <f8, |i1, <i2, <i4, <i8; bf16 only from raw files)")]
    UnsupportedDescr {
        /// The `descr` of the header.
        descr: String,
    },
    /// The data is stored column-major.
    #[error("the array is in Fortran (column-major) order; rows must be contiguous (save it in C order)")]
    FortranOrder,
    /// A shape whose size is more than 2^64 bytes (an NPY header's, or the
    /// row shape raw files are read with).
    #[error("shape {shape:?} of {elem} elements is more than 2^64 bytes")]
    ShapeOverflow {
        /// The shape (for NPY files, the header's, rows first).
        shape: Vec<u64>,
        /// The element type.
        elem: &'static str,
    },
    /// A 0-dimensional array.
    #[error("a 0-dimensional array has no rows to load")]
    NoRowAxis,
    /// This file's element type or row shape differs from the first file's.
    #[error("{field} {this} differs from {that} in {first}")]
    FilesDiffer {
        /// `"element type"` or `"row shape"`.
        field: &'static str,
        /// This file's value.
        this: String,
        /// The first file's value.
        that: String,
        /// The first file's name.
        first: String,
    },
    /// The files hold elements of another type than the table.
    #[error("the file holds {file} elements but the table holds {table}{}", if *table == "bf16" { " (numpy has no bf16: load bf16 tables from raw files)" } else { "" })]
    ElementType {
        /// The files' type.
        file: &'static str,
        /// The table's type.
        table: &'static str,
    },
    /// The files' rows have another shape than the table's.
    #[error("rows of shape {file:?} in the file, {table:?} in the table")]
    RowShape {
        /// Dimensions after the first, in the file.
        file: Vec<u64>,
        /// Dimensions after the first, in the table.
        table: Vec<u64>,
    },
    /// The files hold more or fewer rows than the table.
    #[error("the files hold {files} rows in all, the table has {table}")]
    RowCount {
        /// Rows in all files together.
        files: u64,
        /// Rows in the table.
        table: u64,
    },
    /// A raw file's size is not a whole number of rows.
    #[error("its size, {bytes} bytes, is not a multiple of the row size, {row_bytes} bytes")]
    RawSize {
        /// The file size.
        bytes: u64,
        /// Bytes per row.
        row_bytes: u64,
    },
    /// An NPY file's size does not match its header.
    #[error("the header describes {expected} bytes (data from offset {offset}), the file has {actual}")]
    FileSize {
        /// Header plus data, by the header.
        expected: u64,
        /// Where the data starts.
        offset: u64,
        /// The real size.
        actual: u64,
    },
    /// Another rank discovered a different layout of the same files.
    #[error("rank {rank} sees a different layout from rank {reference}: {detail}")]
    LayoutDiffers {
        /// The world rank that differs.
        rank: usize,
        /// The world rank compared with.
        reference: usize,
        /// The first difference.
        detail: String,
    },
}

impl Error {
    pub(crate) fn os(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Os { context: context.into(), source }
    }

    pub(crate) fn shards(path: impl Into<PathBuf>, problem: ShardProblem) -> Self {
        Self::Shards { path: path.into(), problem }
    }
}

impl crate::agree::PeerError for Error {
    crate::peer_error_variants!();
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
