//! `products`: the matrix products of one training step, shape by shape, each timed on the device
//! and checked against f64, by every provider the model can take on CUDA (cuBLAS in TF32 and in
//! f32, cubek's `Auto` and its double-buffered tensor-core kernel), with PyTorch's `torch.matmul`
//! at the same shapes and layouts beside them: a self-checking micro-benchmark in the manner of
//! llm.c's `dev/cuda/`.
//!
//! A step's products are those of [`step_products`]: four projections per layer and the tied
//! head, each forward and twice backward (`∂A = ∂C Bᵀ`, `∂B = Aᵀ ∂C`), in the layouts the
//! model hands them (the weights row-major `[d_in, d_out]`, a backward operand a transposed
//! view). Attention's products are inside its fused kernels on CUDA, and the cross-entropy's
//! logits come from the head's product.
//!
//! - `device.rs` (feature `cuda`): the timings and the checks on the GPU;
//! - `report.rs`: the tables, the verdict against `--target` (0.8 × `torch.matmul`) and the
//!   step-level sums;
//! - `peer/torch_products.py`: PyTorch's timings.

#[cfg(feature = "cuda")]
pub mod device;
pub mod peer;
pub mod report;

use std::path::PathBuf;

use haares_core::ModelFamily;
use serde::{Deserialize, Serialize};

/// `haares-bench products`: what to measure and where to write it.
#[derive(Debug, Clone, clap::Args)]
pub struct ProductsArgs {
    /// Families (widths) whose step's products to take.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "small,medium"
    )]
    pub family: Vec<crate::cost::Family>,
    /// Layers of the step (a product's count per step).
    #[arg(long, default_value_t = 48)]
    pub layers: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    pub seq: usize,
    /// The vocabulary (the tied head's width).
    #[arg(long, default_value_t = 256)]
    pub vocab: usize,
    /// Products per measurement, after two warm-up products.
    #[arg(long, default_value_t = 20)]
    pub repeats: usize,
    /// The ratio to `torch.matmul`'s TFLOP/s at the same precision a product must reach.
    #[arg(long, default_value_t = 0.8)]
    pub target: f64,
    /// The interpreter of the PyTorch peer (one with a CUDA PyTorch); `none` leaves it out.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Output stem: writes `<out>.md` and `<out>.json`.
    #[arg(long, default_value = "products")]
    pub out: PathBuf,
}

/// Measures every family's products on the first CUDA device, with the PyTorch peer unless
/// `python` is `none`; `log` gets a line per product.
#[cfg(feature = "cuda")]
pub fn run_products(args: &ProductsArgs, mut log: impl FnMut(&str)) -> crate::Result<ProductsRun> {
    let tokens = args.batch * args.seq;
    let mut run = ProductsRun {
        layers: args.layers,
        tokens,
        vocab: args.vocab,
        repeats: args.repeats,
        device: gpu_name(),
        peer: "not run (--python none)".into(),
        cublas: haares_core::ops::matmul::cublas::availability()
            .map_or_else(str::to_string, |()| "loaded".into()),
        families: Vec::new(),
    };
    for family in crate::cost::Family::of(args.family.clone()) {
        let cases = step_products(family, args.layers, tokens, args.vocab);
        let mut results = Vec::with_capacity(cases.len());
        for (index, case) in cases.iter().enumerate() {
            let result = device::measure_case(case, args.repeats, index as u64 + 1)?;
            log(&format!(
                "{family:?} {}: cuBLAS TF32 {} TFLOP/s",
                case.name,
                result
                    .tflops(Kernels::CublasTf32)
                    .map_or("–".into(), |t| format!("{t:.1}"))
            ));
            results.push(result);
        }
        if args.python != "none" {
            match peer::torch_timings(&args.python, &cases, args.repeats) {
                Ok(timings) => {
                    run.peer = timings.version.clone();
                    peer::merge(&mut results, timings);
                }
                Err(why) => {
                    let why = why.reason();
                    log(&why);
                    run.peer = format!("not run: {why}");
                }
            }
        }
        run.families.push(FamilyProducts {
            family,
            cases: results,
        });
    }
    Ok(run)
}

/// The same without the `cuda` feature: the error that says how to get it.
#[cfg(not(feature = "cuda"))]
pub fn run_products(_: &ProductsArgs, _: impl FnMut(&str)) -> crate::Result<ProductsRun> {
    Err(crate::BenchError::Request(
        "`products` measures CUDA's products: rebuild haares-bench with `--features cuda`".into(),
    ))
}

