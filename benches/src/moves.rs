//! What `wm-bench gather`, `scatter` and `apply` take: their options
//! ([`MoveArgs`] and the values of its flags), which way rows move
//! ([`Op`]), and the batches of ids every rank draws.

use clap::ValueEnum;
use wholemem::{Location, MemoryType};
use wm_gather::DType;

use crate::ids::IdDist;
use crate::ranks::RankArgs;
use crate::shape::{BatchArgs, ShapeArgs};

/// `--cache-bypass`: [`wm_gather::cache::Bypass`] by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CacheBypass {
    /// The faster path, measured.
    Auto,
    /// Always through the cache.
    Off,
    /// Always uncached.
    Always,
}

impl CacheBypass {
    pub(crate) fn mode(self) -> wm_gather::cache::Bypass {
        match self {
            Self::Auto => wm_gather::cache::Bypass::Auto,
            Self::Off => wm_gather::cache::Bypass::Off,
            Self::Always => wm_gather::cache::Bypass::Always,
        }
    }
}

/// The options of `wm-bench gather` and `wm-bench scatter`.
#[derive(Debug, Clone, clap::Args)]
pub struct MoveArgs {
    /// Memory type: continuous, chunked, distributed or hierarchy.
    #[arg(long = "type", default_value = "chunked")]
    pub(crate) ty: MemoryType,
    /// Location: host or device.
    #[arg(long, default_value = "host")]
    pub(crate) location: Location,
    /// Where gather's output lives: host, or device (a kernel on this rank's GPU reads the table — device memory, or
    /// host memory registered with CUDA — and the baseline is a copy of the same bytes to the GPU) [default: --location].
    #[arg(long)]
    pub(crate) out_location: Option<Location>,
    /// The local ranks to start without a launcher.
    #[command(flatten)]
    pub(crate) ranks: RankArgs,
    /// The table's shape.
    #[command(flatten)]
    pub(crate) shape: ShapeArgs,
    /// The local buffer's element type (gather output, scatter input) [default: --dtype].
    #[arg(long)]
    pub(crate) out_dtype: Option<DType>,
    /// The batches of ids.
    #[command(flatten)]
    pub(crate) batches: BatchArgs,
    /// How ids are drawn: uniform, or zipf:S (row of rank k asked with probability proportional to k^-S; ranks
    /// spread over the table by a fixed permutation).
    #[arg(long, default_value = "uniform")]
    pub(crate) id_dist: IdDist,
    /// With zipf ids: move the hot set every N batches (warm-up batches count): the Zipf ranks shift by 0.382 of the
    /// table, so each phase's hot rows were cold before.
    #[arg(long, value_name = "N")]
    pub(crate) id_drift: Option<usize>,
    /// Gather through a node cache of this fraction of the table's rows (distributed and hierarchy tables across
    /// nodes), and each batch also without it: reports both, the speed-up, the hit rate and the best static choice's.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) cache_ratio: Option<f64>,
    /// With --cache-ratio: how fast the node cache's access counts fade — `off` (pure LFU: counts only grow) or F
    /// (every count halved once the node counted F x slots accesses) [default: the library's, 4].
    #[arg(long, value_name = "off|F")]
    pub(crate) cache_ageing: Option<Ageing>,
    /// With --cache-ratio: which path the node cache's gathers take — `auto` (the faster of the cached and the
    /// uncached one, measured as it goes), `off` (always through the cache) or `always` (always uncached).
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) cache_bypass: CacheBypass,
    /// Gather through `wm_embedding::Embedding::gather` (f32, f16 or bf16 tables; f32 output) instead of
    /// `wm_gather::gather`; with --cache-ratio, the embedding's node cache.
    #[arg(long)]
    pub(crate) embedding: bool,
    /// Pages of the baseline's private table: `default` (what plain code gets: on most systems small pages) or
    /// `huge` (transparent huge pages asked for with madvise), to see how much of a ratio is the table's huge pages.
    #[arg(long, value_enum, default_value = "default")]
    pub(crate) baseline_pages: BaselinePages,
    /// Who runs the baseline: `one` (rank 0 alone, the others waiting: the machine to itself) or `all` (every rank its
    /// own baseline at the same time — a private table and batches, or on the device its own copy to or on its GPU —
    /// the same sharing of cores, memory or GPUs as the benchmark). With `all`, both are timed as steps, from the last
    /// rank ready to the last rank done, the ratio compares the steps (ranks of one machine: their clocks are
    /// compared), and the report adds the all-ranks figures of both steps.
    #[arg(long, value_enum, default_value = "one")]
    pub(crate) baseline_ranks: BaselineRanks,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Split the timed calls into their phases (ids, owner copy, rows, placing, ...) on every rank and print the time
    /// of each per call, min/median/max over the ranks (JSON: `profile`); with --cache-ratio also each call's time on a
    /// CPU and waiting for one, cached and uncached (JSON: `cpu_ms_per_call`, `cpu_wait_ms_per_call`).
    #[arg(long)]
    pub(crate) profile: bool,
}

/// Who runs the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BaselineRanks {
    One,
    All,
}

/// Pages of the baseline's private table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BaselinePages {
    Default,
    Huge,
}

impl MoveArgs {
    /// The hot-set phase of batch `b` (`--id-drift`; 0 without).
    pub(crate) fn phase(&self, b: usize) -> u64 {
        self.id_drift.map_or(0, |n| (b / n.max(1)) as u64)
    }

    /// Whether the gathered rows land in device memory.
    pub(crate) fn device_out(&self) -> bool {
        self.location == Location::Device || self.out_location == Some(Location::Device)
    }
}

/// Which way rows move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// From the table into the local buffer.
    Gather,
    /// From the local buffer into the table.
    Scatter,
}

impl Op {
    /// The subcommand's name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Gather => "gather",
            Op::Scatter => "scatter",
        }
    }
}

pub(crate) const DEFAULT_TABLE_BYTES: usize = 2 << 30;

/// Batch `b` of rank `rank`, as `--id-dist` draws it.
pub(crate) fn batch_ids(a: &MoveArgs, rows: usize, rank: usize, b: usize) -> Vec<i64> {
    crate::ids::batch(a.id_dist, a.batches.seed, rows, a.batches.batch, rank, b, a.phase(b))
}

/// `--cache-ageing`: how fast a node cache's counts fade.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Ageing {
    /// Pure LFU: counts only grow.
    Off,
    /// Counts halved after this many accesses per slot.
    Every(f64),
}

impl std::str::FromStr for Ageing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "off" {
            return Ok(Self::Off);
        }
        match s.parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => Ok(Self::Every(f)),
            _ => Err(format!("{s:?}: expected off, or a positive number of accesses per slot between halvings (e.g. 1)")),
        }
    }
}

impl std::fmt::Display for Ageing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Every(x) => write!(f, "{x}"),
        }
    }
}
