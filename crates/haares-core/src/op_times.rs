//! Where a training step's time goes, operation by operation: while recording is on, every
//! operation of [`crate::ops`] on Burn's autodiff backend times its forward call and its graph
//! node's backward pass, so that a step's profile needs no sampling profiler
//! (`haares-bench anatomy` reports it beside PyTorch's profiler).
//!
//! Off by default; off, an operation pays one relaxed atomic load. On the CPU backends an
//! operation's work is done when its call returns, so a call's wall time is the operation's. The
//! cube backends only enqueue kernels: there a call's time is its launch, not its work
//! (`haares-bench first-step --kernel-times` times kernels on the device).
//!
//! Only the outermost timed call on a thread counts: an operation that runs another inside it
//! (the routing read's norm) is charged the whole. Matrix products are also timed one by one and
//! kept by shape ([`ProductTime`], [`take_products`]), inside whichever operation runs them, so
//! that a step's products can be set beside another library's of the same shapes.

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// A pass through the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// The operation's own call.
    Forward,
    /// Its graph node's backward pass.
    Backward,
}

/// An operation's recorded time in one pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpTime {
    /// The operation: its folder under `ops` (`matmul`, `norm`, `routing::read`, …).
    pub operation: String,
    /// Forward or backward.
    pub pass: Pass,
    /// Wall seconds, summed over calls.
    pub seconds: f64,
    /// Calls.
    pub calls: usize,
}

/// A matrix product's shape as another library may state it: `matrices` products of `m × k` by
/// `k × n`, with `{m, n}` unordered (`sides`, the shorter first), since `C = A B` and `Cᵀ = Bᵀ Aᵀ`
/// are the same work and libraries choose either (a weight's gradient is `Xᵀ ∂Y` here and
/// `∂Yᵀ X` in PyTorch, whose weights are stored transposed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProductShape {
    /// Products in the batch (1 for a plain matrix product).
    pub matrices: usize,
    /// The shared (inner) dimension.
    pub depth: usize,
    /// The output's two sides, the shorter first.
    pub sides: [usize; 2],
}

impl ProductShape {
    /// The shape of `matrices` products `[m, k] · [k, n]`.
    pub fn new(matrices: usize, m: usize, k: usize, n: usize) -> Self {
        Self {
            matrices,
            depth: k,
            sides: [m.min(n), m.max(n)],
        }
    }

    /// The shape of `lhs · rhs` for a left operand of dimensions `[..., m, k]` and a product
    /// `n` wide.
    pub fn of<const D: usize>(lhs: [usize; D], n: usize) -> Self {
        Self::new(lhs[..D - 2].iter().product(), lhs[D - 2], lhs[D - 1], n)
    }

    /// Floating-point operations of one call (a multiply and an add per term).
    pub fn flops(&self) -> f64 {
        2.0 * (self.matrices * self.depth * self.sides[0] * self.sides[1]) as f64
    }
}

/// The recorded time of every product of one shape, forward and backward together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProductTime {
    /// The products' shape.
    pub shape: ProductShape,
    /// Wall seconds, summed over calls.
    pub seconds: f64,
    /// Calls.
    pub calls: usize,
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static TIMES: Mutex<Vec<OpTime>> = Mutex::new(Vec::new());
static PRODUCTS: Mutex<Vec<ProductTime>> = Mutex::new(Vec::new());

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Starts recording, from nothing.
pub fn start_recording() {
    lock().clear();
    lock_products().clear();
    RECORDING.store(true, Ordering::Relaxed);
}

/// Stops recording and returns what was recorded since [`start_recording`], in order of first
/// call.
pub fn stop_recording() -> Vec<OpTime> {
    RECORDING.store(false, Ordering::Relaxed);
    std::mem::take(&mut *lock())
}

/// Whether operations are being timed.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// The products recorded since [`start_recording`], by shape in order of first call; what is
/// taken is not returned again.
pub fn take_products() -> Vec<ProductTime> {
    std::mem::take(&mut *lock_products())
}

fn lock() -> std::sync::MutexGuard<'static, Vec<OpTime>> {
    TIMES.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock_products() -> std::sync::MutexGuard<'static, Vec<ProductTime>> {
    PRODUCTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `work` on `operands`, a product of shape `shape(&operands)`, charging its wall time to
/// that shape while recording (whatever operation runs it: products are timed apart from
/// [`timed`]'s nesting). The shape is read from the operands only while recording.
pub(crate) fn product<T, R>(
    operands: T,
    shape: impl FnOnce(&T) -> ProductShape,
    work: impl FnOnce(T) -> R,
) -> R {
    if !recording() {
        return work(operands);
    }
    let shape = shape(&operands);
    let started = Instant::now();
    let result = work(operands);
    let seconds = started.elapsed().as_secs_f64();
    let mut products = lock_products();
    match products.iter_mut().find(|p| p.shape == shape) {
        Some(time) => {
            time.seconds += seconds;
            time.calls += 1;
        }
        None => products.push(ProductTime {
            shape,
            seconds,
            calls: 1,
        }),
    }
    result
}

/// Runs `work`, charging its wall time to `operation` in `pass` while recording.
pub fn timed<R>(operation: &str, pass: Pass, work: impl FnOnce() -> R) -> R {
    if !recording() || DEPTH.get() > 0 {
        return work();
    }
    DEPTH.set(1);
    let started = Instant::now();
    let result = work();
    let seconds = started.elapsed().as_secs_f64();
    DEPTH.set(0);
    let mut times = lock();
    match times
        .iter_mut()
        .find(|t| t.pass == pass && t.operation == operation)
    {
        Some(time) => {
            time.seconds += seconds;
            time.calls += 1;
        }
        None => times.push(OpTime {
            operation: operation.to_string(),
            pass,
            seconds,
            calls: 1,
        }),
    }
    result
}

/// The operation a module or type path under `ops` belongs to: the folders between `ops::` and
/// the first `autodiff…` module (`haares_core::ops::routing::read::autodiff_read::ReadBackward`
/// is `routing::read`).
pub(crate) fn operation_of(path: &str) -> &str {
    let path = path.split('<').next().unwrap_or(path);
    let Some(start) = path.find("::ops::").map(|at| at + "::ops::".len()) else {
        return path;
    };
    let rest = &path[start..];
    let end = rest.find("::autodiff").unwrap_or(rest.len());
    &rest[..end]
}

/// [`timed`] for an operation's forward call in the module at `module_path!()`.
pub(crate) fn forward<R>(module: &'static str, work: impl FnOnce() -> R) -> R {
    if !recording() {
        return work();
    }
    timed(operation_of(module), Pass::Forward, work)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_named_by_their_folder() {
        let cases = [
            ("haares_core::ops::norm::autodiff", "norm"),
            (
                "haares_core::ops::routing::read::autodiff_read::ReadBackward<f32>",
                "routing::read",
            ),
            (
                "haares_core::ops::matmul::autodiff::MatmulBackward<3>",
                "matmul",
            ),
            ("somewhere::else::Thing", "somewhere::else::Thing"),
        ];
        for (path, operation) in cases {
            assert_eq!(operation_of(path), operation, "{path}");
        }
    }
}
