//! Sparse optimizers: what they keep per row and how one row is updated.
//!
//! The formulas are WholeGraph's (`embedding_optimizer_func.cu`): `g` is the
//! row's gradient summed over every occurrence of its id in the step (on
//! every rank), `w` the stored weight read as f32, `λ` the weight decay,
//! `lr` the learning rate of the call. Only rows that received a gradient
//! change, state included ("lazy").

use crate::{Error, Result};

/// An optimizer and its parameters. Build one with the constructors (the
/// defaults of WholeGraph and PyTorch) and adjust it with
/// [`with_weight_decay`](Self::with_weight_decay), or write a variant out.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Optimizer {
    /// `g += λ·w; w -= lr·g`. No state.
    Sgd {
        /// λ.
        weight_decay: f32,
    },
    /// Lazy Adam: only rows that received a gradient move, and each row
    /// counts its own steps `t` (as WholeGraph's LazyAdam, which keeps
    /// `β1^t` and `β2^t` per row).
    ///
    /// `g += λ·w` (or, with `decoupled_weight_decay`, AdamW's
    /// `w -= lr·λ·w` first); `m = β1·m + (1-β1)·g`;
    /// `v = β2·v + (1-β2)·g²`; `w -= lr·(m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)`.
    Adam {
        /// λ.
        weight_decay: f32,
        /// β1.
        beta1: f32,
        /// β2.
        beta2: f32,
        /// ε.
        epsilon: f32,
        /// AdamW: decay the weight directly instead of adding `λ·w` to the
        /// gradient.
        decoupled_weight_decay: bool,
    },
    /// `g += λ·w; s += g²; w -= lr·g / (sqrt(s) + ε)`.
    AdaGrad {
        /// λ.
        weight_decay: f32,
        /// ε.
        epsilon: f32,
    },
    /// `g += λ·w; v = α·v + (1-α)·g²; w -= lr·g / (sqrt(v) + ε)`.
    RmsProp {
        /// λ.
        weight_decay: f32,
        /// ε.
        epsilon: f32,
        /// α, the decay of the running mean of `g²`.
        alpha: f32,
    },
}

/// One named piece of an optimizer's per-row state: `cols` f32 values
/// starting `offset` values into the state row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSlot {
    /// The name (WholeGraph's: `m`, `v`, `beta12t`, `state_sum`).
    pub name: &'static str,
    /// Values from the start of the state row.
    pub offset: usize,
    /// Values in the slot.
    pub cols: usize,
}

impl Optimizer {
    /// SGD without weight decay.
    pub fn sgd() -> Self {
        Self::Sgd { weight_decay: 0.0 }
    }

    /// Lazy Adam with β1 = 0.9, β2 = 0.999, ε = 1e-8, no weight decay.
    pub fn adam() -> Self {
        Self::Adam { weight_decay: 0.0, beta1: 0.9, beta2: 0.999, epsilon: 1e-8, decoupled_weight_decay: false }
    }

    /// AdaGrad with ε = 1e-8, no weight decay.
    pub fn ada_grad() -> Self {
        Self::AdaGrad { weight_decay: 0.0, epsilon: 1e-8 }
    }

    /// RMSProp with α = 0.99, ε = 1e-8, no weight decay.
    pub fn rms_prop() -> Self {
        Self::RmsProp { weight_decay: 0.0, epsilon: 1e-8, alpha: 0.99 }
    }

    /// The same optimizer with weight decay λ.
    pub fn with_weight_decay(mut self, lambda: f32) -> Self {
        match &mut self {
            Self::Sgd { weight_decay }
            | Self::Adam { weight_decay, .. }
            | Self::AdaGrad { weight_decay, .. }
            | Self::RmsProp { weight_decay, .. } => *weight_decay = lambda,
        }
        self
    }

