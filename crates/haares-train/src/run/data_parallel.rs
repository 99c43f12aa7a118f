//! Data-parallel training in one process: one replica of the model per device, each on its fixed
//! slice of every global batch ([`Replica::step`]), the gradients all-reduced with
//! `burn-collective`, and one identical AdamW update on every replica (the global clip computed on
//! the reduced gradients). The effective batch and the data order are those of a one-device run.
//!
//! Replica 0 runs the learner loop on this thread (validation on its device, logs, checkpoints);
//! every other one follows it on a thread of its own, and the process's collective is set up
//! before and torn down after, also when a replica fails.

use std::ops::Range;
use std::sync::Mutex;

use burn::module::Module;
use burn::tensor::backend::{Backend, Device, DeviceId};
use burn_collective::CollectiveConfig;
use haares_core::{HaaresModel, TrainingBackend};
use haares_data::batching::{BatchIterator, BatchPosition};
use haares_data::prepared::PreparedShard;

use crate::backend::BackendKind;
use crate::error::{Result, TrainError};
use crate::run::optim::AdamW;
use crate::run::step::{Replica, Stepped, collective_error};

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
        _ => {
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

impl Replica {
    /// Joins the collective of `count` replicas on `device`.
    pub(crate) fn register<B: Backend>(&self, device: &B::Device) -> Result<()> {
        let config = CollectiveConfig::default().with_num_devices(self.count);
        burn_collective::register::<B>(self.peer(), device.clone(), config)
            .map_err(collective_error)
    }
}

/// burn-collective keeps one collective per backend type and process: data-parallel runs of one
/// process take turns.
static COLLECTIVE: Mutex<()> = Mutex::new(());

/// Where the followers start and stop: the training split, the batch position at the first step,
/// the steps `done..last`, and the context length.
pub struct Schedule<'a> {
    /// The training split.
    pub train: &'a PreparedShard,
    /// Where the batches stand at the first step.
    pub position: BatchPosition,
    /// Steps already done, and the step to stop after.
    pub steps: Range<usize>,
    /// Context length.
    pub seq_len: usize,
}

/// Trains with one replica per device: followers on `devices[1..]` (copies of `model` and
/// `optimizer`), and `lead` — replica 0's learner loop — on this thread with `devices[0]`.
/// Returns what `lead` returns, or the first replica's own error when one failed.
pub fn run_replicated<B: TrainingBackend, T>(
    devices: &[B::Device],
    schedule: Schedule<'_>,
    model: HaaresModel<B>,
    optimizer: AdamW<B::InnerBackend>,
    lead: impl FnOnce(HaaresModel<B>, AdamW<B::InnerBackend>, Replica) -> Result<T>,
) -> Result<T> {
    let count = devices.len();
    let collective = Collective::<B::InnerBackend>::take(count);
    std::thread::scope(|scope| {
        let followers: Vec<_> = devices[1..]
            .iter()
            .enumerate()
            .map(|(k, device)| {
                let follower = Follower {
                    replica: Replica {
                        index: k + 1,
                        count,
                    },
                    model: model.clone().fork(device),
                    optimizer: optimizer.to_device(device),
                    device: device.clone(),
                    train: schedule.train,
                    position: schedule.position,
                    steps: schedule.steps.clone(),
                    seq_len: schedule.seq_len,
                };
                scope.spawn(move || follower.run())
            })
            .collect();
        let lead_replica = Replica { index: 0, count };
        let outcome = lead_replica
            .register::<B::InnerBackend>(&devices[0])
            .and_then(|_| lead(model, optimizer, lead_replica));
        let outcome = match outcome {
            Ok(outcome) => collective.finish().map(|_| outcome),
            Err(error) => {
                // Leaving early: followers waiting in an all-reduce now fail instead of waiting.
                drop(collective);
                Err(error)
            }
        };
        let mut first_follower_error = None;
        for follower in followers {
            let result = follower
                .join()
                .unwrap_or_else(|_| Err(TrainError::Device("a replica's thread panicked".into())));
            if let Err(error) = result {
                first_follower_error.get_or_insert(error);
            }
        }
        match (outcome, first_follower_error) {
            // Replica 0's collective error is the echo of a follower's own.
            (Err(TrainError::Device(_)), Some(error)) => Err(error),
            (Ok(_), Some(error)) => Err(error),
            (outcome, _) => outcome,
        }
    })
}

