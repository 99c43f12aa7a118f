//! SIMD building blocks of the Flex loops (the `flex.rs` files under `ops/`), on
//! `macerator`'s vectors: the crate Flex itself uses, which picks AVX-512, AVX2, SSE, NEON or
//! scalar code at run time. A function marked `#[macerator::with_simd]` is compiled once per
//! instruction set and inlines these helpers, so even their scalar parts (the exponential below)
//! are vectorised by the compiler for the set it runs on.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::{DType, Element, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use macerator::{ReduceAdd, Scalar, Simd, VAdd, VMul, VMulAdd, vload_unaligned, vstore_unaligned};

/// Elements per task of the parallel loops (64 KiB of f32). Fixed, not derived from the number of
/// threads, so that every result is the same however many threads run.
pub(crate) const TASK_ELEMENTS: usize = 16 * 1024;

/// A float type the loops run on (macerator's scalars are `bytemuck::Pod`, as Flex's slices need).
pub(crate) trait HostFloat: Element + VAdd + VMul + VMulAdd + ReduceAdd {}

impl HostFloat for f32 {}
impl HostFloat for f64 {}

/// A Flex float tensor over a loop's output buffer.
pub(crate) fn flex_tensor<F: HostFloat, const D: usize>(
    values: Vec<F>,
    shape: [usize; D],
) -> Tensor<Flex, D> {
    let buffer = FlexTensor::from_data(TensorData::new(values, shape));
    Tensor::from_primitive(TensorPrimitive::Float(buffer))
}

/// `a · b` with four vector accumulators: a scalar loop cannot be vectorised without reordering
/// its additions, so it would run as one chain of dependent adds.
#[inline(always)]
pub(crate) fn dot_product<S: Simd, F: HostFloat>(a: &[F], b: &[F]) -> F {
    assert_eq!(a.len(), b.len());
    let lanes = F::lanes::<S>();
    let zero = F::default().splat::<S>();
    let mut sums = [zero; 4];
    let mut at = 0;
    while at + 4 * lanes <= a.len() {
        for (lane_block, sum) in sums.iter_mut().enumerate() {
            let offset = at + lane_block * lanes;
            // SAFETY: `offset + lanes ≤ a.len() = b.len()` by the loop condition.
            let (x, y) = unsafe {
                (
                    vload_unaligned::<S, F>(a.as_ptr().add(offset)),
                    vload_unaligned::<S, F>(b.as_ptr().add(offset)),
                )
            };
            *sum = x.mul_add(y, *sum);
        }
        at += 4 * lanes;
    }
    while at + lanes <= a.len() {
        // SAFETY: `at + lanes ≤ a.len() = b.len()` by the loop condition.
        let (x, y) = unsafe {
            (
                vload_unaligned::<S, F>(a.as_ptr().add(at)),
                vload_unaligned::<S, F>(b.as_ptr().add(at)),
            )
        };
        sums[0] = x.mul_add(y, sums[0]);
        at += lanes;
    }
    let vector_sum = ((sums[0] + sums[1]) + (sums[2] + sums[3])).reduce_add();
    a[at..]
        .iter()
        .zip(&b[at..])
        .fold(vector_sum, |sum, (&x, &y)| sum + x * y)
}

/// `out += factor · row`.
#[inline(always)]
pub(crate) fn scaled_add<S: Simd, F: HostFloat>(out: &mut [F], factor: F, row: &[F]) {
    assert_eq!(out.len(), row.len());
    let lanes = F::lanes::<S>();
    let factors = factor.splat::<S>();
    let mut at = 0;
    while at + lanes <= out.len() {
        // SAFETY: `at + lanes ≤ out.len() = row.len()` by the loop condition.
        unsafe {
            let x = vload_unaligned::<S, F>(row.as_ptr().add(at));
            let y = vload_unaligned::<S, F>(out.as_ptr().add(at));
            vstore_unaligned::<S, F>(out.as_mut_ptr().add(at), x.mul_add(factors, y));
        }
        at += lanes;
    }
    for (out, &x) in out[at..].iter_mut().zip(&row[at..]) {
        *out = *out + factor * x;
    }
}

