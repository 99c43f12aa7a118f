//! What every routing node on Burn's autodiff backend shares ([`super::autodiff`] for the scores,
//! mixtures and mean squares, [`super::autodiff_read`] for the fused read): how many slots one
//! node takes, the padding of unused parent positions, and the start of a backward pass over
//! slots, which takes each slot's gradient accumulated so far out of the container.

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::Ops;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::autodiff_node::{AutodiffPrimitive, primitive};

use super::SlotRows;
use crate::autodiff_node::from_primitive;

/// Slots one graph node takes.
pub(in crate::ops) const SLOTS_PER_NODE: usize = 16;

/// The slot on the inner backend (the values, without their graph).
pub(in crate::ops) fn inner<B: Backend, C: CheckpointStrategy>(
    slot: &SlotRows<Autodiff<B, C>>,
) -> SlotRows<B> {
    SlotRows {
        raw: slot.raw.clone().inner(),
        scale: slot.scale.clone().map(Tensor::inner),
        mean_square: slot.mean_square.clone().inner(),
    }
}

/// An untracked tensor that fills unused parent positions: `like`'s values without its graph, so
/// that no constant is made (a kernel launch per node on the GPU backends).
pub(in crate::ops) fn padding<B: Backend, C: CheckpointStrategy>(
    like: &Tensor<Autodiff<B, C>, 2>,
) -> AutodiffPrimitive<B, C> {
    primitive(Tensor::<Autodiff<B, C>, 2>::from_inner(
        like.clone().inner(),
    ))
}

/// Which of these parents take a gradient (untracked inputs and padding do not).
fn tracked(parents: &[Option<NodeId>]) -> Vec<bool> {
    parents.iter().map(Option::is_some).collect()
}

/// Hands each computed gradient to its parent, position by position.
pub(in crate::ops) fn register<B: Backend, const D: usize>(
    grads: &mut Gradients,
    parents: &[Option<NodeId>],
    gradients: Vec<Option<Tensor<B, D>>>,
) {
    for (parent, gradient) in parents.iter().zip(gradients) {
        if let (Some(node), Some(gradient)) = (parent, gradient) {
            grads.register::<B>(*node, gradient.into_primitive().tensor());
        }
    }
}

/// Takes out of the container the gradient that each of the first `slots` parents has
/// accumulated so far (`None` for untracked parents and those without one yet); the caller adds
/// its own share and registers the sums.
pub(in crate::ops) fn take_accumulated<B: Backend, S, const N: usize, const D: usize>(
    grads: &mut Gradients,
    ops: &Ops<S, N>,
    slots: usize,
    like: &Tensor<B, D>,
) -> Vec<Option<Tensor<B, D>>> {
    // `Gradients::remove` looks a gradient up by the node of an autodiff tensor: an untracked one
    // over any inner tensor, pointed at each parent in turn.
    let mut key = Tensor::<Autodiff<B>, D>::from_inner(like.clone())
        .into_primitive()
        .tensor();
    ops.parents[..slots]
        .iter()
        .map(|parent| {
            let node = parent.as_ref()?;
            key.node = node.clone();
            grads.remove::<B>(&key).map(from_primitive)
        })
        .collect()
}

/// What the backward pass of a node over slots starts from: its output's gradient, the gradient
/// each of the first slots' parents has accumulated so far (taken out of the container, see
/// [`take_accumulated`]), and every parent's id.
pub(in crate::ops) struct SlotsBackward<B: Backend> {
    pub(in crate::ops) grad: Tensor<B, 2>,
    pub(in crate::ops) into: Vec<Option<Tensor<B, 2>>>,
    pub(in crate::ops) parents: Vec<Option<NodeId>>,
}

impl<B: Backend> SlotsBackward<B> {
    pub(in crate::ops) fn start<S, const N: usize>(
        ops: &Ops<S, N>,
        grads: &mut Gradients,
        slots: usize,
    ) -> Self {
        let grad = from_primitive(grads.consume::<B>(&ops.node));
        let into = take_accumulated(grads, ops, slots, &grad);
        let parents = ops
            .parents
            .iter()
            .map(|parent| parent.as_ref().map(|node| node.id));
        Self {
            grad,
            into,
            parents: parents.collect(),
        }
    }

    /// Which of the `count` parents from `first` on take a gradient.
    pub(in crate::ops) fn wanted(&self, first: usize, count: usize) -> Vec<bool> {
        tracked(&self.parents[first..][..count])
    }
}
