//! The matrix product on CUDA through NVIDIA's cuBLAS, as PyTorch, llm.c and candle take it:
//! `cublasGemmStridedBatchedEx` on the tensors' own device memory, into a tensor CubeCL
//! allocated. cuBLAS is loaded at run time (cudarc's dynamic loading), so a build needs no CUDA
//! toolkit; where the library cannot be loaded the products stay on cubek, and the process is told
//! once, with the file names looked for.
//!
//! **Order with CubeCL's kernels.** CubeCL 0.10 gives each calling thread a non-blocking stream of
//! its own and does not expose it, so nothing orders a cuBLAS call with CubeCL's kernels by
//! itself. A product therefore waits on the host for CubeCL's stream (after asking CubeCL for the
//! operands' memory, which makes that stream wait for any other stream that wrote them), runs
//! on a stream of this module's, and waits for that stream before it returns: CubeCL may reuse
//! an operand's memory for the next kernel as soon as the tensor is dropped, ordered only against
//! its own stream. docs/decisions.md (decision 36) gives the alternatives and what each costs.
//!
//! **Handles.** One cuBLAS handle, stream and workspace per device and thread, created with that
//! device's primary context current (CubeCL's context: it makes it current only on its own server
//! thread). A handle is used by one thread at a time, so data-parallel runs (several threads on
//! one card, or several cards in one process) each get their own. They are released when the
//! thread ends.
//!
//! The layouts come from [`super::blas_call`]; this module only turns its calls into pointers.
//! `handle.rs` keeps the handles, `timing.rs` times the products with CUDA events.

use std::ffi::c_void;
use std::sync::OnceLock;

use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::cubecl::future::block_on;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cudarc::cublas::sys as blas;
use cudarc::driver::result as driver;

use super::blas_call::{GemmCall, NoBlasCall, Operand, StridedLayout, gemm_calls};

mod handle;
mod timing;

use handle::with_handle;
pub use handle::{WORKSPACE_BYTES, workspace_bytes};
use timing::DeviceTimer;
pub use timing::{BlasTimes, is_timing, start_timing, stop_timing, timed_so_far};

/// The compute type of a cuBLAS product of f32 tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasPrecision {
    /// TF32 tensor cores (10-bit mantissas in, f32 sums): the model's products on CUDA, as
    /// cubek's and PyTorch's `allow_tf32` ones.
    Tf32,
    /// f32 throughout (`CUBLAS_COMPUTE_32F` with the default math mode).
    Fp32,
}

/// Why cuBLAS did not compute a product. Every case leaves the caller free to compute it
/// another way: nothing was written that a later product depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CublasFailure {
    /// The library could not be loaded (the message names the files looked for).
    Unavailable(String),
    /// An operand is not f32.
    NotF32,
    /// Shapes or a layout with no BLAS call.
    Layout(NoBlasCall),
    /// The driver or cuBLAS returned an error.
    Call(String),
}

impl std::fmt::Display for CublasFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable(message) | Self::Call(message) => f.write_str(message),
            Self::NotF32 => f.write_str("cuBLAS products take f32 operands here"),
            Self::Layout(why) => write!(f, "no cuBLAS call for this product: {why}"),
        }
    }
}

/// Whether cuBLAS can be loaded in this process, checked once: `Err` names the files the
/// loader looked for and how to make one of them visible.
pub fn availability() -> Result<(), &'static str> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    let checked = AVAILABLE.get_or_init(|| {
        // SAFETY: opening a shared library by name and closing it again runs its initialisers
        // only, as any dynamic load of cuBLAS does.
        match unsafe { blas::is_culib_present() } {
            true => Ok(()),
            false => Err(format!(
                "cuBLAS could not be loaded: none of {:?} is on the dynamic loader's path. Put the \
                 directory of a libcublas (the CUDA toolkit's lib64, or PyTorch's \
                 nvidia/cublas/lib) on LD_LIBRARY_PATH; until then the products run on cubek",
                cudarc::get_lib_name_candidates("cublas")
            )),
        }
    });
    checked.as_ref().map(|_| ()).map_err(String::as_str)
}

