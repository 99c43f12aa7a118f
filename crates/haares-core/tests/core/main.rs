//! haares-core's test suite, one binary (one link) for all of it. NdArray, f64 where exactness
//! matters, tiny shapes.

mod common;
mod reference;
mod accumulator;
mod rms_match;
mod analysis;
mod routing;
mod causality;
mod checkpoint;
mod errors;
