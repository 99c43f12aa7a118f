//! The training step (tab:reprotrain), one function for one device and for many: a replica's
//! slice of the global batch forward and backward, its loss normalised by the global batch's real
//! targets, the gradients and the loss all-reduced when several replicas train the run, then the
//! clipped AdamW update. The learner ([`super::learner`]) and the cost protocol (`haares-bench`)
//! both step through [`Replica::step`].
//!
//! With `n` replicas, replica k takes rows `[k·b/n, (k+1)·b/n)` of each global batch, and its
//! loss is its summed cross-entropy divided by the global batch's count of real targets, so the
//! all-reduced sum is the one-device gradient up to float rounding. How the replicas run side by
//! side is [`super::data_parallel`]'s part.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData, TensorPrimitive};
use burn_collective::{PeerId, ReduceOperation};
use haares_core::graph_gate::{self, GraphWork};
use haares_core::{HaaresModel, TrainingBackend};
use haares_data::batching::Batch;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::run::loss::{real_target_count, summed_cross_entropy, to_device};
use crate::run::optim::{AdamW, NamedGradients, UpdateStats, named_gradients};

/// A phase of a training step, in the order a step runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Batch upload, forward pass and loss, ending with the loss read back.
    Forward,
    /// `loss.backward()`, the gradients collected (and all-reduced between replicas).
    Backward,
    /// The clipped AdamW update.
    Optimizer,
}

impl Phase {
    /// The three phases in order.
    pub const ALL: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

    /// The phase's place in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The phase after this one in a step (`None` after the update).
    pub fn next(self) -> Option<Phase> {
        Phase::ALL.get(self.index() + 1).copied()
    }

    /// The phase's name in logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "update",
        }
    }
}

/// One replica's place among `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// 0-based; replica 0 runs the learner loop.
    pub index: usize,
    /// How many replicas train the run.
    pub count: usize,
}

impl Replica {
    /// The only replica of a one-device run.
    pub const SOLE: Self = Self { index: 0, count: 1 };

    /// Refuses a batch that does not split evenly.
    pub fn check_batch(count: usize, batch_size: usize) -> Result<()> {
        if count > 1 && !batch_size.is_multiple_of(count) {
            return Err(TrainError::Config(format!(
                "batch_size {batch_size} does not split over {count} devices; choose a batch size \
                 that is a multiple of the device count (each device takes an equal slice)"
            )));
        }
        Ok(())
    }

    /// The rows of a global batch of `batch_size` rows this replica takes.
    pub fn rows(&self, batch_size: usize) -> Range<usize> {
        let share = batch_size / self.count;
        self.index * share..(self.index + 1) * share
    }

    /// This replica's slice of `batch`.
    pub fn slice(&self, batch: &Batch) -> Batch {
        let rows = self.rows(batch.batch_size);
        let values = rows.start * batch.seq_len..rows.end * batch.seq_len;
        Batch {
            batch_size: rows.len(),
            seq_len: batch.seq_len,
            inputs: batch.inputs[values.clone()].to_vec(),
            targets: batch.targets[values.clone()].to_vec(),
            mask: batch.mask[values].to_vec(),
        }
    }

    /// One training step: this replica's slice forward and backward, its loss normalised by the
    /// global batch's real targets (in the first `seq_len` positions), the gradients and the loss
    /// all-reduced when there are several replicas, then the update. Returns the global batch's
    /// mean loss and the update's statistics; a non-finite loss stops before the update.
    ///
    /// `at_end` runs after each [`Phase`] that ran: the learner passes `|_| Ok(())`, the cost
    /// protocol syncs the device and times the phase there. Its error ends the step.
    pub fn step<B: TrainingBackend>(
        &self,
        model: &mut HaaresModel<B>,
        optimizer: &mut AdamW<B::InnerBackend>,
        batch: &Batch,
        seq_len: usize,
        device: &B::Device,
        mut at_end: impl FnMut(Phase) -> Result<()>,
    ) -> Result<Stepped> {
        let global_real = real_target_count(batch, seq_len).max(1) as f64;
        let mine = match self.count {
            1 => to_device::<B>(batch, seq_len, device),
            _ => to_device::<B>(&self.slice(batch), seq_len, device),
        };
        // The graph is built, and its backward pass run, inside the gate that keeps other
        // threads' cleanups away from it (haares_core::graph_gate).
        let loss = {
            let _building = graph_gate::enter(GraphWork::Building);
            summed_cross_entropy(model, &mine) / global_real
        };
        let local = loss.clone().into_scalar().elem::<f64>();
        at_end(Phase::Forward)?;
        let grads = {
            let _backward = graph_gate::enter(GraphWork::Backward);
            loss.backward()
        };
        let gradients =
            named_gradients(model, &grads).map_err(|missing| TrainError::LostGradient {
                parameter: missing.parameter,
                replica: self.index,
                step: None,
            })?;
        drop(grads);
        let (gradients, value) = match self.count {
            1 => (gradients, local),
            _ => all_reduce(self.peer(), gradients, local)?,
        };
        at_end(Phase::Backward)?;
        if !value.is_finite() {
            return Ok(Stepped::NonFinite(value));
        }
        let stats = optimizer.apply(model, gradients);
        at_end(Phase::Optimizer)?;
        Ok(Stepped::Updated { loss: value, stats })
    }

    pub(crate) fn peer(&self) -> PeerId {
        PeerId::from(self.index as u32)
    }
}

/// What a training step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stepped {
    /// The update is applied.
    Updated {
        /// Mean cross-entropy over the global batch's real targets.
        loss: f64,
        /// The update's statistics.
        stats: UpdateStats,
    },
    /// The loss was not finite (NaN or infinite); nothing was updated.
    NonFinite(f64),
}

/// Sums every replica's gradients and loss: one all-reduce of all of them, concatenated, in the
/// model's visiting order (the same on every replica).
fn all_reduce<B: Backend>(
    peer: PeerId,
    gradients: NamedGradients<B>,
    loss: f64,
) -> Result<(NamedGradients<B>, f64)> {
    let Some((_, first)) = gradients.first() else {
        return Ok((gradients, loss));
    };
    let device = first.device();
    let sizes: Vec<usize> = gradients.iter().map(|(_, g)| g.dims()[0]).collect();
    let mut parts: Vec<Tensor<B, 1>> = gradients.iter().map(|(_, g)| g.clone()).collect();
    let loss_data = TensorData::from([loss]).convert::<B::FloatElem>();
    parts.push(Tensor::from_data(loss_data, &device));
    let flat = Tensor::cat(parts, 0).into_primitive().tensor();
    let reduced = burn_collective::all_reduce::<B>(peer, flat, ReduceOperation::Sum)
        .map_err(collective_error)?;
    let reduced = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(reduced));
    let mut offset = 0;
    let mut summed = Vec::with_capacity(gradients.len());
    for ((name, _), size) in gradients.into_iter().zip(sizes) {
        summed.push((name, reduced.clone().narrow(0, offset, size)));
        offset += size;
    }
    let loss = reduced.narrow(0, offset, 1).into_scalar().elem::<f64>();
    Ok((summed, loss))
}

pub(crate) fn collective_error(error: burn_collective::CollectiveError) -> TrainError {
    TrainError::Device(format!(
        "the all-reduce between the devices failed ({error:?}); another replica stopped — its \
         error, if any, is reported instead"
    ))
}
