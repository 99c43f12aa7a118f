//! haares-bench's test suite, one binary (one link) for all of it: the analytic commands, the
//! cost protocol, its PyTorch peer and `versus` through the real binary, the GPU check's stages and scripts
//! at the tiny profile, the counting allocator's measurements, and (on wgpu) the kernel-launch
//! accounting.
//!
//! The counting allocator is this binary's global allocator: `heap` and `model_file_memory`
//! measure with it. Its counters are process-wide, which is safe because test binaries run their
//! tests one at a time (`RUST_TEST_THREADS=1` in `.cargo/config.toml`).

use haares_bench::heap::CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

mod analytic;
mod anatomy;
mod common;
mod cost;
mod feature_flags;
mod flops;
mod gpu_check;
mod gpu_portability;
mod gpu_scripts;
mod heap;
mod model_file_memory;
mod peer;
mod versus;
#[cfg(feature = "wgpu")]
mod wgpu_launches;
