//! The `products` measurements on a CUDA device: each case's operands made once, in the model's
//! layouts, then each provider's product taken `repeats` times after two warm-up products, timed
//! on the device (CUDA events: cuBLAS's through `cublas::start_timing`, cubek's through CubeCL's
//! profiler), and its output sampled against f64 on the host.

use std::time::Instant;

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{Strategy, launch_ref};
use cubek::std::InputBinding;
use haares_base::SplitMix64;
use haares_core::backend::Cuda;
use haares_core::ops::matmul::cublas::{self, BlasPrecision};

use super::{CaseResult, Kernels, ProductCase, Timing};
use crate::error::{BenchError, Result};

/// Output elements sampled per product for its error against f64.
const SAMPLES: usize = 256;

/// A case's operands on the device, and their values on the host (row-major, logical).
struct Operands {
    lhs: CubeTensor<CudaRuntime>,
    rhs: CubeTensor<CudaRuntime>,
    lhs_values: Vec<f32>,
    rhs_values: Vec<f32>,
}

/// Every provider of ours on `case`, `repeats` products each.
pub fn measure_case(case: &ProductCase, repeats: usize, seed: u64) -> Result<CaseResult> {
    let operands = operands(case, seed);
    let mut timings = Vec::new();
    // Without cuBLAS (`cublas::availability`, which the run reports) cubek and PyTorch are still
    // measured.
    if cublas::availability().is_ok() {
        for precision in [BlasPrecision::Tf32, BlasPrecision::Fp32] {
            timings.push(cublas_timing(case, &operands, precision, repeats)?);
        }
    }
    timings.push(cubek_timing(case, &operands, Kernels::CubekAuto, repeats)?);
    // cubek 0.2's double-buffered kernels read a stage past the operands where `k` is an odd
    // number of 32-deep stages (decision 24): measured only where it is not.
    if case.k % 64 == 0 {
        timings.push(cubek_timing(
            case,
            &operands,
            Kernels::CubekDouble,
            repeats,
        )?);
    }
    Ok(CaseResult {
        case: case.clone(),
        timings,
    })
}

/// The operands of `case`, values in `[-1, 1)`: a transposed operand stored transposed and
/// handed over as a view, as the backward pass hands it.
fn operands(case: &ProductCase, seed: u64) -> Operands {
    let mut rng = SplitMix64::new(seed);
    let mut values = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| (rng.next_f64() * 2.0 - 1.0) as f32)
            .collect()
    };
    let (lhs_values, rhs_values) = (values(case.m * case.k), values(case.k * case.n));
    let device = CudaDevice::default();
    let laid = |values: &[f32], [rows, columns]: [usize; 2], transposed: bool| {
        let tensor = match transposed {
            false => Tensor::<Cuda, 2>::from_data(
                TensorData::new(values.to_vec(), [rows, columns]),
                &device,
            ),
            true => {
                let stored: Vec<f32> = (0..rows * columns)
                    .map(|at| values[(at % rows) * columns + at / rows])
                    .collect();
                Tensor::<Cuda, 2>::from_data(TensorData::new(stored, [columns, rows]), &device)
                    .transpose()
            }
        };
        tensor.into_primitive().tensor()
    };
    Operands {
        lhs: laid(&lhs_values, [case.m, case.k], case.lhs_transposed),
        rhs: laid(&rhs_values, [case.k, case.n], case.rhs_transposed),
        lhs_values,
        rhs_values,
    }
}

fn cublas_timing(
    case: &ProductCase,
    operands: &Operands,
    precision: BlasPrecision,
    repeats: usize,
) -> Result<Timing> {
    let product = || {
        cublas::matmul(operands.lhs.clone(), operands.rhs.clone(), precision)
            .map_err(|failure| BenchError::Device(format!("{}: {failure}", case.name)))
    };
    for _ in 0..2 {
        product()?;
    }
    cublas::start_timing();
    let start = Instant::now();
    let mut last = None;
    for _ in 0..repeats {
        last = Some(product()?);
    }
    let wall = start.elapsed().as_secs_f64();
    let times = cublas::stop_timing();
    if times.calls < repeats as u64 {
        return Err(BenchError::Device(format!(
            "{}: {} of {repeats} cuBLAS products timed",
            case.name, times.calls
        )));
    }
    let output =
        last.ok_or_else(|| BenchError::Device(format!("{}: no product taken", case.name)))?;
    Ok(Timing {
        kernels: match precision {
            BlasPrecision::Tf32 => Kernels::CublasTf32,
            BlasPrecision::Fp32 => Kernels::CublasFp32,
        },
        device_s: times.seconds / repeats as f64,
        wall_s: Some(wall / repeats as f64),
        error: Some(sampled_error(case, operands, output)),
    })
}

