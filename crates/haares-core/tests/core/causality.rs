//! Causality for every method (NOTES decision 1): changing tokens after position t leaves every
//! logit at positions ≤ t unchanged.

use crate::common::*;

#[test]
fn future_tokens_never_change_past_logits() {
    let (seq, t) = (8, 3);
    let mut rng = Rng::new(51);
    for method in all_methods() {
        let config = tiny_config(method, 4, 4);
        let model = model_from(&config, &random_params(&config, rng.next_u64()));
        let original = random_tokens(&mut rng, 2, seq, config.vocab_size);
        let mut changed = original.clone();
        for row in changed.iter_mut() {
            for token in row[t + 1..].iter_mut() {
                *token = (*token + 1 + rng.below(config.vocab_size - 1)) % config.vocab_size;
            }
        }
        let (a, b) = (logits(&model, &original), logits(&model, &changed));
        let vocab = config.vocab_size;
        for row in 0..2 {
            let past = |x: &[f64]| x[row * seq * vocab..(row * seq + t + 1) * vocab].to_vec();
            let future =
                |x: &[f64]| x[(row * seq + t + 1) * vocab..(row + 1) * seq * vocab].to_vec();
            assert!(
                max_abs_diff(&past(&a), &past(&b)) < 1e-12,
                "{}: past logits moved",
                method.name()
            );
            assert!(
                max_abs_diff(&future(&a), &future(&b)) > 1e-6,
                "{}: the change must be visible later",
                method.name()
            );
        }
    }
}
