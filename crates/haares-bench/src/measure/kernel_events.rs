//! Counts CubeCL's kernel compilations, autotune results and kernel launches as they happen.
//!
//! CubeCL logs `[Compiling kernel] <name>` once for every kernel a process compiles (a cache hit
//! logs nothing: the PTX cache on CUDA, the pipeline table within a process) and `Fastest result
//! <kernel>-<key>` once for every autotune key it benchmarks (a key found in the autotune cache
//! logs nothing). [`haares_train::kernel_cache::KernelEvents::ToLogCrate`] sends both to the `log`
//! crate; `KernelEvents::ToLogCrateWithLaunches` adds `Executing <name>` for every kernel launched
//! (CubeCL's profiling log at its minimal level), and `KernelEvents::ToLogCrateWithTimes` each
//! launch with its device time (`| <duration> | <name>`, the profiling log's basic level: every
//! launch then runs alone and is timed on the device). [`install`] puts a logger there that
//! tallies them, and [`tally`] reads the tally.
//! CubeCL delivers its messages through a channel to a logging thread, so a tally read right after
//! a device sync can trail by the messages still in flight: [`settled_tally`] waits for them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Kernels compiled and autotune keys benchmarked so far in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelTally {
    /// Kernels compiled (each distinct kernel once per process).
    pub compiled: usize,
    /// Autotune keys benchmarked.
    pub autotuned: usize,
    /// Compilations per kernel name (the name without its generic arguments).
    pub compiled_by_name: BTreeMap<String, usize>,
    /// Every autotune key benchmarked (`<fastest kernel>-<key>`).
    pub autotune_keys: Vec<String>,
    /// Kernels launched (counted only where launches are logged; an autotune run's benchmark
    /// launches count too).
    #[serde(default)]
    pub launched: usize,
    /// Launches per kernel name (the name without its generic arguments).
    #[serde(default)]
    pub launched_by_name: BTreeMap<String, usize>,
    /// Device nanoseconds of the launches logged with a time (none unless times are logged).
    #[serde(default)]
    pub device_ns: u64,
    /// Device nanoseconds per kernel name.
    #[serde(default)]
    pub device_ns_by_name: BTreeMap<String, u64>,
}

impl KernelTally {
    /// What was compiled, tuned and launched since `earlier`.
    pub fn since(&self, earlier: &KernelTally) -> KernelTally {
        KernelTally {
            compiled: self.compiled - earlier.compiled,
            autotuned: self.autotuned - earlier.autotuned,
            compiled_by_name: counts_since(&self.compiled_by_name, &earlier.compiled_by_name),
            autotune_keys: self.autotune_keys[earlier.autotune_keys.len()..].to_vec(),
            launched: self.launched - earlier.launched,
            launched_by_name: counts_since(&self.launched_by_name, &earlier.launched_by_name),
            device_ns: self.device_ns - earlier.device_ns,
            device_ns_by_name: counts_since(&self.device_ns_by_name, &earlier.device_ns_by_name),
        }
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &KernelTally) {
        self.compiled += other.compiled;
        self.autotuned += other.autotuned;
        self.launched += other.launched;
        for (name, count) in &other.compiled_by_name {
            *self.compiled_by_name.entry(name.clone()).or_default() += count;
        }
        for (name, count) in &other.launched_by_name {
            *self.launched_by_name.entry(name.clone()).or_default() += count;
        }
        self.device_ns += other.device_ns;
        for (name, nanos) in &other.device_ns_by_name {
            *self.device_ns_by_name.entry(name.clone()).or_default() += nanos;
        }
        self.autotune_keys
            .extend(other.autotune_keys.iter().cloned());
    }

    /// Counts one CubeCL message; other messages are ignored. Says whether it counted.
    pub fn record(&mut self, message: &str) -> bool {
        if let Some(rest) = message.strip_prefix("[Compiling kernel]") {
            let name = rest.trim();
            let name = if name.is_empty() { "(unnamed)" } else { name };
            self.compiled += 1;
            *self.compiled_by_name.entry(name.to_string()).or_default() += 1;
        } else if let Some(rest) = message.strip_prefix("Executing ") {
            self.launched += 1;
            *self.launched_by_name.entry(kernel_name(rest)).or_default() += 1;
        } else if let Some((nanos, rest)) = timed_launch(message) {
            let name = kernel_name(rest);
            self.launched += 1;
            *self.launched_by_name.entry(name.clone()).or_default() += 1;
            self.device_ns += nanos;
            *self.device_ns_by_name.entry(name).or_default() += nanos;
        } else if let Some(rest) = message.strip_prefix("Fastest result ") {
            self.autotuned += 1;
            let key = rest
                .split(". \n")
                .next()
                .unwrap_or(rest)
                .trim_end_matches('.');
            self.autotune_keys.push(key.to_string());
        } else {
            return false;
        }
        true
    }
}

/// The counts in `now` above those in `earlier`, by name.
fn counts_since<T>(now: &BTreeMap<String, T>, earlier: &BTreeMap<String, T>) -> BTreeMap<String, T>
where
    T: Copy + Default + PartialOrd + std::ops::Sub<Output = T>,
{
    now.iter()
        .filter_map(|(name, &count)| {
            let before = earlier.get(name).copied().unwrap_or_default();
            (count > before).then(|| (name.clone(), count - before))
        })
        .collect()
}

