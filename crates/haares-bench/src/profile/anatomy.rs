//! `haares-bench anatomy`: where a steady training step's time goes, operation by operation, on a
//! CPU backend, beside `torch.profiler`'s table of the same step in PyTorch eager.
//!
//! Ours: a worker per method trains the cost protocol's steps, and after the warm-up every
//! operation of `haares_core::ops` times its forward call and its backward pass
//! ([`haares_core::op_times`]). What a phase spends outside them (residual adds, reshapes, the
//! embedding, Burn's graph bookkeeping, allocation) is its "other" row; the update (AdamW, the
//! gradient norm and clip) is one row. PyTorch's: the same model, weights and batch shapes, its
//! phases timed without the profiler, then its operations' self time under it. Both sides' matrix
//! products are also timed call by call and set side by side by shape.

use std::path::PathBuf;

use haares_core::ModelFamily;
use haares_core::op_times::{OpTime, Pass, ProductTime};
use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

use crate::cost::{CostSpec, SizeArgs};
use crate::error::{BenchError, Result};
use crate::measure::export::ExportTask;
use crate::measure::run_worker;
use crate::measure::worker::{TrainSample, WorkerTask};
use crate::method_choice::MethodChoice;
use crate::peer::Peer;
use crate::peer::profile::PeerProfile;

/// `haares-bench anatomy`'s options.
#[derive(clap::Args)]
pub struct AnatomyArgs {
    /// Backend: flex or ndarray (operations are timed by their calls' wall time, which on the
    /// GPU backends is their launch: `first-step --kernel-times` times kernels there).
    #[arg(long, default_value = "flex")]
    backend: BackendKind,
    /// Methods, as for `cost`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "standard,block-attnres,haares"
    )]
    methods: Vec<MethodChoice>,
    /// The model's sizes [default: the cost protocol's `cpu` preset].
    #[command(flatten)]
    sizes: SizeArgs,
    /// Steps per method; the first `--warmup` are not timed.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Steps before the timed ones.
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// Also profile PyTorch eager's step (`torch.profiler`), with `--python`.
    #[arg(long)]
    peer: bool,
    /// The peer's Python interpreter (one that can `import torch, safetensors`).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Output path without extension [default: `runs/bench/anatomy-<backend>`].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One method's anatomy: per steady step, each phase and each operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MethodAnatomy {
    /// Method name.
    pub method: MethodChoice,
    /// Median wall seconds of a steady step.
    pub step_s: f64,
    /// Mean forward, backward, update seconds of a steady step.
    pub phase_s: [f64; 3],
    /// Every operation's seconds and calls per steady step.
    pub operations: Vec<OpTime>,
    /// The matrix products' seconds and calls per steady step, by shape (both passes).
    #[serde(default)]
    pub products: Vec<ProductTime>,
    /// PyTorch eager's step, where asked.
    pub peer: Option<PeerProfile>,
}

/// The whole run: `<out>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnatomyRun {
    /// The sizes (the cost protocol's `cpu` preset, with this command's steps).
    pub spec: CostSpec,
    /// PyTorch's version, where the peer ran.
    pub torch_version: Option<String>,
    /// Why the peer did not run, where asked.
    pub peer_skipped: Option<String>,
    /// Per method.
    pub methods: Vec<MethodAnatomy>,
}

