//! Causality for every method (docs/decisions.md, decision 1): changing tokens after position t
//! leaves every logit at positions ≤ t unchanged — exactly, in f64 on NdArray.

use crate::common::*;

#[test]
fn future_tokens_never_change_past_logits() {
    check_causality::<B64>(&Default::default(), 1e-12);
}
