//! The argument groups of the subcommands that take a table: `--rows`,
//! `--dim` and `--dtype`, the shape of the table a benchmark spreads over
//! its ranks ([`ShapeArgs`]: `gather`, `scatter`, `apply`, `get`, `load`),
//! and `--ids`, `--batch`, `--iters`, `--warmup` and `--seed`, the batches
//! of random ids it moves ([`BatchArgs`]: `gather`, `scatter`, `apply`,
//! `get`).

use anyhow::{Result, ensure};
use clap::ValueEnum;
use wm_gather::DType;

/// The table's shape: rows, elements per row and element type.
#[derive(Debug, Clone, clap::Args)]
pub struct ShapeArgs {
    /// Rows in the table [default: a 2 GiB table].
    #[arg(long)]
    pub rows: Option<usize>,
    /// Elements per row.
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    /// The table's element type.
    #[arg(long, default_value = "f32")]
    pub dtype: DType,
}

impl ShapeArgs {
    /// Bytes of one row of the table.
    pub fn row_bytes(&self) -> usize {
        self.dim * self.dtype.size()
    }

    /// `--rows`, or as many rows as fill `default_bytes`.
    ///
    /// # Errors
    /// When that makes no row.
    pub fn rows_or(&self, default_bytes: usize) -> Result<usize> {
        let rows = self.rows.unwrap_or(default_bytes / self.row_bytes());
        ensure!(rows > 0, "--rows must be positive");
        Ok(rows)
    }
}

/// The ids' integer type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum IdType {
    I32,
    I64,
}

/// The batches of random ids a benchmark moves. The defaults are
/// `gather`'s; a subcommand changes a default or a help text with
/// `mut_arg`.
#[derive(Debug, Clone, clap::Args)]
pub struct BatchArgs {
    /// Id type.
    #[arg(long, value_enum, default_value = "i64")]
    pub(crate) ids: IdType,
    /// Ids per batch, per rank.
    #[arg(long, default_value_t = 65_536)]
    pub(crate) batch: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 20)]
    pub(crate) iters: usize,
    /// Untimed batches first (with --cache-ratio or --embedding: through the path under test only, warming its cache).
    #[arg(long, default_value_t = 3)]
    pub(crate) warmup: usize,
    /// Seed of the random ids.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}
