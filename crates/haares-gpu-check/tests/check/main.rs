//! haares-gpu-check's test suite, one binary: the stage runner at the tiny profile on NdArray
//! (`stages`), the portability stage against a stand-in harness (`portability`), and the
//! GPU-side scripts on a bundle laid out as `scripts/gpu/build.sh` lays it out (`scripts`).

mod common;
mod portability;
mod scripts;
mod stages;