    /// The lower-case name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::Adam { .. } => "adam",
            Self::AdaGrad { .. } => "adagrad",
            Self::RmsProp { .. } => "rmsprop",
        }
    }

    /// The weight decay λ.
    pub fn weight_decay(&self) -> f32 {
        match *self {
            Self::Sgd { weight_decay }
            | Self::Adam { weight_decay, .. }
            | Self::AdaGrad { weight_decay, .. }
            | Self::RmsProp { weight_decay, .. } => weight_decay,
        }
    }

    /// Checks every parameter's range.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let optimizer = self.name();
        let bad = |name, value, reason| Err(Error::InvalidParameter { optimizer, name, value, reason });
        let wd = self.weight_decay();
        if !(wd.is_finite() && wd >= 0.0) {
            return bad("weight_decay", wd, "it must be finite and at least 0");
        }
        let epsilon = match *self {
            Self::Sgd { .. } => None,
            Self::Adam { epsilon, .. } | Self::AdaGrad { epsilon, .. } | Self::RmsProp { epsilon, .. } => Some(epsilon),
        };
        if let Some(e) = epsilon
            && !(e.is_finite() && e > 0.0)
        {
            return bad("epsilon", e, "it must be finite and above 0");
        }
        let decays: &[(&'static str, f32)] = match self {
            Self::Adam { beta1, beta2, .. } => &[("beta1", *beta1), ("beta2", *beta2)],
            Self::RmsProp { alpha, .. } => &[("alpha", *alpha)],
            _ => &[],
        };
        for &(name, v) in decays {
            if !(0.0..1.0).contains(&v) {
                return bad(name, v, "it must be in [0, 1)");
            }
        }
        Ok(())
    }

    /// The named pieces of the per-row state for rows of `dim` values.
    pub fn state_slots(&self, dim: usize) -> Vec<StateSlot> {
        let slot = |name, offset, cols| StateSlot { name, offset, cols };
        match self {
            Self::Sgd { .. } => Vec::new(),
            Self::Adam { .. } => vec![slot("m", 0, dim), slot("v", dim, dim), slot("beta12t", 2 * dim, 2)],
            Self::AdaGrad { .. } => vec![slot("state_sum", 0, dim)],
            Self::RmsProp { .. } => vec![slot("v", 0, dim)],
        }
    }

    /// f32 values of state per row (0 for SGD).
    pub fn state_width(&self, dim: usize) -> usize {
        self.state_slots(dim).iter().map(|s| s.offset + s.cols).max().unwrap_or(0)
    }

    /// The state of a row that has never been updated: zeros, and
    /// `β1^0 = β2^0 = 1` for Adam.
    pub fn initial_state(&self, dim: usize) -> Vec<f32> {
        let mut s = vec![0.0; self.state_width(dim)];
        if let Self::Adam { .. } = self {
            s[2 * dim..].fill(1.0);
        }
        s
    }

    /// Updates one row: `w` its weights (as f32), `state` its state row,
    /// `grad` its summed gradient.
    pub(crate) fn update_row(&self, lr: f32, w: &mut [f32], state: &mut [f32], grad: &[f32]) {
        let dim = w.len();
        debug_assert_eq!(grad.len(), dim);
        debug_assert_eq!(state.len(), self.state_width(dim));
        match *self {
            Self::Sgd { weight_decay } => {
                for (w, &g) in w.iter_mut().zip(grad) {
                    let g = g + weight_decay * *w;
                    *w -= lr * g;
                }
            }
            Self::Adam { weight_decay, beta1, beta2, epsilon, decoupled_weight_decay } => {
                let (mv, powers) = state.split_at_mut(2 * dim);
                let (m, v) = mv.split_at_mut(dim);
                let beta1t = powers[0] * beta1;
                let beta2t = powers[1] * beta2;
                for j in 0..dim {
                    let mut g = grad[j];
                    let mut x = w[j];
                    if decoupled_weight_decay {
                        x -= lr * weight_decay * x;
                    } else {
                        g += weight_decay * x;
                    }
                    m[j] = beta1 * m[j] + (1.0 - beta1) * g;
                    v[j] = beta2 * v[j] + (1.0 - beta2) * g * g;
                    let m_hat = m[j] / (1.0 - beta1t);
                    let v_hat = v[j] / (1.0 - beta2t);
                    w[j] = x - lr * m_hat / (v_hat.sqrt() + epsilon);
                }
                powers[0] = beta1t;
                powers[1] = beta2t;
            }
            Self::AdaGrad { weight_decay, epsilon } => {
                for j in 0..dim {
                    let g = grad[j] + weight_decay * w[j];
                    state[j] += g * g;
                    w[j] -= lr * g / (state[j].sqrt() + epsilon);
                }
            }
            Self::RmsProp { weight_decay, epsilon, alpha } => {
                for j in 0..dim {
                    let g = grad[j] + weight_decay * w[j];
                    state[j] = alpha * state[j] + (1.0 - alpha) * g * g;
                    w[j] -= lr * g / (state[j].sqrt() + epsilon);
                }
            }
        }
    }
}

