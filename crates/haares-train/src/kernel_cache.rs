//! CubeCL's compiled-kernel and autotune caches, in one place per machine.
//!
//! CubeCL (the engine under Burn's CUDA and wgpu backends) compiles every kernel the first time a
//! process launches it and autotunes the matrix products and reductions once per shape key. By
//! default it keeps no compiled kernels between processes and puts its autotune results under the
//! `target/` of whichever Cargo project the process starts in. A sweep or a cost run starts many
//! processes, so every one of them paid the whole first-step cost again.
//!
//! Every process of this workspace that uses a cube backend calls `configure_cube_runtime` (a
//! function of the `cuda` and `wgpu` builds) before its first kernel: both caches then live in [`kernel_cache_dir`], shared by every run,
//! sweep and cost worker on the machine, so a kernel is compiled and tuned once per machine.
//! CUDA caches compiled PTX there; wgpu's WGSL pipelines are not cached by CubeCL 0.10 (only its
//! SPIR-V compiler has a cache), so on wgpu only the autotune results are shared. The caches are
//! keyed by CubeCL version and device, so one directory serves several GPUs and versions.
//!
//! Everything else in a `cubecl.toml` (log sinks, autotune level, …) and CubeCL's environment
//! variables (`CUBECL_AUTOTUNE_LEVEL`, `CUBECL_DEBUG_LOG`) still applies; only the two cache
//! locations are replaced.

use std::path::PathBuf;

/// Environment variable naming the kernel cache directory.
pub const KERNEL_CACHE_ENV: &str = "HAARES_KERNEL_CACHE";

/// Where CubeCL's caches live: `$HAARES_KERNEL_CACHE` if set, else
/// `$XDG_CACHE_HOME/haares/kernels`, else `$HOME/.cache/haares/kernels`, else a folder in the
/// system's temporary directory.
pub fn kernel_cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(dir) = var(KERNEL_CACHE_ENV) {
        return PathBuf::from(dir);
    }
    let cache_home = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|home| PathBuf::from(home).join(".cache")));
    match cache_home {
        Some(dir) => dir.join("haares").join("kernels"),
        None => std::env::temp_dir().join("haares-kernels"),
    }
}

/// What CubeCL reports about its kernels, besides caching them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelEvents {
    /// Nothing beyond the user's own `cubecl.toml`.
    Quiet,
    /// Every compilation (`[Compiling kernel] <name>`) and every autotune result (`Fastest result
    /// …`) also goes to the `log` crate at info level, where a logger can count them (the cost
    /// worker's first-step anatomy does).
    ToLogCrate,
    /// [`Self::ToLogCrate`], and every kernel launched (`Executing <name>`, CubeCL's profiling
    /// log at its minimal level, which times nothing). Each launch then formats its kernel's name
    /// and sends it to CubeCL's logging thread, a cost of its own on the host: for counting
    /// launches, not for timing steps.
    ToLogCrateWithLaunches,
    /// [`Self::ToLogCrate`], and every kernel launched with its device time (`| <duration> |
    /// <name>`, CubeCL's profiling log at its basic level). Each launch then runs alone, waited
    /// for and timed on the device: for where a step's device time goes, not for its wall time.
    ToLogCrateWithTimes,
}

#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
mod cube {
    use super::{KernelEvents, kernel_cache_dir};
    use crate::error::{Result, TrainError};
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use serde_json::{Value, json};
    use std::path::PathBuf;
    use std::sync::OnceLock;

    static CONFIGURED: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

    /// Points CubeCL's caches at [`kernel_cache_dir`] (and, unless [`KernelEvents::Quiet`], its
    /// compilation and autotune messages, and perhaps its launches, at the `log` crate). Only the first call in a process
    /// takes effect, and it must come before the first kernel: CubeCL reads its configuration
    /// once. Returns the cache directory.
    pub fn configure_cube_runtime(events: KernelEvents) -> Result<PathBuf> {
        CONFIGURED
            .get_or_init(|| apply(events))
            .clone()
            .map_err(TrainError::Config)
    }

    fn apply(events: KernelEvents) -> std::result::Result<PathBuf, String> {
        let dir = kernel_cache_dir();
        std::fs::create_dir_all(&dir).map_err(|e| {
            format!(
                "cannot create the kernel cache `{}`: {e}; set {} to a writable directory",
                dir.display(),
                super::KERNEL_CACHE_ENV
            )
        })?;
        // The user's cubecl.toml and CUBECL_* variables, as CubeCL itself would read them.
        let config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        let mut value = serde_json::to_value(&config).map_err(|e| e.to_string())?;
        let cache = json!({ "file": dir });
        value["compilation"]["cache"] = cache.clone();
        value["autotune"]["cache"] = cache;
        if events != KernelEvents::Quiet {
            raise_level(&mut value["compilation"]["logger"], "basic");
            raise_level(&mut value["autotune"]["logger"], "minimal");
        }
        match events {
            KernelEvents::ToLogCrateWithLaunches => {
                raise_level(&mut value["profiling"]["logger"], "minimal")
            }
            KernelEvents::ToLogCrateWithTimes => {
                raise_level(&mut value["profiling"]["logger"], "basic")
            }
            KernelEvents::Quiet | KernelEvents::ToLogCrate => {}
        }
        let config: CubeClRuntimeConfig =
            serde_json::from_value(value).map_err(|e| format!("CubeCL configuration: {e}"))?;
        // `RuntimeConfig::set` panics once CubeCL has read its configuration; check first.
        let mut slot = CubeClRuntimeConfig::storage().lock();
        if slot.is_some() {
            return Err(
                "CubeCL read its configuration before haares could set the kernel \
                        cache: configure_cube_runtime must run before the first kernel"
                    .into(),
            );
        }
        *slot = Some(std::sync::Arc::new(config));
        Ok(dir)
    }

    /// Adds the `log` crate as a sink, at `level` unless the user asked for more detail.
    fn raise_level(logger: &mut Value, level: &str) {
        // CubeCL's log levels, least detail first (each logger takes some of them).
        const DETAIL: [&str; 5] = ["disabled", "minimal", "basic", "medium", "full"];
        let detail = |level: Option<&str>| {
            level.and_then(|level| DETAIL.iter().position(|known| *known == level))
        };
        logger["log"] = json!("info");
        if detail(logger["level"].as_str()).unwrap_or(0) < detail(Some(level)).unwrap_or(0) {
            logger["level"] = json!(level);
        }
    }
}

#[cfg(any(feature = "cuda-backend", feature = "wgpu-backend"))]
pub use cube::configure_cube_runtime;
