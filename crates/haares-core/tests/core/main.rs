//! haares-core's test suite, one binary (one link) for all of it. NdArray, f64 where exactness
//! matters, tiny shapes.

mod accumulator;
mod analysis;
mod attention;
mod attention_checks;
mod blas_call;
mod blas_interpreter;
mod causality;
mod checkpoint;
mod common;
mod cross_entropy;
mod cross_entropy_checks;
mod errors;
#[path = "../../examples/foreign_decoder/model.rs"]
mod foreign_model;
mod fused;
mod graph_gate;
mod library_guide;
mod materialise;
mod matmul;
#[allow(dead_code)] // its stage-depth checks are the cube backends' (`portability.rs`)
mod matmul_checks;
mod method_names;
mod model_file;
mod norm;
mod norm_checks;
mod op_times;
mod projections;
mod projections_checks;
mod read;
mod readme;
mod reference;
mod reference_tests;
mod rms_match;
mod rotary;
mod rotary_checks;
mod routing;
mod routing_stats;
mod slot_sums;
mod softmax;
mod softmax_checks;
mod source_write;
mod stream;
mod stream_checks;
mod stream_errors;
mod swiglu;
mod swiglu_checks;
