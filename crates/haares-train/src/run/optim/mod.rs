//! AdamW with the paper's weight-decay exclusions and global gradient-norm clipping
//! (tab:reprotrain), keeping its state under the checkpoint's parameter names.
//!
//! Burn's `AdamW` decays every parameter alike and clips per tensor; the paper decays only weight
//! matrices and clips the global norm, as PyTorch's `clip_grad_norm_` does. State keyed by name
//! (not by Burn's `ParamId`) survives a save and load of the model.

use std::collections::BTreeMap;

use crate::error::TrainError;
use burn::module::Param;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use haares_core::HaaresModel;
use haares_core::checkpoint::ParamVisitor;

#[cfg(test)]
mod checks;
#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
mod cube;
#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
mod cube_kernels;
#[cfg(all(feature = "cuda-backend", feature = "wgpu-backend"))]
mod cube_sources;
#[cfg(feature = "flex")]
mod flex;
mod rule;

#[cfg(all(feature = "cuda-backend", feature = "wgpu-backend"))]
pub use cube_sources::optimizer_cuda_sources;
pub use rule::{AdamWSettings, Moments};
use rule::{Pending, UpdateRule, update_plain};

/// Whether the parameter `name` of rank `rank` is weight-decayed: only matrices with at least two
/// dimensions that are not biases, norm weights, gates, residual scales or router parameters.
/// (The SwiGLU `w_gate` projection is a weight matrix, not a gate, and decays.)
pub fn decays(name: &str, rank: usize) -> bool {
    let excluded = |segment: &str| {
        segment.ends_with("norm")
            || segment.ends_with("router")
            || segment.ends_with("bias")
            || segment == "query"
            || matches!(segment, "attn_gate" | "mlp_gate" | "gate")
            || segment.ends_with("_scale")
    };
    rank >= 2 && !name.split('.').any(excluded)
}

/// The optimizer: settings, the number of updates taken, and the moments by parameter name.
#[derive(Debug, Clone)]
pub struct AdamW<B: Backend> {
    /// Hyper-parameters.
    pub settings: AdamWSettings,
    /// Updates applied so far (the bias-correction time step).
    pub steps: u64,
    /// Moments by parameter checkpoint name.
    pub state: BTreeMap<String, Moments<B>>,
}

