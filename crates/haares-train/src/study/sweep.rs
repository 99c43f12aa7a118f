//! Running a study: every planned run in order, skipping finished runs, resuming unfinished ones.

use haares_core::TrainingBackend;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::backend::{BackendJob, BackendKind};
use crate::config::{RunConfig, TokenizerKind};
use crate::data::{self, DataPaths, RunData};
use crate::error::{Result, TrainError};
use crate::run::checkpoint::config_difference;
use crate::run::data_parallel::resolve_devices;
use crate::run::learner::{Outcome, RunSummary, TrainOptions, summary_path, train_on};
use crate::study::PlannedRun;

/// What happened to each run of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum RunStatus {
    /// Finished before this sweep started; not run again.
    Skipped,
    /// Trained (from scratch or resumed) to the end in this sweep.
    Trained(Box<RunSummary>),
    /// Stopped early on request.
    Stopped(usize),
    /// Another process is training it (its lock's holder, in words); skipped.
    Locked(String),
}

/// Runs `runs` into `study_dir/<run name>/` on one backend.
pub struct SweepJob {
    /// The runs, in order.
    pub runs: Vec<PlannedRun>,
    /// `runs/<study>`.
    pub study_dir: PathBuf,
    /// Data locations.
    pub paths: DataPaths,
    /// Progress bars.
    pub progress: bool,
    /// Passed to every run (see [`TrainOptions::stop_after`]).
    pub stop_after: Option<usize>,
    /// Runs trained at the same time (1 when a run trains on several devices).
    pub jobs: usize,
    /// Devices each run trains on, data-parallel (`--devices`, see
    /// [`crate::run::data_parallel::resolve_devices`]); empty: the backend's default device.
    pub devices: Vec<usize>,
}

/// The summary of a finished run in `run_dir`, if there is one.
pub fn finished_summary(run_dir: &Path) -> Result<Option<RunSummary>> {
    let path = summary_path(run_dir);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            TrainError::Checkpoint(format!("`{}` is not a run summary: {e}", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainError::io(&path, e)),
    }
}

