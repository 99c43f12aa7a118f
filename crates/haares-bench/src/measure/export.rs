//! What a worker of ours writes for the PyTorch peer ([`crate::peer`]): the initial model, a
//! perturbed copy, and our logits of the copy on fixed tokens, which the peer must reproduce.

use std::path::PathBuf;

use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use haares_base::SplitMix64;
use haares_core::{ModelConfig, TrainingBackend};
use haares_train::run::learner::init_model;
use serde::{Deserialize, Serialize};

/// Rows and positions of the logits check.
const CHECK_ROWS: usize = 2;
const CHECK_SEQ: usize = 32;

/// A worker's export of one method for the peer: the initial model, a perturbed copy, and our
/// logits of the copy on fixed tokens (JSON `{"tokens": [[id…]…], "logits": [f…]}`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExportTask {
    /// The model.
    pub config: ModelConfig,
    /// The initial weights (model seed 42, as our training workers start).
    pub initial: PathBuf,
    /// The perturbed copy.
    pub perturbed: PathBuf,
    /// Tokens and our logits of the perturbed copy.
    pub reference: PathBuf,
}

impl ExportTask {
    /// Writes the three files on backend `B`.
    pub fn run<B: TrainingBackend>(&self, device: &B::Device) -> haares_train::Result<()> {
        let model = init_model::<B>(&self.config, 42, device)?;
        model.save_safetensors(&self.initial)?;
        let perturbed = model.valid().map(&mut Perturb {
            rng: SplitMix64::new(7),
        });
        perturbed.save_safetensors(&self.perturbed)?;
        let mut rng = SplitMix64::new(99);
        let vocab = self.config.vocab_size;
        let ids: Vec<i64> = (0..CHECK_ROWS * CHECK_SEQ)
            .map(|_| ((rng.next_f64() * vocab as f64) as i64).min(vocab as i64 - 1))
            .collect();
        let tokens = Tensor::<B::InnerBackend, 2, Int>::from_data(
            TensorData::new(ids.clone(), [CHECK_ROWS, CHECK_SEQ]),
            device,
        );
        let logits = perturbed.forward(tokens)?.into_data().convert::<f64>();
        let reference = serde_json::json!({
            "tokens": ids.chunks(CHECK_SEQ).collect::<Vec<_>>(),
            "logits": logits.to_vec::<f64>().map_err(|e| haares_train::TrainError::Device(format!("{e:?}")))?,
        });
        haares_data::write_atomically(&self.reference, reference.to_string().as_bytes())?;
        Ok(())
    }
}

/// Adds N(0, 0.1²) to every vector parameter (router queries, norm weights, detail biases,
/// gates, scales); matrices are random already.
struct Perturb {
    rng: SplitMix64,
}

impl<B: Backend> ModuleMapper<B> for Perturb {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 1 {
            return param;
        }
        let seed = (self.rng.next_f64() * 1e9) as u64;
        param.map(|tensor| {
            let device = tensor.device();
            B::seed(&device, seed);
            let noise = Tensor::random(tensor.shape(), Distribution::Normal(0.0, 0.1), &device);
            tensor + noise
        })
    }
}
