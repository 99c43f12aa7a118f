//! A whole read (`read.rs`) on Burn's autodiff backend. Burn's custom nodes have one output, and a
//! read has two, the mixture and the weights, whose gradients one backward pass needs together.
//! So the read is a node whose output is the mixture, and the weights are a second node whose
//! only parent is the first. Burn runs a child's backward pass before its parent's: the weights
//! node hands its gradient to the read node through a shared cell, and the read node's backward
//! pass ([`RoutingBackend::routing_read_backward`]) then forms every input's gradient at once.

use std::sync::{Arc, Mutex};

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::Tensor;

use super::autodiff::{SLOTS_PER_NODE, SlotsBackward, inner, padding, register};
use super::{MixtureAndWeights, ReadBackward, RoutingBackend, SlotRows};
use crate::autodiff_node::{from_primitive, primitive};

/// Parents of a read node: every slot's rows and mean square, the folded query, the bias.
const READ_PARENTS: usize = 2 * SLOTS_PER_NODE + 2;

/// `∂L/∂α`, from the weights node's backward pass to the read node's.
type WeightsGrad<B> = Arc<Mutex<Option<Tensor<B, 2>>>>;

/// What a read node keeps for its backward pass: the sources (held by the bank anyway), the
/// query and `[S, tokens]` scalars.
#[derive(Debug, Clone)]
struct ReadState<B: RoutingBackend> {
    slots: Vec<SlotRows<B>>,
    folded_query: Tensor<B, 1>,
    epsilon: f64,
    scores: Tensor<B, 2>,
    weights: Tensor<B, 2>,
    weights_grad: WeightsGrad<B>,
}

#[derive(Debug)]
struct ReadNodeBackward;

impl<B: RoutingBackend> Backward<B, READ_PARENTS> for ReadNodeBackward {
    type State = ReadState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, READ_PARENTS>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let count = ops.state.slots.len();
        let start = SlotsBackward::start(&ops, grads, count);
        let (wanted, mean_squares_wanted) =
            (start.wanted(0, count), start.wanted(SLOTS_PER_NODE, count));
        let (grad, into, parents) = (start.grad, start.into, start.parents);
        let state = ops.state;
        let weights_grad = state
            .weights_grad
            .lock()
            .expect("the weights' gradient cell is never poisoned")
            .take();
        let same_rows = same_rows(&parents[..count]);
        let read = ReadBackward {
            same_rows,
            slots: state.slots,
            folded_query: state.folded_query,
            epsilon: state.epsilon,
            scores: state.scores,
            weights: state.weights,
            mixture_grad: grad,
            weights_grad,
        };
        let gradients = B::routing_read_backward(read, into, &wanted, &mean_squares_wanted);
        register(grads, &parents, gradients.raws);
        register(grads, &parents[SLOTS_PER_NODE..], gradients.mean_squares);
        let [query, bias] = [2 * SLOTS_PER_NODE, 2 * SLOTS_PER_NODE + 1];
        register(grads, &parents[query..], vec![Some(gradients.folded_query)]);
        register(grads, &parents[bias..], vec![Some(gradients.bias)]);
    }
}

/// For each slot, the first slot with the same rows node (itself for untracked rows).
fn same_rows(rows: &[Option<NodeId>]) -> Vec<usize> {
    let first_with = |slot: usize, node: NodeId| (0..slot).find(|&at| rows[at] == Some(node));
    (0..rows.len())
        .map(|slot| {
            rows[slot]
                .and_then(|node| first_with(slot, node))
                .unwrap_or(slot)
        })
        .collect()
}

/// What a weights node keeps: the cell it fills, and the mixture's shape.
#[derive(Debug, Clone)]
struct WeightsState<B: RoutingBackend> {
    weights_grad: WeightsGrad<B>,
    mixture_shape: [usize; 2],
}

#[derive(Debug)]
struct WeightsBackward;

impl<B: RoutingBackend> Backward<B, 1> for WeightsBackward {
    type State = WeightsState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, 2> = from_primitive(grads.consume::<B>(&ops.node));
        let device = grad.device();
        *ops.state
            .weights_grad
            .lock()
            .expect("the weights' gradient cell is never poisoned") = Some(grad);
        // Burn runs the read node's backward pass only when its own output has a gradient: a
        // zero one makes it run when the weights reach the loss and the mixture does not.
        let zero = Tensor::<B, 2>::zeros(ops.state.mixture_shape, &device);
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        register(grads, &parents, vec![Some(zero)]);
    }
}

/// The read of up to [`SLOTS_PER_NODE`] slots as a read node and a weights node.
pub(super) fn read_node<B: RoutingBackend, C: CheckpointStrategy>(
    slots: &[SlotRows<Autodiff<B, C>>],
    folded_query: Tensor<Autodiff<B, C>, 1>,
    bias: Option<Tensor<Autodiff<B, C>, 2>>,
    epsilon: f64,
) -> MixtureAndWeights<Autodiff<B, C>> {
    let filler = padding(&slots[0].raw);
    let mut parents: [_; READ_PARENTS] = core::array::from_fn(|_| filler.node.clone());
    for (position, slot) in slots.iter().enumerate() {
        parents[position] = primitive(slot.raw.clone()).node;
        parents[SLOTS_PER_NODE + position] = primitive(slot.mean_square.clone()).node;
    }
    parents[2 * SLOTS_PER_NODE] = primitive(folded_query.clone()).node;
    if let Some(bias) = &bias {
        parents[2 * SLOTS_PER_NODE + 1] = primitive(bias.clone()).node;
    }

    let inner_slots: Vec<_> = slots.iter().map(inner).collect();
    let inner_query = folded_query.inner();
    let forward = B::routing_read_forward(
        &inner_slots,
        inner_query.clone(),
        bias.map(Tensor::inner),
        epsilon,
    );
    let weights_grad = WeightsGrad::default();
    let mixture_shape = forward.mixture.dims();
    let mixture_output = forward.mixture.into_primitive().tensor();
    let mixture = match ReadNodeBackward
        .prepare::<C>(parents)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            ReadState {
                slots: inner_slots,
                folded_query: inner_query,
                epsilon,
                scores: forward.scores,
                weights: forward.weights.clone(),
                weights_grad: weights_grad.clone(),
            },
            mixture_output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(mixture_output),
    };
    let weights_output = forward.weights.into_primitive().tensor();
    let weights = match WeightsBackward
        .prepare::<C>([mixture.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            WeightsState {
                weights_grad,
                mixture_shape,
            },
            weights_output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(weights_output),
    };
    (from_primitive(mixture), from_primitive(weights))
}