/// The sum of a slice, with one vector accumulator.
#[inline(always)]
pub(crate) fn sum<S: Simd>(values: &[f32]) -> f32 {
    let lanes = f32::lanes::<S>();
    let mut sums = 0f32.splat::<S>();
    let mut at = 0;
    while at + lanes <= values.len() {
        // SAFETY: `at + lanes ≤ values.len()` by the loop condition.
        sums += unsafe { vload_unaligned::<S, f32>(values.as_ptr().add(at)) };
        at += lanes;
    }
    values[at..]
        .iter()
        .fold(sums.reduce_add(), |sum, &x| sum + x)
}

/// The largest element of a non-empty slice.
#[inline(always)]
pub(crate) fn max<S: Simd>(values: &[f32]) -> f32 {
    let lanes = f32::lanes::<S>();
    let mut at = 0;
    let mut vector_max = None;
    while at + lanes <= values.len() {
        // SAFETY: `at + lanes ≤ values.len()` by the loop condition.
        let x = unsafe { vload_unaligned::<S, f32>(values.as_ptr().add(at)) };
        vector_max = Some(vector_max.map_or(x, |max: macerator::Vector<S, f32>| max.max(x)));
        at += lanes;
    }
    let start = vector_max.map_or(f32::NEG_INFINITY, |max| max.reduce_max());
    values[at..]
        .iter()
        .fold(start, |max, &x| if x > max { x } else { max })
}

/// `e^x` in f32 to within 2 units in the last place on `[−87.33, 88.37]`, and NaN for NaN;
/// an argument below (above) that range gives the value at its lower (upper) end, ≈ 1.2e−38
/// (≈ 2.4e38), where libm would give 0 or a denormal (∞).
///
/// Flex's own `exp` and `sigmoid` call libm's scalar `expf` per element, which took 14% of a
/// training step (docs/notebook/cpu-speed.md). This one is branch-free, so a loop of it vectorises:
/// the Cody–Waite reduction `x = n·ln 2 + r` with `n` rounded to nearest by adding and subtracting
/// 1.5·2²³, the classic degree-7 polynomial for `e^r` on `|r| ≤ ln 2 / 2` (Cephes' `expf`
/// coefficients), and `2^n` assembled in the exponent bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOWEST: f32 = -87.336_55; // ln of the smallest normal f32, 2^−126
    const HIGHEST: f32 = 88.376_26; // 127.5 · ln 2: n stays ≤ 127
    const ROUNDING: f32 = 12_582_912.0; // 1.5 · 2^23
    const LN2_HIGH: f32 = 0.693_359_4; // ln 2 in two parts, the first exact in few bits
    const LN2_LOW: f32 = -2.121_944_4e-4;
    // Comparisons, not `clamp`/`max`, so that NaN passes through unchanged.
    #[allow(clippy::manual_clamp)]
    let x = if x < LOWEST {
        LOWEST
    } else if x > HIGHEST {
        HIGHEST
    } else {
        x
    };
    let shifted = x * std::f32::consts::LOG2_E + ROUNDING;
    let n = shifted - ROUNDING;
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 0.166_666_65;
    let p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    // The low bits of `shifted` hold n; n + 127, moved into the exponent field, is 2^n.
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDING.to_bits());
    let two_to_n = f32::from_bits(n_bits.wrapping_add(127) << 23);
    e_r * two_to_n
}

/// `out += a·x + b·y`, one pass over `out`.
#[inline(always)]
pub(crate) fn two_scaled_adds<S: Simd>(out: &mut [f32], a: f32, x: &[f32], b: f32, y: &[f32]) {
    assert!(out.len() == x.len() && out.len() == y.len());
    let lanes = f32::lanes::<S>();
    let (a_lanes, b_lanes) = (a.splat::<S>(), b.splat::<S>());
    let mut at = 0;
    while at + lanes <= out.len() {
        // SAFETY: `at + lanes ≤ out.len() = x.len() = y.len()` by the loop condition.
        unsafe {
            let x_lanes = vload_unaligned::<S, f32>(x.as_ptr().add(at));
            let y_lanes = vload_unaligned::<S, f32>(y.as_ptr().add(at));
            let sum = vload_unaligned::<S, f32>(out.as_ptr().add(at));
            let sum = x_lanes.mul_add(a_lanes, sum);
            vstore_unaligned::<S, f32>(out.as_mut_ptr().add(at), y_lanes.mul_add(b_lanes, sum));
        }
        at += lanes;
    }
    for ((out, &x), &y) in out[at..].iter_mut().zip(&x[at..]).zip(&y[at..]) {
        *out = *out + a * x + b * y;
    }
}

