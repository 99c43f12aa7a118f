//! Checkpoints of f32 models. In the portability binary, not the core suite's: NdArray<f32> and
//! NdArray<f64> share one CPU device whose default float type is process-wide, so f32 and f64
//! tests must not run in one process.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor};
use haares_core::{HaaresModel, ModelConfig, ResidualMethod};

#[test]
fn f32_models_round_trip_as_f32() {
    type B32 = NdArray<f32>;
    let config = ModelConfig::new(23, 16, 24, 2)
        .with_n_heads(2)
        .with_blocks(2)
        .with_method(ResidualMethod::haares());
    let model = config.init::<B32>(&Default::default()).unwrap();
    let bytes = model.to_safetensors_bytes().unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        file.tensor("embed.weight").unwrap().dtype(),
        safetensors::Dtype::F32
    );
    let loaded = HaaresModel::<B32>::from_safetensors_bytes(&bytes, &Default::default()).unwrap();
    let tokens = Tensor::<B32, 2, Int>::from_ints([[1, 2, 3]], &Default::default());
    let (a, b) = (
        model.forward(tokens.clone()).unwrap().into_data(),
        loaded.forward(tokens).unwrap().into_data(),
    );
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
}
