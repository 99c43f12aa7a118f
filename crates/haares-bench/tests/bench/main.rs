//! haares-bench's test suite, one binary (one link) for all of it: the analytic commands, the
//! cost protocol, its PyTorch peer and `versus` through the real binary, the counting allocator's
//! measurements, and (on wgpu) the kernel-launch accounting. The GPU check's tests are in
//! `crates/haares-gpu-check`.
//!
//! The counting allocator is this binary's global allocator: `heap` and `model_file_memory`
//! measure with it. Its counters are process-wide, which is safe because test binaries run their
//! tests one at a time (`RUST_TEST_THREADS=1` in `.cargo/config.toml`).

use haares_bench::measure::heap::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

mod analytic;
mod anatomy;
mod common;
mod cost;
mod feature_flags;
mod flops;
mod heap;
mod model_file_memory;
mod peer;
mod versus;
#[cfg(feature = "wgpu")]
mod wgpu_launches;
