//! First-step anatomy: where a cost worker's start and its first training steps spend their time.
//!
//! A worker times its backend start (the first tensor read back: driver, context, runtime), the
//! model's initialisation, and every step's forward pass, backward pass and optimizer update
//! apart, each ended by a device sync. On the cube backends it also counts, per phase of the first
//! two steps, the kernels CubeCL compiled, the autotune keys it benchmarked and, where asked, the
//! kernels it launched ([`crate::measure::kernel_events`]); what the first step spends beyond a steady step
//! is that compilation and tuning (and first allocations), and the second step's launches are a
//! steady step's. `haares-bench first-step` runs one worker per method and
//! depth and reports whether the number of kernels a step compiles grows with depth.

use serde::{Deserialize, Serialize};

use crate::measure::kernel_events::{KernelTally, settled_tally};
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
    /// During the second step's phases: a steady step's launches (`None` in runs recorded
    /// before it was tallied apart, whose `later_steps` hold it).
    #[serde(default)]
    pub second_step: Option<[KernelTally; 3]>,
    /// During every step after the second (after the first, in runs without `second_step`).
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
        (!later.is_empty()).then(|| crate::measure::stats::median(&later))
    }
}

impl KernelAnatomy {
    /// Everything the first step compiled, tuned and launched.
    pub fn first_step_total(&self) -> KernelTally {
        let mut total = KernelTally::default();
        self.first_step.iter().for_each(|part| total.add(part));
        total
    }

    /// Everything compiled, tuned and launched after the first step.
    pub fn after_first_step(&self) -> KernelTally {
        let mut total = KernelTally::default();
        self.second_step
            .iter()
            .flatten()
            .for_each(|part| total.add(part));
        total.add(&self.later_steps);
        total
    }

    /// The kernels a steady step launches, per phase (forward, backward, update): the second
    /// step's, where launches were counted.
    pub fn steady_launches(&self) -> Option<[usize; 3]> {
        let second = self.second_step.as_ref()?;
        let launches = second.each_ref().map(|part| part.launched);
        (launches.iter().sum::<usize>() > 0).then_some(launches)
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
        let last = crate::measure::kernel_events::tally();
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
                second_step: Some(Default::default()),
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

    /// `phase` of step `step` has ended; only the first two steps' phases are tallied apart (a
    /// tally waits for CubeCL's logging thread).
    pub fn mark_phase(&mut self, step: usize, phase: Phase) {
        if step > 1 {
            return;
        }
        if let Some((kernels, tally)) = self.take() {
            match step {
                0 => kernels.first_step[phase.index()] = tally,
                _ => {
                    if let Some(second) = &mut kernels.second_step {
                        second[phase.index()] = tally;
                    }
                }
            }
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
