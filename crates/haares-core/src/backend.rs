//! The GPU backends to write with this crate: Burn's cube backends *without* kernel fusion, which
//! carry this crate's kernels (the routing operator, attention, the norms, the loss).
//!
//! Burn's own `burn::backend::Wgpu` and `burn::backend::Cuda` are `Fusion<CubeBackend<…>>` under
//! Burn's default features, since its `fusion` feature is on by default. Those types are not these:
//! under Burn 0.21's fusion, this crate's kernels cannot run (each would have to be registered as
//! an operation of the fusion stream), and fusion together with CubeCL's autotuning gave wrong
//! logits on wgpu (docs/deviations.md, "GPU backends without Burn's kernel fusion"). So this crate
//! does not implement its bound for them outside its own test-only `fusion` feature, and the
//! guide (docs/library.md, "The backend bound") steers you here instead.
//!
//! ```ignore
//! use haares_core::backend::{Wgpu, WgpuDevice};
//! type B = burn::backend::Autodiff<Wgpu>;
//! let device = WgpuDevice::default();
//! ```

/// wgpu (Vulkan, Metal, DX12) without fusion: Burn's `CubeBackend` over CubeCL's wgpu runtime,
/// with `f32` floats, `i32` integers and `u32` booleans (Burn's defaults for wgpu).
#[cfg(feature = "wgpu")]
pub type Wgpu = burn_cubecl::CubeBackend<burn_cubecl::cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// The device type of [`Wgpu`] (`WgpuDevice::default()` picks the best adapter).
#[cfg(feature = "wgpu")]
pub use burn::backend::wgpu::WgpuDevice;

/// CUDA without fusion: Burn's `CubeBackend` over CubeCL's CUDA runtime, with `f32` floats, `i32`
/// integers and `u8` booleans (Burn's defaults for CUDA).
#[cfg(feature = "cuda")]
pub type Cuda = burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// The device type of [`Cuda`] (`CudaDevice::default()` is the first card).
#[cfg(feature = "cuda")]
pub use burn::backend::cuda::CudaDevice;
