//! Shared fixtures: tiny configs on the embedded corpus, and a tiny repeating corpus to overfit.

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use haares_data::char_tokenizer::CharCounter;
use haares_data::chunking::{CHUNK_LEN, Chunk};
use haares_data::prepared::PreparedWriter;
use haares_train::RunConfig;
use haares_train::data::{self, DataPaths, RunData, Tokenizer};
use haares_train::run::learner::{Outcome, TrainOptions, train};
use haares_train::run::summary::RunSummary;

pub type B = Autodiff<NdArray>;

/// `train`'s flags for a small model on the depth study's cpu preset, for tests of the binary.
pub const SMALL_RUN: &[&str] = &[
    "--study",
    "depth",
    "--layers",
    "2",
    "--methods",
    "haares",
    "--set",
    "d_model=32",
    "--set",
    "d_ff=64",
    "--set",
    "val_chunks=2",
    "--set",
    "eval_every=2",
    "--set",
    "checkpoint_every=2",
    "--set",
    "log_every=2",
    "--backend",
    "ndarray",
];

/// A tiny model trained a few steps on the embedded corpus.
pub fn tiny_config(method: &str) -> RunConfig {
    RunConfig {
        dataset: "sotu".into(),
        method: method.into(),
        layers: 2,
        blocks: 2,
        d_model: 16,
        d_ff: 32,
        heads: 2,
        seq_len: 16,
        batch_size: 2,
        steps: 4,
        eval_every: 2,
        checkpoint_every: 2,
        log_every: 1,
        val_chunks: Some(4),
        ..RunConfig::default()
    }
}

/// Data paths inside `dir`, never downloading.
pub fn paths(dir: &Path) -> DataPaths {
    DataPaths {
        data_dir: dir.join("data"),
        cache_dir: dir.join("cache"),
        download: false,
    }
}

/// The embedded corpus prepared into `dir`.
pub fn sotu(dir: &Path) -> RunData {
    data::prepare(&tiny_config("haares"), &paths(dir), false).expect("the embedded corpus prepares")
}

/// Two fixed chunks as both splits: every batch is the same data, so a model can overfit it.
pub fn repeating(dir: &Path) -> RunData {
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(20);
    let mut counter = CharCounter::default();
    counter.add(&text);
    let tokenizer = counter.build(256).expect("vocabulary");
    let ids = tokenizer.encode(&text);
    let shard = |name: &str| {
        let mut writer = PreparedWriter::create(&dir.join(name), tokenizer.vocab_size(), CHUNK_LEN)
            .expect("writer");
        for start in [0, 7] {
            let tokens = ids[start..start + CHUNK_LEN].to_vec();
            writer
                .push(&Chunk {
                    len: tokens.len(),
                    tokens,
                })
                .expect("push");
        }
        writer.finish().expect("finish")
    };
    RunData {
        train: shard("train.tokens"),
        validation: shard("validation.tokens"),
        tokenizer: Tokenizer::Char(tokenizer),
    }
}

/// Trains to the end and returns the summary.
pub fn train_to_end(config: &RunConfig, data: &RunData, run_dir: &Path) -> RunSummary {
    match run(config, data, run_dir, None).expect("training succeeds") {
        Outcome::Finished(summary) => *summary,
        other => panic!("expected a finished run, got {other:?}"),
    }
}

/// One call of `train` on NdArray.
pub fn run(
    config: &RunConfig,
    data: &RunData,
    run_dir: &Path,
    stop_after: Option<usize>,
) -> haares_train::Result<Outcome> {
    let options = TrainOptions {
        stop_after,
        ..TrainOptions::default()
    };
    train::<B>(
        config,
        data,
        run_dir,
        "ndarray",
        &Default::default(),
        &options,
    )
}

/// Runs the `haares-train` binary: whether it succeeded, and its standard error.
pub fn cli(args: &[&str]) -> (bool, String) {
    cli_with(args, &[])
}

/// [`cli`] with environment variables set.
pub fn cli_with(args: &[&str], environment: &[(&str, &str)]) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_haares-train"))
        .args(args)
        .envs(environment.iter().copied())
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Writes the summary of a finished run of `run` under `dir`, as a report reads it: its validation
/// `curve` (best loss and step its minimum), the paper's throughputs (HAARES 14K, others 17K
/// tokens/s, tab:cost at d = 512) and `devices`.
pub fn write_finished_summary(
    run: &haares_train::study::PlannedRun,
    dir: &Path,
    curve: Vec<(usize, f64)>,
    devices: Vec<String>,
) {
    let (best_step, best) = curve
        .iter()
        .copied()
        .fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    let tokens_per_s = if run.config.method == "haares" {
        14_000.0
    } else {
        17_000.0
    };
    let steps = run.config.steps;
    let summary = RunSummary {
        config: run.config.clone(),
        vocab_size: 256,
        parameters: 0,
        steps,
        best_val_loss: best,
        best_step,
        val_curve: curve,
        tokens_per_s,
        train_seconds: steps as f64 * 8192.0 / tokens_per_s,
        backend: "fixture".into(),
        devices,
        products: "fixture products".into(),
    };
    let run_dir = dir.join(&run.name);
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(
        haares_train::run::summary::summary_path(&run_dir),
        serde_json::to_vec(&summary).unwrap(),
    )
    .unwrap();
}

/// This crate's directory in the checkout under test: cargo's `CARGO_MANIFEST_DIR` when it runs the
/// test, else the one compiled in. A test binary is reused from a shared target directory by
/// another checkout of the same sources, and the compiled-in path would then read the first
/// checkout's files.
#[allow(dead_code)] // not every test file reads the checkout
pub fn crate_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
