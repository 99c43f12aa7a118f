//! The routing operator on Burn's autodiff backend: the scores and the mixture are one graph node
//! each, with the backward passes of [`scores_backward`] and [`mixture_backward`].
//!
//! Burn's public extension API gives a custom node a fixed number of parents
//! (`Backward<B, N>`), while a read has 1 to hundreds of slots. A node therefore takes up to
//! [`SLOTS_PER_NODE`](super::autodiff_slots::SLOTS_PER_NODE) slots, unused parent positions are
//! filled with an untracked constant (which Burn leaves out of the graph), and a larger read is
//! split into chunks whose scores are concatenated and whose mixtures are summed. A source's mean
//! square is a node of its own, with the same one-pass backward.
//!
//! A source is read by every later read site, so its gradient is a sum over reads. Burn's
//! `Gradients::register` adds each node's contribution to that sum with one more pass; here each
//! backward pass takes the sum out of the container instead, and adds its slot gradients to it
//! in the same pass that forms them ([`RoutingBackend::add_scaled_rows`]).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::tensor::Tensor;

use crate::autodiff_node::{finish, primitive};
use crate::config::RoutingPath;

use super::autodiff_read::read_node;
use super::autodiff_slots::{
    SLOTS_PER_NODE, SlotsBackward, inner, padding, register, take_accumulated,
};
use super::{
    MixtureAndWeights, PairWrite, ReadBias, ReadNorm, ReadQuery, RmsMatching, RoutingBackend,
    ScoresForward, SlotRows, from_primitive, mixture_backward, scores_backward, scores_forward,
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

    fn row_mean_square(rows: Tensor<Self, 2>) -> Tensor<Self, 2> {
        mean_square_node(rows)
    }

    /// The inner backend's values: the multiplier untracked (no graph for a constant), the
    /// matched mean square a node whose backward pass gives `m_D` the gradient times `a²`.
    fn rms_match_multiplier(
        cumulative_mean_square: Tensor<Self, 2>,
        detail_mean_square: Tensor<Self, 2>,
        gamma: f64,
        epsilon: f64,
    ) -> (Tensor<Self, 2>, Tensor<Self, 2>) {
        let parents = [primitive(detail_mean_square.clone())];
        let (multiplier, matched) = B::rms_match_multiplier(
            cumulative_mean_square.inner(),
            detail_mean_square.inner(),
            gamma,
            epsilon,
        );
        let matched = finish(
            MatchedMeanSquareBackward::<2>,
            parents,
            multiplier.clone(),
            matched,
        );
        (Tensor::from_inner(multiplier), matched)
    }

    fn signed_sum<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> Tensor<Self, D> {
        let output = B::signed_sum(sum.clone().inner(), term.clone().inner(), sign);
        signed_sum_node(&sum, &term, sign, output)
    }

    /// The sum as [`signed_sum`](RoutingBackend::signed_sum)'s node, and the inner backend's
    /// mean square as a node over the sum.
    fn signed_sum_with_mean_square<const D: usize>(
        sum: Tensor<Self, D>,
        term: Tensor<Self, D>,
        sign: f64,
    ) -> (Tensor<Self, D>, Option<Tensor<Self, D>>) {
        let (output, mean_square) =
            B::signed_sum_with_mean_square(sum.clone().inner(), term.clone().inner(), sign);
        let node = signed_sum_node(&sum, &term, sign, output.clone());
        let mean_square = mean_square.map(|mean_square| mean_square_of(&node, output, mean_square));
        (node, mean_square)
    }

    /// The inner backend's values (one launch on the cube backends) with the nodes of the
    /// operations they replace: each sum's, each mean square's over its sum, and the matched
    /// mean square's; the multiplier untracked.
    fn pair_write<const D: usize>(
        cumulative: Tensor<Self, D>,
        detail: Option<Tensor<Self, D>>,
        term: Tensor<Self, D>,
        sign: f64,
        matching: RmsMatching,
    ) -> PairWrite<Self, D> {
        let inner = B::pair_write(
            cumulative.clone().inner(),
            detail.clone().map(Tensor::inner),
            term.clone().inner(),
            sign,
            matching,
        );
        let tracked = |base: &Tensor<Self, D>, sign: f64, (sum, mean_square): (Tensor<B, D>, _)| {
            let node = signed_sum_node(base, &term, sign, sum.clone());
            let mean_square = mean_square_of(&node, sum, mean_square);
            (node, mean_square)
        };
        let (cumulative, cumulative_mean_square) = tracked(
            &cumulative,
            1.0,
            (inner.cumulative, inner.cumulative_mean_square),
        );
        let detail = detail
            .zip(inner.detail)
            .map(|(base, sum)| tracked(&base, sign, sum));
        let detail_mean_square = detail
            .as_ref()
            .map_or(&cumulative_mean_square, |(_, mean_square)| mean_square);
        let parents = [primitive(detail_mean_square.clone())];
        let matched_mean_square = finish(
            MatchedMeanSquareBackward::<D>,
            parents,
            inner.multiplier.clone(),
            inner.matched_mean_square,
        );
        PairWrite {
            cumulative,
            cumulative_mean_square,
            detail,
            multiplier: Tensor::from_inner(inner.multiplier),
            matched_mean_square,
        }
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
        let read = super::read::compose(slots, &query, bias.as_ref(), epsilon, norm.as_ref());
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
    let forward = scores_forward(&inner_slots, inner_query.clone(), epsilon);
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
    let output = B::routing_mixture(&inner_slots, inner_weights.clone());
    let state = MixtureState {
        slots: inner_slots,
        weights: inner_weights,
    };
    finish(MixtureBackward, parents, state, output)
}

/// The backward pass of a mean square over the last dimension,
/// [`RoutingBackend::row_mean_square_backward`] on the tensor's token rows.
#[derive(Debug)]
struct MeanSquareBackward<const D: usize>;

impl<B: RoutingBackend, const D: usize> Backward<B, 1> for MeanSquareBackward<D> {
    /// The tensor whose mean square was taken.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let into = take_accumulated(grads, &ops, 1, &grad).pop().flatten();
        let shape = ops.state.dims();
        let d_model = shape[D - 1];
        let tokens = ops.state.shape().num_elements() / d_model;
        let rows = |tensor: Tensor<B, D>| tensor.reshape([tokens, d_model]);
        let value =
            B::row_mean_square_backward(into.map(rows), grad.reshape([tokens, 1]), rows(ops.state));
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        register(grads, &parents, vec![Some(value.reshape(shape))]);
    }
}