/// The first GPU's name from `nvidia-smi`, or a plain label where it cannot be asked.
#[cfg(feature = "cuda")]
fn gpu_name() -> String {
    std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", "--id=0"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "CUDA device 0".into())
}

/// Writes `run` as `<out>.md` and `<out>.json`, each atomically; the markdown back.
pub fn write_products_run(run: &ProductsRun, args: &ProductsArgs) -> crate::Result<String> {
    let table = report::markdown(run, args.target);
    crate::report_files::write_atomically_both(&args.out, run, &table)?;
    Ok(table)
}

/// One product of a training step: `[m, k] · [k, n]`, each operand row-major or a transposed
/// view of a row-major tensor, taken `per_step` times a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProductCase {
    /// What it is: the projection and the pass (e.g. `QKV ∂W`).
    pub name: String,
    /// Rows of the output.
    pub m: usize,
    /// The contraction.
    pub k: usize,
    /// Columns of the output.
    pub n: usize,
    /// The left operand is a transposed view (stored `[k, m]`).
    pub lhs_transposed: bool,
    /// The right operand is a transposed view (stored `[n, k]`).
    pub rhs_transposed: bool,
    /// Times a training step takes it.
    pub per_step: usize,
}

impl ProductCase {
    /// `2 m k n`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }

    /// `m×k·k×n`, a transposed operand marked `ᵀ`.
    pub fn shape(&self) -> String {
        let mark = |transposed| if transposed { "ᵀ" } else { "" };
        format!(
            "{}×{}{} · {}×{}{}",
            self.m,
            self.k,
            mark(self.lhs_transposed),
            self.k,
            self.n,
            mark(self.rhs_transposed)
        )
    }
}

/// The products of a training step of `layers` layers of `family` at `tokens` tokens a batch
/// and a vocabulary of `vocab`, on the cube backends: per layer the packed QKV projection
/// (`[d, 3d]`), attention's output (`[d, d]`), the packed gate and up projection (`[d, 2 d_ff]`)
/// and the down projection (`[d_ff, d]`), each as `x W`, `∂Y Wᵀ` and `xᵀ ∂Y`; then the tied head
/// `h Eᵀ` (`E` is `[V, d]`), `∂Z E` and `∂Zᵀ h`.
pub fn step_products(
    family: ModelFamily,
    layers: usize,
    tokens: usize,
    vocab: usize,
) -> Vec<ProductCase> {
    let (d, d_ff) = family.widths();
    let projection = |name: &str, d_in: usize, d_out: usize| {
        let case =
            |pass: &str, [m, k, n]: [usize; 3], [lhs_transposed, rhs_transposed]: [bool; 2]| {
                ProductCase {
                    name: format!("{name} {pass}"),
                    m,
                    k,
                    n,
                    lhs_transposed,
                    rhs_transposed,
                    per_step: layers,
                }
            };
        [
            case("forward", [tokens, d_in, d_out], [false, false]),
            case("∂x", [tokens, d_out, d_in], [false, true]),
            case("∂W", [d_in, tokens, d_out], [true, false]),
        ]
    };
    let head = |pass: &str, [m, k, n]: [usize; 3], [lhs_transposed, rhs_transposed]: [bool; 2]| {
        ProductCase {
            name: format!("head {pass}"),
            m,
            k,
            n,
            lhs_transposed,
            rhs_transposed,
            per_step: 1,
        }
    };
    let mut cases: Vec<ProductCase> = [
        projection("QKV", d, 3 * d),
        projection("attention out", d, d),
        projection("gate/up", d, 2 * d_ff),
        projection("down", d_ff, d),
    ]
    .into_iter()
    .flatten()
    .collect();
    cases.extend([
        head("forward", [tokens, d, vocab], [false, true]),
        head("∂h", [tokens, vocab, d], [false, false]),
        head("∂E", [vocab, tokens, d], [true, false]),
    ]);
    cases
}

/// One provider's kernels, as the table names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kernels {
    /// cuBLAS, TF32 tensor cores.
    CublasTf32,
    /// cuBLAS, f32 throughout.
    CublasFp32,
    /// cubek's `Strategy::Auto` (the single-stage tensor-core kernel), as the model runs it.
    CubekAuto,
    /// cubek's double-buffered tensor-core kernel (`DoubleCyclicCmma`), only where `k` is a
    /// multiple of two 32-deep stages (decision 24).
    CubekDouble,
    /// PyTorch's `torch.matmul` with TF32 allowed.
    TorchTf32,
    /// PyTorch's `torch.matmul` in f32.
    TorchFp32,
}