/// A timed launch as CubeCL 0.10's profiling log writes it from its basic level
/// (`AsyncLogger::process`: `| {duration:<10?} | {name}`): its device nanoseconds and the name.
/// The level's summary table starts `|⎺`, not `| `, and is not a launch.
fn timed_launch(message: &str) -> Option<(u64, &str)> {
    let (duration, name) = message.strip_prefix("| ")?.split_once(" | ")?;
    Some((debug_duration_ns(duration.trim())?, name))
}

/// Nanoseconds of a `Duration` as `{:?}` writes it (`1.5s`, `12.25ms`, `3.1µs`, `870ns`).
fn debug_duration_ns(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" => 1e9,
        "ms" => 1e6,
        "µs" => 1e3,
        "ns" => 1.0,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    Some((value * scale).round() as u64)
}

/// A launched kernel's name with at most its first type argument and never its runtime, so that
/// launches group by kernel: CubeCL logs `KernelBinop | MulOp | WgpuRuntime` (its balanced type
/// name format) → `KernelBinop<MulOp>`, `AdamwKernel | CudaRuntime` → `AdamwKernel`, and a
/// matrix product's dozens of type arguments → `MatmulEntry<TensorArgs>` (no `|`, which would
/// split a markdown table's cell); a Rust-style `matmul_entry<f32, …>` → `matmul_entry`.
fn kernel_name(logged: &str) -> String {
    let name = logged.trim();
    let name = name.split('<').next().unwrap_or(name);
    let parts: Vec<&str> = name
        .split(" | ")
        .map(str::trim)
        .filter(|part| !part.is_empty() && !part.ends_with("Runtime"))
        .take(2)
        .collect();
    match parts[..] {
        [] => "(unnamed)".into(),
        [name] => name.to_string(),
        [name, argument, ..] => format!("{name}<{argument}>"),
    }
}

static TALLY: Mutex<Option<KernelTally>> = Mutex::new(None);

/// The last message counted, and when: a heartbeat tells compiling from waiting by its age.
static LAST_EVENT: Mutex<Option<(String, Instant)>> = Mutex::new(None);

struct TallyLogger;

impl log::Log for TallyLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.target().starts_with("cubecl")
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let message = record.args().to_string();
            let counted = TALLY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .is_some_and(|tally| tally.record(&message));
            if counted {
                let first_line = message.lines().next().unwrap_or_default().to_string();
                *LAST_EVENT.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((first_line, Instant::now()));
            }
        }
    }

    fn flush(&self) {}
}

/// Installs the tallying logger; `false` when another logger was installed first (then nothing
/// is counted and [`tally`] returns `None`).
pub fn install() -> bool {
    static LOGGER: TallyLogger = TallyLogger;
    if log::set_logger(&LOGGER).is_err() {
        return false;
    }
    log::set_max_level(log::LevelFilter::Info);
    *TALLY.lock().unwrap_or_else(|e| e.into_inner()) = Some(KernelTally::default());
    true
}

/// The tally so far; `None` without [`install`]. While cuBLAS's products are timed (CUDA,
/// `--kernel-times`), they are in it as the kernel [`CUBLAS_GEMM`]: CubeCL's log does not see
/// them.
pub fn tally() -> Option<KernelTally> {
    let tally = TALLY.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
    #[cfg(feature = "cuda")]
    let tally = with_cublas_products(tally);
    Some(tally)
}

/// `tally` with cuBLAS's products timed so far, as the kernel [`CUBLAS_GEMM`].
#[cfg(feature = "cuda")]
fn with_cublas_products(mut tally: KernelTally) -> KernelTally {
    use haares_core::ops::matmul::cublas;
    if cublas::is_timing() {
        let blas = cublas::timed_so_far();
        let nanos = (blas.seconds * 1e9).round() as u64;
        tally.launched += blas.calls as usize;
        tally.device_ns += nanos;
        tally
            .launched_by_name
            .insert(CUBLAS_GEMM.into(), blas.calls as usize);
        tally.device_ns_by_name.insert(CUBLAS_GEMM.into(), nanos);
    }
    tally
}

/// The name cuBLAS's products take in a tally.
pub const CUBLAS_GEMM: &str = "cuBLAS gemmStridedBatchedEx";

/// The last compilation or autotune result counted (its message's first line), and how long ago.
pub fn last_event() -> Option<(String, Duration)> {
    let last = LAST_EVENT.lock().unwrap_or_else(|e| e.into_inner());
    last.as_ref()
        .map(|(message, at)| (message.clone(), at.elapsed()))
}

