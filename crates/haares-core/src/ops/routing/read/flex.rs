//! A whole read on Burn's Flex backend: the loops of `flex_forward.rs` and `flex_backward.rs`,
//! token by token, with Flex's own fused RMSNorm after the forward loops and before the backward
//! ones.

use burn::backend::Flex;
use burn::tensor::Tensor;

use super::{
    ReadBackward, ReadBias, ReadForward, ReadGradients, ReadNorm, ReadQuery, RoutingBackend,
};
use crate::ops::NormBackend;
use crate::ops::routing::SlotRows;

impl RoutingBackend for Flex {
    fn routing_read_forward(
        slots: &[SlotRows<Self>],
        query: &ReadQuery<Self>,
        bias: Option<&ReadBias<Self>>,
        epsilon: f64,
        norm: Option<&ReadNorm<Self>>,
    ) -> ReadForward<Self> {
        // The norm is Flex's own fused pass after the read's loops.
        let read = super::flex_forward::read_forward(slots, query, bias, epsilon);
        ReadForward {
            normed: norm
                .map(|norm| Self::rms_norm(read.mixture.clone(), norm.gain.clone(), norm.epsilon)),
            ..read
        }
    }

    fn routing_read_backward(
        read: ReadBackward<Self>,
        into: Vec<Option<Tensor<Self, 2>>>,
        wanted: &[bool],
        mean_squares_wanted: &[bool],
    ) -> ReadGradients<Self> {
        let (read, gain) = read.without_norm();
        let gradients =
            super::flex_backward::read_backward(read, into, wanted, mean_squares_wanted);
        ReadGradients { gain, ..gradients }
    }
}