impl Kernels {
    /// Every provider, in the table's order.
    pub const ALL: [Kernels; 6] = [
        Kernels::CublasTf32,
        Kernels::CublasFp32,
        Kernels::CubekAuto,
        Kernels::CubekDouble,
        Kernels::TorchTf32,
        Kernels::TorchFp32,
    ];

    /// The column's name.
    pub fn name(self) -> &'static str {
        match self {
            Kernels::CublasTf32 => "cuBLAS TF32",
            Kernels::CublasFp32 => "cuBLAS fp32",
            Kernels::CubekAuto => "cubek Auto",
            Kernels::CubekDouble => "cubek double",
            Kernels::TorchTf32 => "torch TF32",
            Kernels::TorchFp32 => "torch fp32",
        }
    }

    /// The peer at the same precision, for the ratio the target is stated in.
    pub fn torch_peer(self) -> Option<Kernels> {
        match self {
            Kernels::CublasTf32 | Kernels::CubekAuto | Kernels::CubekDouble => {
                Some(Kernels::TorchTf32)
            }
            Kernels::CublasFp32 => Some(Kernels::TorchFp32),
            Kernels::TorchTf32 | Kernels::TorchFp32 => None,
        }
    }
}

/// One provider's measurement of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Whose kernels.
    pub kernels: Kernels,
    /// Device seconds per product (CUDA events around the calls).
    pub device_s: f64,
    /// Host seconds per product, the call's own ordering included (for cuBLAS, the waits on
    /// CubeCL's stream and on its own); `None` where not measured.
    #[serde(default)]
    pub wall_s: Option<f64>,
    /// Largest error of the sampled output elements against f64, relative to each element's
    /// scale `Σ_k |a_ik b_kj|`; `None` where not checked (the peer's).
    #[serde(default)]
    pub error: Option<f64>,
}

/// Every provider's measurement of one case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// The product.
    pub case: ProductCase,
    /// One per provider that ran it.
    pub timings: Vec<Timing>,
}

impl CaseResult {
    /// The timing of `kernels`, if it ran.
    pub fn timing(&self, kernels: Kernels) -> Option<&Timing> {
        self.timings.iter().find(|timing| timing.kernels == kernels)
    }

    /// TFLOP/s of `kernels` by device time.
    pub fn tflops(&self, kernels: Kernels) -> Option<f64> {
        self.timing(kernels)
            .map(|timing| self.case.flops() / timing.device_s / 1e12)
    }
}

/// One family's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyProducts {
    /// The family.
    pub family: ModelFamily,
    /// Its cases, in [`step_products`]' order.
    pub cases: Vec<CaseResult>,
}

/// A whole run: what was measured and where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProductsRun {
    /// Layers of the step whose products these are.
    pub layers: usize,
    /// Tokens of its batch (`batch × seq`).
    pub tokens: usize,
    /// Its vocabulary.
    pub vocab: usize,
    /// Products per measurement (after two warm-up products).
    pub repeats: usize,
    /// The card, as the driver names it.
    pub device: String,
    /// The PyTorch peer's version, or why it did not run.
    pub peer: String,
    /// `loaded`, or why cuBLAS could not be loaded (its columns are then empty).
    #[serde(default)]
    pub cublas: String,
    /// Per family.
    pub families: Vec<FamilyProducts>,
}

/// The tolerances of a product's error against f64, relative to each element's scale: TF32
/// (10-bit mantissas in) and f32 throughout, as the portability suite's cuBLAS check holds them.
pub const TF32_TOLERANCE: f64 = 2e-3;
/// See [`TF32_TOLERANCE`].
pub const FP32_TOLERANCE: f64 = 1e-5;

/// Every measurement whose error exceeds its precision's tolerance, named: a wrong product fails
/// the run (after its report is written), however fast it was.
pub fn wrong_products(run: &ProductsRun) -> Vec<String> {
    let mut wrong = Vec::new();
    for family in &run.families {
        for result in &family.cases {
            for timing in &result.timings {
                let tolerance = match timing.kernels {
                    Kernels::CublasFp32 => FP32_TOLERANCE,
                    _ => TF32_TOLERANCE,
                };
                if let Some(error) = timing.error.filter(|error| !(*error <= tolerance)) {
                    wrong.push(format!(
                        "{:?} {} by {}: {error:.1e} of the scale, over {tolerance:.0e}",
                        family.family,
                        result.case.name,
                        timing.kernels.name()
                    ));
                }
            }
        }
    }
    wrong
}
