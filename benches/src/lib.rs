//! Shared pieces of wholemem's command-line tools: how a tool starts its own
//! ranks when no launcher did, and how results are summarised across ranks.
#![forbid(unsafe_code)]

use std::ffi::OsString;

use wm_comm::launch::{self, Launch};
use wm_comm::{RankEnv, RankSource};

pub mod load;
pub mod sample;

/// Whether a launcher (wm-run, mpirun, srun, PMI) started this process.
pub fn under_launcher() -> anyhow::Result<bool> {
    Ok(RankEnv::from_env()?.source != RankSource::Singleton)
}

/// Re-runs this program as `ranks` local ranks with the same arguments and
/// returns its exit code. Rank 0's output is printed as is; the others'
/// only when something failed, prefixed with their rank.
///
/// # Errors
/// When the ranks cannot be started.
pub fn run_as_ranks(ranks: usize, node_size: Option<usize>) -> anyhow::Result<i32> {
    let exe = std::env::current_exe()?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut l = Launch::new(ranks, exe, args);
    l.node_size = node_size;
    l.echo = false;
    let report = launch::run(&l)?;
    for line in &report.ranks[0].output {
        println!("{line}");
    }
    if !report.success() {
        for r in report.ranks.iter().skip(1) {
            for line in &r.output {
                eprintln!("[{}] {line}", r.rank);
            }
        }
        for f in report.failures() {
            eprintln!("wm-bench: {f}");
        }
    }
    Ok(report.exit_code())
}

/// Minimum, median and maximum of per-rank figures.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Smallest.
    pub min: f64,
    /// Median (the mean of the middle two for an even count).
    pub median: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `v` (not empty).
    pub fn of(v: &[f64]) -> Self {
        assert!(!v.is_empty());
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Self { min: s[0], median, max: s[n - 1] }
    }
}

/// Default rank count: the cores of this machine, at most 4.
pub fn default_ranks() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Spread { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]), Spread { min: 1.0, median: 2.5, max: 4.0 });
    }
}

/// Element encoding for benchmark tables, written independently of the
/// library's kernels so that verification checks them.
pub mod values {
    use half::{bf16, f16};
    use wm_gather::DType;

    /// The value at (row, col) of a benchmark table: depends on both, and is
    /// integral for integer types.
    pub fn at(row: usize, col: usize, d: DType) -> f64 {
        let base = ((row.wrapping_mul(131) + col.wrapping_mul(7)) % 1021) as f64;
        if d.is_float() { base * 0.5 - 100.25 } else { base - 100.0 }
    }

    /// Writes `v` as one element of `d` into `out` (ints as `as` casts do).
    pub fn put(d: DType, out: &mut [u8], v: f64) {
        match d {
            DType::F16 => out.copy_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::Bf16 => out.copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.copy_from_slice(&v.to_le_bytes()),
            DType::I8 => out.copy_from_slice(&((v as i64) as i8).to_le_bytes()),
            DType::I16 => out.copy_from_slice(&((v as i64) as i16).to_le_bytes()),
            DType::I32 => out.copy_from_slice(&((v as i64) as i32).to_le_bytes()),
            DType::I64 => out.copy_from_slice(&(v as i64).to_le_bytes()),
        }
    }

    /// Reads one element of `d` (exactly, as f64).
    pub fn get(d: DType, b: &[u8]) -> f64 {
        match d {
            DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::F32 => f64::from(f32::from_le_bytes(b[..4].try_into().expect("4 bytes"))),
            DType::F64 => f64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            DType::I8 => f64::from(b[0] as i8),
            DType::I16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
            DType::I32 => f64::from(i32::from_le_bytes(b[..4].try_into().expect("4 bytes"))),
            DType::I64 => i64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as f64,
        }
    }

    /// One row of `cols` elements of `d` as stored in a table, then read as
    /// `out`: the bytes a correct gather produces.
    pub fn row(row: usize, cols: usize, table: DType, out: DType, buf: &mut [u8]) {
        let (ts, os) = (table.size(), out.size());
        let mut tmp = [0u8; 8];
        for c in 0..cols {
            put(table, &mut tmp[..ts], at(row, c, table));
            put(out, &mut buf[c * os..][..os], get(table, &tmp[..ts]));
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn put_get_round_trip() {
            for d in DType::ALL {
                let mut b = [0u8; 8];
                put(d, &mut b[..d.size()], -7.0);
                assert_eq!(get(d, &b[..d.size()]), -7.0, "{d}");
            }
        }
    }
}