/// Flex's buffers behind tensors of one shape, when all are f32, contiguous and not empty.
pub(crate) fn f32_buffers<const D: usize, const N: usize>(
    tensors: [&Tensor<Flex, D>; N],
) -> Option<[FlexTensor; N]> {
    let dims = tensors[0].dims();
    let readable = tensors
        .iter()
        .all(|tensor| tensor.dims() == dims && tensor.dtype() == DType::F32 && !dims.contains(&0));
    let buffers = tensors.map(|tensor| tensor.clone().into_primitive().tensor());
    let contiguous = buffers
        .iter()
        .all(|buffer| buffer.as_slice::<f32>().is_some());
    (readable && contiguous).then_some(buffers)
}

/// A Flex f32 tensor's buffer, the offset of its first element and its strides, when no
/// dimension is empty, no stride is negative and every element lies inside the buffer: what the
/// loops that read an operand through its strides (the matrix product, fused attention) need.
pub(crate) fn strided_f32<const D: usize>(
    tensor: &Tensor<Flex, D>,
) -> Option<(FlexTensor, usize, [usize; D])> {
    let dims = tensor.dims();
    if tensor.dtype() != DType::F32 || dims.contains(&0) {
        return None;
    }
    let buffer = tensor.clone().into_primitive().tensor();
    let layout = buffer.layout();
    let strides: Vec<usize> = (layout.strides().iter())
        .map(|&stride| usize::try_from(stride).ok())
        .collect::<Option<_>>()?;
    let strides: [usize; D] = strides.try_into().ok()?;
    let start = layout.start_offset();
    let last = (dims.iter().zip(&strides))
        .map(|(&size, &stride)| (size - 1) * stride)
        .sum::<usize>()
        + start;
    (last < buffer.storage::<f32>().len()).then_some((buffer, start, strides))
}

/// An output buffer shared by Rayon tasks that each write a part of it no other task writes (a
/// matrix product's bands, attention's rows of one sequence and head).
#[derive(Clone, Copy)]
pub(crate) struct SharedOutput(*mut f32);

// SAFETY: the users' tasks write disjoint parts of the buffer, and the buffer outlives them (they
// end inside the function that allocated it); each user's call sites say why theirs are disjoint.
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    pub(crate) fn of(buffer: &mut [MaybeUninit<f32>]) -> Self {
        Self(buffer.as_mut_ptr().cast())
    }

    /// The address of element `at`.
    ///
    /// # Safety
    /// `at` lies in the buffer (or one past its end).
    #[inline]
    pub(crate) unsafe fn at(self, at: usize) -> *mut f32 {
        // SAFETY: by the caller's guarantee.
        unsafe { self.0.add(at) }
    }

    /// Writes `values` at element `at`.
    ///
    /// # Safety
    /// `at..at + values.len()` lies in the buffer and no other task writes it.
    #[inline]
    pub(crate) unsafe fn write(self, at: usize, values: &[f32]) {
        const CHUNK: usize = 16;
        let (chunks, rest) = values.as_chunks::<CHUNK>();
        // SAFETY: by the caller's guarantee; whole chunks are moved as arrays, which the compiler
        // inlines, where a `copy_nonoverlapping` of a short row's length would call `memcpy`.
        unsafe {
            let out = self.at(at);
            for (k, chunk) in chunks.iter().enumerate() {
                out.add(k * CHUNK)
                    .cast::<[f32; CHUNK]>()
                    .write_unaligned(*chunk);
            }
            let out = out.add(chunks.len() * CHUNK);
            for (k, &x) in rest.iter().enumerate() {
                out.add(k).write(x);
            }
        }
    }
}

/// The elements of a buffer [`f32_buffers`] accepted.
pub(crate) fn slice(buffer: &FlexTensor) -> &[f32] {
    buffer
        .as_slice::<f32>()
        .expect("f32_buffers accepts contiguous f32 buffers only")
}
