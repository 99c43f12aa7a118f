//! What the routing operator's loops on Flex share (`sums/flex.rs`, `sums/flex_add.rs`,
//! `write/flex.rs`, `read/flex_forward.rs`, `read/flex_backward.rs`): Flex's buffers as slices, a
//! `[tokens, d]` operand as rows, and the tokens of one task on Rayon's pool.

use burn::backend::Flex;
use burn::tensor::Tensor;
use burn_flex::FlexTensor;

use crate::simd::{HostFloat, TASK_ELEMENTS};

/// Flex's buffers behind some tensors.
pub(super) fn buffers(tensors: &[Tensor<Flex, 2>]) -> Vec<FlexTensor> {
    tensors
        .iter()
        .map(|tensor| tensor.clone().into_primitive().tensor())
        .collect()
}

/// Every buffer's elements as one contiguous slice, or `None`.
pub(super) fn slices<F: HostFloat>(buffers: &[FlexTensor]) -> Option<Vec<&[F]>> {
    buffers.iter().map(FlexTensor::as_slice::<F>).collect()
}

/// A `[tokens, d]` buffer, or one `[d]` row shared by all tokens.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a, F> {
    values: &'a [F],
    per_token: bool,
    pub(super) d_model: usize,
}

impl<'a, F> Rows<'a, F> {
    /// `rows` as the loops read them, for `tokens` tokens; `None` for any other shape and for
    /// empty rows.
    pub(super) fn new(rows: &Tensor<Flex, 2>, values: &'a [F], tokens: usize) -> Option<Self> {
        let [count, d_model] = rows.dims();
        let per_token = match count {
            _ if d_model == 0 || tokens == 0 => return None,
            1 => false,
            count if count == tokens => true,
            _ => return None,
        };
        Some(Self {
            values,
            per_token,
            d_model,
        })
    }

    pub(super) fn row(&self, token: usize) -> &'a [F] {
        match self.per_token {
            true => &self.values[token * self.d_model..][..self.d_model],
            false => self.values,
        }
    }
}

/// Tokens per task of the parallel loops: about 64 KiB of one slot's rows. It depends on the
/// width alone, not on the number of threads, so every result is the same however many threads
/// run (`weighted_total` adds its per-task sums in task order).
pub(super) fn tokens_per_task(d_model: usize) -> usize {
    (TASK_ELEMENTS / d_model).max(1)
}
