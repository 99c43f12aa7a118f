//! haares-core's test suite, one binary (one link) for all of it. NdArray, f64 where exactness
//! matters, tiny shapes.

mod accumulator;
mod activation_checks;
mod activations;
mod analysis;
mod attention_checks;
mod causality;
mod checkpoint;
mod common;
mod cross_entropy_checks;
mod errors;
mod fused;
mod graph_gate;
mod heads;
mod matmul;
mod method_names;
mod model_file;
mod packed_checks;
mod primitives;
mod read;
mod readme;
mod reference;
mod reference_tests;
mod rms_match;
mod rotary_checks;
mod routing;
mod routing_stats;
mod signed_sum;
