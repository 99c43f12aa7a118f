//! Bad configurations and inputs give clear errors, never panics.

use haares_core::{HaaresError, ModelConfig, ResidualMethod};

use crate::common::*;

fn config_error(config: ModelConfig) -> (String, String) {
    match config.init::<B64>(&Default::default()) {
        Ok(_) => panic!("expected an invalid configuration"),
        Err(HaaresError::InvalidConfig { field, message }) => (field.to_string(), message),
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[test]
fn blocks_must_divide_the_event_count() {
    for method in [ResidualMethod::BlockAttnRes, ResidualMethod::haares()] {
        let (field, message) = config_error(tiny_config(method, 3, 4));
        assert_eq!(field, "blocks");
        assert!(
            message.contains("N = 4 does not divide the 2L = 6"),
            "{message}"
        );
        assert!(
            message.contains("[1, 2, 3, 6]"),
            "the message lists the valid counts: {message}"
        );
    }
    // Unrouted methods ignore the block count.
    assert!(
        tiny_config(ResidualMethod::Standard, 3, 4)
            .init::<B64>(&Default::default())
            .is_ok()
    );
}

#[test]
fn width_must_split_into_even_heads() {
    let (field, message) =
        config_error(tiny_config(ResidualMethod::haares(), 2, 2).with_n_heads(3));
    assert_eq!(field, "n_heads");
    assert!(message.contains("d_model = 16 is not divisible by n_heads = 3"));
    let (field, _) = config_error(ModelConfig::new(10, 6, 8, 2).with_n_heads(2).with_blocks(2));
    assert_eq!(field, "d_model", "head width 3 is odd");
    let (field, _) = config_error(tiny_config(ResidualMethod::haares(), 0, 1));
    assert_eq!(field, "n_layers");
}

#[test]
fn out_of_range_tokens_are_refused() {
    let config = tiny_config(ResidualMethod::haares(), 2, 2);
    let model = model_from(&config, &random_params(&config, 71));
    let device = Default::default();
    let message =
        |tokens: Vec<Vec<usize>>| match model.forward(token_tensor::<B64>(&tokens, &device)) {
            Ok(_) => panic!("expected an error"),
            Err(error) => error.to_string(),
        };
    assert!(
        message(vec![vec![1, 23, 2]])
            .contains("token ids span [1, 23] but the vocabulary has 23 entries")
    );
    assert!(message(vec![vec![0; 17]]).contains("sequence length 17 exceeds the RoPE cache of 16"));
    let negative = burn::tensor::Tensor::<B64, 2, burn::tensor::Int>::from_ints([[3, -1]], &device);
    assert!(model.forward(negative).is_err());
}
