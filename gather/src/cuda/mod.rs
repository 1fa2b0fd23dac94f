//! CUDA kernels for gather, scatter, the id checks, the resolution of
//! repeated ids and the bucketing of the distributed exchange, compiled at
//! run time with NVRTC.
//!
//! - [`compile`] turns the CUDA C source (`kernels.cu` plus generated entry
//!   points, no headers) into a CUBIN for one [`Arch`], cached in the
//!   process and on disk ([`cache_dir`]); [`check`] compiles without the
//!   caches, for `wm-bench kernels --check`.
//! - [`Kernels`] is that module loaded into a CUDA context, with one launch
//!   method per operation. Arguments are plain values ([`GatherArgs`],
//!   [`ScatterArgs`], [`BucketArgs`], [`CheckArgs`], [`RepeatArgs`]); device
//!   memory is named by raw `u64` addresses, which the caller promises are
//!   valid (hence `unsafe`). [`Kernels`] also enqueues the copies and fills
//!   of the device paths on the launch stream ([`StreamCopy`]).
//!
//! Table rows are found through a small per-owner table: `bases[r]` is the
//! address of the first row that owner `r` holds, and owner `r` holds rows
//! `first_rows[r]..first_rows[r + 1]`. One owner with `first_rows = [0,
//! rows]` describes continuous memory or a plain buffer.
//!
//! Conversions match the CPU kernels (on an x86-64 host) bit for bit, NaN
//! payloads included; `docs/kernels.md` has the table and the two rounding
//! choices this takes.
//!
//! Nothing here touches a CUDA library before checking it is there:
//! without NVRTC, [`compile`] fails with [`KernelError::NoNvrtc`].

use std::fmt;
use std::str::FromStr;

use crate::DType;

mod geometry;
#[cfg(test)]
#[allow(unsafe_code)]
mod gpu_check;
#[cfg(test)]
#[allow(unsafe_code)]
mod host_check;
#[allow(unsafe_code)]
mod launch;
#[allow(unsafe_code)]
mod nvrtc;
pub(crate) mod repeats;
mod source;

pub use launch::{Kernels, StreamCopy};
pub use nvrtc::{CacheHit, Compiled, ImageFormat, cache_dir, check, compile, nvrtc_version, prebuild};

/// Threads per block of every kernel.
pub const BLOCK_THREADS: u32 = 256;

/// A GPU architecture (compute capability), e.g. `sm_90`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Major compute capability.
    pub major: u32,
    /// Minor compute capability.
    pub minor: u32,
}

impl Arch {
    /// Ampere A100.
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    /// Hopper H100 / H200.
    pub const SM90: Arch = Arch { major: 9, minor: 0 };
    /// What `wm-bench kernels --check` compiles for by default.
    pub const DEFAULT_CHECK: [Arch; 2] = [Arch::SM80, Arch::SM90];

    /// The number NVRTC uses: 90 for `sm_90`.
    pub fn number(self) -> u32 {
        self.major * 10 + self.minor
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

impl FromStr for Arch {
    type Err = String;
    /// `sm_90`, `90` or `9.0`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("unknown GPU architecture {s:?}; expected e.g. sm_80, sm_90 or 9.0");
        let t = s.trim();
        let t = t.strip_prefix("sm_").or_else(|| t.strip_prefix("compute_")).unwrap_or(t);
        let (major, minor) = match t.split_once('.') {
            Some((a, b)) => (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?),
            None if t.len() >= 2 && t.bytes().all(|b| b.is_ascii_digit()) => {
                let (a, b) = t.split_at(t.len() - 1);
                (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?)
            }
            None => return Err(bad()),
        };
        if !(3..=20).contains(&major) || minor > 9 {
            return Err(bad());
        }
        Ok(Arch { major, minor })
    }
}

/// The type of the ids of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdType {
    /// 32-bit signed ids.
    I32,
    /// 64-bit signed ids.
    I64,
}

impl IdType {
    /// `i32` or `i64`.
    pub fn name(self) -> &'static str {
        match self {
            IdType::I32 => "i32",
            IdType::I64 => "i64",
        }
    }

    /// Bytes per id.
    pub fn size(self) -> usize {
        match self {
            IdType::I32 => 4,
            IdType::I64 => 8,
        }
    }
}

