//! Data-parallel training in one process: one replica of the model per device, each on its fixed
//! slice of every global batch, the gradients all-reduced with `burn-collective`, and one
//! identical AdamW update on every replica (the global clip computed on the reduced gradients).
//!
//! The effective batch and the data order are those of a one-device run: replica k takes rows
//! `[k·b/n, (k+1)·b/n)` of each global batch, and its loss is its summed cross-entropy divided by
//! the global batch's count of real targets, so the all-reduced sum is the one-device gradient up
//! to float rounding. Replica 0 runs the learner loop (validation on its device, logs,
//! checkpoints); the others only step ([`crate::replicas`]).

use std::ops::Range;

use burn::tensor::backend::{Backend, Device, DeviceId};
use burn::tensor::{ElementConversion, Tensor, TensorData, TensorPrimitive};
use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};
use haares_core::{HaaresModel, TrainingBackend};
use haares_data::batching::Batch;

use crate::backend::BackendKind;
use crate::error::{Result, TrainError};
use crate::loss::{real_target_count, summed_cross_entropy, to_device};
use crate::optim::{AdamW, NamedGradients, UpdateStats, named_gradients};

/// The devices a run trains on, from the command line: indices of GPUs (`0,1,2,3`), or, on a CPU
/// backend, one number: how many replicas share the CPU.
pub fn resolve_devices<B: Backend>(
    kind: BackendKind,
    requested: &[usize],
) -> Result<Vec<B::Device>> {
    let default = B::Device::default();
    match kind {
        BackendKind::Flex | BackendKind::Ndarray => match requested {
            [] => Ok(vec![default]),
            [count] if *count >= 1 => Ok(vec![default; *count]),
            _ => Err(TrainError::Config(format!(
                "on the CPU backend `{kind}`, --devices takes one number, the count of replicas \
                 (e.g. --devices 2); got {requested:?}"
            ))),
        },
        BackendKind::Wgpu | BackendKind::Cuda => {
            if requested.is_empty() {
                return Ok(vec![default]);
            }
            let type_id = default.to_id().type_id;
            let available = B::device_count(type_id);
            let mut seen = Vec::new();
            for &index in requested {
                if index >= available {
                    return Err(TrainError::Device(format!(
                        "--devices names {kind} device {index}, but this machine has {available} \
                         (indices 0–{}); list existing devices, e.g. --devices 0,1",
                        available.saturating_sub(1)
                    )));
                }
                if seen.contains(&index) {
                    return Err(TrainError::Config(format!(
                        "--devices names device {index} twice; name each device once"
                    )));
                }
                seen.push(index);
            }
            Ok(seen
                .into_iter()
                .map(|index| {
                    B::Device::from_id(DeviceId {
                        type_id,
                        index_id: index as u16,
                    })
                })
                .collect())
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
    pub fn step<B: TrainingBackend>(
        &self,
        model: &mut HaaresModel<B>,
        optimizer: &mut AdamW<B::InnerBackend>,
        batch: &Batch,
        seq_len: usize,
        device: &B::Device,
    ) -> Result<Stepped> {
        let global_real = real_target_count(batch, seq_len).max(1) as f64;
        let mine = to_device::<B>(&self.slice(batch), seq_len, device);
        let loss = summed_cross_entropy(model, &mine) / global_real;
        let local = loss.clone().into_scalar().elem::<f64>();
        let grads = loss.backward();
        let gradients = named_gradients(model, &grads);
        drop(grads);
        let (gradients, value) = match self.count {
            1 => (gradients, local),
            _ => all_reduce(self.peer(), gradients, local)?,
        };
        if !value.is_finite() {
            return Ok(Stepped::NonFinite(value));
        }
        let stats = optimizer.apply(model, gradients);
        Ok(Stepped::Updated { loss: value, stats })
    }

    pub(crate) fn peer(&self) -> PeerId {
        PeerId::from(self.index as u32)
    }

    /// Joins the collective of `count` replicas on `device`.
    pub(crate) fn register<B: Backend>(&self, device: &B::Device) -> Result<()> {
        let config = CollectiveConfig::default().with_num_devices(self.count);
        burn_collective::register::<B>(self.peer(), device.clone(), config)
            .map_err(collective_error)
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
