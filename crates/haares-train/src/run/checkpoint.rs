//! A run's checkpoint: model (the core crate's safetensors), optimizer moments, and the loop state
//! (step, data position, validation curve, seeds, config), written as one directory that replaces
//! the previous one only once complete.

use haares_core::TrainingBackend;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use haares_core::HaaresModel;
use haares_core::checkpoint::{deserialize_named_tensors, serialize_named_tensors};
use haares_data::batching::BatchPosition;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::error::{Result, TrainError, write_atomically};
use crate::run::optim::AdamW;

/// The loop state saved with every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Steps completed.
    pub step: usize,
    /// Updates the optimizer has applied (its bias-correction time).
    pub optimizer_steps: u64,
    /// Where the training batches stand (data-order seed, epoch, offset).
    pub data_position: BatchPosition,
    /// `(step, validation loss)` of every pass so far.
    pub val_curve: Vec<(usize, f64)>,
    /// Training seconds so far (validation and checkpointing excluded).
    pub train_seconds: f64,
    /// The run's config; a resume with another config is refused.
    pub config: RunConfig,
}

impl LoopState {
    /// The best validation pass so far, `(step, loss)` (eq:endpoint: the minimum over the grid).
    pub fn best(&self) -> Option<(usize, f64)> {
        best_of(&self.val_curve)
    }
}

/// The minimum of a validation curve; the earliest step wins a tie.
pub fn best_of(curve: &[(usize, f64)]) -> Option<(usize, f64)> {
    curve
        .iter()
        .copied()
        .fold(None, |best, (step, loss)| match best {
            Some((_, b)) if b <= loss => best,
            _ => Some((step, loss)),
        })
}

const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const STATE: &str = "state.json";

/// The checkpoint directory of a run.
pub fn checkpoint_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoint")
}

fn previous_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoint.previous")
}

/// Writes a checkpoint: a fresh temporary directory is filled and synced, then renamed into place;
/// the old checkpoint is kept as `checkpoint.previous` until the new one is in place.
pub fn save<B: TrainingBackend>(
    run_dir: &Path,
    model: &HaaresModel<B>,
    optimizer: &AdamW<B::InnerBackend>,
    state: &LoopState,
) -> Result<()> {
    let temporary = run_dir.join(format!("checkpoint.tmp-{}", std::process::id()));
    if temporary.exists() {
        std::fs::remove_dir_all(&temporary).map_err(|e| TrainError::io(&temporary, e))?;
    }
    std::fs::create_dir_all(&temporary).map_err(|e| TrainError::io(&temporary, e))?;
    model.save_safetensors(temporary.join(MODEL))?;
    let moments = serialize_named_tensors(optimizer.to_named_tensors(), HashMap::new())?;
    write_atomically(&temporary.join(OPTIMIZER), &moments)?;
    let json = serde_json::to_vec_pretty(state).expect("loop state serialises");
    write_atomically(&temporary.join(STATE), &json)?;

    let (current, previous) = (checkpoint_dir(run_dir), previous_dir(run_dir));
    if previous.exists() {
        std::fs::remove_dir_all(&previous).map_err(|e| TrainError::io(&previous, e))?;
    }
    if current.exists() {
        std::fs::rename(&current, &previous).map_err(|e| TrainError::io(&current, e))?;
    }
    std::fs::rename(&temporary, &current).map_err(|e| TrainError::io(&current, e))?;
    if previous.exists() {
        std::fs::remove_dir_all(&previous).map_err(|e| TrainError::io(&previous, e))?;
    }
    Ok(())
}

/// A loaded checkpoint.
pub struct Loaded<B: TrainingBackend> {
    /// The model.
    pub model: HaaresModel<B>,
    /// The optimizer.
    pub optimizer: AdamW<B::InnerBackend>,
    /// The loop state.
    pub state: LoopState,
}

/// The directory of the last complete checkpoint of a run, if any (a crash between the two
/// renames of [`save`] leaves only `checkpoint.previous`).
pub fn latest(run_dir: &Path) -> Option<PathBuf> {
    [checkpoint_dir(run_dir), previous_dir(run_dir)]
        .into_iter()
        .find(|dir| dir.join(STATE).is_file())
}

/// Loads the checkpoint in `dir`, checking that it belongs to a run of `config`.
pub fn load<B: TrainingBackend>(
    dir: &Path,
    config: &RunConfig,
    device: &B::Device,
) -> Result<Loaded<B>> {
    let corrupt = |what: &str, e: &dyn std::fmt::Display| {
        TrainError::Checkpoint(format!(
            "`{}` {what}: {e}; delete the run directory to start the run afresh",
            dir.display()
        ))
    };
    let state_path = dir.join(STATE);
    let text = std::fs::read(&state_path).map_err(|e| TrainError::io(&state_path, e))?;
    let state: LoopState =
        serde_json::from_slice(&text).map_err(|e| corrupt("has an unreadable state.json", &e))?;
    if &state.config != config {
        return Err(TrainError::Checkpoint(format!(
            "`{}` was written by a run with another configuration ({}); resume with the same \
             settings, or choose another --runs-dir",
            dir.display(),
            config_difference(&state.config, config)
        )));
    }
    let model = HaaresModel::<B>::load_safetensors(dir.join(MODEL), device)
        .map_err(|e| corrupt("holds an unreadable model", &e))?;
    let optimizer_path = dir.join(OPTIMIZER);
    let bytes = std::fs::read(&optimizer_path).map_err(|e| TrainError::io(&optimizer_path, e))?;
    let (tensors, _) = deserialize_named_tensors(&bytes)
        .map_err(|e| corrupt("holds unreadable optimizer state", &e))?;
    let shapes = model.checkpoint_shapes();
    let tensors: BTreeMap<_, _> = tensors.into_iter().collect();
    for (name, data) in &tensors {
        let parameter = name.split_once('.').map(|(_, p)| p).unwrap_or(name);
        let expected: usize = shapes
            .get(parameter)
            .map(|s| s.iter().product())
            .unwrap_or(0);
        if data.num_elements() != expected {
            return Err(corrupt(
                "holds optimizer state that does not match the model",
                &format!("`{name}` has {} values", data.num_elements()),
            ));
        }
    }
    let optimizer =
        AdamW::from_named_tensors(config.optimizer, state.optimizer_steps, tensors, device)
            .map_err(|e| match e {
                TrainError::Checkpoint(why) => corrupt("holds inconsistent optimizer state", &why),
                other => other,
            })?;
    Ok(Loaded {
        model,
        optimizer,
        state,
    })
}

/// The fields that differ between two configs, as `field: a ≠ b`.
pub fn config_difference(a: &RunConfig, b: &RunConfig) -> String {
    let (a, b) = (
        serde_json::to_value(a).expect("config serialises"),
        serde_json::to_value(b).expect("config serialises"),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return String::new();
    };
    a.iter()
        .filter(|(key, value)| b.get(*key) != Some(value))
        .map(|(key, value)| {
            format!(
                "{key}: {value} ≠ {}",
                b.get(key).cloned().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
