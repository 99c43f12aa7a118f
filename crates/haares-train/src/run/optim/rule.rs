//! AdamW's rule for one parameter (PyTorch's semantics): its constants at a time step, and the
//! update as tensor operations, the reference that `flex.rs`'s one-pass update matches bit for bit.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use serde::{Deserialize, Serialize};

/// AdamW hyper-parameters; the defaults are the paper's (tab:reprotrain).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWSettings {
    /// Learning rate, constant (no warmup, no decay). Default 3e-4.
    pub lr: f64,
    /// First-moment decay β₁. Default 0.9.
    pub beta1: f64,
    /// Second-moment decay β₂. Default 0.95.
    pub beta2: f64,
    /// Denominator ε. Default 1e-8.
    pub epsilon: f64,
    /// Decoupled weight decay of the decayed group. Default 0.01.
    pub weight_decay: f64,
    /// Global gradient-norm clip; `None` disables clipping. Default 1.0.
    pub clip_norm: Option<f64>,
}

impl Default for AdamWSettings {
    fn default() -> Self {
        Self {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.01,
            clip_norm: Some(1.0),
        }
    }
}

/// First and second moments of one parameter, flattened.
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    /// Exponential average of gradients.
    pub exp_avg: Tensor<B, 1>,
    /// Exponential average of squared gradients.
    pub exp_avg_sq: Tensor<B, 1>,
}

/// One parameter's update waiting to run: its rule, its flattened value and gradient, and its
/// moments (taken out of the optimizer's state, put back updated).
#[derive(Debug, Clone)]
pub(crate) struct Pending<B: Backend> {
    pub(crate) rule: UpdateRule,
    pub(crate) value: Tensor<B, 1>,
    pub(crate) grad: Tensor<B, 1>,
    pub(crate) moments: Moments<B>,
}

/// The constants of one parameter's update at time step `t` (PyTorch's AdamW): the moments'
/// decays, the bias corrections, and the decoupled decay factor where the parameter decays.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UpdateRule {
    pub(crate) beta1: f64,
    pub(crate) beta2: f64,
    /// `√(1 − β₂ᵗ)`, the second moment's bias correction under the root.
    pub(crate) bias2_root: f64,
    pub(crate) epsilon: f64,
    /// `lr / (1 − β₁ᵗ)`.
    pub(crate) step_size: f64,
    /// `1 − lr·λ`, or `None` where the parameter does not decay.
    pub(crate) decay: Option<f64>,
    /// The global clip's factor on the gradient, `max / (‖g‖ + 10⁻⁶)`, where it is below 1.
    pub(crate) clip: Option<f64>,
}

impl UpdateRule {
    pub(crate) fn new(settings: &AdamWSettings, steps: u64, decays: bool) -> Self {
        let t = steps as i32;
        Self {
            beta1: settings.beta1,
            beta2: settings.beta2,
            bias2_root: (1.0 - settings.beta2.powi(t)).sqrt(),
            epsilon: settings.epsilon,
            step_size: settings.lr / (1.0 - settings.beta1.powi(t)),
            decay: (decays && settings.weight_decay != 0.0)
                .then_some(1.0 - settings.lr * settings.weight_decay),
            clip: None,
        }
    }

    /// The same rule with the gradient scaled by `scale` first, where it is below 1.
    pub(crate) fn with_clip(self, scale: f64) -> Self {
        Self {
            clip: (scale < 1.0).then_some(scale),
            ..self
        }
    }
}

/// One parameter's update as tensor operations, the reference for `flex.rs` and `cube.rs`: the
/// clipped gradient `g ← g·c`, then `m ← β₁m + (1 − β₁)g`, `v ← β₂v + (1 − β₂)g²`,
/// `p ← p·(1 − lr·λ) − lr/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)`.
pub(crate) fn update_plain<B: Backend>(
    rule: &UpdateRule,
    value: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: &mut Moments<B>,
) -> Tensor<B, 1> {
    let grad = match rule.clip {
        Some(scale) => grad * scale,
        None => grad,
    };
    moments.exp_avg = moments.exp_avg.clone() * rule.beta1 + grad.clone() * (1.0 - rule.beta1);
    moments.exp_avg_sq =
        moments.exp_avg_sq.clone() * rule.beta2 + grad.square() * (1.0 - rule.beta2);
    let denominator = moments.exp_avg_sq.clone().sqrt() / rule.bias2_root + rule.epsilon;
    let decayed = match rule.decay {
        Some(factor) => value * factor,
        None => value,
    };
    decayed - moments.exp_avg.clone() / denominator * rule.step_size
}

/// The rule's constants as f32, converted as Burn's backends convert a scalar operand (`as
/// f32`): what the fast paths (`flex.rs`, `cube.rs`) compute with.
#[cfg(any(feature = "flex", feature = "cuda-backend", feature = "wgpu-backend"))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct F32Rule {
    pub(crate) beta1: f32,
    pub(crate) one_minus_beta1: f32,
    pub(crate) beta2: f32,
    pub(crate) one_minus_beta2: f32,
    pub(crate) bias2_root: f32,
    pub(crate) epsilon: f32,
    pub(crate) step_size: f32,
    pub(crate) decay: Option<f32>,
    pub(crate) clip: Option<f32>,
}

#[cfg(any(feature = "flex", feature = "cuda-backend", feature = "wgpu-backend"))]
impl F32Rule {
    pub(crate) fn new(rule: &UpdateRule) -> Self {
        Self {
            beta1: rule.beta1 as f32,
            one_minus_beta1: (1.0 - rule.beta1) as f32,
            beta2: rule.beta2 as f32,
            one_minus_beta2: (1.0 - rule.beta2) as f32,
            bias2_root: rule.bias2_root as f32,
            epsilon: rule.epsilon as f32,
            step_size: rule.step_size as f32,
            decay: rule.decay.map(|factor| factor as f32),
            clip: rule.clip.map(|scale| scale as f32),
        }
    }

    /// Whether one launch can take this rule beside a batch of `first`'s constants whose
    /// decaying parameters decay by `decay`: the same constants, and the same decay factor if
    /// this parameter decays (one that does not takes factor 1 instead).
    #[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
    pub(crate) fn joins(&self, first: &Self, decay: Option<f32>) -> bool {
        let decays_alike = match (self.decay, decay) {
            (Some(own), Some(batch)) => own == batch,
            _ => true,
        };
        let constants = |rule: &Self| Self {
            decay: None,
            ..*rule
        };
        decays_alike && constants(self) == constants(first)
    }
}