fn cubek_timing(
    case: &ProductCase,
    operands: &Operands,
    kernels: Kernels,
    repeats: usize,
) -> Result<Timing> {
    let strategy = match kernels {
        Kernels::CubekDouble => Strategy::DoubleCyclicCmma(Default::default()),
        _ => Strategy::Auto,
    };
    let launch = || launch_with(&strategy, operands.lhs.clone(), operands.rhs.clone());
    let client = operands.lhs.client.clone();
    for _ in 0..2 {
        launch().map_err(|error| by(case, kernels, error))?;
    }
    let (outputs, duration) = client
        .profile(
            || (0..repeats).map(|_| launch()).collect::<Vec<_>>(),
            "products",
        )
        .map_err(|error| {
            BenchError::Device(format!("{}: CubeCL's profiler: {error:?}", case.name))
        })?;
    let seconds = block_on(duration.resolve()).duration().as_secs_f64();
    let output = outputs
        .into_iter()
        .last()
        .ok_or_else(|| BenchError::Device(format!("{}: no product taken", case.name)))?
        .map_err(|error| by(case, kernels, error))?;
    Ok(Timing {
        kernels,
        device_s: seconds / repeats as f64,
        wall_s: None,
        error: Some(sampled_error(case, operands, output)),
    })
}

/// `case`'s product by `kernels` failed with `error`.
fn by(case: &ProductCase, kernels: Kernels, error: BenchError) -> BenchError {
    BenchError::Device(format!(
        "{} by {}: {}",
        case.name,
        kernels.name(),
        error.reason()
    ))
}

/// cubek's product by `strategy`, as Burn's cube backend launches it (`Strategy::Auto` is the
/// model's): into a new output of Burn's allocation.
fn launch_with(
    strategy: &Strategy,
    lhs: CubeTensor<CudaRuntime>,
    rhs: CubeTensor<CudaRuntime>,
) -> Result<CubeTensor<CudaRuntime>> {
    let out = init_matmul_output(&lhs, &rhs, DType::F32);
    let float = DType::F32.into();
    let mut elements = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: float,
        rhs: float,
        out: float,
    });
    launch_ref(
        strategy,
        &out.client,
        InputBinding::new(lhs.binding(), float),
        InputBinding::new(rhs.binding(), float),
        out.clone().binding(),
        &mut elements,
    )
    .map_err(|error| BenchError::Device(format!("{error:?}")))?;
    Ok(out)
}

/// The largest error of [`SAMPLES`] output elements (spread over the output by a fixed stride)
/// against f64, relative to each element's scale `Σ_k |a_ik b_kj|`.
fn sampled_error(case: &ProductCase, operands: &Operands, output: CubeTensor<CudaRuntime>) -> f64 {
    let values: Vec<f32> = Tensor::<Cuda, 2>::from_primitive(TensorPrimitive::Float(output))
        .into_data()
        .to_vec()
        .unwrap_or_default();
    let elements = case.m * case.n;
    if values.len() != elements {
        return f64::INFINITY;
    }
    let step = (elements / SAMPLES).max(1) | 1;
    (0..elements)
        .step_by(step)
        .take(SAMPLES)
        .map(|at| {
            let (i, j) = (at / case.n, at % case.n);
            let (mut exact, mut scale) = (0.0f64, 0.0f64);
            for l in 0..case.k {
                let term = f64::from(operands.lhs_values[i * case.k + l])
                    * f64::from(operands.rhs_values[l * case.n + j]);
                exact += term;
                scale += term.abs();
            }
            let error = (f64::from(values[at]) - exact).abs() / scale.max(f64::MIN_POSITIVE);
            if error.is_nan() { f64::INFINITY } else { error }
        })
        .fold(0.0, f64::max)
}