/// Runs the anatomy; the run and where its files go (`--out`, or `runs/bench/anatomy-<backend>`).
/// [`super::anatomy_report`] writes it.
pub fn anatomy(args: AnatomyArgs) -> Result<(AnatomyRun, PathBuf)> {
    if args.backend.is_cube() {
        return Err(BenchError::Request(format!(
            "anatomy times operations on the CPU backends (flex, ndarray), not `{}`: a GPU \
             backend's calls only enqueue kernels; use `first-step --kernel-times` there",
            args.backend
        )));
    }
    let mut spec = CostSpec::cpu(args.backend);
    args.sizes.apply(&mut spec);
    spec.methods = args.methods;
    spec.steps = args.steps;
    spec.warmup = args.warmup;
    spec.validate()?;
    let family = ModelFamily::Small;
    let (peer, mut peer_skipped, torch_version) = match args.peer {
        false => (None, None, None),
        true => match Peer::start(&args.python, args.backend) {
            Ok((peer, run)) => (Some(peer), None, run.torch_version),
            Err(why) => {
                let why = why.reason();
                eprintln!("PyTorch peer skipped: {why}");
                (None, Some(why), None)
            }
        },
    };
    let mut methods = Vec::new();
    for method in &spec.methods {
        let sample = spec.operations_worker(family, method)?;
        let mut anatomy = method_anatomy(&sample, spec.warmup)?;
        if let Some(peer) = &peer {
            match profile_peer(peer, &spec, family, method) {
                Ok(profile) => anatomy.peer = Some(profile),
                Err(why) => {
                    let why = why.reason();
                    eprintln!("PyTorch peer of {method}: {why}");
                    peer_skipped.get_or_insert(why);
                }
            }
        }
        eprintln!("{method}: {:.4} s per steady step", anatomy.step_s);
        methods.push(anatomy);
    }
    let run = AnatomyRun {
        spec,
        torch_version,
        peer_skipped,
        methods,
    };
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from(format!("runs/bench/anatomy-{}", run.spec.backend)));
    Ok((run, out))
}

/// A worker's recorded operations as per-steady-step figures.
fn method_anatomy(sample: &TrainSample, warmup: usize) -> Result<MethodAnatomy> {
    let steady = &sample.step_s[warmup.min(sample.step_s.len())..];
    let phases = sample
        .anatomy
        .as_ref()
        .map(|a| &a.phase_s[warmup.min(a.phase_s.len())..])
        .unwrap_or_default();
    if steady.is_empty() || phases.is_empty() {
        return Err(BenchError::Worker(format!(
            "{}: no steady step was timed; give --steps more than --warmup",
            sample.method
        )));
    }
    let steps = steady.len() as f64;
    let mut phase_s = [0.0; 3];
    for phase in phases {
        for (sum, seconds) in phase_s.iter_mut().zip(phase) {
            *sum += seconds / phases.len() as f64;
        }
    }
    let operations = (sample.operations.iter().flatten())
        .map(|op| OpTime {
            seconds: op.seconds / steps,
            calls: (op.calls as f64 / steps).round() as usize,
            ..op.clone()
        })
        .collect();
    let products = (sample.products.iter().flatten())
        .map(|product| ProductTime {
            seconds: product.seconds / steps,
            calls: (product.calls as f64 / steps).round() as usize,
            ..product.clone()
        })
        .collect();
    Ok(MethodAnatomy {
        method: sample.method,
        step_s: crate::measure::stats::median(steady),
        phase_s,
        operations,
        products,
        peer: None,
    })
}

/// PyTorch eager's step of the same model, from the weights our worker exports.
fn profile_peer(
    peer: &Peer,
    spec: &CostSpec,
    family: ModelFamily,
    method: &MethodChoice,
) -> Result<PeerProfile> {
    let (initial, perturbed, reference) = peer.export_paths(family, method);
    let export = ExportTask {
        config: spec.model(family, method)?,
        initial,
        perturbed,
        reference,
    };
    run_worker(spec.backend, &WorkerTask::Export(export.clone()))?;
    peer.profile(
        &export,
        (spec.batch, spec.seq),
        (spec.steps - spec.warmup, spec.warmup),
    )
}

/// The seconds per steady step our operations spent in `pass`.
pub(crate) fn pass_total(operations: &[OpTime], pass: Pass) -> f64 {
    operations
        .iter()
        .filter(|op| op.pass == pass)
        .map(|op| op.seconds)
        .sum()
}
