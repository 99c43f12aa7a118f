//! AdamW's update of one parameter on Flex as one pass over its f32 buffers: read `p`, `g`, `m`,
//! `v` once, write `p`, `m`, `v` once, in tasks on Rayon's pool. As tensor operations
//! ([`update_plain`](super::rule::update_plain)) the update is about ten passes, each allocating
//! its output, and Flex runs its scalar operations on one thread: 3.9% of a `cpu`-preset step
//! (docs/notebook/cpu-speed.md). Each element takes the plain path's f32 operations in its order, with
//! the same f32 constants, so both paths give the same bits.
//!
//! The optimizer is generic over the backend; Flex is recognised by its type (`Any`), since a
//! backend trait for it would put a bound on every generic user of
//! [`AdamW`](crate::run::optim::AdamW).

use std::any::Any;
use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::rule::{F32Rule, Moments, UpdateRule};

/// Elements per task: large enough that a task's bookkeeping is negligible.
const TASK_ELEMENTS: usize = 1 << 15;

/// `x` as a `U`, when `T` is `U`.
fn same_type<T: 'static, U: 'static>(x: T) -> Option<U> {
    (Box::new(x) as Box<dyn Any>)
        .downcast::<U>()
        .ok()
        .map(|b| *b)
}

/// The updated parameter, with `moments` updated, when `B` is Flex and every buffer is f32 and
/// contiguous; `None` (nothing changed) otherwise.
pub(crate) fn update<B: Backend>(
    rule: &UpdateRule,
    value: &Tensor<B, 1>,
    grad: &Tensor<B, 1>,
    moments: &mut Moments<B>,
) -> Option<Tensor<B, 1>> {
    let value = (value as &dyn Any).downcast_ref::<Tensor<Flex, 1>>()?;
    let grad = (grad as &dyn Any).downcast_ref::<Tensor<Flex, 1>>()?;
    let moments = (moments as &mut dyn Any).downcast_mut::<Moments<Flex>>()?;
    let flex = |tensor: &Tensor<Flex, 1>| {
        let buffer = tensor.clone().into_primitive().tensor();
        (tensor.dtype() == DType::F32).then_some(buffer)
    };
    let buffers = [value, grad, &moments.exp_avg, &moments.exp_avg_sq].map(flex);
    let [Some(p), Some(g), Some(m), Some(v)] = buffers else {
        return None;
    };
    let [p, g, m, v] = [&p, &g, &m, &v].map(|buffer| buffer.as_slice::<f32>());
    let (Some(p), Some(g), Some(m), Some(v)) = (p, g, m, v) else {
        return None;
    };
    let len = p.len();
    if [g.len(), m.len(), v.len()] != [len; 3] {
        return None;
    }
    let constants = F32Rule::new(rule);
    let [mut new_p, mut new_m, mut new_v] = [(); 3].map(|_| Vec::<f32>::with_capacity(len));
    // `with_capacity` may reserve more than asked: only the first `len` are written.
    let outputs = [&mut new_p, &mut new_m, &mut new_v]
        .map(|out| out.spare_capacity_mut()[..len].par_chunks_mut(TASK_ELEMENTS));
    let [out_p, out_m, out_v] = outputs;
    (out_p.zip(out_m).zip(out_v).enumerate()).for_each(|(task, ((out_p, out_m), out_v))| {
        let at = task * TASK_ELEMENTS;
        let inputs = [p, g, m, v].map(|x| &x[at..at + out_p.len()]);
        constants.apply(inputs, [out_p, out_m, out_v]);
    });
    // SAFETY: every task wrote each element of its three chunks.
    for out in [&mut new_p, &mut new_m, &mut new_v] {
        unsafe { out.set_len(len) };
    }
    let device = value.device();
    let tensor =
        |values: Vec<f32>| Tensor::<Flex, 1>::from_data(TensorData::new(values, [len]), &device);
    // Converted back before the moments change, so that `None` always means nothing changed.
    let updated = same_type(tensor(new_p))?;
    moments.exp_avg = tensor(new_m);
    moments.exp_avg_sq = tensor(new_v);
    Some(updated)
}

impl F32Rule {
    /// [`update_plain`](super::rule::update_plain) element by element, in its order: writes
    /// every element of the new `p`, `m`, `v`.
    fn apply(
        &self,
        [p, g, m, v]: [&[f32]; 4],
        [out_p, out_m, out_v]: [&mut [MaybeUninit<f32>]; 3],
    ) {
        for at in 0..out_p.len() {
            let grad = self.clip.map_or(g[at], |scale| g[at] * scale);
            let exp_avg = m[at] * self.beta1 + grad * self.one_minus_beta1;
            let exp_avg_sq = v[at] * self.beta2 + (grad * grad) * self.one_minus_beta2;
            let denominator = exp_avg_sq.sqrt() / self.bias2_root + self.epsilon;
            let decayed = self.decay.map_or(p[at], |factor| p[at] * factor);
            out_p[at].write(decayed - (exp_avg / denominator) * self.step_size);
            out_m[at].write(exp_avg);
            out_v[at].write(exp_avg_sq);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::run::optim::checks;

    /// More than two tasks' worth of elements, with a partial last one.
    #[test]
    fn the_pass_gives_the_plain_operations_bits() {
        checks::gives_the_plain_operations_bits(
            super::update::<burn::backend::Flex>,
            2 * super::TASK_ELEMENTS + 1000,
        );
    }

    #[cfg(feature = "ndarray")]
    #[test]
    fn other_backends_take_the_plain_operations() {
        checks::leaves_other_backends_alone(super::update);
    }
}