fn mean_square_node<B: RoutingBackend, C: CheckpointStrategy>(
    rows: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let inner_rows = rows.clone().inner();
    let output = B::row_mean_square(inner_rows.clone());
    mean_square_of(&rows, inner_rows, output)
}

/// The node of `sum + sign · term` over the inner backend's `output`.
fn signed_sum_node<B: RoutingBackend, C: CheckpointStrategy, const D: usize>(
    sum: &Tensor<Autodiff<B, C>, D>,
    term: &Tensor<Autodiff<B, C>, D>,
    sign: f64,
    output: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D> {
    let parents = [primitive(term.clone()), primitive(sum.clone())];
    finish(SignedSumBackward::<D>, parents, sign, output)
}

/// The node of the mean square over the last dimension of `node`, whose inner value is `value`,
/// over the inner backend's `mean_square`.
fn mean_square_of<B: RoutingBackend, C: CheckpointStrategy, const D: usize>(
    node: &Tensor<Autodiff<B, C>, D>,
    value: Tensor<B, D>,
    mean_square: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D> {
    finish(
        MeanSquareBackward::<D>,
        [primitive(node.clone())],
        value,
        mean_square,
    )
}

/// The backward pass of the matched mean square `m_D · a²` of
/// [`RoutingBackend::rms_match_multiplier`]: `∂m_D = g · a²`, as the product's backward pass
/// forms it (`a²` rounded first). It runs only where a gradient reaches it (a read that does not
/// fold mean squares).
#[derive(Debug)]
struct MatchedMeanSquareBackward<const D: usize>;

impl<B: RoutingBackend, const D: usize> Backward<B, 1> for MatchedMeanSquareBackward<D> {
    /// The multiplier `a`.
    type State = Tensor<B, D>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let square = ops.state.clone() * ops.state;
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        register(grads, &parents, vec![Some(grad * square)]);
    }
}

/// The backward pass of [`RoutingBackend::signed_sum`]; its parents are `[term, sum]`.
#[derive(Debug)]
struct SignedSumBackward<const D: usize>;

impl<B: RoutingBackend, const D: usize> Backward<B, 2> for SignedSumBackward<D> {
    /// The sign.
    type State = f64;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: Tensor<B, D> = from_primitive(grads.consume::<B>(&ops.node));
        let sign = ops.state;
        let accumulated = take_accumulated(grads, &ops, 1, &grad).pop().flatten();
        let parents = ops.parents.map(|parent| parent.map(|node| node.id));
        let term = parents[0].map(|_| match accumulated {
            Some(accumulated) => B::signed_sum(accumulated, grad.clone(), sign),
            None if sign == 1.0 => grad.clone(),
            None => grad.clone().mul_scalar(sign),
        });
        register(grads, &parents, vec![term, Some(grad)]);
    }
}
