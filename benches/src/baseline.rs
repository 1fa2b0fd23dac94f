//! The baseline every row-moving benchmark prints beside its figures: the
//! same batches moved by plain single-threaded code from or into a private
//! table of the same shape, and with `--baseline-ranks all` the steps that
//! time every rank at once.

use std::time::Instant;

use anyhow::{Result, ensure};
use wm_comm::{CommExt, Communicator};
use wm_gather::DType;

use crate::moves::{BaselinePages, MoveArgs, Op};
use crate::values;

/// The ratio batch by batch: for each timed batch, the call's speed (by the
/// median over the ranks of their times for it, or by the step) over the
/// baseline's on it, and the median of those over the batches. Unlike the
/// ratio of totals, a batch that stalled — in the call or in the baseline —
/// moves it by one place, not by its length. `calls` holds every rank's
/// times, rank-major, `base.len()` of them each; 0 without a baseline.
pub(crate) fn ratio_by_batch(calls: &[f64], call_bytes: f64, base: &[(f64, f64)]) -> f64 {
    let iters = base.len();
    if iters == 0 || calls.len() % iters != 0 {
        return 0.0;
    }
    let ranks = calls.len() / iters;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
    };
    let ratios: Vec<f64> = (0..iters)
        .map(|b| {
            let call = median((0..ranks).map(|r| calls[r * iters + b]).collect());
            let (secs, bytes) = base[b];
            (call_bytes / call.max(1e-12)) / (bytes / secs.max(1e-12))
        })
        .collect();
    median(ratios)
}

/// Fails unless every rank runs on this one machine: step times
/// (`--baseline-ranks all`) compare the ranks' clocks, so one kernel's only
/// (network namespaces that pose as hosts are fine). Collective.
pub(crate) fn one_machine(world: &dyn Communicator) -> Result<()> {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let boots = world.allgatherv(&boot)?;
    ensure!(
        !boot.is_empty() && boots.iter().all(|b| b == &boots[0]),
        "--baseline-ranks all times steps across ranks by their clocks: every rank must run on this one machine"
    );
    Ok(())
}

/// Seconds on this machine's real-time clock (steps compare ranks' clocks:
/// ranks of one machine only).
pub(crate) fn wall_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One step of every rank: from the last rank's `ready` to the last rank's
/// `done`.
pub(crate) fn step(world: &dyn Communicator, ready: f64, done: f64) -> Result<f64> {
    let all = world.allgather_pod(&[ready, done])?;
    let last = |k: usize| all.chunks(2).map(|c| c[k]).fold(f64::MIN, f64::max);
    Ok((last(1) - last(0)).max(0.0))
}

/// The same batches (rank 0's) moved by plain single-threaded code from or
/// into a private table of the same shape (also `wm-bench get`'s baseline).
pub(crate) struct Baseline {
    op: Op,
    table: Vec<u8>,
    buf: Vec<u8>,
    dim: usize,
    dtype: DType,
    out: DType,
    /// Each timed batch's seconds and bytes.
    batches: Vec<(f64, f64)>,
}

impl Baseline {
    pub(crate) fn new(op: Op, a: &MoveArgs, rows: usize, out: DType) -> Self {
        Self::with(op, rows, a.shape.dim, a.shape.dtype, out, a.batches.batch, a.baseline_pages == BaselinePages::Huge)
    }

    /// A private table of `rows` rows of `dim` elements of `dtype`, holding
    /// the benchmark values, for batches of `batch` ids moved as `out`.
    pub(crate) fn with(op: Op, rows: usize, dim: usize, dtype: DType, out: DType, batch: usize, huge: bool) -> Self {
        let es = dtype.size();
        let row_bytes = dim * es;
        let mut table = vec![0u8; rows * row_bytes];
        if huge {
            wholemem::advise_huge_pages(&mut table);
        }
        for (r, row) in table.chunks_mut(row_bytes).enumerate() {
            for c in 0..dim {
                dtype.write_f64(&mut row[c * es..][..es], values::at(r, c, dtype));
            }
        }
        let buf = vec![0u8; batch * dim * out.size()];
        Self { op, table, buf, dim, dtype, out, batches: Vec::new() }
    }

