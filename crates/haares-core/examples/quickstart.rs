//! The README's library example: build a small-family HAARES model, run a forward pass, read the
//! routing weights and save a checkpoint.
//!
//! `cargo run -p haares-core --example quickstart`

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor};
use haares_core::{HaaresOptions, ModelFamily, ResidualMethod};

fn main() -> Result<(), haares_core::HaaresError> {
    let device = Default::default();
    // The paper's small family at 12 layers, character vocabulary, full HAARES with N = 4 blocks.
    let config = ModelFamily::Small.config(12, 256, ResidualMethod::haares());
    let model = config.init::<NdArray>(&device)?;
    let tokens = Tensor::<NdArray, 2, Int>::from_ints([[2, 72, 105]], &device);
    let (logits, trace) = model.forward_with_trace(tokens)?; // logits [1, 3, 256]
    let p_detail = trace.sites[1].detail_share(); // eq:groupmixture
    println!(
        "logits {:?}; p_D at the first active read: {}",
        logits.dims(),
        p_detail.mean().into_scalar()
    );
    let path = std::env::temp_dir().join("haares-quickstart.safetensors");
    model.save_safetensors(&path)?; // PyTorch names and layouts
    println!("saved {}", path.display());

    // Ablations are options:
    let no_match = ResidualMethod::Haares(HaaresOptions::without_rms_match());
    println!("ablation: {}", no_match.name());
    Ok(())
}