/// What can go wrong compiling, loading or launching the kernels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The NVRTC library cannot be loaded (or lacks a function we call).
    #[error("{0}")]
    NoNvrtc(String),
    /// NVRTC refused the source; `log` is its log.
    #[error("NVRTC failed to compile the kernels for {arch}:\n{log}")]
    Compile {
        /// The architecture compiled for.
        arch: Arch,
        /// NVRTC's error and log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// Floating ↔ integer (the rule of [`DType::check_conversion`]).
    #[error("the kernels do not convert {from} to {to}: floating and integer types do not convert into each other")]
    UnsupportedPair {
        /// The type read.
        from: DType,
        /// The type written.
        to: DType,
    },
    /// Launch arguments that do not describe a valid launch; the message names the values.
    #[error("invalid kernel arguments: {0}")]
    InvalidArgument(String),
}

/// The message of [`KernelError::NoNvrtc`] when the library is missing.
pub const NO_NVRTC: &str =
    "NVRTC (libnvrtc.so.12) not found: install the nvidia-cuda-nvrtc-cu12 wheel and put its lib directory on LD_LIBRARY_PATH";

/// A gather: `n_ids` table rows into a dense output.
///
/// Output row `i` (at `out + i * out_stride_bytes`) receives the first
/// `dim` elements of table row `ids[i]`, converted from `table_dtype` to
/// `out_dtype`. All addresses are device (or device-mapped) addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherArgs {
    /// Device address of `ranks` `u64`: the address of each owner's first row.
    pub bases: u64,
    /// Device address of `ranks + 1` `i64`: owner `r` holds rows `first_rows[r]..first_rows[r + 1]`.
    pub first_rows: u64,
    /// Owners (at least 1).
    pub ranks: u32,
    /// Bytes from one table row to the next.
    pub row_stride_bytes: u64,
    /// The table's element type.
    pub table_dtype: DType,
    /// Elements per row moved.
    pub dim: u32,
    /// Device address of `n_ids` ids of `id_type`, all valid row numbers.
    pub ids: u64,
    /// The ids' type.
    pub id_type: IdType,
    /// Rows to move (0 launches nothing).
    pub n_ids: u64,
    /// Device address of the output.
    pub out: u64,
    /// Bytes from one output row to the next.
    pub out_stride_bytes: u64,
    /// The output's element type.
    pub out_dtype: DType,
    /// Device address of a status word ([`STATUS_OK`] or the first bad
    /// position, as [`Kernels::check_ids`] leaves it), or 0: the launch
    /// moves nothing when the word is not [`STATUS_OK`].
    pub status: u64,
}

/// A scatter: `n_ids` dense rows into table rows.
///
/// Dense row `i` (at `src + i * src_stride_bytes`), converted from
/// `src_dtype` to `table_dtype`, is written to the first `dim` elements of
/// table row `ids[i]` — unless `keep` is set and `keep[i] == 0`. Rows that
/// appear twice must be masked by the caller (the kernel writes rows in no
/// particular order), e.g. keeping only the last occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScatterArgs {
    /// As [`GatherArgs::bases`].
    pub bases: u64,
    /// As [`GatherArgs::first_rows`].
    pub first_rows: u64,
    /// Owners (at least 1).
    pub ranks: u32,
    /// Bytes from one table row to the next.
    pub row_stride_bytes: u64,
    /// The table's element type.
    pub table_dtype: DType,
    /// Elements per row moved.
    pub dim: u32,
    /// Device address of `n_ids` ids of `id_type`, all valid row numbers.
    pub ids: u64,
    /// The ids' type.
    pub id_type: IdType,
    /// Rows to move (0 launches nothing).
    pub n_ids: u64,
    /// Device address of the dense input.
    pub src: u64,
    /// Bytes from one input row to the next.
    pub src_stride_bytes: u64,
    /// The input's element type.
    pub src_dtype: DType,
    /// Device address of `n_ids` `u8` (0 = skip that row), or 0 to write every row.
    pub keep: u64,
    /// As [`GatherArgs::status`].
    pub status: u64,
}

