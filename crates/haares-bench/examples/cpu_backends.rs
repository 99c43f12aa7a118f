//! Times one training step (forward, cross-entropy, backward, AdamW update) of the same model on
//! the two CPU backends, NdArray and Flex, interleaved so that machine noise hits both alike.
//!
//! `cargo run -p haares-bench --features flex --example cpu_backends -- [layers] [batch] [seq] [steps]`

use haares_core::TrainingBackend;
use std::time::Instant;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::log_softmax;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use haares_core::{HaaresModel, ModelFamily, ResidualMethod};

struct Runner<B: TrainingBackend> {
    model: Option<HaaresModel<B>>,
    optimizer: burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, HaaresModel<B>, B>,
    tokens: Tensor<B, 2, Int>,
    targets: Tensor<B, 2, Int>,
}

impl<B: TrainingBackend> Runner<B>
where
    HaaresModel<B>: AutodiffModule<B, InnerModule = HaaresModel<B::InnerBackend>>,
{
    fn new(method: ResidualMethod, layers: usize, batch: usize, seq: usize) -> Self {
        let device = B::Device::default();
        let config = ModelFamily::Small.config(layers, 256, method);
        let model = config.init::<B>(&device).expect("valid config");
        let ids: Vec<i64> = (0..batch * (seq + 1))
            .map(|i| ((i * 7919) % 251) as i64)
            .collect();
        let all = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq + 1]), &device);
        Self {
            model: Some(model),
            optimizer: AdamWConfig::new()
                .with_beta_2(0.95)
                .with_epsilon(1e-8)
                .with_weight_decay(0.01)
                .init(),
            tokens: all.clone().narrow(1, 0, seq),
            targets: all.narrow(1, 1, seq),
        }
    }

    fn step(&mut self) -> f64 {
        let model = self.model.take().unwrap();
        let logits = model.forward_unchecked(self.tokens.clone());
        let [batch, seq, vocab] = logits.dims();
        let log_probs = log_softmax(logits.reshape([batch * seq, vocab]), 1);
        let loss = -log_probs
            .gather(1, self.targets.clone().reshape([batch * seq, 1]))
            .mean();
        let value: f64 = loss.clone().into_scalar().elem();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optimizer.step(3e-4, model, grads));
        value
    }
}

fn time<F: FnMut() -> f64>(mut step: F, steps: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..steps {
        assert!(step().is_finite());
    }
    start.elapsed().as_secs_f64() / steps as f64
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (layers, batch, seq, steps) = (arg(0, 12), arg(1, 4), arg(2, 128), arg(3, 5));
    println!(
        "small family (d = 128), {layers} layers, batch {batch} x {seq}, {steps} timed steps after 2 warm-up steps"
    );
    println!("| method | NdArray ms/step | Flex ms/step | NdArray / Flex |");
    println!("|---|---|---|---|");
    for method in [
        ResidualMethod::Standard,
        ResidualMethod::BlockAttnRes,
        ResidualMethod::haares(),
    ] {
        let mut ndarray = Runner::<Autodiff<NdArray>>::new(method, layers, batch, seq);
        let mut flex = Runner::<Autodiff<Flex>>::new(method, layers, batch, seq);
        for _ in 0..2 {
            ndarray.step();
            flex.step();
        }
        let (mut t_ndarray, mut t_flex) = (0.0, 0.0);
        for _ in 0..steps {
            t_ndarray += time(|| ndarray.step(), 1);
            t_flex += time(|| flex.step(), 1);
        }
        let (a, b) = (1e3 * t_ndarray / steps as f64, 1e3 * t_flex / steps as f64);
        println!("| {} | {a:.1} | {b:.1} | {:.2} |", method.name(), a / b);
    }
}