    /// Bytes of huge pages of the private table, as a fraction.
    pub(crate) fn huge_fraction(&self) -> f64 {
        wholemem::huge_page_bytes(&self.table) as f64 / self.table.len().max(1) as f64
    }

    /// Moves one batch; `timed` adds it to the figures.
    pub(crate) fn batch(&mut self, ids: &[i64], timed: bool) {
        let (es, os, dim) = (self.dtype.size(), self.out.size(), self.dim);
        let (row_bytes, buf_row) = (dim * es, dim * os);
        let same = self.dtype == self.out;
        let t0 = Instant::now();
        for (i, &id) in ids.iter().enumerate() {
            let t = &mut self.table[id as usize * row_bytes..][..row_bytes];
            let o = &mut self.buf[i * buf_row..][..buf_row];
            match (self.op, same) {
                (Op::Gather, true) => o.copy_from_slice(t),
                (Op::Scatter, true) => t.copy_from_slice(o),
                (Op::Gather, false) => {
                    for c in 0..dim {
                        self.out.write_f64(&mut o[c * os..][..os], self.dtype.read_f64(&t[c * es..][..es]));
                    }
                }
                (Op::Scatter, false) => {
                    for c in 0..dim {
                        self.dtype.write_f64(&mut t[c * es..][..es], self.out.read_f64(&o[c * os..][..os]));
                    }
                }
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        std::hint::black_box(&self.buf);
        if timed {
            self.batches.push((dt, (ids.len() * buf_row) as f64));
        }
    }

    /// Adds one timed batch measured elsewhere (the device baseline's
    /// copy): seconds and bytes.
    #[cfg(feature = "cuda")]
    pub(crate) fn add(&mut self, seconds: f64, bytes: f64) {
        self.batches.push((seconds, bytes));
    }

    /// Each timed batch's seconds and bytes.
    pub(crate) fn batches(&self) -> &[(f64, f64)] {
        &self.batches
    }

    /// Decimal GB/s over the timed batches.
    pub(crate) fn gbps(&self) -> f64 {
        let (seconds, bytes) = self.batches.iter().fold((0.0, 0.0), |(s, b), &(ds, db)| (s + ds, b + db));
        bytes / f64::max(seconds, 1e-12) / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::ratio_by_batch;

    #[test]
    fn a_stalled_batch_moves_the_batch_ratio_by_one_place_only() {
        // Two ranks, four batches of 1 MB; the baseline takes 1 ms a batch.
        let base = vec![(1e-3, 1e6); 4];
        // Calls of 2 ms (rank 0) and 4 ms (rank 1): their median, 3 ms.
        let calls = [[2e-3; 4], [4e-3; 4]].concat();
        assert!((ratio_by_batch(&calls, 1e6, &base) - 1.0 / 3.0).abs() < 1e-9);
        // One batch stalls for a second on both ranks: the ratio of totals
        // would fall to about 0.003; batch by batch it stays.
        let mut stalled = calls.clone();
        stalled[2] = 1.0;
        stalled[4 + 2] = 1.0;
        assert!((ratio_by_batch(&stalled, 1e6, &base) - 1.0 / 3.0).abs() < 1e-9);
        // A stall in the baseline likewise.
        let mut slow_base = base.clone();
        slow_base[1].0 = 1.0;
        assert!((ratio_by_batch(&calls, 1e6, &slow_base) - 1.0 / 3.0).abs() < 1e-9);
        // Bytes count: a baseline that moved twice the bytes in the same
        // time is twice as fast.
        let double = vec![(1e-3, 2e6); 4];
        assert!((ratio_by_batch(&calls, 1e6, &double) - 1.0 / 6.0).abs() < 1e-9);
        // No baseline (ranks other than 0), or times that do not fit it: 0.
        assert_eq!(ratio_by_batch(&calls, 1e6, &[]), 0.0);
        assert_eq!(ratio_by_batch(&calls[..7], 1e6, &base), 0.0);
    }
}
