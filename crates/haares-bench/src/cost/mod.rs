//! The paper's cost protocol (sec:costprotocol) for this implementation: step time, throughput
//! from step zero and in steady state, peak memory, ratios between methods, and model FLOP
//! utilisation against a GEMM peak measured in the same run.
//!
//! Every measurement runs in a fresh worker process (`haares-bench cost-worker`), so start-up,
//! peak memory and allocator state belong to one method alone. Methods are interleaved across
//! repeats in alternating order (A B C, C B A, A B C, …) so that a drift of the machine's speed
//! affects every method alike.

pub mod family_args;
pub mod launches;
pub mod peer_report;
pub mod report;
pub mod spec;
pub mod summary;
pub mod targets;

pub use family_args::{Family, Preset, SizeArgs};
pub use spec::CostSpec;

use std::path::Path;

use haares_core::ModelFamily;
use haares_core::flops::flops_per_token;
use serde::{Deserialize, Serialize};

use crate::error::{BenchError, Result};
use crate::measure::worker::{TrainSample, WorkerResult, WorkerTask};
use crate::measure::{run_worker, stats};
use crate::method_choice::MethodChoice;
use crate::peer;
use crate::report_files::write_atomically_both;

/// Every sample of a cost run, ready for [`report`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CostRun {
    /// What was measured.
    pub spec: CostSpec,
    /// GEMM rates (FLOP/s) measured before and after the model runs.
    pub gemm_flops_per_s: Vec<f64>,
    /// Samples per family, in measurement order.
    pub samples: Vec<(ModelFamily, Vec<TrainSample>)>,
    /// Training FLOPs per token of every family × method (analytic, [`crate::flops`]).
    pub training_flops: Vec<(ModelFamily, MethodChoice, f64)>,
    /// The PyTorch peer's measurements, when one was asked for.
    #[serde(default)]
    pub peer: Option<peer::PeerRun>,
    /// Kernel launches per step of every family × method, on the cube backends.
    #[serde(default)]
    pub launches: Vec<launches::LaunchCount>,
}

impl CostRun {
    /// Whether the run stopped before its last family (a file written after an earlier one).
    pub fn is_partial(&self) -> bool {
        self.samples.len() < self.spec.families.len()
    }
}

/// Runs the protocol: GEMM peak, then every family's methods interleaved over the repeats, then
/// the GEMM peak again. `log` receives one line per finished measurement, and `finished_family`
/// the run so far after each family but the last (so that a run cut short on a GPU machine's time
/// limit keeps the families it finished; [`CostRun::is_partial`] says so).
pub fn run_cost(
    spec: &CostSpec,
    mut log: impl FnMut(&str),
    mut finished_family: impl FnMut(&CostRun) -> Result<()>,
) -> Result<CostRun> {
    spec.validate()?;
    let gemm = WorkerTask::Gemm {
        n: spec.gemm_n,
        reps: 3,
    };
    let mut gemm_rates = vec![gemm_of(run_worker(spec.backend, &gemm)?)?];
    log(&format!(
        "GEMM {0}×{0}: {1:.1} GFLOP/s",
        spec.gemm_n,
        gemm_rates[0] / 1e9
    ));
    let mut peer = peer::PeerSession::start(spec, &mut log);
    if let Some(peer) = &mut peer {
        peer.gemm(spec.gemm_n, spec.backend, &mut log);
    }
    let mut samples = Vec::new();
    let mut training_flops = Vec::new();
    let mut launch_counts = Vec::new();
    for &family in &spec.families {
        let family_samples = measure_family(spec, family, peer.as_mut(), &mut log)?;
        for method in &spec.methods {
            let flops = flops_per_token(&spec.model(family, method)?, spec.seq).training();
            training_flops.push((family, *method, flops));
            if launches::counts_launches(spec)
                && let Some(count) = launches::count_launches(spec, family, method)?
            {
                log(&format!(
                    "{family:?} {method}: {} kernel launches per step",
                    count.total()
                ));
                launch_counts.push(count);
            }
        }
        samples.push((family, family_samples));
        if samples.len() < spec.families.len() {
            finished_family(&CostRun {
                spec: spec.clone(),
                gemm_flops_per_s: gemm_rates.clone(),
                samples: samples.clone(),
                training_flops: training_flops.clone(),
                peer: peer.as_ref().map(peer::PeerSession::snapshot),
                launches: launch_counts.clone(),
            })?;
        }
    }
    gemm_rates.push(gemm_of(run_worker(spec.backend, &gemm)?)?);
    if let Some(peer) = &mut peer {
        peer.gemm(spec.gemm_n, spec.backend, &mut log);
    }
    Ok(CostRun {
        spec: spec.clone(),
        gemm_flops_per_s: gemm_rates,
        samples,
        training_flops,
        peer: peer.map(peer::PeerSession::finish),
        launches: launch_counts,
    })
}

/// Every method of `family` in `spec.repeats` interleaved rounds, the order turning each round,
/// with the PyTorch peer's run after each of ours where there is a peer.
fn measure_family(
    spec: &CostSpec,
    family: ModelFamily,
    mut peer: Option<&mut peer::PeerSession>,
    log: &mut impl FnMut(&str),
) -> Result<Vec<TrainSample>> {
    let mut samples = Vec::new();
    for repeat in 0..spec.repeats {
        let mut order: Vec<&MethodChoice> = spec.methods.iter().collect();
        if repeat % 2 == 1 {
            order.reverse();
        }
        for method in order {
            let sample = spec.measure(family, method)?;
            log(&format!(
                "{family:?} {method} (repeat {}): {:.3} s/step, loss {:.3} → {:.3}",
                repeat + 1,
                stats::median(&sample.step_s[spec.warmup..]),
                sample.first_loss,
                sample.last_loss
            ));
            samples.push(sample);
            if let Some(peer) = peer.as_deref_mut() {
                peer.measure(spec, family, method, repeat, log);
            }
        }
    }
    Ok(samples)
}

fn gemm_of(result: WorkerResult) -> Result<f64> {
    match result {
        WorkerResult::Gemm { flops_per_s } => Ok(flops_per_s),
        _ => Err(BenchError::Worker(
            "a GEMM worker answered with something else".into(),
        )),
    }
}

/// Writes `run` as `<stem>.json` and its table as `<stem>.md`, atomically.
pub fn write_cost_run(run: &CostRun, stem: &Path) -> Result<String> {
    let table = report::cost_table(run);
    write_atomically_both(stem, run, &table)?;
    Ok(table)
}
