//! Looking at a trained model: validation loss of a checkpoint (`eval`) and text generation with
//! temperature and top-k (`sample`).

use haares_core::TrainingBackend;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use haares_base::SplitMix64;
use haares_core::{HaaresModel, LoadOptions};

use crate::backend::{BackendJob, BackendKind};
use crate::config::RunConfig;
use crate::data::{self, DataPaths, Tokenizer};
use crate::error::{Result, TrainError};
use crate::run::loss::{validation_loss, validation_pass};

/// A model file and the run it belongs to: a `.safetensors` file inside a run directory (its
/// `config.json` and `tokenizer.json` are beside it or one level up), or the run directory itself
/// (then its best model, else its last checkpoint).
pub struct ModelSource {
    /// The `.safetensors` file.
    pub model: PathBuf,
    /// The run directory.
    pub run_dir: PathBuf,
    /// How the model file is read.
    pub options: LoadOptions,
}

impl ModelSource {
    /// Resolves `path` as described on [`ModelSource`].
    pub fn resolve(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let candidates = [
                path.join("best-model.safetensors"),
                path.join("checkpoint/model.safetensors"),
            ];
            let model = candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "`{}` holds no best-model.safetensors or checkpoint/model.safetensors; is it a run directory?",
                    path.display()
                ))
            })?;
            return Ok(Self {
                model,
                run_dir: path.to_path_buf(),
                options: LoadOptions::default(),
            });
        }
        if !path.is_file() {
            return Err(TrainError::Checkpoint(format!(
                "`{}` does not exist",
                path.display()
            )));
        }
        let run_dir = path
            .ancestors()
            .skip(1)
            .take(2)
            .find(|dir| dir.join("config.json").is_file())
            .ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "no config.json beside `{}` or one directory up; pass a file inside a run directory",
                    path.display()
                ))
            })?
            .to_path_buf();
        Ok(Self {
            model: path.to_path_buf(),
            run_dir,
            options: LoadOptions::default(),
        })
    }

    /// The same source, read with `options`.
    pub fn with_options(self, options: LoadOptions) -> Self {
        Self { options, ..self }
    }

    /// The run's config.
    pub fn run_config(&self) -> Result<RunConfig> {
        let path = self.run_dir.join("config.json");
        crate::run::learner::saved_run_config(&path)?
            .ok_or_else(|| TrainError::Checkpoint(format!("`{}` does not exist", path.display())))
    }

    /// The run's tokeniser.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::load(
            self.run_config()?.tokenizer,
            &self.run_dir.join("tokenizer.json"),
        )
    }

    fn load<B: Backend>(&self, device: &B::Device) -> Result<HaaresModel<B>> {
        Ok(HaaresModel::<B>::load_safetensors_with(
            &self.model,
            device,
            self.options,
        )?)
    }
}

/// `eval`: the validation loss of a model on a dataset's validation split.
pub struct EvalJob {
    /// The model.
    pub source: ModelSource,
    /// Dataset to evaluate on (the run's own when `None`).
    pub dataset: Option<String>,
    /// Chunks to evaluate (all when `None`).
    pub chunks: Option<usize>,
    /// Data locations.
    pub paths: DataPaths,
}

impl BackendJob for EvalJob {
    type Output = (f64, usize);

    fn run<B: TrainingBackend>(self, device: B::Device, _: BackendKind) -> Result<(f64, usize)> {
        let mut config = self.source.run_config()?;
        if let Some(dataset) = self.dataset {
            config.dataset = dataset;
        }
        let data = data::prepare(&config, &self.paths, true)?;
        let saved = self.source.tokenizer()?;
        if saved.vocab_size() != data.tokenizer.vocab_size() {
            return Err(TrainError::Config(format!(
                "the model's tokeniser has {} ids but dataset `{}` prepares {}; evaluate on the run's own dataset",
                saved.vocab_size(),
                config.dataset,
                data.tokenizer.vocab_size()
            )));
        }
        let model = self.source.load::<B::InnerBackend>(&device)?;
        let chunks = self.chunks.unwrap_or(usize::MAX).min(data.validation.len());
        let batches = validation_pass(&data.validation, config.batch_size, Some(chunks));
        Ok((
            validation_loss(&model, batches, config.seq_len, &device),
            chunks,
        ))
    }
}

/// Ids 0–3 hold the specials in both tokenisers.
const SPECIAL_IDS: usize = 4;

/// `sample`: text generated from a prompt.
pub struct SampleJob {
    /// The model.
    pub source: ModelSource,
    /// The prompt.
    pub prompt: String,
    /// New tokens to generate.
    pub tokens: usize,
    /// Softmax temperature (0 = greedy).
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Sampling seed.
    pub seed: u64,
}

impl BackendJob for SampleJob {
    type Output = String;

    fn run<B: TrainingBackend>(self, device: B::Device, _: BackendKind) -> Result<String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(TrainError::Config(format!(
                "--temperature must be ≥ 0, got {}",
                self.temperature
            )));
        }
        let tokenizer = self.source.tokenizer()?;
        let model = self.source.load::<B::InnerBackend>(&device)?;
        let mut ids = tokenizer.encode(&self.prompt)?;
        if ids.is_empty() {
            return Err(TrainError::Config(
                "the prompt is empty; give a few characters with --prompt".into(),
            ));
        }
        let context = model.config.max_seq_len.min(512);
        let mut rng = SplitMix64::new(self.seed);
        let start = ids.len();
        for _ in 0..self.tokens {
            let window = &ids[ids.len().saturating_sub(context)..];
            let input: Vec<i64> = window.iter().map(|&t| t as i64).collect();
            let tokens = Tensor::<B::InnerBackend, 2, Int>::from_data(
                TensorData::new(input, [1, window.len()]),
                &device,
            );
            let logits = model.forward(tokens)?;
            let [_, seq, vocab] = logits.dims();
            let mut last: Vec<f32> = logits
                .slice([0..1, seq - 1..seq, 0..vocab])
                .into_data()
                .convert::<f32>()
                .to_vec()
                .expect("f32 logits");
            // Both tokenisers keep their four specials (pad, unk, begin, end) at ids 0–3; the
            // model is never trained to predict them, so they are never sampled.
            for special in last.iter_mut().take(SPECIAL_IDS) {
                *special = f32::NEG_INFINITY;
            }
            ids.push(choose(&last, self.temperature, self.top_k, &mut rng) as u32);
        }
        tokenizer.decode(&ids[start..])
    }
}

/// Picks a token from `logits`: greedy at temperature 0, else softmax(logits / T) over the top k.
pub fn choose(logits: &[f32], temperature: f64, top_k: usize, rng: &mut SplitMix64) -> usize {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if temperature == 0.0 {
        return order[0];
    }
    let keep = if top_k == 0 {
        order.len()
    } else {
        top_k.min(order.len())
    };
    let max = logits[order[0]] as f64;
    let weights: Vec<f64> = order[..keep]
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / temperature).exp())
        .collect();
    let mut target = rng.next_f64() * weights.iter().sum::<f64>();
    for (k, w) in weights.iter().enumerate() {
        if target < *w {
            return order[k];
        }
        target -= w;
    }
    order[keep - 1]
}
