//! Sizes computed from values a caller, a file or a peer gave: one checked
//! product, whose error names what was being sized and every factor, for
//! every crate above this one.

use crate::{Error, Result};

/// The product of `factors` (a count, a width, an element size, …): the
/// size of `what`, checked rather than wrapped.
///
/// # Errors
/// [`Error::SizeOverflow`] naming `what` and every factor when the product
/// is more than `usize::MAX`.
///
/// # Examples
/// ```
/// assert_eq!(wholemem::checked_size("3 rows of 4 f64", &[3, 4, 8]).unwrap(), 96);
/// let e = wholemem::checked_size("the output", &[3, 1 << 62, 4]).unwrap_err();
/// assert_eq!(e.to_string(), "the output (3 × 4611686018427387904 × 4) is more than usize::MAX");
/// ```
pub fn checked_size(what: &str, factors: &[usize]) -> Result<usize> {
    // A zero anywhere makes the size 0, whatever the others multiply to.
    if factors.contains(&0) {
        return Ok(0);
    }
    factors
        .iter()
        .try_fold(1usize, |product, &f| product.checked_mul(f))
        .ok_or_else(|| Error::SizeOverflow { what: what.to_owned(), factors: factors.to_vec() })
}

/// `a × b × c` (`1` for none), as [`Error::SizeOverflow`] writes factors.
pub(crate) fn product_text(factors: &[usize]) -> String {
    if factors.is_empty() {
        return "1".to_owned();
    }
    factors.iter().map(ToString::to_string).collect::<Vec<_>>().join(" × ")
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Factors near `usize::MAX` or small, 0 and 1 included.
    fn factor() -> impl Strategy<Value = usize> {
        prop_oneof![usize::MAX - 64..=usize::MAX, (1usize << 31)..(1usize << 33), 0usize..=16, any::<usize>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The product when it fits (checked against 128-bit arithmetic),
        /// else an error naming `what` and each factor: never a wrapped
        /// value, never a panic.
        #[test]
        fn extreme_factors_give_the_product_or_an_error_naming_them(factors in proptest::collection::vec(factor(), 0..5)) {
            let exact = if factors.contains(&0) { Some(0) } else { factors.iter().try_fold(1u128, |p, &f| p.checked_mul(f as u128)) };
            match checked_size("a test size", &factors) {
                Ok(size) => prop_assert_eq!(Some(size as u128), exact),
                Err(e) => {
                    prop_assert!(exact.is_none_or(|p| p > usize::MAX as u128), "{:?} fits, yet: {}", factors, e);
                    let text = e.to_string();
                    prop_assert!(text.starts_with("a test size ("), "{}", text);
                    for f in &factors {
                        prop_assert!(text.contains(&f.to_string()), "{} does not name {}", text, f);
                    }
                    let named = matches!(&e, Error::SizeOverflow { factors: got, .. } if *got == factors);
                    prop_assert!(named, "not SizeOverflow with the factors: {:?}", e);
                }
            }
        }
    }
}