impl std::fmt::Display for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Sgd { weight_decay } => write!(f, "sgd(weight_decay={weight_decay})"),
            Self::Adam { weight_decay, beta1, beta2, epsilon, decoupled_weight_decay } => write!(
                f,
                "adam(weight_decay={weight_decay}, beta1={beta1}, beta2={beta2}, epsilon={epsilon}, decoupled_weight_decay={decoupled_weight_decay})"
            ),
            Self::AdaGrad { weight_decay, epsilon } => write!(f, "adagrad(weight_decay={weight_decay}, epsilon={epsilon})"),
            Self::RmsProp { weight_decay, epsilon, alpha } => {
                write!(f, "rmsprop(weight_decay={weight_decay}, epsilon={epsilon}, alpha={alpha})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(o: Optimizer, lr: f32, w: &mut [f32], grad: &[f32]) -> Vec<f32> {
        let mut s = o.initial_state(w.len());
        o.update_row(lr, w, &mut s, grad);
        s
    }

    #[test]
    fn sgd_is_exact_arithmetic() {
        let mut w = [1.0, -2.0];
        step(Optimizer::sgd().with_weight_decay(0.5), 0.25, &mut w, &[2.0, 4.0]);
        // g = (2 + 0.5, 4 - 1) = (2.5, 3); w -= 0.25 g.
        assert_eq!(w, [1.0 - 0.625, -2.0 - 0.75]);
    }

    #[test]
    fn adam_first_step_moves_by_lr_in_the_gradient_sign() {
        // After one step m̂ = g and v̂ = g², so the move is lr·g/(|g| + ε).
        let mut w = [0.5, 0.5, 0.5];
        let s = step(Optimizer::adam(), 0.1, &mut w, &[3.0, -0.01, 0.0]);
        assert!((w[0] - 0.4).abs() < 1e-6 && (w[1] - 0.6).abs() < 1e-5 && w[2] == 0.5, "{w:?}");
        assert_eq!(&s[6..], &[0.9, 0.999]);
        assert_eq!(Optimizer::adam().state_width(3), 8);
    }

    #[test]
    fn adagrad_and_rmsprop_normalise_by_accumulated_squares() {
        let mut w = [1.0];
        let s = step(Optimizer::ada_grad(), 0.5, &mut w, &[-2.0]);
        assert_eq!(s, [4.0]);
        assert!((w[0] - 1.5).abs() < 1e-6);
        let mut w = [1.0];
        let s = step(Optimizer::rms_prop(), 0.5, &mut w, &[2.0]);
        assert!((s[0] - 0.04).abs() < 1e-7, "{s:?}");
        // g / sqrt(0.01 g²) = 10 sign(g).
        assert!((w[0] - (1.0 - 5.0)).abs() < 1e-4, "{w:?}");
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Optimizer::Adam { weight_decay: 0.0, beta1: 1.0, beta2: 0.999, epsilon: 1e-8, decoupled_weight_decay: false }
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "adam parameter beta1 = 1 is invalid: it must be in [0, 1)");
        let e = Optimizer::sgd().with_weight_decay(-0.1).validate().unwrap_err();
        assert!(e.to_string().contains("weight_decay = -0.1"), "{e}");
        let e = Optimizer::AdaGrad { weight_decay: 0.0, epsilon: 0.0 }.validate().unwrap_err();
        assert!(e.to_string().contains("epsilon = 0"), "{e}");
        for o in [Optimizer::sgd(), Optimizer::adam(), Optimizer::ada_grad(), Optimizer::rms_prop()] {
            o.validate().unwrap();
        }
    }
}