/// What a helper replica needs to follow replica 0.
struct Follower<'a, B: TrainingBackend> {
    /// Its place.
    replica: Replica,
    /// Its copy of the model, on its device.
    model: HaaresModel<B>,
    /// Its copy of the optimizer.
    optimizer: AdamW<B::InnerBackend>,
    /// Its device.
    device: B::Device,
    /// The training split and where its batches stand.
    train: &'a PreparedShard,
    /// Where the batches stand at the first step.
    position: BatchPosition,
    /// Steps already done, and the step to stop after.
    steps: Range<usize>,
    /// Context length.
    seq_len: usize,
}

impl<B: TrainingBackend> Follower<'_, B> {
    /// Steps in lockstep with replica 0 until the last step, or until the collective fails. A
    /// follower that fails (or panics) resets the collective on its way out, so that the other
    /// replicas' pending all-reduce fails at once instead of waiting for it for ever.
    fn run(mut self) -> Result<()> {
        let guard = ResetOnExit::<B::InnerBackend>::armed();
        self.replica.register::<B::InnerBackend>(&self.device)?;
        let mut batches = BatchIterator::restore(self.train, self.position)?;
        for step in self.steps.clone() {
            let batch = batches.next_batch();
            let stepped = self
                .replica
                .step(
                    &mut self.model,
                    &mut self.optimizer,
                    &batch,
                    self.seq_len,
                    &self.device,
                    |_| Ok(()),
                )
                .map_err(|error| error.at_step(step + 1))?;
            if let Stepped::NonFinite(_) = stepped {
                // Replica 0 reports the non-finite loss; every replica saw the same one.
                guard.disarm();
                return Ok(());
            }
        }
        guard.disarm();
        burn_collective::finish_collective::<B::InnerBackend>(self.replica.peer())
            .map_err(collective_error)
    }
}

/// Resets the process's collective when dropped armed: on an early return or a panic.
struct ResetOnExit<B: Backend> {
    armed: std::cell::Cell<bool>,
    backend: std::marker::PhantomData<B>,
}

impl<B: Backend> ResetOnExit<B> {
    fn armed() -> Self {
        Self {
            armed: std::cell::Cell::new(true),
            backend: std::marker::PhantomData,
        }
    }

    fn disarm(&self) {
        self.armed.set(false);
    }
}

impl<B: Backend> Drop for ResetOnExit<B> {
    fn drop(&mut self) {
        if self.armed.get() {
            burn_collective::reset_collective::<B>();
        }
    }
}

/// Holds the process's collective for one data-parallel run, and resets the collective when the
/// run ends early, so that followers waiting in an all-reduce fail instead
/// of waiting for ever.
struct Collective<B: Backend> {
    _turn: std::sync::MutexGuard<'static, ()>,
    replica: Replica,
    finished: bool,
    backend: std::marker::PhantomData<B>,
}

impl<B: Backend> Collective<B> {
    /// Takes the process's turn (waiting for another data-parallel run to end) and clears what
    /// an earlier run may have left.
    fn take(count: usize) -> Self {
        let turn = COLLECTIVE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        burn_collective::reset_collective::<B>();
        Self {
            _turn: turn,
            replica: Replica { index: 0, count },
            finished: false,
            backend: std::marker::PhantomData,
        }
    }

    /// Leaves the collective after the last step.
    fn finish(mut self) -> Result<()> {
        self.finished = true;
        burn_collective::finish_collective::<B>(self.replica.peer()).map_err(collective_error)
    }
}

impl<B: Backend> Drop for Collective<B> {
    fn drop(&mut self) {
        if !self.finished {
            burn_collective::reset_collective::<B>();
        }
    }
}
