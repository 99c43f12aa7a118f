//! How each custom autodiff node of this crate (the routing operator's, the fused activations')
//! joins Burn's graph: its parents as autodiff primitives, and its output finished with the state
//! its backward pass keeps, or without one when no parent is tracked.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// An autodiff tensor's primitive, which carries its graph node.
pub(crate) type AutodiffPrimitive<B, C> = FloatTensor<Autodiff<B, C>>;

pub(crate) fn primitive<B: Backend, C: CheckpointStrategy, const D: usize>(
    tensor: Tensor<Autodiff<B, C>, D>,
) -> AutodiffPrimitive<B, C> {
    tensor.into_primitive().tensor()
}

/// A float tensor from a backend primitive.
pub(crate) fn from_primitive<B: Backend, const D: usize>(
    primitive: FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// The node of `backward` over `parents` with the inner backend's `output`, keeping `state` for
/// the backward pass when a parent is tracked. The backward pass is timed for
/// [`crate::op_times`] under the operation its type belongs to.
pub(crate) fn finish<B, C, T, const N: usize, const D: usize>(
    backward: T,
    parents: [AutodiffPrimitive<B, C>; N],
    state: T::State,
    output: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D>
where
    B: Backend,
    C: CheckpointStrategy,
    T: Backward<B, N>,
{
    let output = output.into_primitive().tensor();
    let nodes = parents.map(|parent| parent.node);
    let node = match Timed(backward)
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, output),
        OpsKind::UnTracked(prep) => prep.finish(output),
    };
    from_primitive(node)
}

/// Registers `gradient` for the parent at `position`, when that parent is tracked.
pub(crate) fn register<B: Backend, S, const N: usize, const D: usize>(
    grads: &mut Gradients,
    ops: &Ops<S, N>,
    position: usize,
    gradient: Tensor<B, D>,
) {
    if let Some(parent) = &ops.parents[position] {
        grads.register::<B>(parent.id, gradient.into_primitive().tensor());
    }
}

/// A node's backward pass, timed while [`crate::op_times`] records.
#[derive(Debug)]
struct Timed<T>(T);

impl<B: Backend, T: Backward<B, N>, const N: usize> Backward<B, N> for Timed<T> {
    type State = T::State;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        if !crate::op_times::recording() {
            return self.0.backward(ops, grads, checkpointer);
        }
        let operation = crate::op_times::operation_of(std::any::type_name::<T>());
        crate::op_times::timed(operation, crate::op_times::Pass::Backward, || {
            self.0.backward(ops, grads, checkpointer)
        })
    }
}
