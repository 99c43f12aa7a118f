//! The values a read takes and gives: its query, bias and norm, its forward pass's outputs, and
//! what its backward pass takes and gives.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::RoutingBackend;
use crate::ops::routing::SlotRows;

/// A read's output `[tokens, d]` (its mixture, or the mixture's norm for a read with a
/// [`ReadNorm`]) and weights `[S, tokens]`.
pub type MixtureAndWeights<B> = (Tensor<B, 2>, Tensor<B, 2>);

/// What a read scores with: the router's query `q` and its key norm's weight `w`, `[d]` each.
/// Their product is the folded query `u = q ⊙ w` (the key norm factored out of the dot product,
/// eq:routingweights). A read takes the two apart so that a backend can form `u` where it uses it
/// and `∂q`, `∂w` where it sums `∂u`: on the GPU backends a product forward, two backward and a sum
/// over tokens become part of the read's own launches.
#[derive(Debug, Clone)]
pub struct ReadQuery<B: Backend> {
    /// `q`, `[d]`.
    pub query: Tensor<B, 1>,
    /// `w`, `[d]`.
    pub key_weight: Tensor<B, 1>,
}

impl<B: Backend> ReadQuery<B> {
    /// `u = q ⊙ w`.
    pub fn folded(&self) -> Tensor<B, 1> {
        self.query.clone() * self.key_weight.clone()
    }

    /// `(∂q, ∂w) = (∂u ⊙ w, ∂u ⊙ q)` from the folded query's gradient.
    pub fn gradients(&self, folded_grad: Tensor<B, 1>) -> QueryGradients<B> {
        QueryGradients {
            query: folded_grad.clone() * self.key_weight.clone(),
            key_weight: folded_grad * self.query.clone(),
        }
    }
}

/// The bias `b` of eq:routingweights a read adds to some of its slots' logits (HAARES's detail
/// slots): one value, learned or fixed, and the slots that take it. A backend can add it where it
/// forms the logits and sum its gradient with the query's, where the `[S, 1]` column of the
/// composition costs a product forward, and a product and two sums backward.
#[derive(Debug, Clone)]
pub struct ReadBias<B: Backend> {
    /// `b`, `[1]`.
    pub value: Tensor<B, 1>,
    /// Whether each slot takes `b`.
    pub slots: Vec<bool>,
}

impl<B: Backend> ReadBias<B> {
    /// `b` on the slots that take it and 0 on the others, as an `[S, 1]` column.
    pub fn column(&self) -> Tensor<B, 2> {
        let mask = slot_mask::<B>(&self.slots, &self.value.device());
        (mask * self.value.clone()).reshape([self.slots.len(), 1])
    }
}

/// `∂b = Σ_s [s takes b] ∂column_s` from the gradient of [`ReadBias::column`], `[S, 1]`, for the
/// slots that take `b` (`biased_slots`).
pub fn bias_gradient<B: Backend>(column_grad: Tensor<B, 2>, biased_slots: &[bool]) -> Tensor<B, 1> {
    let mask = slot_mask::<B>(biased_slots, &column_grad.device());
    (column_grad.reshape([biased_slots.len()]) * mask).sum()
}

/// 1 on the slots that take the bias, 0 on the others, `[S]`.
fn slot_mask<B: Backend>(slots: &[bool], device: &B::Device) -> Tensor<B, 1> {
    let mask: Vec<f32> = slots
        .iter()
        .map(|&takes| f32::from(u8::from(takes)))
        .collect();
    Tensor::from_floats(mask.as_slice(), device)
}

/// The RMSNorm a read's mixture goes through before its sublayer reads it (eq:sublayer's PreNorm,
/// or the final norm after eq:final): `y = h̃ / √(mean(h̃²) + ε) ⊙ g`. A read that takes it returns
/// `y` and keeps `h̃` for its backward pass, so that a backend can normalise the mixture where it
/// forms it and start its backward pass from `∂y`: on the GPU backends the norm's launch forward,
/// and its two backward (`∂h̃` and the rows' sum for `∂g`), become part of the read's own.
#[derive(Debug, Clone)]
pub struct ReadNorm<B: Backend> {
    /// `g`, `[d]`.
    pub gain: Tensor<B, 1>,
    /// The norm's ε.
    pub epsilon: f64,
}

/// What a normalised read's backward pass needs of its norm: the norm and the mixture it
/// normalised.
#[derive(Debug, Clone)]
pub struct NormBackward<B: Backend> {
    /// The norm applied.
    pub norm: ReadNorm<B>,
    /// `h̃`, `[tokens, d]`: the read's own mixture of its slots by its weights, which a backend
    /// may form again from them instead of reading it (the cube backends do, to stay within a
    /// launch's bindings).
    pub mixture: Tensor<B, 2>,
}

