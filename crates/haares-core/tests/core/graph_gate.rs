//! Threads that build autodiff graphs and run backward passes at once lose no gradient when they
//! pass through `haares_core::graph_gate` (docs/model.md, "Gradients on several threads at
//! once"). Without the gate, Burn 0.21 loses one now and then: see the ignored test below.

use burn::module::Param;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use haares_core::ResidualMethod;
use haares_core::checkpoint::ParamVisitor;
use haares_core::graph_gate::{self, GraphWork};

use crate::common::*;

/// Threads × steps of each stress run: about 2 s on two cores.
const THREADS: usize = 4;
const STEPS: usize = 250;

/// Steps, over `THREADS` threads of `STEPS` forward and backward passes each, whose backward
/// pass left a parameter without a gradient that should have one.
fn steps_that_lost_a_gradient(gated: bool) -> usize {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let expected = config.checkpoint_layout().len() - config.parameters_without_gradient().len();
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS as u64)
            .map(|seed| {
                let config = &config;
                scope.spawn(move || {
                    let device = Default::default();
                    let model = model_on::<Ad64>(config, &random_params(config, seed), &device);
                    let mut rng = Rng::new(seed);
                    let mut lost = 0;
                    for _ in 0..STEPS {
                        let tokens = random_tokens(&mut rng, 1, 8, config.vocab_size);
                        let loss = {
                            let _pass = gated.then(|| graph_gate::enter(GraphWork::Building));
                            model
                                .forward(token_tensor::<Ad64>(&tokens, &device))
                                .unwrap()
                                .sum()
                        };
                        let grads = {
                            let _pass = gated.then(|| graph_gate::enter(GraphWork::Backward));
                            loss.backward()
                        };
                        let mut counter = Counter(&grads, 0);
                        model.clone().visit_named_params(&mut counter);
                        lost += usize::from(counter.1 != expected);
                    }
                    lost
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    })
}

#[test]
fn threads_through_the_gate_lose_no_gradient() {
    assert_eq!(steps_that_lost_a_gradient(true), 0);
}

/// The upstream defect the gate works around, shown: without the gate some steps lose
/// gradients (on the 2-core development machine: in each of ten runs, 1 to 9 steps of 1,000). Ignored
/// because it measures Burn, not this crate, and a run may by chance lose none; run it with
/// `cargo test -p haares-core --test core graph_gate -- --ignored`. When Burn fixes the defect
/// it fails, and the gate can go.
#[test]
#[ignore = "shows Burn 0.21's defect; nondeterministic"]
fn without_the_gate_threads_lose_gradients() {
    let lost = steps_that_lost_a_gradient(false);
    println!("{lost} of {} steps lost a gradient", THREADS * STEPS);
    assert!(lost > 0, "no step lost a gradient without the gate");
}

/// Counts the parameters `grads` holds a gradient for.
struct Counter<'a>(&'a <Ad64 as AutodiffBackend>::Gradients, usize);

impl Counter<'_> {
    fn count<const D: usize>(&mut self, param: &Param<Tensor<Ad64, D>>) {
        self.1 += usize::from(param.val().grad(self.0).is_some());
    }
}

impl ParamVisitor<Ad64> for Counter<'_> {
    fn vector(&mut self, _: String, param: &mut Param<Tensor<Ad64, 1>>) {
        self.count(param);
    }
    fn linear(&mut self, _: String, param: &mut Param<Tensor<Ad64, 2>>) {
        self.count(param);
    }
    fn matrix(&mut self, _: String, param: &mut Param<Tensor<Ad64, 2>>) {
        self.count(param);
    }
}
