//! The read on Burn's autodiff backend: a whole read as one graph node where its slots fit one
//! (`autodiff_read.rs`), and otherwise the scores and the mixture as one graph node each, with
//! the backward passes of [`scores_backward`] and [`mixture_backward`].
//!
//! Burn's public extension API gives a custom node a fixed number of parents
//! (`Backward<B, N>`), while a read has 1 to hundreds of slots. A node therefore takes up to
//! [`SLOTS_PER_NODE`] slots, unused parent positions are filled with an untracked constant (which
//! Burn leaves out of the graph), and a larger read is split into chunks whose scores are
//! concatenated and whose mixtures are summed.
//!
//! A source is read by every later read site, so its gradient is a sum over reads. Burn's
//! `Gradients::register` adds each node's contribution to that sum with one more pass; here each
//! backward pass takes the sum out of the container instead, and adds its slot gradients to it
//! in the same pass that forms them ([`SlotSumsBackend::add_scaled_rows`]).
//!
//! [`SlotSumsBackend::add_scaled_rows`]: crate::ops::SlotSumsBackend::add_scaled_rows

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use super::RoutingPath;
use crate::autodiff_node::{finish, primitive};

use super::autodiff_read::read_node;
use super::naive::{ScoresForward, mixture_backward, scores_backward, scores_forward};
use super::{MixtureAndWeights, ReadBias, ReadNorm, ReadQuery, RoutingBackend, naive};
use crate::ops::routing::SlotRows;
use crate::ops::routing::autodiff_slots::{
    SLOTS_PER_NODE, SlotsBackward, inner, padding, register,
};

/// Parents of a scores node: every slot's rows and mean square, then the folded query.
const SCORES_PARENTS: usize = 2 * SLOTS_PER_NODE + 1;

/// Parents of a mixture node: every slot's rows, then the weights.
const MIXTURE_PARENTS: usize = SLOTS_PER_NODE + 1;

impl<B: RoutingBackend, C: CheckpointStrategy> RoutingBackend for Autodiff<B, C> {
    fn auto_routing() -> RoutingPath {
        B::auto_routing()
    }

    fn routing_scores(
        slots: &[SlotRows<Self>],
        folded_query: Tensor<Self, 1>,
        epsilon: f64,
    ) -> Tensor<Self, 2> {
        let chunks = slots
            .chunks(SLOTS_PER_NODE)
            .map(|chunk| scores_node(chunk, folded_query.clone(), epsilon))
            .collect();
        Tensor::cat(chunks, 0)
    }

    fn routing_read(
        slots: &[SlotRows<Self>],
        query: ReadQuery<Self>,
        bias: Option<ReadBias<Self>>,
        epsilon: f64,
        norm: Option<ReadNorm<Self>>,
    ) -> MixtureAndWeights<Self> {
        if slots.len() <= SLOTS_PER_NODE {
            return read_node(slots, query, bias, epsilon, norm);
        }
        // The softmax spans every slot, which one node cannot take: the two operations' nodes.
        let read = naive::compose(slots, &query, bias.as_ref(), epsilon, norm.as_ref());
        (read.normed.unwrap_or(read.mixture), read.weights)
    }

    fn routing_mixture(slots: &[SlotRows<Self>], weights: Tensor<Self, 2>) -> Tensor<Self, 2> {
        slots
            .chunks(SLOTS_PER_NODE)
            .enumerate()
            .map(|(chunk, slots)| {
                let weights = weights
                    .clone()
                    .narrow(0, chunk * SLOTS_PER_NODE, slots.len());
                mixture_node(slots, weights)
            })
            .reduce(|sum, part| sum + part)
            .expect("a read has at least one slot")
    }
}

/// What a scores node keeps for its backward pass: the sources (held by the bank anyway), the
/// query and `[S, tokens]` scalars.
#[derive(Debug, Clone)]
struct ScoresState<B: RoutingBackend> {
    slots: Vec<SlotRows<B>>,
    folded_query: Tensor<B, 1>,
    forward: ScoresForward<B>,
}

