//! Gradient flow in f32: every parameter of every method gets a finite, nonzero gradient on the
//! backend (the portability suite's third check, beside the reference and causality).

use burn::module::Param;
use burn::tensor::Tensor;
use haares_core::TrainingBackend;
use haares_core::checkpoint::ParamVisitor;

use crate::common::{
    Rng, all_methods, model_on, random_params_for, random_tokens, tensor_values, tiny_config,
    token_tensor,
};

/// Collects, per parameter, whether its gradient exists, is finite, and is nonzero.
struct GradientReport<'a, B: TrainingBackend> {
    grads: &'a B::Gradients,
    problems: Vec<String>,
}

impl<B: TrainingBackend> GradientReport<'_, B> {
    fn check<const D: usize>(&mut self, name: String, param: &Param<Tensor<B, D>>) {
        // The first read site's only slot is the embedding: a softmax over one slot is constant,
        // so its router gets a zero gradient, and its detail bias, which no slot uses, none
        // (core/routing.rs tests that exactly).
        let constant_site = name.starts_with("layers.0.attn_router.");
        match param.grad(self.grads) {
            None if constant_site => {}
            None => self.problems.push(format!("{name}: no gradient")),
            Some(grad) => {
                let values = tensor_values(grad);
                if values.iter().any(|v| !v.is_finite()) {
                    self.problems.push(format!("{name}: non-finite gradient"));
                } else if !constant_site && values.iter().all(|v| *v == 0.0) {
                    self.problems.push(format!("{name}: zero gradient"));
                }
            }
        }
    }
}

impl<B: TrainingBackend> ParamVisitor<B> for GradientReport<'_, B> {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        self.check(name, param);
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.check(name, param);
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.check(name, param);
    }
}

/// Every parameter of every method's tiny model gets a finite, nonzero gradient on `B`.
pub fn gradients_reach_every_parameter<B: TrainingBackend>(device: &B::Device) {
    let mut rng = Rng::new(63);
    for method in all_methods() {
        let config = tiny_config(method, 4, 2);
        let mut model = model_on::<B>(
            &config,
            &random_params_for::<B>(&config, rng.next_u64(), device),
            device,
        );
        let tokens = token_tensor::<B>(&random_tokens(&mut rng, 2, 6, config.vocab_size), device);
        let grads = model
            .forward(tokens)
            .expect("valid tokens")
            .powi_scalar(2)
            .mean()
            .backward();
        let mut report = GradientReport::<B> {
            grads: &grads,
            problems: Vec::new(),
        };
        model.visit_named_params(&mut report);
        assert!(
            report.problems.is_empty(),
            "{} on {}: {:?}",
            method.name(),
            B::name(device),
            report.problems
        );
    }
}