/// What one update did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpdateStats {
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer.
    pub fn new(settings: AdamWSettings) -> Self {
        Self {
            settings,
            steps: 0,
            state: BTreeMap::new(),
        }
    }

    /// Clips the global gradient norm, then applies one AdamW update to every parameter with a
    /// gradient (PyTorch semantics: decoupled decay `p ← p − lr·λ·p`, bias-corrected moments,
    /// `p ← p − lr·m̂ / (√v̂ + ε)`). A parameter whose gradient is missing ([`named_gradients`])
    /// is an error, and nothing is updated.
    pub fn step<AB>(
        &mut self,
        model: &mut HaaresModel<AB>,
        grads: &AB::Gradients,
    ) -> Result<UpdateStats, MissingGradient>
    where
        AB: AutodiffBackend<InnerBackend = B>,
    {
        let gradients = named_gradients(model, grads)?;
        Ok(self.apply(model, gradients))
    }

    /// [`step`](Self::step) from gradients already collected (and, in data-parallel training,
    /// all-reduced): clip, then update.
    pub fn apply<AB>(
        &mut self,
        model: &mut HaaresModel<AB>,
        gradients: NamedGradients<B>,
    ) -> UpdateStats
    where
        AB: AutodiffBackend<InnerBackend = B>,
    {
        let grad_norm = global_norm(&gradients);
        let scale = match self.settings.clip_norm {
            // torch.nn.utils.clip_grad_norm_: coefficient max/(norm + 1e-6), capped at 1.
            Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
            None => 1.0,
        };
        self.steps += 1;
        let mut collector = ValueCollector::<AB> {
            grads: gradients.into_iter().collect(),
            found: Vec::new(),
        };
        model.visit_named_params(&mut collector);
        let updated = self.update_all(collector.found, scale);
        model.visit_named_params(&mut Installer::<AB> { updated });
        UpdateStats { grad_norm }
    }

    /// The same optimizer with its moments on `device` (a data-parallel replica's copy).
    pub fn to_device(&self, device: &B::Device) -> Self {
        let state = self
            .state
            .iter()
            .map(|(name, m)| {
                let moments = Moments {
                    exp_avg: m.exp_avg.clone().to_device(device),
                    exp_avg_sq: m.exp_avg_sq.clone().to_device(device),
                };
                (name.clone(), moments)
            })
            .collect();
        Self {
            settings: self.settings,
            steps: self.steps,
            state,
        }
    }

    /// New values of the parameters (flattened), by name, given their flattened gradients, each
    /// scaled by `clip` where that is below 1: on the runners' cube backends a few launches for
    /// all of them (`cube.rs`), on Flex one pass over each parameter's four buffers (`flex.rs`),
    /// elsewhere [`update_plain`]'s tensor operations.
    fn update_all(
        &mut self,
        params: Vec<FoundParam<B>>,
        clip: f64,
    ) -> BTreeMap<String, Tensor<B, 1>> {
        let (names, mut pending): (Vec<String>, Vec<Pending<B>>) = params
            .into_iter()
            .map(
                |FoundParam {
                     name,
                     rank,
                     value,
                     grad,
                 }| {
                    let rule = UpdateRule::new(&self.settings, self.steps, decays(&name, rank))
                        .with_clip(clip);
                    let moments = self.state.remove(&name).unwrap_or_else(|| Moments {
                        exp_avg: grad.zeros_like(),
                        exp_avg_sq: grad.zeros_like(),
                    });
                    (
                        name,
                        Pending {
                            rule,
                            value,
                            grad,
                            moments,
                        },
                    )
                },
            )
            .unzip();
        #[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
        let batched = cube::update_batch(&mut pending);
        #[cfg(not(any(feature = "cuda-backend", feature = "wgpu-backend")))]
        let batched: Option<Vec<Tensor<B, 1>>> = None;
        let values = match batched {
            Some(values) => values,
            None => pending.iter_mut().map(update_one).collect(),
        };
        names
            .into_iter()
            .zip(pending)
            .zip(values)
            .map(|((name, done), value)| {
                self.state.insert(name.clone(), done.moments);
                (name, value)
            })
            .collect()
    }

    /// The moments as named host tensors (`exp_avg.<name>`, `exp_avg_sq.<name>`), for a checkpoint.
    pub fn to_named_tensors(&self) -> Vec<(String, TensorData)> {
        let mut out = Vec::with_capacity(2 * self.state.len());
        for (name, moments) in &self.state {
            out.push((format!("exp_avg.{name}"), moments.exp_avg.to_data()));
            out.push((format!("exp_avg_sq.{name}"), moments.exp_avg_sq.to_data()));
        }
        out
    }

    /// Restores moments written by [`Self::to_named_tensors`].
    pub fn from_named_tensors(
        settings: AdamWSettings,
        steps: u64,
        mut tensors: BTreeMap<String, TensorData>,
        device: &B::Device,
    ) -> crate::Result<Self> {
        let mut optimizer = Self::new(settings);
        optimizer.steps = steps;
        let names: Vec<String> = tensors
            .keys()
            .filter_map(|k| k.strip_prefix("exp_avg.").map(str::to_string))
            .collect();
        for name in names {
            let avg = tensors.remove(&format!("exp_avg.{name}"));
            let sq = tensors.remove(&format!("exp_avg_sq.{name}"));
            let (Some(avg), Some(sq)) = (avg, sq) else {
                return Err(TrainError::Checkpoint(format!(
                    "the optimizer state of `{name}` is incomplete"
                )));
            };
            optimizer.state.insert(
                name,
                Moments {
                    exp_avg: Tensor::from_data(avg, device),
                    exp_avg_sq: Tensor::from_data(sq, device),
                },
            );
        }
        if let Some(extra) = tensors.keys().next() {
            return Err(TrainError::Checkpoint(format!(
                "unexpected optimizer tensor `{extra}`"
            )));
        }
        Ok(optimizer)
    }
}

/// The global gradient norm `√(Σ_params Σ g²)`, read back once: on the cube backends one kernel
/// launch per batch of up to 16 parameters and one for the total (`cube.rs`), elsewhere a square
/// and a sum per parameter, one concatenation and a sum.
fn global_norm<B: Backend>(gradients: &NamedGradients<B>) -> f64 {
    if gradients.is_empty() {
        return 0.0;
    }
    let tensors: Vec<Tensor<B, 1>> = gradients.iter().map(|(_, g)| g.clone()).collect();
    #[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
    let total = cube::squared_norm(&tensors);
    #[cfg(not(any(feature = "cuda-backend", feature = "wgpu-backend")))]
    let total = None;
    let total = total.unwrap_or_else(|| {
        Tensor::cat(tensors.into_iter().map(|g| g.square().sum()).collect(), 0).sum()
    });
    total.into_scalar().elem::<f64>().sqrt()
}

