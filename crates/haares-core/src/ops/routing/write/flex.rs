//! eq:update's signed sum on Burn's Flex backend as one SIMD pass over its host buffers (f32 and
//! f64, contiguous operands), where Burn's subtraction or scaled addition takes one or two.

use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::{DType, ElementConversion, Tensor};
use burn_flex::FlexTensor;
use macerator::{Simd, vload_unaligned, vstore_unaligned};
use rayon::prelude::*;

use super::{SourceWriteBackend, naive};
use crate::simd::{HostFloat, TASK_ELEMENTS, flex_tensor};

impl SourceWriteBackend for Flex {
    fn signed_sum<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> Tensor<Self, D> {
        let looped = match sum.dtype() {
            DType::F32 => host_signed_sum::<f32, D>(&sum, &term, sign),
            DType::F64 => host_signed_sum::<f64, D>(&sum, &term, sign),
            _ => None,
        };
        looped.unwrap_or_else(|| naive::signed_sum(sum, term, sign))
    }
}

/// `sum + sign · term` into a new buffer, when both are contiguous, of the loop's type, of one
/// shape and not empty; `None` otherwise (the plain operation runs).
fn host_signed_sum<F: HostFloat, const D: usize>(
    sum: &Tensor<Flex, D>,
    term: &Tensor<Flex, D>,
    sign: f64,
) -> Option<Tensor<Flex, D>> {
    let dims = sum.dims();
    if term.dims() != dims || dims.contains(&0) {
        return None;
    }
    let [sum_buffer, term_buffer]: [FlexTensor; 2] =
        [sum, term].map(|tensor| tensor.clone().into_primitive().tensor());
    let (sums, terms) = (sum_buffer.as_slice::<F>()?, term_buffer.as_slice::<F>()?);
    let sign: F = sign.elem();
    let mut out: Vec<F> = Vec::with_capacity(sums.len());
    // `with_capacity` may reserve more than asked: only the first `sums.len()` are written.
    out.spare_capacity_mut()[..sums.len()]
        .par_chunks_mut(TASK_ELEMENTS)
        .zip(sums.par_chunks(TASK_ELEMENTS))
        .zip(terms.par_chunks(TASK_ELEMENTS))
        .for_each(|((out, sums), terms)| signed_sum_task(sums, sign, terms, out));
    // SAFETY: the tasks above wrote every element of the `sums.len()` reserved.
    unsafe { out.set_len(sums.len()) };
    Some(flex_tensor(out, dims))
}

/// `out = sums + sign · terms`, a fused multiply–add per vector (exact for `sign = ±1`),
/// written into memory not yet initialised (a zero fill first would be one more pass).
#[macerator::with_simd]
fn signed_sum_task<'a, S: Simd, F: HostFloat>(
    sums: &'a [F],
    sign: F,
    terms: &'a [F],
    out: &mut [MaybeUninit<F>],
) {
    assert!(sums.len() == out.len() && terms.len() == out.len());
    let lanes = F::lanes::<S>();
    let signs = sign.splat::<S>();
    let out_ptr = out.as_mut_ptr().cast::<F>();
    let mut at = 0;
    while at + lanes <= out.len() {
        // SAFETY: `at + lanes ≤ len` for all three slices; `MaybeUninit<F>` has `F`'s layout.
        unsafe {
            let x = vload_unaligned::<S, F>(sums.as_ptr().add(at));
            let y = vload_unaligned::<S, F>(terms.as_ptr().add(at));
            vstore_unaligned::<S, F>(out_ptr.add(at), y.mul_add(signs, x));
        }
        at += lanes;
    }
    for ((out, &x), &y) in out[at..].iter_mut().zip(&sums[at..]).zip(&terms[at..]) {
        out.write(x + sign * y);
    }
}