/// The gradients of a [`ReadQuery`]'s two vectors.
#[derive(Debug, Clone)]
pub struct QueryGradients<B: Backend> {
    /// `∂L/∂q`, `[d]`.
    pub query: Tensor<B, 1>,
    /// `∂L/∂w`, `[d]`.
    pub key_weight: Tensor<B, 1>,
}

/// A read's outputs, and the scores its backward pass reuses.
#[derive(Debug, Clone)]
pub struct ReadForward<B: Backend> {
    /// The mixture `h̃ = Σ_s α_s c_s ⊙ raw_s`, `[tokens, d]`.
    pub mixture: Tensor<B, 2>,
    /// `y = RMSNorm(h̃)`, `[tokens, d]`, for a read with a [`ReadNorm`].
    pub normed: Option<Tensor<B, 2>>,
    /// The weights `α = softmax_s(z' + b)`, slot-major `[S, tokens]`.
    pub weights: Tensor<B, 2>,
    /// The scores `z'` before the bias, `[S, tokens]`.
    pub scores: Tensor<B, 2>,
}

/// What a read's backward pass starts from: its inputs and forward pass, and the gradients of
/// its outputs.
#[derive(Debug, Clone)]
pub struct ReadBackward<B: Backend> {
    /// The slots read.
    pub slots: Vec<SlotRows<B>>,
    /// The query and key weight read with.
    pub query: ReadQuery<B>,
    /// The key norm's ε.
    pub epsilon: f64,
    /// `z'`, `[S, tokens]`.
    pub scores: Tensor<B, 2>,
    /// `α`, `[S, tokens]`.
    pub weights: Tensor<B, 2>,
    /// The gradient of the read's output, `[tokens, d]`: `∂L/∂y` for a read with a norm,
    /// `∂L/∂h̃` otherwise.
    pub mixture_grad: Tensor<B, 2>,
    /// The norm between the mixture and the output, where the read has one.
    pub norm: Option<NormBackward<B>>,
    /// `∂L/∂α`, `[S, tokens]`, where the weights reach the loss.
    pub weights_grad: Option<Tensor<B, 2>>,
    /// Whether `∂L/∂b` is wanted: false for a read without a bias (Block AttnRes) or with a fixed
    /// one, whose backward pass then skips the sum over tokens that forms it.
    pub bias_wanted: bool,
    /// Whether each slot takes the bias ([`ReadBias::slots`]; all false without one).
    pub biased_slots: Vec<bool>,
    /// Whether each slot's mean-square gradient goes into its rows' gradient,
    /// `∂raw_s += ∂m_s · (2/d) c_s² raw_s`, instead of being returned: valid where every mean
    /// square is `mean((c_s ⊙ raw_s)²)` of the slot's own rows, as a source bank's are
    /// ([`RoutingBackend::folds_mean_squares`](super::RoutingBackend::folds_mean_squares)).
    /// `ReadGradients::mean_squares` is then all `None`.
    pub fold_mean_squares: bool,
    /// For each slot, the first slot whose rows are the same tensor, itself where no earlier one
    /// is: HAARES's early-half detail is its cumulative sum's rows with their own scale and mean
    /// square. A backend may form the gradient of such shared rows once, in the first slot's
    /// entry, and give none for the others; the composition forms each slot's own.
    pub same_rows: Vec<usize>,
}

/// Gradients of a read with respect to its inputs.
#[derive(Debug)]
pub struct ReadGradients<B: Backend> {
    /// `∂L/∂raw_s`, `[tokens, d]`, for the slots asked for, each added to what the slot's source
    /// had accumulated.
    pub raws: Vec<Option<Tensor<B, 2>>>,
    /// `∂L/∂m_s`, `[tokens, 1]`, for the slots asked for.
    pub mean_squares: Vec<Option<Tensor<B, 2>>>,
    /// `∂L/∂q` and `∂L/∂w`.
    pub query: QueryGradients<B>,
    /// `∂L/∂b`, `[1]`, where [`ReadBackward::bias_wanted`].
    pub bias: Option<Tensor<B, 1>>,
    /// `∂L/∂g`, `[d]`, for a read with a norm.
    pub gain: Option<Tensor<B, 1>>,
}

impl<B: RoutingBackend> ReadBackward<B> {
    /// The same backward pass without its norm: `∂h̃` from `∂y` by the norm's own backward pass
    /// ([`NormBackend::rms_norm_backward`](crate::ops::NormBackend::rms_norm_backward)),
    /// and `∂g`. For the backends whose read does not take the norm into its kernel.
    pub fn without_norm(self) -> (Self, Option<Tensor<B, 1>>) {
        match self.norm {
            None => (self, None),
            Some(NormBackward { norm, mixture }) => {
                let (mixture_grad, gain) =
                    B::rms_norm_backward(mixture, norm.gain, self.mixture_grad, norm.epsilon);
                let read = Self {
                    mixture_grad,
                    norm: None,
                    ..self
                };
                (read, Some(gain))
            }
        }
    }
}