/// `lhs · rhs` over the last two dimensions by cuBLAS: `[..., m, k] · [..., k, n]`, batch
/// dimensions equal or 1 (broadcast). Operands in any layout BLAS reads (row- or column-major
/// matrices, pitched rows, nested batch strides) are read in place; another layout is copied to
/// a dense one first.
///
/// # Shapes
/// - lhs: `[..., m, k]`; rhs: `[..., k, n]`
/// - output: `[..., m, n]`
pub fn matmul(
    lhs: CubeTensor<CudaRuntime>,
    rhs: CubeTensor<CudaRuntime>,
    precision: BlasPrecision,
) -> Result<CubeTensor<CudaRuntime>, CublasFailure> {
    availability().map_err(|message| CublasFailure::Unavailable(message.to_owned()))?;
    if lhs.dtype != DType::F32 || rhs.dtype != DType::F32 {
        return Err(CublasFailure::NotF32);
    }
    let shape = output_shape(lhs.meta.shape(), rhs.meta.shape()).map_err(CublasFailure::Layout)?;
    let out = empty_device_dtype(
        lhs.client.clone(),
        lhs.device.clone(),
        shape.clone(),
        DType::F32,
    );
    let (lhs, rhs, calls) = match plan(lhs, rhs, &out) {
        Ok(planned) => planned,
        Err(NoBlasCall::EmptyContraction) => {
            return Ok(zeros_client(
                out.client.clone(),
                out.device.clone(),
                shape,
                DType::F32,
            ));
        }
        Err(why) => return Err(CublasFailure::Layout(why)),
    };
    if !calls.is_empty() {
        run(&lhs, &rhs, &out, &calls, precision)?;
    }
    Ok(out)
}

