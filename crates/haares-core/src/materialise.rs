//! Materialising a module's lazily initialised parameters.
//!
//! Burn 0.21 initialises a parameter lazily: `LinearConfig::init` records how to draw the weight,
//! and the draw happens on the first read. A clone taken before that read carries the recipe, not
//! the values, so the clone and the original draw *independently* (docs/deviations.md, "Lazy
//! parameters and clones"). A model cloned for a reference check, for an optimiser step on a copy,
//! or for evaluation then silently holds different weights.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

/// Reads every float parameter of `module` once, so that its lazy initialiser runs in place and
/// every later clone shares the drawn values.
///
/// [`ModelConfig::init`](crate::ModelConfig::init) calls it before returning;
/// [`ResidualStreamConfig::init`](crate::ResidualStreamConfig::init) needs it not, since the
/// stream draws nothing at random. Call it on your own module, the one that holds a
/// [`ResidualStream`](crate::ResidualStream) beside Burn's lazily initialised sublayers, before
/// cloning it. It costs one draw per parameter, which the first forward pass would make anyway.
pub fn materialise<B: Backend, M: Module<B>>(module: &M) {
    module.visit(&mut ReadEveryFloat);
}

/// Touches every float parameter so that its lazy initialiser runs.
struct ReadEveryFloat;

impl<B: Backend> ModuleVisitor<B> for ReadEveryFloat {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        param.val();
    }
}