/// Checks that `study_dir` can be created and written, before any run starts.
pub fn check_writable(study_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(study_dir).map_err(|e| TrainError::io(study_dir, e))?;
    let probe = study_dir.join(format!(".write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| TrainError::io(study_dir, e))?;
    std::fs::remove_file(&probe).map_err(|e| TrainError::io(&probe, e))
}

impl BackendJob for SweepJob {
    type Output = Vec<(String, RunStatus)>;

    fn run<B: TrainingBackend>(self, _: B::Device, backend: BackendKind) -> Result<Self::Output> {
        check_writable(&self.study_dir)?;
        let devices = resolve_devices::<B>(backend, &self.devices)?;
        let mut statuses: Vec<Option<(String, RunStatus)>> = vec![None; self.runs.len()];
        let pending = self.unfinished(&mut statuses)?;
        let mut prepared: BTreeMap<(String, TokenizerKind), RunData> = BTreeMap::new();
        for (_, run) in &pending {
            if let Entry::Vacant(slot) = prepared.entry(data_key(&run.config)) {
                slot.insert(data::prepare(&run.config, &self.paths, self.progress)?);
            }
        }
        let trainer = SweepTrainer::<B> {
            job: &self,
            prepared: &prepared,
            devices: &devices,
            backend,
            bars: indicatif::MultiProgress::new(),
        };
        for (index, name, outcome) in trainer.train_all(pending) {
            statuses[index] = Some((name, outcome?));
        }
        Ok(statuses.into_iter().flatten().collect())
    }
}

/// A run's prepared data is shared by every run of the same dataset and tokeniser.
fn data_key(config: &RunConfig) -> (String, TokenizerKind) {
    (config.dataset.clone(), config.tokenizer)
}

impl SweepJob {
    /// The runs still to train, with their places; finished runs are marked skipped in
    /// `statuses`, and a finished run of another configuration is an error.
    fn unfinished(
        &self,
        statuses: &mut [Option<(String, RunStatus)>],
    ) -> Result<Vec<(usize, PlannedRun)>> {
        let total = self.runs.len();
        let mut pending = Vec::new();
        for (index, run) in self.runs.iter().enumerate() {
            let run_dir = self.study_dir.join(&run.name);
            match finished_summary(&run_dir)? {
                Some(summary) if summary.config != run.config => {
                    return Err(TrainError::Checkpoint(format!(
                        "`{}` holds a finished run with another configuration ({}); choose another \
                         --runs-dir or delete that run",
                        run_dir.display(),
                        config_difference(&summary.config, &run.config)
                    )));
                }
                Some(_) => {
                    if self.progress {
                        eprintln!(
                            "[{}/{total}] {}: finished earlier, skipped",
                            index + 1,
                            run.name
                        );
                    }
                    statuses[index] = Some((run.name.clone(), RunStatus::Skipped));
                }
                None => pending.push((index, run.clone())),
            }
        }
        Ok(pending)
    }
}

/// What every job of a sweep trains with.
struct SweepTrainer<'a, B: TrainingBackend> {
    job: &'a SweepJob,
    prepared: &'a BTreeMap<(String, TokenizerKind), RunData>,
    devices: &'a [B::Device],
    backend: BackendKind,
    bars: indicatif::MultiProgress,
}

/// A run's place in the sweep, its name and how it ended.
type Trained = (usize, String, Result<RunStatus>);

impl<B: TrainingBackend> SweepTrainer<'_, B> {
    /// Trains `pending` on `jobs` threads that take runs in order from a shared queue (runs are
    /// independent; Burn's CPU backends run small models on about one core, so two jobs use a
    /// 2-core machine fully). A data-parallel run already uses every device: runs then take
    /// turns. After a failure no new run starts. Returns the outcomes in run order.
    fn train_all(&self, pending: Vec<(usize, PlannedRun)>) -> Vec<Trained> {
        let jobs = if self.devices.len() > 1 {
            1
        } else {
            self.job.jobs.max(1)
        };
        if !self.job.progress {
            self.bars
                .set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let queue = Mutex::new(pending.into_iter());
        let results = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| {
                    loop {
                        let next = queue.lock().expect("queue").next();
                        let Some((index, run)) = next else { break };
                        let outcome = self.train_one(index, &run);
                        let failed = outcome.is_err();
                        results
                            .lock()
                            .expect("results")
                            .push((index, run.name, outcome));
                        if failed {
                            // Stop handing out runs; the other jobs finish their current run.
                            while queue.lock().expect("queue").next().is_some() {}
                        }
                    }
                });
            }
        });
        let mut results = results.into_inner().expect("results");
        results.sort_by_key(|(index, ..)| *index);
        results
    }

    /// Trains the run at `index`; a run another process holds is skipped.
    fn train_one(&self, index: usize, run: &PlannedRun) -> Result<RunStatus> {
        let total = self.job.runs.len();
        let options = TrainOptions {
            progress: self.job.progress,
            stop_after: self.job.stop_after,
            label: format!("[{}/{total}] {}", index + 1, run.name),
            bars: Some(self.bars.clone()),
        };
        let outcome = train_on::<B>(
            &run.config,
            &self.prepared[&data_key(&run.config)],
            &self.job.study_dir.join(&run.name),
            self.backend.name(),
            self.devices,
            &options,
        );
        match outcome {
            Ok(Outcome::Finished(summary)) => Ok(RunStatus::Trained(summary)),
            Ok(Outcome::Stopped { step }) => Ok(RunStatus::Stopped(step)),
            // Another process trains this run (an overlapping shard, a resubmitted task): leave
            // it to that process and go on.
            Err(TrainError::Locked { holder, .. }) => {
                eprintln!(
                    "[{}/{total}] {}: being trained by {holder}, skipped",
                    index + 1,
                    run.name
                );
                Ok(RunStatus::Locked(holder))
            }
            Err(error) => Err(error),
        }
    }
}

/// Trains one run from a config into `run_dir` (the `train` command).
pub struct SingleRunJob {
    /// The config.
    pub config: RunConfig,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Data locations.
    pub paths: DataPaths,
    /// Progress bar.
    pub progress: bool,
    /// Devices to train on, data-parallel (see [`SweepJob::devices`]).
    pub devices: Vec<usize>,
}

impl BackendJob for SingleRunJob {
    type Output = Outcome;

    fn run<B: TrainingBackend>(self, _: B::Device, backend: BackendKind) -> Result<Outcome> {
        let devices = resolve_devices::<B>(backend, &self.devices)?;
        let data = data::prepare(&self.config, &self.paths, self.progress)?;
        let options = TrainOptions {
            progress: self.progress,
            stop_after: None,
            label: self
                .run_dir
                .file_name()
                .and_then(|s| s.to_str())
                .unwrap_or("run")
                .to_string(),
            bars: None,
        };
        train_on::<B>(
            &self.config,
            &data,
            &self.run_dir,
            backend.name(),
            &devices,
            &options,
        )
    }
}