/// Implements [`ParamVisitor`] for a visitor by calling its `$method::<D>(name, param)` on every
/// parameter, whichever of the three kinds (they differ only in how a checkpoint stores them).
macro_rules! visit_every_param_with {
    ($visitor:ty, $method:ident) => {
        impl<AB: AutodiffBackend> ParamVisitor<AB> for $visitor {
            fn vector(&mut self, name: String, param: &mut Param<Tensor<AB, 1>>) {
                self.$method(name, param);
            }
            fn linear(&mut self, name: String, param: &mut Param<Tensor<AB, 2>>) {
                self.$method(name, param);
            }
            fn matrix(&mut self, name: String, param: &mut Param<Tensor<AB, 2>>) {
                self.$method(name, param);
            }
        }
    };
}

/// Every parameter's gradient, flattened, by checkpoint name, in the model's visiting order (the
/// same on every replica of one model).
pub type NamedGradients<B> = Vec<(String, Tensor<B, 1>)>;

/// The gradients `grads` holds for `model`'s parameters, or the first parameter it lacks one
/// for: every parameter receives a gradient from every backward pass except those of
/// [`ModelConfig::parameters_without_gradient`](haares_core::ModelConfig::parameters_without_gradient),
/// so a missing one was lost, and is never taken as zero.
pub fn named_gradients<AB: AutodiffBackend>(
    model: &mut HaaresModel<AB>,
    grads: &AB::Gradients,
) -> Result<NamedGradients<AB::InnerBackend>, MissingGradient> {
    let mut collector = GradientCollector::<AB> {
        grads,
        without: model.config.parameters_without_gradient(),
        found: Vec::new(),
        missing: None,
    };
    model.visit_named_params(&mut collector);
    match collector.missing {
        Some(parameter) => Err(MissingGradient { parameter }),
        None => Ok(collector.found),
    }
}

/// A trainable parameter that a backward pass gave no gradient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingGradient {
    /// Its checkpoint name.
    pub parameter: String,
}

struct GradientCollector<'a, AB: AutodiffBackend> {
    grads: &'a AB::Gradients,
    /// Parameters no loss reaches.
    without: Vec<String>,
    found: Vec<(String, Tensor<AB::InnerBackend, 1>)>,
    missing: Option<String>,
}

impl<AB: AutodiffBackend> GradientCollector<'_, AB> {
    fn collect<const D: usize>(&mut self, name: String, param: &Param<Tensor<AB, D>>) {
        match param.val().grad(self.grads) {
            Some(grad) => self.found.push((name, grad.flatten::<1>(0, D - 1))),
            None if self.missing.is_none() && !self.without.contains(&name) => {
                self.missing = Some(name);
            }
            None => {}
        }
    }
}

visit_every_param_with!(GradientCollector<'_, AB>, collect);

/// One parameter's update on its own: on Flex one pass over the four buffers (`flex.rs`),
/// elsewhere [`update_plain`]'s tensor operations.
fn update_one<B: Backend>(pending: &mut Pending<B>) -> Tensor<B, 1> {
    let Pending {
        rule,
        value,
        grad,
        moments,
    } = pending;
    #[cfg(feature = "flex")]
    if let Some(updated) = flex::update(rule, value, grad, moments) {
        return updated;
    }
    update_plain(rule, value.clone(), grad.clone(), moments)
}

/// A parameter with a gradient, flattened, as the update takes it.
struct FoundParam<B: Backend> {
    name: String,
    rank: usize,
    value: Tensor<B, 1>,
    grad: Tensor<B, 1>,
}

/// Collects every parameter that has a gradient, in the model's visiting order.
struct ValueCollector<AB: AutodiffBackend> {
    grads: BTreeMap<String, Tensor<AB::InnerBackend, 1>>,
    found: Vec<FoundParam<AB::InnerBackend>>,
}

impl<AB: AutodiffBackend> ValueCollector<AB> {
    fn collect<const D: usize>(&mut self, name: String, param: &Param<Tensor<AB, D>>) {
        if let Some(grad) = self.grads.remove(&name) {
            let value = param.val().inner().flatten::<1>(0, D - 1);
            self.found.push(FoundParam {
                name,
                rank: D,
                value,
                grad,
            });
        }
    }
}

visit_every_param_with!(ValueCollector<AB>, collect);

/// Puts the updated values in place, each in its parameter's shape.
struct Installer<AB: AutodiffBackend> {
    updated: BTreeMap<String, Tensor<AB::InnerBackend, 1>>,
}

impl<AB: AutodiffBackend> Installer<AB> {
    fn install<const D: usize>(&mut self, name: String, param: &mut Param<Tensor<AB, D>>) {
        let Some(updated) = self.updated.remove(&name) else {
            return;
        };
        let updated = updated.reshape(param.val().shape());
        *param = Param::initialized(param.id, Tensor::from_inner(updated).require_grad());
    }
}

visit_every_param_with!(Installer<AB>, install);