#[derive(Debug)]
struct ScoresBackward;

impl<B: RoutingBackend> Backward<B, SCORES_PARENTS> for ScoresBackward {
    type State = ScoresState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, SCORES_PARENTS>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let count = ops.state.slots.len();
        let start = SlotsBackward::start(&ops, grads, count);
        let (raws_wanted, mean_squares_wanted) =
            (start.wanted(0, count), start.wanted(SLOTS_PER_NODE, count));
        let (grad, into, parents) = (start.grad, start.into, start.parents);
        let state = ops.state;
        let gradients = scores_backward(
            &state.slots,
            state.folded_query,
            state.forward,
            grad,
            into,
            &raws_wanted,
            &mean_squares_wanted,
        );
        register(grads, &parents, gradients.raws);
        register(grads, &parents[SLOTS_PER_NODE..], gradients.mean_squares);
        register(
            grads,
            &parents[2 * SLOTS_PER_NODE..],
            vec![Some(gradients.folded_query)],
        );
    }
}

fn scores_node<B: RoutingBackend, C: CheckpointStrategy>(
    slots: &[SlotRows<Autodiff<B, C>>],
    folded_query: Tensor<Autodiff<B, C>, 1>,
    epsilon: f64,
) -> Tensor<Autodiff<B, C>, 2> {
    let filler = padding(&slots[0].raw);
    let mut parents: [_; SCORES_PARENTS] = core::array::from_fn(|_| filler.clone());
    for (position, slot) in slots.iter().enumerate() {
        parents[position] = primitive(slot.raw.clone());
        parents[SLOTS_PER_NODE + position] = primitive(slot.mean_square.clone());
    }
    parents[2 * SLOTS_PER_NODE] = primitive(folded_query.clone());

    let inner_slots: Vec<_> = slots.iter().map(inner).collect();
    let inner_query = folded_query.inner();
    let forward = crate::op_times::forward(module_path!(), || {
        scores_forward(&inner_slots, inner_query.clone(), epsilon)
    });
    let output = forward.scores.clone();
    let state = ScoresState {
        slots: inner_slots,
        folded_query: inner_query,
        forward,
    };
    finish(ScoresBackward, parents, state, output)
}

/// What a mixture node keeps for its backward pass: the sources and the weights.
#[derive(Debug, Clone)]
struct MixtureState<B: RoutingBackend> {
    slots: Vec<SlotRows<B>>,
    weights: Tensor<B, 2>,
}

#[derive(Debug)]
struct MixtureBackward;

impl<B: RoutingBackend> Backward<B, MIXTURE_PARENTS> for MixtureBackward {
    type State = MixtureState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, MIXTURE_PARENTS>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let start = SlotsBackward::start(&ops, grads, ops.state.slots.len());
        let wanted = start.wanted(0, ops.state.slots.len());
        let (grad, into, parents) = (start.grad, start.into, start.parents);
        let state = ops.state;
        let (raws, weights) = mixture_backward(&state.slots, state.weights, grad, into, &wanted);
        register(grads, &parents, raws);
        register(grads, &parents[SLOTS_PER_NODE..], vec![Some(weights)]);
    }
}

fn mixture_node<B: RoutingBackend, C: CheckpointStrategy>(
    slots: &[SlotRows<Autodiff<B, C>>],
    weights: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let filler = padding(&slots[0].raw);
    let mut parents: [_; MIXTURE_PARENTS] = core::array::from_fn(|_| filler.clone());
    for (position, slot) in slots.iter().enumerate() {
        parents[position] = primitive(slot.raw.clone());
    }
    parents[SLOTS_PER_NODE] = primitive(weights.clone());

    let inner_slots: Vec<_> = slots.iter().map(inner).collect();
    let inner_weights = weights.inner();
    let output = crate::op_times::forward(module_path!(), || {
        B::routing_mixture(&inner_slots, inner_weights.clone())
    });
    let state = MixtureState {
        slots: inner_slots,
        weights: inner_weights,
    };
    finish(MixtureBackward, parents, state, output)
}
