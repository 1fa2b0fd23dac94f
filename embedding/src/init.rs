//! Initial values of an embedding: a pure function of (seed, row, column),
//! so a table holds the same values whatever the rank count, partition or
//! memory type.

/// How to fill a table.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Init {
    /// Every value `c`.
    Constant(f32),
    /// Uniform in `[low, high)`.
    Uniform {
        /// The lower bound.
        low: f32,
        /// The upper bound (excluded).
        high: f32,
    },
    /// Normal with this mean and standard deviation (Box–Muller).
    Normal {
        /// The mean.
        mean: f32,
        /// The standard deviation.
        std: f32,
    },
}

/// splitmix64's finaliser: a bijection that mixes every input bit into
/// every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform value in `[0, 1)` with 53 random bits, for `(seed, row, col)`
/// and an independent `stream`.
fn unit(seed: u64, row: u64, col: u64, stream: u64) -> f64 {
    let h = mix(mix(mix(mix(seed) ^ row) ^ col) ^ stream);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The largest f32 below finite `x`.
fn next_below(x: f32) -> f32 {
    if x > 0.0 {
        f32::from_bits(x.to_bits() - 1)
    } else if x == 0.0 {
        -f32::from_bits(1)
    } else {
        f32::from_bits(x.to_bits() + 1)
    }
}

impl Init {
    /// The value at `(row, col)` for `seed`.
    pub fn value(&self, seed: u64, row: u64, col: u64) -> f32 {
        match *self {
            Self::Constant(c) => c,
            Self::Uniform { low, high } => {
                let u = unit(seed, row, col, 0);
                // Rounding to f32 can reach `high`; keep the bound excluded.
                let v = (f64::from(low) + u * (f64::from(high) - f64::from(low))) as f32;
                if v >= high { low.max(next_below(high)) } else { v }
            }
            Self::Normal { mean, std } => {
                // 1 - u is in (0, 1], so the logarithm is finite.
                let (u1, u2) = (1.0 - unit(seed, row, col, 1), unit(seed, row, col, 2));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (f64::from(mean) + f64::from(std) * z) as f32
            }
        }
    }

    /// Checks the parameters: finite, `low < high`, `std >= 0`.
    pub(crate) fn check(&self) -> Result<(), String> {
        match *self {
            Self::Constant(c) if !c.is_finite() => Err(format!("constant {c} is not finite")),
            Self::Uniform { low, high } if !(low.is_finite() && high.is_finite() && low < high) => {
                Err(format!("uniform [{low}, {high}) is not a finite, non-empty interval"))
            }
            Self::Normal { mean, std } if !(mean.is_finite() && std.is_finite() && std >= 0.0) => {
                Err(format!("normal with mean {mean} and std {std}: both must be finite and std at least 0"))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_stays_in_bounds_and_fills_them() {
        let init = Init::Uniform { low: -0.5, high: 0.25 };
        let vals: Vec<f32> = (0..20_000).map(|i| init.value(7, i / 16, i % 16)).collect();
        assert!(vals.iter().all(|v| (-0.5..0.25).contains(v)));
        let mean = vals.iter().map(|&v| f64::from(v)).sum::<f64>() / vals.len() as f64;
        assert!((mean - -0.125).abs() < 0.01, "mean {mean}");
        assert!(vals.iter().any(|&v| v < -0.49) && vals.iter().any(|&v| v > 0.24));
    }

    #[test]
    fn normal_has_its_moments_and_values_depend_on_row_column_and_seed() {
        let init = Init::Normal { mean: 1.0, std: 2.0 };
        let vals: Vec<f64> = (0..40_000).map(|i| f64::from(init.value(3, i / 64, i % 64))).collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        assert!((mean - 1.0).abs() < 0.05 && (var.sqrt() - 2.0).abs() < 0.05, "mean {mean} std {}", var.sqrt());
        assert_ne!(init.value(3, 1, 2), init.value(3, 2, 1));
        assert_ne!(init.value(3, 1, 2), init.value(4, 1, 2));
        assert_eq!(init.value(3, 1, 2), init.value(3, 1, 2));
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Init::Uniform { low: 1.0, high: 1.0 }.check().unwrap_err().contains("[1, 1)"));
        assert!(Init::Normal { mean: 0.0, std: -1.0 }.check().is_err());
        assert!(Init::Constant(f32::NAN).check().is_err());
        assert!(Init::Constant(0.5).check().is_ok());
    }
}
