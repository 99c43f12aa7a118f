//! A model file whose config lies costs no memory beyond the file's own tensors: the config is
//! checked against the file's header before a model is allocated (haares-core's
//! `checkpoint::layout`). Measured with the counting allocator, as `heap.rs` measures.

use std::collections::HashMap;

use burn::backend::NdArray;
use haares_bench::measure::heap::{
    allocated_bytes, peak_allocated_bytes, reset_peak_allocated_bytes,
};
use haares_core::checkpoint::{
    CONFIG_METADATA_KEY, deserialize_named_tensors, serialize_named_tensors,
};
use haares_core::{HaaresModel, ModelConfig, ResidualMethod, limits};

type B = NdArray;

/// Bytes allowed beyond the file's tensors: the header's parse, the messages, and the list of
/// names and shapes the config implies, whose length the bound on layers caps (about 1.5 MB at
/// `limits::MAX_LAYERS`).
const SMALL_CONSTANT: u64 = 4 << 20;

/// The most heap bytes in use above the level before, while loading `bytes`, and its error.
fn load_peak(bytes: &[u8]) -> (u64, Option<String>) {
    let before = allocated_bytes().expect("the counting allocator is installed");
    reset_peak_allocated_bytes();
    let result = HaaresModel::<B>::from_safetensors_bytes(bytes, &Default::default());
    let peak = peak_allocated_bytes().unwrap() - before;
    (peak, result.err().map(|e| e.to_string()))
}

/// A config's lie, in words, and the edit that tells it.
type Lie = (&'static str, fn(&mut ModelConfig));

/// One test, because the counters are process-wide and parallel tests would disturb them.
#[test]
fn a_lying_config_costs_no_more_than_the_files_tensors() {
    let config = ModelConfig::new(256, 64, 128, 2)
        .with_n_heads(4)
        .with_max_seq_len(64)
        .with_method(ResidualMethod::haares());
    let model = config.init::<B>(&Default::default()).unwrap();
    let honest = model.to_safetensors_bytes().unwrap();
    let (tensors, _) = deserialize_named_tensors(&honest).unwrap();
    let tensor_bytes: u64 = tensors.values().map(|t| t.as_bytes().len() as u64).sum();
    drop(model);

    let (peak, error) = load_peak(&honest);
    assert_eq!(error, None, "the honest file loads");
    assert!(
        peak >= tensor_bytes,
        "loading the honest file was counted: {peak} bytes for {tensor_bytes} of tensors"
    );

    let lies: [Lie; 7] = [
        ("a vocabulary of 2^30", |c| c.vocab_size = 1 << 30),
        ("a vocabulary at the bound", |c| {
            c.vocab_size = limits::MAX_VOCAB
        }),
        ("100,000 layers", |c| c.n_layers = 100_000),
        ("layers at the bound", |c| c.n_layers = limits::MAX_LAYERS),
        ("a width of 65,536", |c| c.d_model = 1 << 16),
        ("a width of 8,192", |c| c.d_model = 8192),
        ("a million layers at width 2^20", |c| {
            c.n_layers = 1 << 20;
            c.d_model = 1 << 20;
        }),
    ];
    for (lie, edit) in lies {
        let mut lying = config.clone();
        edit(&mut lying);
        let metadata = HashMap::from([(
            CONFIG_METADATA_KEY.to_string(),
            serde_json::to_string(&lying).unwrap(),
        )]);
        let bytes =
            serialize_named_tensors(tensors.clone().into_iter().collect(), metadata).unwrap();
        let (peak, error) = load_peak(&bytes);
        let error = error.unwrap_or_else(|| panic!("{lie}: the file loaded"));
        assert!(
            peak <= tensor_bytes + SMALL_CONSTANT,
            "{lie}: {peak} bytes at the peak, for a file of {tensor_bytes} bytes of tensors ({error})"
        );
    }
}
