//! `--rows`, `--dim` and `--dtype`: the shape of the table a benchmark
//! spreads over its ranks, one argument group for every subcommand that
//! takes one (`gather`, `scatter`, `apply`, `get`, `load`).

use anyhow::{Result, ensure};
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
