//! A whole read on Burn's autodiff backend. Burn's custom nodes have one output, and a
//! read has two, the mixture (or its norm, for a read with a [`ReadNorm`]) and the weights: two
//! nodes over the same parents and the same forward pass. Each one's backward pass
//! ([`RoutingBackend::routing_read_backward`]) forms the gradients that flow through its own
//! output, through the softmax inside the read, and Burn adds them where both outputs reach the
//! loss. A training loss uses the mixture alone, so a step runs the
//! mixture's backward pass only.
//!
//! (A first design made the weights a node whose parent was the read node, handing `∂α` to it
//! through a shared cell so that one backward pass served both. With several threads building
//! graphs at once, the router query's gradient went missing in about one test run in two; Burn's
//! graph cleanup, which runs at the end of any thread's backward pass over every graph,
//! interacted with that node pair. `tests/core/fused.rs` runs its cases on parallel test
//! threads, and every output reaching the loss alone and together.)

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::{
    MixtureAndWeights, NormBackward, ReadBackward, ReadBias, ReadNorm, ReadQuery, RoutingBackend,
};
use crate::autodiff_node::{finish, primitive};
use crate::ops::routing::SlotRows;
use crate::ops::routing::autodiff_slots::{
    SLOTS_PER_NODE, SlotsBackward, inner, padding, register,
};

/// Parents of a read node: every slot's rows and mean square (none where the backend
/// [folds them](RoutingBackend::folds_mean_squares)), the query, the key weight, the bias, the
/// norm's gain.
const READ_PARENTS: usize = 2 * SLOTS_PER_NODE + 4;
/// Position of the query among a read node's parents; the key weight, the bias and the gain
/// follow it.
const QUERY: usize = 2 * SLOTS_PER_NODE;
const KEY_WEIGHT: usize = QUERY + 1;
const BIAS: usize = QUERY + 2;
const GAIN: usize = QUERY + 3;

/// What a read node keeps for its backward pass: the sources (held by the bank anyway), the
/// query, `[S, tokens]` scalars, and with a norm the mixture it normalised (which a separate
/// norm node would keep instead).
#[derive(Debug, Clone)]
struct ReadState<B: RoutingBackend> {
    slots: Vec<SlotRows<B>>,
    query: ReadQuery<B>,
    biased_slots: Vec<bool>,
    epsilon: f64,
    scores: Tensor<B, 2>,
    weights: Tensor<B, 2>,
    norm: Option<NormBackward<B>>,
}

/// Which output of the read a node is. Each node's backward pass forms the gradients that flow
/// through its own output, and Burn adds the two where both outputs reach the loss.
#[derive(Debug)]
enum ReadNodeBackward {
    Mixture,
    Weights,
}

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
        let same_rows = same_rows(&parents[..count]);
        // The weights are formed before the norm: their gradient does not pass through it.
        let (mixture_grad, weights_grad, norm) = match self {
            Self::Mixture => (grad, None, state.norm),
            Self::Weights => {
                let [tokens, d_model] = state.slots[0].raw.dims();
                let zeros = Tensor::zeros([tokens, d_model], &grad.device());
                (zeros, Some(grad), None)
            }
        };
        let bias_wanted = parents[BIAS].is_some();
        let read = ReadBackward {
            bias_wanted,
            fold_mean_squares: B::folds_mean_squares(),
            same_rows,
            slots: state.slots,
            query: state.query,
            biased_slots: state.biased_slots,
            epsilon: state.epsilon,
            scores: state.scores,
            weights: state.weights,
            mixture_grad,
            weights_grad,
            norm,
        };
        let gradients = B::routing_read_backward(read, into, &wanted, &mean_squares_wanted);
        register(grads, &parents, gradients.raws);
        register(grads, &parents[SLOTS_PER_NODE..], gradients.mean_squares);
        register(grads, &parents[QUERY..], vec![Some(gradients.query.query)]);
        register(
            grads,
            &parents[KEY_WEIGHT..],
            vec![Some(gradients.query.key_weight)],
        );
        register(grads, &parents[BIAS..], vec![gradients.bias]);
        register(grads, &parents[GAIN..], vec![gradients.gain]);
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

/// The read of up to [`SLOTS_PER_NODE`] slots as an output node (the mixture, or its norm) and a
/// weights node.
pub(super) fn read_node<B: RoutingBackend, C: CheckpointStrategy>(
    slots: &[SlotRows<Autodiff<B, C>>],
    query: ReadQuery<Autodiff<B, C>>,
    bias: Option<ReadBias<Autodiff<B, C>>>,
    epsilon: f64,
    norm: Option<ReadNorm<Autodiff<B, C>>>,
) -> MixtureAndWeights<Autodiff<B, C>> {
    // The parents are held as tensors, not just nodes, until the node is registered: a
    // temporary such as a fixed bias has no other holder, and Burn's graph cleanup (run at the
    // end of any thread's backward pass) frees an unregistered root whose tensor is gone.
    let filler = padding(&slots[0].raw);
    let mut parents: [_; READ_PARENTS] = core::array::from_fn(|_| filler.clone());
    for (position, slot) in slots.iter().enumerate() {
        parents[position] = primitive(slot.raw.clone());
        // A backend that folds mean squares takes their gradients through the rows.
        if !B::folds_mean_squares() {
            parents[SLOTS_PER_NODE + position] = primitive(slot.mean_square.clone());
        }
    }
    parents[QUERY] = primitive(query.query.clone());
    parents[KEY_WEIGHT] = primitive(query.key_weight.clone());
    if let Some(bias) = &bias {
        parents[BIAS] = primitive(bias.value.clone());
    }
    if let Some(norm) = &norm {
        parents[GAIN] = primitive(norm.gain.clone());
    }

    let inner_slots: Vec<_> = slots.iter().map(inner).collect();
    let inner_query = ReadQuery {
        query: query.query.inner(),
        key_weight: query.key_weight.inner(),
    };
    let inner_bias = bias.map(|bias| ReadBias {
        value: bias.value.inner(),
        slots: bias.slots,
    });
    let inner_norm = norm.map(|norm| ReadNorm {
        gain: norm.gain.inner(),
        epsilon: norm.epsilon,
    });
    let forward = crate::op_times::forward(module_path!(), || {
        B::routing_read_forward(
            &inner_slots,
            &inner_query,
            inner_bias.as_ref(),
            epsilon,
            inner_norm.as_ref(),
        )
    });
    let read_state = ReadState {
        slots: inner_slots,
        query: inner_query,
        biased_slots: inner_bias.map_or_else(|| vec![false; slots.len()], |bias| bias.slots),
        epsilon,
        scores: forward.scores,
        weights: forward.weights.clone(),
        norm: inner_norm.map(|norm| NormBackward {
            norm,
            mixture: forward.mixture.clone(),
        }),
    };
    let output = forward.normed.unwrap_or(forward.mixture);
    let mixture = finish(
        ReadNodeBackward::Mixture,
        parents.clone(),
        read_state.clone(),
        output,
    );
    let weights = finish(
        ReadNodeBackward::Weights,
        parents,
        read_state,
        forward.weights,
    );
    (mixture, weights)
}