/// The value of a status word while no bad id was found.
pub const STATUS_OK: u64 = u64::MAX;

/// A range check of ids: [`Kernels::check_ids`] lowers the status word to
/// the position of every id outside `lo..hi`, so it ends as the first bad
/// position (or stays [`STATUS_OK`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckArgs {
    /// Device address of `n_ids` ids of `id_type`.
    pub ids: u64,
    /// The ids' type.
    pub id_type: IdType,
    /// Ids (0 launches nothing).
    pub n_ids: u64,
    /// The first valid id.
    pub lo: i64,
    /// One past the last valid id.
    pub hi: i64,
    /// Device address of the status word (one `u64`), which the caller set
    /// to [`STATUS_OK`] before (several checks may share one word).
    pub status: u64,
}

/// The resolution of repeated ids for a scatter ("the last occurrence of
/// an id wins"): a hash table of `capacity` slots records each id's highest
/// position, then `keep[i]` is set to 1 where position `i` is that highest
/// one, 0 elsewhere (and for ids outside `lo..hi`). The algorithm is
/// `repeats.cuh`; `cuda::repeats` holds its host reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatArgs {
    /// Device address of `n_ids` ids of `id_type`.
    pub ids: u64,
    /// The ids' type.
    pub id_type: IdType,
    /// Ids (0 launches nothing; below 2^32).
    pub n_ids: u64,
    /// The first id inserted; ids outside `lo..hi` are skipped.
    pub lo: i64,
    /// One past the last id inserted.
    pub hi: i64,
    /// Device address of `capacity` `u64` keys (filled by the launch).
    pub keys: u64,
    /// Device address of `capacity` `u32` positions (filled by the launch).
    pub vals: u64,
    /// Slots: a power of two above `n_ids` (the device paths take twice
    /// `n_ids`, rounded up).
    pub capacity: u64,
    /// Device address of `n_ids` `u8`: the keep mask written.
    pub keep: u64,
}

/// Bucketing ids by owner, for the distributed exchange.
///
/// [`Kernels::bucket_count`] zeroes `counts`, then writes `owner[i]` and
/// adds up `counts[owner]`; [`Kernels::bucket_place`] takes `cursors` (the
/// caller's exclusive prefix sum of `counts`) and writes every id to
/// `out_ids[slot]` with `positions[slot] = i`, where `slot` is taken from
/// its owner's cursor. [`Kernels::bucket`] runs both with the prefix sum in
/// between. The order of ids within one owner's bucket is not
/// deterministic; `positions` says where each came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketArgs {
    /// As [`GatherArgs::first_rows`].
    pub first_rows: u64,
    /// Owners (at least 1).
    pub ranks: u32,
    /// Device address of `n_ids` ids of `id_type`, all valid row numbers.
    pub ids: u64,
    /// The ids' type.
    pub id_type: IdType,
    /// Ids (0 launches nothing; at most `u32::MAX`).
    pub n_ids: u64,
    /// Device address of `n_ids` `u32`: each id's owner.
    pub owner: u64,
    /// Device address of `ranks` `u32`: ids per owner.
    pub counts: u64,
    /// Device address of `ranks` `u32`: next free slot per owner (consumed by `bucket_place`).
    pub cursors: u64,
    /// Device address of `n_ids` `i64`: the ids grouped by owner.
    pub out_ids: u64,
    /// Device address of `n_ids` `u32`: each grouped id's position in `ids`.
    pub positions: u64,
}

/// How a launch is laid out; computed by [`GatherArgs::plan`] and
/// [`ScatterArgs::plan`] (public so tools can print it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPlan {
    /// The kernel's `extern "C"` name.
    pub kernel: String,
    /// Blocks of [`BLOCK_THREADS`].
    pub blocks: u32,
    /// Threads that share one row (a power of two, 1 to 32).
    pub lanes: u32,
    /// Bytes per load and store: 16, 8, 4, 2 or 1 for a plain copy, 0 when converting.
    pub copy_width: u32,
    /// Dynamic shared memory (bytes): `first_rows` staged when it fits.
    pub shared_bytes: u32,
}

pub use geometry::MAX_STAGED_BYTES;
