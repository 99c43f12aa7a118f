//! haares-train integration tests (NdArray f32, the reference CPU backend).

mod common;
mod cpu;
mod downloads;
mod errors;
mod inference;
mod kernel_sources;
mod learner;
mod optim;
mod paper;
mod paper_report;
mod parallel;
mod report;
mod routing;
mod sweep;
mod writers;
