//! Shared pieces of wholemem's command-line tools, and `wm-bench`'s
//! subcommands, one module each: [`gather`] (gather and scatter; its
//! options in `moves.rs`, its cached runs in `cached.rs` (each call's CPU
//! time and wait for a CPU in `sched.rs`), the same-run
//! baseline in `baseline.rs`, its id distributions in [`ids`]), [`get`]
//! (one-sided reads), [`apply`] (`apply_gradients`), [`load`],
//! [`sample`], [`probe`], [`kernels`]. The options every benchmark shares about its
//! ranks, and how a tool starts its own ranks when no launcher did, are in
//! [`ranks`]; the shape of the table they spread over the ranks (`--rows`,
//! `--dim`, `--dtype`) in [`shape`]; the report every benchmark prints (speeds, baseline, ratio,
//! verification, the JSON line) in [`report`]. `src/bin/wm-bench.rs` only
//! parses the command line and dispatches.
#![forbid(unsafe_code)]

pub mod apply;
mod baseline;
mod cached;
pub mod gather;
pub mod get;
pub mod ids;
pub mod kernels;
pub mod load;
mod moves;
pub mod probe;
pub mod ranks;
pub mod report;
pub mod sample;
mod sched;
pub mod shape;

pub use ranks::{default_ranks, run_as_ranks, under_launcher};
pub use report::Spread;
pub use wm_gather::cache::CacheStats;

/// Values of benchmark tables, encoded one element at a time by
/// [`DType::write_f64`](wholemem::DType::write_f64) and not by the
/// gather's conversion kernels, so that verification checks those kernels.
pub mod values {
    use wholemem::WholeMemory;
    use wm_gather::DType;

    /// The value at (row, col) of a benchmark table: depends on both, and is
    /// integral for integer types.
    pub fn at(row: usize, col: usize, d: DType) -> f64 {
        let base = ((row.wrapping_mul(131) + col.wrapping_mul(7)) % 1021) as f64;
        if d.is_float() { base * 0.5 - 100.25 } else { base - 100.0 }
    }

    /// One row of `cols` elements of `d` as stored in a table, then read as
    /// `out`: the bytes a correct gather produces.
    pub fn row(row: usize, cols: usize, table: DType, out: DType, buf: &mut [u8]) {
        let (ts, os) = (table.size(), out.size());
        let mut stored = [0u8; 8];
        for c in 0..cols {
            table.write_f64(&mut stored[..ts], at(row, c, table));
            out.write_f64(&mut buf[c * os..][..os], table.read_f64(&stored[..ts]));
        }
    }

    /// Fills this rank's rows of `mem` (rows of `dim` elements of `dtype`)
    /// with [`at`] of row and column, a stretch at a time through
    /// `write_rows` (so device memory fills too).
    ///
    /// # Errors
    /// When the rows cannot be written.
    pub fn fill(mem: &mut WholeMemory, dim: usize, dtype: DType) -> anyhow::Result<()> {
        let (es, row_bytes) = (dtype.size(), dim * dtype.size());
        let own = mem.local_rows();
        let step = ((64 << 20) / row_bytes).max(1);
        let mut chunk = Vec::new();
        for first in own.clone().step_by(step) {
            let n = step.min(own.end - first);
            chunk.resize(n * row_bytes, 0);
            for (i, row) in chunk.chunks_mut(row_bytes).enumerate() {
                for c in 0..dim {
                    dtype.write_f64(&mut row[c * es..][..es], at(first + i, c, dtype));
                }
            }
            mem.write_rows(first, &chunk)?;
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn put_get_round_trip() {
            for d in DType::ALL {
                let mut b = [0u8; 8];
                d.write_f64(&mut b[..d.size()], -7.0);
                assert_eq!(d.read_f64(&b[..d.size()]), -7.0, "{d}");
            }
        }
    }
}
