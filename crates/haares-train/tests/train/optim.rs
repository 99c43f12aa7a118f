//! AdamW against a host reference written from PyTorch's update rule, the decay groups by name,
//! and the global clip.

use burn::module::Param;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use haares_core::HaaresModel;
use haares_core::checkpoint::ParamVisitor;
use haares_data::batching::BatchIterator;
use haares_train::run::learner::init_model;
use haares_train::run::loss::{mean_cross_entropy, to_device};
use haares_train::run::optim::{AdamW, AdamWSettings, decays};

use crate::common::{B, repeating, tiny_config};

/// Host copies of every parameter and its gradient, in visiting order.
struct Snapshot<'a> {
    grads: &'a <B as AutodiffBackend>::Gradients,
    params: Vec<Entry>,
}

impl Snapshot<'_> {
    fn take<const D: usize>(&mut self, name: String, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        let host = |t: Tensor<_, D>| t.into_data().convert::<f64>().to_vec::<f64>().unwrap();
        let grad = value.grad(self.grads).map(host);
        self.params.push((name, D, host(value.inner()), grad));
    }
}

impl ParamVisitor<B> for Snapshot<'_> {
    fn vector(&mut self, name: String, param: &mut Param<Tensor<B, 1>>) {
        self.take(name, param);
    }
    fn linear(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.take(name, param);
    }
    fn matrix(&mut self, name: String, param: &mut Param<Tensor<B, 2>>) {
        self.take(name, param);
    }
}

type Entry = (String, usize, Vec<f64>, Option<Vec<f64>>);

fn snapshot(model: &mut HaaresModel<B>, grads: &<B as AutodiffBackend>::Gradients) -> Vec<Entry> {
    let mut snapshot = Snapshot {
        grads,
        params: Vec::new(),
    };
    model.visit_named_params(&mut snapshot);
    snapshot.params
}

fn values(model: &mut HaaresModel<B>) -> Vec<Vec<f64>> {
    let mut out = Vec::new();
    struct Values<'a>(&'a mut Vec<Vec<f64>>);
    impl ParamVisitor<B> for Values<'_> {
        fn vector(&mut self, _: String, p: &mut Param<Tensor<B, 1>>) {
            self.0
                .push(p.val().into_data().convert::<f64>().to_vec().unwrap());
        }
        fn linear(&mut self, _: String, p: &mut Param<Tensor<B, 2>>) {
            self.0
                .push(p.val().into_data().convert::<f64>().to_vec().unwrap());
        }
        fn matrix(&mut self, _: String, p: &mut Param<Tensor<B, 2>>) {
            self.0
                .push(p.val().into_data().convert::<f64>().to_vec().unwrap());
        }
    }
    model.visit_named_params(&mut Values(&mut out));
    out
}

#[test]
fn two_adamw_steps_match_the_pytorch_rule_with_decay_groups_and_global_clipping() {
    let dir = tempfile::tempdir().unwrap();
    let data = repeating(dir.path());
    let config = tiny_config("haares");
    let model_config = config.model_config(data.tokenizer.vocab_size()).unwrap();
    let device = Default::default();
    let mut model = init_model::<B>(&model_config, 7, &device).unwrap();
    // A clip below the gradient norm makes clipping active; a large decay makes it visible.
    let settings = AdamWSettings {
        lr: 1e-2,
        weight_decay: 0.5,
        clip_norm: Some(0.5),
        ..AdamWSettings::default()
    };
    let mut optimizer = AdamW::new(settings);
    let mut batches = BatchIterator::new(&data.train, 2, 1).unwrap();

    let mut moments: Vec<(Vec<f64>, Vec<f64>)> = Vec::new();
    let mut clipped_any = false;
    for t in 1..=2 {
        let batch = to_device::<B>(&batches.next_batch(), 16, &device);
        let grads = mean_cross_entropy(&model, &batch).backward();
        let before = snapshot(&mut model, &grads);
        let norm = before
            .iter()
            .flat_map(|p| p.3.iter().flatten())
            .map(|g| g * g)
            .sum::<f64>()
            .sqrt();
        let scale = (0.5 / (norm + 1e-6)).min(1.0);
        clipped_any |= scale < 1.0;
        optimizer.step(&mut model, &grads).unwrap();
        let after = values(&mut model);
        if moments.is_empty() {
            moments = before
                .iter()
                .map(|p| (vec![0.0; p.2.len()], vec![0.0; p.2.len()]))
                .collect();
        }
        for ((name, rank, value, grad), ((m, v), new)) in
            before.iter().zip(moments.iter_mut().zip(&after))
        {
            let Some(grad) = grad else {
                // PyTorch skips a parameter without a gradient: no decay, no moment update.
                assert_eq!(new, value, "`{name}` has no gradient and must not change");
                continue;
            };
            let decay = if decays(name, *rank) { 0.5 } else { 0.0 };
            for i in 0..value.len() {
                let g = grad[i] * scale;
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.95 * v[i] + 0.05 * g * g;
                let m_hat = m[i] / (1.0 - 0.9f64.powi(t));
                let v_hat = v[i] / (1.0 - 0.95f64.powi(t));
                let expected =
                    value[i] * (1.0 - 1e-2 * decay) - 1e-2 * m_hat / (v_hat.sqrt() + 1e-8);
                assert!(
                    (new[i] - expected).abs() <= 1e-5 * (1.0 + expected.abs()),
                    "step {t}, `{name}`[{i}]: optimizer {} vs reference {expected}",
                    new[i]
                );
            }
        }
    }
    assert!(clipped_any, "the test must exercise clipping");
}

