//! Running a study: every planned run in order, skipping finished runs, resuming unfinished ones.

use haares_core::TrainingBackend;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::path::{Path, PathBuf};

use crate::backend::{BackendJob, BackendKind};
use crate::config::{RunConfig, TokenizerKind};
use crate::data::{self, DataPaths, RunData};
use crate::error::{Result, TrainError};
use crate::report::write_report;
use crate::run::checkpoint::config_difference;
use crate::run::data_parallel::resolve_devices;
use crate::run::learner::{Outcome, TrainOptions, train_on};
use crate::run::summary::{RunSummary, finished_summary};
use crate::study::placement::{Placement, train_queue};
use crate::study::{PlannedRun, Study};

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
    /// It failed on its device (runs placed per device only: the others go on); the error.
    Failed(String),
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
    /// The devices (`--devices`, see [`crate::run::data_parallel::resolve_devices`]); empty: the
    /// backend's default device. Each run trains data-parallel on all of them, unless
    /// `runs_per_device` places runs on them one by one.
    pub devices: Vec<usize>,
    /// Place each run on one of the devices, this many runs at a time on each
    /// (`--runs-per-device`; GPU backends only), instead of training each run on all of them.
    pub runs_per_device: Option<usize>,
}

/// The sweep's statuses in one line: trained, finished earlier, locked, failed.
pub fn tally(statuses: &[(String, RunStatus)]) -> String {
    let count = |wanted: fn(&RunStatus) -> bool| statuses.iter().filter(|(_, s)| wanted(s)).count();
    let trained = count(|s| matches!(s, RunStatus::Trained(_)));
    let locked = count(|s| matches!(s, RunStatus::Locked(_)));
    let failed = count(|s| matches!(s, RunStatus::Failed(_)));
    format!(
        "{trained} runs trained, {} finished earlier, {locked} being trained by other processes, \
         {failed} failed",
        statuses.len() - trained - locked - failed
    )
}

/// Writes the study's report after a sweep and returns its path, or the runs that failed: then
/// the report still covers the runs that finished, and when none did, the failures are the
/// error (not "no finished runs").
pub fn report_after_sweep(
    study: &Study,
    all: &[PlannedRun],
    study_dir: &Path,
    statuses: &[(String, RunStatus)],
) -> Result<PathBuf> {
    let failures: Vec<String> = statuses
        .iter()
        .filter_map(|(name, status)| match status {
            RunStatus::Failed(error) => Some(format!("{name}: {error}")),
            _ => None,
        })
        .collect();
    let report = write_report(study, all, study_dir);
    match (report, failures.is_empty()) {
        (report, true) => report,
        (Ok(written), false) => {
            println!("report: {}", written.display());
            Err(TrainError::RunsFailed(failures))
        }
        (Err(_), false) => Err(TrainError::RunsFailed(failures)),
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
        if let Some(runs_per_device) = self.runs_per_device {
            check_placement(backend, &self.devices, runs_per_device)?;
        }
        let devices = resolve_devices::<B>(backend, &self.devices)?;
        self.train_on_devices::<B>(backend, &devices)
    }
}

/// Refuses a placement per device that makes no sense, before anything trains.
fn check_placement(backend: BackendKind, devices: &[usize], runs_per_device: usize) -> Result<()> {
    if runs_per_device == 0 {
        return Err(TrainError::Config(
            "--runs-per-device must be at least 1".into(),
        ));
    }
    if matches!(backend, BackendKind::Flex | BackendKind::Ndarray) {
        return Err(TrainError::Config(format!(
            "--runs-per-device places runs on GPUs; on the CPU backend `{backend}` every run \
             shares the CPU: use --jobs N to train N runs at a time"
        )));
    }
    if devices.is_empty() {
        return Err(TrainError::Config(
            "--runs-per-device places runs on the devices --devices names; name them, e.g. \
             --devices 0,1,2,3"
                .into(),
        ));
    }
    Ok(())
}

impl SweepJob {
    /// How the runs use the devices.
    pub fn placement(&self) -> Placement {
        match self.runs_per_device {
            Some(runs_per_device) => Placement::PerDevice { runs_per_device },
            None => Placement::Replicated { jobs: self.jobs },
        }
    }

    /// Trains the sweep's unfinished runs on `devices`, as [`Self::placement`] says. A library
    /// caller may name the devices itself (several copies of the CPU's stand in for devices in
    /// the tests).
    pub fn train_on_devices<B: TrainingBackend>(
        &self,
        backend: BackendKind,
        devices: &[B::Device],
    ) -> Result<Vec<(String, RunStatus)>> {
        let mut statuses: Vec<Option<(String, RunStatus)>> = vec![None; self.runs.len()];
        let pending = self.unfinished(&mut statuses)?;
        let mut prepared: BTreeMap<(String, TokenizerKind), RunData> = BTreeMap::new();
        for (_, run) in &pending {
            if let Entry::Vacant(slot) = prepared.entry(data_key(&run.config)) {
                slot.insert(data::prepare(&run.config, &self.paths, self.progress)?);
            }
        }
        let placement = self.placement();
        let trainer = SweepTrainer::<B> {
            job: self,
            prepared: &prepared,
            backend,
            bars: indicatif::MultiProgress::new(),
            device: std::marker::PhantomData,
        };
        if !self.progress {
            trainer
                .bars
                .set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let groups = match placement {
            Placement::Replicated { .. } => vec![devices.to_vec()],
            Placement::PerDevice { .. } => devices.iter().map(|d| vec![d.clone()]).collect(),
        };
        let trained = train_queue(pending, placement, devices.len(), |place, run, group| {
            trainer.train_one(place, run, &groups[group])
        });
        for (place, run, group, outcome) in trained {
            let status = match (outcome, placement) {
                (Ok(status), _) => status,
                (Err(error), Placement::PerDevice { .. }) => {
                    let message = format!("{error} (on {:?})", groups[group][0]);
                    eprintln!("{}: failed: {message}", run.name);
                    RunStatus::Failed(message)
                }
                (Err(error), Placement::Replicated { .. }) => return Err(error),
            };
            statuses[place] = Some((run.name, status));
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

/// What every slot of a sweep trains with.
struct SweepTrainer<'a, B: TrainingBackend> {
    job: &'a SweepJob,
    prepared: &'a BTreeMap<(String, TokenizerKind), RunData>,
    backend: BackendKind,
    bars: indicatif::MultiProgress,
    device: std::marker::PhantomData<B>,
}

impl<B: TrainingBackend> SweepTrainer<'_, B> {
    /// Trains the run at `index` on `devices`; a run another process holds is skipped.
    fn train_one(
        &self,
        index: usize,
        run: &PlannedRun,
        devices: &[B::Device],
    ) -> Result<RunStatus> {
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
            devices,
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