/// The output's shape: the batch dimensions broadcast, then `[m, n]`.
fn output_shape(lhs: &[usize], rhs: &[usize]) -> Result<Shape, NoBlasCall> {
    let rank = lhs.len();
    if rank < 2 || rhs.len() != rank || lhs[rank - 1] != rhs[rank - 2] {
        return Err(NoBlasCall::Shapes(format!("{lhs:?} · {rhs:?}")));
    }
    let mut dims: Vec<usize> = (0..rank - 2)
        .map(|dim| match (lhs[dim], rhs[dim]) {
            (a, b) if a == b || b == 1 => Ok(a),
            (1, b) => Ok(b),
            _ => Err(NoBlasCall::Shapes(format!(
                "batch dimension {dim} of {lhs:?} · {rhs:?}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    dims.extend([lhs[rank - 2], rhs[rank - 1]]);
    Ok(Shape::from(dims))
}

/// The calls for `lhs · rhs` into `out`, copying an operand BLAS cannot read in place.
fn plan(
    mut lhs: CubeTensor<CudaRuntime>,
    mut rhs: CubeTensor<CudaRuntime>,
    out: &CubeTensor<CudaRuntime>,
) -> Result<
    (
        CubeTensor<CudaRuntime>,
        CubeTensor<CudaRuntime>,
        Vec<GemmCall>,
    ),
    NoBlasCall,
> {
    let layout = |tensor: &CubeTensor<CudaRuntime>| -> (Vec<usize>, Vec<usize>) {
        (tensor.meta.shape().to_vec(), tensor.meta.strides().to_vec())
    };
    // At most one copy per operand: a dense copy has a unit column stride.
    let mut copied = [false; 2];
    loop {
        let [(ls, lt), (rs, rt), (os, ot)] = [layout(&lhs), layout(&rhs), layout(out)];
        let strided = |shape, strides| StridedLayout { shape, strides };
        match gemm_calls(strided(&ls, &lt), strided(&rs, &rt), strided(&os, &ot)) {
            Ok(calls) => return Ok((lhs, rhs, calls)),
            Err(NoBlasCall::Layout(Operand::Lhs)) if !copied[0] => {
                (lhs, copied[0]) = (dense(lhs), true);
            }
            Err(NoBlasCall::Layout(Operand::Rhs)) if !copied[1] => {
                (rhs, copied[1]) = (dense(rhs), true);
            }
            Err(why) => return Err(why),
        }
    }
}

/// A dense row-major copy (`into_contiguous` returns a tensor it deems contiguous unchanged,
/// which a broadcast or overlapping one is not).
fn dense(tensor: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    into_contiguous(tensor)
}

/// Runs `calls` on this thread's handle for the output's device, ordered after CubeCL's work
/// on the operands and finished before returning.
fn run(
    lhs: &CubeTensor<CudaRuntime>,
    rhs: &CubeTensor<CudaRuntime>,
    out: &CubeTensor<CudaRuntime>,
    calls: &[GemmCall],
    precision: BlasPrecision,
) -> Result<(), CublasFailure> {
    let client = &out.client;
    let resource = |tensor: &CubeTensor<CudaRuntime>| {
        client.get_resource(tensor.handle.clone()).map_err(|error| {
            CublasFailure::Call(format!("CubeCL's memory of an operand: {error:?}"))
        })
    };
    // Held until the calls have finished: they keep the memory from being freed meanwhile.
    let resources = [resource(lhs)?, resource(rhs)?, resource(out)?];
    let pointers = resources.each_ref().map(|held| held.resource().ptr);
    // A call that would reach past an operand's memory is refused before it runs: the mapping's
    // arithmetic is tested on the host, this keeps a fault in it from writing into other memory.
    let sizes = resources.each_ref().map(|held| held.resource().size);
    if let Some(call) = calls.iter().find(|call| !within(call, sizes)) {
        return Err(CublasFailure::Layout(NoBlasCall::Shapes(format!(
            "a call reaches past its operands' {sizes:?} bytes: {call:?}"
        ))));
    }
    block_on(client.sync())
        .map_err(|error| CublasFailure::Call(format!("waiting for CubeCL's stream: {error:?}")))?;
    let ordinal = out.device.index;
    with_handle(ordinal, |handle| {
        let timer = DeviceTimer::start(handle.stream);
        let issued = calls
            .iter()
            .try_for_each(|call| gemm(handle.blas, call, pointers, precision));
        let timer = timer.and_then(|timer| timer.end(handle.stream));
        // Waited for whatever was issued, failed or not: the memory is CubeCL's again after this.
        // SAFETY: the stream is this handle's, alive while the handle is.
        let finished = unsafe { driver::stream::synchronize(handle.stream) }
            .map_err(|error| CublasFailure::Call(format!("cuStreamSynchronize: {error:?}")));
        if let Some(timer) = timer {
            timer.add(calls.len());
        }
        issued.and(finished)
    })
}

/// Whether every element `call` reads or writes lies within the operands' `[lhs, rhs, out]`
/// bytes.
fn within(call: &GemmCall, [lhs, rhs, out]: [u64; 3]) -> bool {
    const F32_BYTES: u64 = 4;
    // One past the last element of the batch's last column-major `rows × columns` matrix.
    let span = |offset: usize, batch_stride: usize, ld: usize, [rows, columns]: [usize; 2]| {
        (offset + (call.batch - 1) * batch_stride + (columns - 1) * ld + rows) as u64 * F32_BYTES
    };
    let input = |input: &super::blas_call::BlasInput, op_rows: usize, op_columns: usize| {
        let stored = match input.transposed {
            false => [op_rows, op_columns],
            true => [op_columns, op_rows],
        };
        let bytes = match input.operand {
            Operand::Lhs => lhs,
            Operand::Rhs => rhs,
        };
        span(input.offset, input.batch_stride, input.ld, stored) <= bytes
    };
    input(&call.a, call.m, call.k)
        && input(&call.b, call.k, call.n)
        && span(
            call.c.offset,
            call.c.batch_stride,
            call.c.ld,
            [call.m, call.n],
        ) <= out
}

/// One strided-batched call on `blas`, operands at the three base pointers `[lhs, rhs, out]`.
fn gemm(
    blas: blas::cublasHandle_t,
    call: &GemmCall,
    [lhs, rhs, out]: [u64; 3],
    precision: BlasPrecision,
) -> Result<(), CublasFailure> {
    const F32_BYTES: u64 = 4;
    let base = |operand| match operand {
        Operand::Lhs => lhs,
        Operand::Rhs => rhs,
    };
    let at = |pointer: u64, offset: usize| (pointer + offset as u64 * F32_BYTES) as *mut c_void;
    let op = |transposed| match transposed {
        true => blas::cublasOperation_t::CUBLAS_OP_T,
        false => blas::cublasOperation_t::CUBLAS_OP_N,
    };
    let compute = match precision {
        BlasPrecision::Tf32 => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        BlasPrecision::Fp32 => blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let f32_type = blas::cudaDataType::CUDA_R_32F;
    // `gemm_calls` checked every size and leading dimension against `i32`.
    let int = |value: usize| value as i32;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the pointers are the operands' device memory (held by the caller's resources), the
    // offsets, leading dimensions and batch strides come from their own layouts
    // (`blas_call::gemm_calls`), so every element read or written lies inside them; the
    // handle is this thread's, its context current.
    let status = unsafe {
        blas::cublasGemmStridedBatchedEx(
            blas,
            op(call.a.transposed),
            op(call.b.transposed),
            int(call.m),
            int(call.n),
            int(call.k),
            (&raw const alpha).cast(),
            at(base(call.a.operand), call.a.offset),
            f32_type,
            int(call.a.ld),
            call.a.batch_stride as i64,
            at(base(call.b.operand), call.b.offset),
            f32_type,
            int(call.b.ld),
            call.b.batch_stride as i64,
            (&raw const beta).cast(),
            at(out, call.c.offset),
            f32_type,
            int(call.c.ld),
            call.c.batch_stride as i64,
            int(call.batch),
            compute,
            blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    status
        .result()
        .map_err(|error| CublasFailure::Call(format!("cublasGemmStridedBatchedEx: {error:?}")))
}