/// The tally once CubeCL's logging thread has caught up: read again until two reads 20 ms apart
/// agree (at most 1 s).
pub fn settled_tally() -> Option<KernelTally> {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut last = tally()?;
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = tally()?;
        if now == last || Instant::now() > deadline {
            return Some(now);
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages as CubeCL 0.10 writes them (`CompiledKernel::format_basic`,
    /// `tuner::log_result` at the minimal level); the wgpu runs in docs/notebook/first-step.md counted
    /// real ones.
    #[test]
    fn compilations_and_autotune_results_are_told_apart_and_diffed() {
        let mut tally = KernelTally::default();
        tally.record("[Compiling kernel] matmul_entry");
        let before = tally.clone();
        let mut counted = 0;
        for message in [
            "[Compiling kernel] matmul_entry",
            "[Compiling kernel] reduce_kernel",
            "[Compiling kernel]",
            "Fastest result SimpleUnit-MatmulAutotuneKey { m: 64, n: 64 }. \n Top 3 times: \
             [(0, 1ms)], context: ",
            "Using PTX cache",
            "validate checksum key=k, checksum=c",
        ] {
            counted += usize::from(tally.record(message));
        }
        assert_eq!(counted, 4, "only compilations and autotune results count");
        let since = tally.since(&before);
        assert_eq!((since.compiled, since.autotuned), (3, 1));
        assert_eq!(since.compiled_by_name["matmul_entry"], 1);
        assert_eq!(since.compiled_by_name["reduce_kernel"], 1);
        assert_eq!(since.compiled_by_name["(unnamed)"], 1);
        assert_eq!(
            since.autotune_keys,
            ["SimpleUnit-MatmulAutotuneKey { m: 64, n: 64 }"]
        );
        assert_eq!(tally.compiled_by_name["matmul_entry"], 2);
        assert_eq!(since.launched, 0, "nothing above was a launch");
    }

    /// `Executing <name>` as CubeCL 0.10's profiling log writes it at the minimal level
    /// (`AsyncLogger::process`, the kernel's name as `type_name_format` shortens it).
    #[test]
    fn launches_are_counted_by_kernel_and_diffed() {
        let mut tally = KernelTally::default();
        tally.record("Executing matmul_entry<f32, f32>");
        let before = tally.clone();
        for message in [
            "Executing matmul_entry<f32, f32>",
            "Executing elemwise_fuse",
            "Executing elemwise_fuse",
            "Executing ",
            "[Compiling kernel] elemwise_fuse",
        ] {
            assert!(tally.record(message), "{message}");
        }
        assert!(!tally.record("Executing-ish noise"), "not a launch");
        for (logged, grouped) in [
            ("Executing AdamwKernel | WgpuRuntime", "AdamwKernel"),
            (
                "Executing KernelBinop | MulOp | CudaRuntime",
                "KernelBinop<MulOp>",
            ),
            (
                "Executing MatmulEntry | TensorArgs | DynamicScalar | __Lhs | WgpuRuntime",
                "MatmulEntry<TensorArgs>",
            ),
        ] {
            let mut one = KernelTally::default();
            assert!(one.record(logged), "{logged}");
            assert_eq!(one.launched_by_name[grouped], 1, "{logged}");
        }
        let since = tally.since(&before);
        assert_eq!((since.launched, since.compiled), (4, 1));
        assert_eq!(since.launched_by_name["matmul_entry"], 1);
        assert_eq!(since.launched_by_name["elemwise_fuse"], 2);
        assert_eq!(since.launched_by_name["(unnamed)"], 1);
        assert_eq!(tally.launched_by_name["matmul_entry"], 2);
        let mut sum = before.clone();
        sum.add(&since);
        assert_eq!(
            sum, tally,
            "the earlier tally and the difference add up to the whole"
        );
    }

    /// `| {duration:<10?} | {name}` as CubeCL 0.10's profiling log writes each launch from its
    /// basic level, with durations formatted here by `Duration`'s own `Debug`.
    #[test]
    fn timed_launches_count_as_launches_with_their_device_time() {
        let line =
            |nanos: u64, name: &str| format!("| {:<10?} | {name}", Duration::from_nanos(nanos));
        let mut tally = KernelTally::default();
        assert!(tally.record(&line(1_500, "matmul_entry<f32, f32>")));
        let before = tally.clone();
        for (nanos, name) in [
            (12_345_678, "matmul_entry<f32, f32>"),
            (870, "read_forward_kernel<f32>"),
            (2_000_000_001, "read_forward_kernel<f32>"),
            (40_250, "matmul_entry<f32, f32>"),
        ] {
            assert!(tally.record(&line(nanos, name)), "{}", line(nanos, name));
        }
        for noise in ["|⎺⎺⎺⎺| ", "| Name | Num Computed |", "| soon | kernel"] {
            assert!(!tally.record(noise), "not a timed launch: {noise}");
        }
        let since = tally.since(&before);
        assert_eq!(since.launched, 4);
        assert_eq!(since.launched_by_name["read_forward_kernel"], 2);
        assert_eq!(since.device_ns, 12_345_678 + 870 + 2_000_000_001 + 40_250);
        assert_eq!(since.device_ns_by_name["matmul_entry"], 12_345_678 + 40_250);
        assert_eq!(
            since.device_ns_by_name["read_forward_kernel"],
            2_000_000_871
        );
        assert_eq!(tally.device_ns_by_name["matmul_entry"], 12_387_428);
    }
}
