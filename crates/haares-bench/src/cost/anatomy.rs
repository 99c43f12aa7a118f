//! First-step anatomy: where a cost worker's start and its first training steps spend their time.
//!
//! A worker times its backend start (the first tensor read back: driver, context, runtime), the
//! model's initialisation, and every step's forward pass, backward pass and optimizer update
//! apart, each ended by a device sync. On the cube backends it also counts, per phase of the first
//! step, the kernels CubeCL compiled and the autotune keys it benchmarked
//! ([`crate::kernel_events`]); what the first step spends beyond a steady step is that compilation
//! and tuning (and first allocations). `haares-bench first-step` runs one worker per method and
//! depth and reports whether the number of kernels a step compiles grows with depth.

use serde::{Deserialize, Serialize};

use crate::kernel_events::{KernelTally, settled_tally};
pub use haares_train::run::step::Phase;

/// One step's loss and the seconds of its three phases.
#[derive(Debug, Clone, Copy)]
pub struct StepTimes {
    /// The step's loss.
    pub loss: f64,
    /// Forward, backward, optimizer seconds.
    pub phase_s: [f64; 3],
}

/// Where a worker's time went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Anatomy {
    /// Seconds from the worker process's start to its backend's first tensor read back.
    pub backend_start_s: f64,
    /// Seconds to initialise the model and optimizer (synced).
    pub model_init_s: f64,
    /// Forward, backward, optimizer seconds of every step.
    pub phase_s: Vec<[f64; 3]>,
    /// CubeCL's compilations and autotune runs; `None` on the CPU backends (no CubeCL).
    pub kernels: Option<KernelAnatomy>,
}

/// CubeCL's compilations and autotune runs, by part of the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelAnatomy {
    /// During the backend start.
    pub backend_start: KernelTally,
    /// During model initialisation.
    pub model_init: KernelTally,
    /// During the first step's forward, backward and optimizer phases.
    pub first_step: [KernelTally; 3],
    /// During every later step (zero once the first step has met every kernel).
    pub later_steps: KernelTally,
}

impl Anatomy {
    /// The first step's seconds.
    pub fn first_step_s(&self) -> Option<f64> {
        self.phase_s.first().map(|p| p.iter().sum())
    }

    /// The median step after the first, in seconds.
    pub fn steady_step_s(&self) -> Option<f64> {
        let later: Vec<f64> = self
            .phase_s
            .iter()
            .skip(1)
            .map(|p| p.iter().sum())
            .collect();
        (!later.is_empty()).then(|| super::stats::median(&later))
    }
}

impl KernelAnatomy {
    /// Everything the first step compiled and tuned.
    pub fn first_step_total(&self) -> KernelTally {
        let mut total = KernelTally::default();
        for part in &self.first_step {
            total.compiled += part.compiled;
            total.autotuned += part.autotuned;
            for (name, count) in &part.compiled_by_name {
                *total.compiled_by_name.entry(name.clone()).or_default() += count;
            }
            total
                .autotune_keys
                .extend(part.autotune_keys.iter().cloned());
        }
        total
    }
}

/// Builds a worker's [`Anatomy`] as it runs: the caller marks the end of each part.
pub struct AnatomyRecorder {
    anatomy: Anatomy,
    kernels: Option<KernelAnatomy>,
    last: Option<KernelTally>,
}

impl AnatomyRecorder {
    /// Starts recording (before the backend's first tensor).
    pub fn start() -> Self {
        let last = crate::kernel_events::tally();
        Self {
            anatomy: Anatomy {
                backend_start_s: 0.0,
                model_init_s: 0.0,
                phase_s: Vec::new(),
                kernels: None,
            },
            kernels: last.as_ref().map(|_| KernelAnatomy {
                backend_start: KernelTally::default(),
                model_init: KernelTally::default(),
                first_step: Default::default(),
                later_steps: KernelTally::default(),
            }),
            last,
        }
    }

    /// What CubeCL compiled and tuned since the previous mark, and where to put it (`None`
    /// without a tally).
    fn take(&mut self) -> Option<(&mut KernelAnatomy, KernelTally)> {
        let now = settled_tally()?;
        let since = now.since(self.last.as_ref()?);
        self.last = Some(now);
        Some((self.kernels.as_mut()?, since))
    }

    /// The backend is up, `seconds` after the process started.
    pub fn mark_start(&mut self, seconds: f64) {
        self.anatomy.backend_start_s = seconds;
        if let Some((kernels, tally)) = self.take() {
            kernels.backend_start = tally;
        }
    }

    /// The model and optimizer are ready, after `seconds`.
    pub fn mark_init(&mut self, seconds: f64) {
        self.anatomy.model_init_s = seconds;
        if let Some((kernels, tally)) = self.take() {
            kernels.model_init = tally;
        }
    }

    /// `phase` of step `step` has ended; only the first step's phases are tallied apart (a
    /// tally waits for CubeCL's logging thread).
    pub fn mark_phase(&mut self, step: usize, phase: Phase) {
        if step == 0
            && let Some((kernels, tally)) = self.take()
        {
            kernels.first_step[phase.index()] = tally;
        }
    }

    /// A step has ended.
    pub fn record_step(&mut self, times: StepTimes) {
        self.anatomy.phase_s.push(times.phase_s);
    }

    /// The first step, in one line for the live log.
    pub fn first_step_line(&self) -> String {
        let Some(p) = self.anatomy.phase_s.first() else {
            return "not run".into();
        };
        let mut line = format!(
            "{:.2} s (forward {:.2} s, backward {:.2} s, update {:.2} s",
            p.iter().sum::<f64>(),
            p[0],
            p[1],
            p[2]
        );
        if let Some(kernels) = &self.kernels {
            let total = kernels.first_step_total();
            line += &format!(
                "; {} kernels compiled, {} autotuned",
                total.compiled, total.autotuned
            );
        }
        line + ")"
    }

    /// The finished anatomy; the later steps' tally is taken now.
    pub fn finish(mut self) -> Anatomy {
        if let Some((kernels, tally)) = self.take() {
            kernels.later_steps = tally;
        }
        self.anatomy.kernels = self.kernels;
        self.anatomy
    }
}