#[test]
fn weight_decay_applies_to_weight_matrices_only() {
    let config = tiny_config("haares");
    let model_config = config.model_config(40).unwrap();
    let model = init_model::<B>(&model_config, 1, &Default::default()).unwrap();
    let matrices = [
        "attn.wq.weight",
        "attn.wk.weight",
        "attn.wv.weight",
        "attn.wo.weight",
        "mlp.w_gate.weight",
        "mlp.w_up.weight",
        "mlp.w_down.weight",
    ];
    let mut decayed = 0;
    for (name, shape) in model.checkpoint_shapes() {
        let expected = name == "embed.weight" || matrices.iter().any(|m| name.ends_with(m));
        assert_eq!(
            decays(&name, shape.len()),
            expected,
            "`{name}` (shape {shape:?})"
        );
        decayed += expected as usize;
    }
    assert_eq!(
        decayed,
        1 + 7 * 2,
        "the embedding and seven matrices per layer decay"
    );
    // Names the paper excludes even if they were matrices.
    for name in [
        "layers.0.attn_router.query",
        "layers.0.mlp_router.key_norm.weight",
        "layers.1.attn_router.detail_bias",
        "layers.0.attn_gate",
        "layers.0.mlp_scale",
        "final_norm.weight",
        "layers.0.attn.wq.bias",
    ] {
        assert!(!decays(name, 2), "`{name}` must not decay");
    }
    assert!(
        decays("layers.3.mlp.w_gate.weight", 2),
        "SwiGLU's w_gate is a weight matrix"
    );
}

#[test]
fn a_missing_gradient_is_an_error_naming_the_parameter_and_nothing_is_updated() {
    let device = Default::default();
    let config = tiny_config("haares").model_config(23).unwrap();
    let mut model = init_model::<B>(&config, 5, &device).unwrap();
    // A loss only the embedding reaches: the parameters after it in visiting order get no
    // gradient, as if a backward pass had lost them.
    let tokens = burn::tensor::TensorData::new(vec![1i64, 2, 3], [1, 3]);
    let tokens = Tensor::<B, 2, burn::tensor::Int>::from_data(tokens, &device);
    let grads = model.embed.forward(tokens).sum().backward();
    let before = model.to_named_tensors();
    let mut optimizer = AdamW::new(AdamWSettings::default());
    let missing = optimizer.step(&mut model, &grads).unwrap_err();
    assert_eq!(missing.parameter, "final_norm.weight");
    assert_eq!(optimizer.steps, 0, "no update was counted");
    assert!(optimizer.state.is_empty(), "no moment was written");
    assert_eq!(model.to_named_tensors(), before, "no parameter moved");

    let error = haares_train::TrainError::LostGradient {
        parameter: missing.parameter,
        replica: 1,
        step: None,
    }
    .at_step(7)
    .to_string();
    for part in [
        "replica 1 at step 7",
        "`final_norm.weight`",
        "no checkpoint",
    ] {
        assert!(error.contains(part), "{error}");
    }
}
