//! Our training step and PyTorch's, alternated step by step: `haares-bench versus`.
//!
//! The cost protocol times our steps and the peer's in separate runs seconds apart; on a host
//! whose speed drifts within seconds (a shared 2-core host's Standard Residual step has moved by
//! a fifth between runs minutes apart: docs/notebook/cpu-results.md) the ratio of two such medians moves with
//! the host. Here our model (in this process) and each PyTorch
//! peer (a process of its own, [`PeerServer`]) take one step each per round, one after another,
//! the order turning every round, so that the steps of a round see nearly the same machine. The
//! ratio is taken within each round, and its median over the rounds comes with the sign test's
//! distribution-free 95% interval ([`median_interval`](crate::measure::stats::median_interval)), which
//! says whether the throughput target is met, missed, or not settled by the run.
//!
//! While one side steps, the others wait on a pipe. Our pool's threads look for work for 10 ms
//! after our step and then every 0.5 ms (`haares_train::cpu::WorkersAwake`), yielding the core
//! between looks; PyTorch's OpenMP threads spin for a while after each of its parallel regions.

use std::time::Instant;

use haares_core::{ModelConfig, TrainingBackend};
use haares_train::backend::{BackendJob, BackendKind};
use serde::{Deserialize, Serialize};

use crate::backends::dispatch;
use crate::cost::CostSpec;
use crate::cost::targets::default_throughput;
use crate::error::{BenchError, Result};
use crate::measure::export::ExportTask;
use crate::measure::worker::Trainer;
use crate::method_choice::MethodChoice;
use crate::peer::server::{PeerServer, PeerStep};
use crate::peer::{Peer, PeerKind, PeerMatmul, PeerMode, logits_agree};

/// A `versus` run: the cost protocol's models (one family) for each method, against PyTorch
/// eager and/or compiled.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersusSpec {
    /// Backend, sizes, the family, the methods and the peer (its interpreter and modes, at our
    /// matrix products' precision); `steps` is the number of rounds and `warmup` the rounds left
    /// out (a compiled peer's first step compiles).
    pub cost: CostSpec,
    /// Our throughput over the best PyTorch's at which the target is met.
    pub target: f64,
}

/// Rounds that a 95% interval of the median needs.
const MIN_ROUNDS: usize = 6;

impl VersusSpec {
    /// Refuses what cannot be measured, before any model is built.
    pub fn validate(&self) -> Result<()> {
        let refuse = |message: String| Err(BenchError::Request(message));
        if self.cost.families.len() != 1 {
            return refuse("a versus run measures one family: e.g. --family small".into());
        }
        if self.cost.peer.is_none() || self.cost.peer_modes.is_empty() {
            return refuse("name the peers to step against: --peer torch,torch-compile".into());
        }
        if self.cost.steps < self.cost.warmup + MIN_ROUNDS {
            return refuse(format!(
                "--rounds {} leaves fewer than {MIN_ROUNDS} rounds after --warmup {}: the \
                 median's confidence interval needs at least {MIN_ROUNDS}",
                self.cost.steps, self.cost.warmup
            ));
        }
        self.cost.validate()
    }
}

/// What a versus run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersusRun {
    /// What was measured.
    pub spec: VersusSpec,
    /// The host's CPU as `/proc/cpuinfo` names it.
    pub host: Option<String>,
    /// Threads of our CPU pool (Rayon's count: `RAYON_NUM_THREADS`, else one per core).
    pub threads: usize,
    /// PyTorch's version, threads and inter-op threads.
    pub torch: (Option<String>, Option<usize>, Option<usize>),
    /// Every method's rounds, in the spec's order: those measured before the run stopped, if it
    /// did.
    pub methods: Vec<VersusMethod>,
    /// Why the run stopped before its last method (a peer failed), if it did.
    #[serde(default)]
    pub stopped: Option<String>,
}

/// One method's rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersusMethod {
    /// As in the spec (`name` or `name/routing`).
    pub method: MethodChoice,
    /// Our step's wall time, round by round (warm-up rounds included).
    pub ours_s: Vec<f64>,
    /// Our first and last loss.
    pub ours_losses: (f64, f64),
    /// Each peer's steps, in the spec's mode order.
    pub peers: Vec<VersusPeer>,
    /// Who stepped first in each round: 0 ours, `1 + i` peer `i`.
    pub first: Vec<usize>,
}

/// One peer's steps of a method.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersusPeer {
    /// Eager or compiled.
    pub mode: PeerMode,
    /// The precision of its matrix products (ours).
    pub matmul: PeerMatmul,
    /// Its step's wall time as it timed it, round by round.
    pub step_s: Vec<f64>,
    /// Its first and last loss.
    pub losses: (f64, f64),
    /// `max |logits_peer − logits_haares|` on the perturbed copy, and `max |logits_haares|`.
    pub agreement: (f64, f64),
}

impl VersusPeer {
    /// Whether its logits agree with ours (the cost protocol's tolerance at our precision).
    pub fn agrees(&self) -> bool {
        logits_agree(self.agreement.0, self.agreement.1, self.matmul)
    }
}

/// Runs the rounds: for each method, our model here and one peer process per mode. Where a peer
/// fails, the methods measured before it are returned with [`VersusRun::stopped`] saying why; where
/// none was, the reason is the error.
pub fn run_versus(spec: &VersusSpec, mut log: impl FnMut(&str) + Send) -> Result<VersusRun> {
    spec.validate()?;
    let kind = spec.cost.backend;
    let python = spec.cost.peer.as_deref().unwrap_or("python3");
    let (peer, version) = Peer::start(python, spec.cost.backend)?;
    log(&format!(
        "PyTorch {} with {} threads, {} inter-op ({python})",
        version.torch_version.as_deref().unwrap_or("?"),
        version.threads.unwrap_or(0),
        version.interop_threads.unwrap_or(0)
    ));
    let family = spec.cost.families[0];
    let configs = (spec.cost.methods.iter())
        .map(|method| spec.cost.model(family, method))
        .collect::<Result<Vec<_>>>()?;
    let job = VersusJob {
        spec,
        peer: &peer,
        configs,
        log: &mut log,
    };
    let (methods, stopped) = match dispatch(kind, job)? {
        (methods, Some(reason)) if methods.is_empty() => return Err(reason),
        (methods, stopped) => (methods, stopped.map(|reason| reason.reason())),
    };
    Ok(VersusRun {
        spec: spec.clone(),
        host: host_cpu(),
        threads: rayon::current_num_threads(),
        torch: (
            version.torch_version,
            version.threads,
            version.interop_threads,
        ),
        methods,
        stopped,
    })
}

struct VersusJob<'a, L> {
    spec: &'a VersusSpec,
    peer: &'a Peer,
    configs: Vec<ModelConfig>,
    log: L,
}

impl<L: FnMut(&str) + Send> BackendJob for VersusJob<'_, L> {
    /// The methods measured, and why the run stopped before the rest, if it did.
    type Output = (Vec<VersusMethod>, Option<BenchError>);

    fn run<B: TrainingBackend>(
        mut self,
        device: B::Device,
        _backend: BackendKind,
    ) -> haares_train::Result<Self::Output> {
        let mut methods = Vec::new();
        let spec = self.spec;
        for (method, config) in spec
            .cost
            .methods
            .iter()
            .zip(std::mem::take(&mut self.configs))
        {
            let (initial, perturbed, reference) =
                self.peer.export_paths(spec.cost.families[0], method);
            let export = ExportTask {
                config,
                initial,
                perturbed,
                reference,
            };
            export.run::<B>(&device)?;
            let servers = match self.start_peers(&export, method) {
                Ok(servers) => servers,
                Err(e) => return Ok((methods, Some(e))),
            };
            let (batch, seq) = (spec.cost.batch, spec.cost.seq);
            let trainer = Trainer::<B>::new(&export.config, batch, seq, &device)?;
            match self.rounds(method, trainer, servers)? {
                Ok(rounds) => methods.push(rounds),
                Err(e) => return Ok((methods, Some(e))),
            }
        }
        Ok((methods, None))
    }
}

impl<L: FnMut(&str) + Send> VersusJob<'_, L> {
    /// One peer process per mode, each ready (its logits checked).
    fn start_peers(
        &mut self,
        export: &ExportTask,
        method: &MethodChoice,
    ) -> Result<Vec<PeerServer>> {
        let cost = &self.spec.cost;
        let matmul = PeerMatmul::ours(cost.backend);
        let mut servers = Vec::new();
        for &mode in &cost.peer_modes {
            let errors = export
                .reference
                .with_extension(format!("{}.stderr", mode.label()));
            let sizes = (cost.batch, cost.seq);
            let server =
                PeerServer::start(self.peer, export, method, sizes, (matmul, mode), errors)?;
            (self.log)(&format!(
                "{method}: PyTorch {} ready, logits within {:.1e} of ours",
                mode.label(),
                server.agreement.0
            ));
            servers.push(server);
        }
        Ok(servers)
    }

    /// The rounds of one method: ours and every peer once each, the order turning every round.
    fn rounds<B: TrainingBackend>(
        &mut self,
        method: &MethodChoice,
        mut trainer: Trainer<B>,
        mut servers: Vec<PeerServer>,
    ) -> haares_train::Result<Result<VersusMethod>> {
        let rounds = self.spec.cost.steps;
        let matmul = PeerMatmul::ours(self.spec.cost.backend);
        let mut ours = VersusMethod {
            method: *method,
            ours_s: Vec::with_capacity(rounds),
            ours_losses: (f64::NAN, f64::NAN),
            peers: (self.spec.cost.peer_modes.iter().zip(&servers))
                .map(|(&mode, server)| VersusPeer {
                    mode,
                    matmul,
                    step_s: Vec::with_capacity(rounds),
                    losses: (f64::NAN, f64::NAN),
                    agreement: server.agreement,
                })
                .collect(),
            first: Vec::with_capacity(rounds),
        };
        let sides = 1 + servers.len();
        for round in 0..rounds {
            ours.first.push(round % sides);
            for side in (0..sides).map(|i| (round + i) % sides) {
                let (seconds, loss) = match side {
                    0 => {
                        let start = Instant::now();
                        let loss = trainer.step(|_| {})?.loss;
                        (start.elapsed().as_secs_f64(), loss)
                    }
                    peer => match servers[peer - 1].step() {
                        Ok(PeerStep { step_s, loss }) => (step_s, loss),
                        Err(e) => return Ok(Err(e)),
                    },
                };
                let (steps, losses) = match side {
                    0 => (&mut ours.ours_s, &mut ours.ours_losses),
                    peer => {
                        let peer = &mut ours.peers[peer - 1];
                        (&mut peer.step_s, &mut peer.losses)
                    }
                };
                steps.push(seconds);
                if round == 0 {
                    losses.0 = loss;
                }
                losses.1 = loss;
            }
            if (round + 1) % LOG_EVERY == 0 || round + 1 == rounds {
                let peers = ours
                    .peers
                    .iter()
                    .map(|p| format!(", PyTorch {} {:.3} s", p.mode.label(), p.step_s[round]));
                (self.log)(&format!(
                    "{method}, round {}/{rounds}: ours {:.3} s{}",
                    round + 1,
                    ours.ours_s[round],
                    peers.collect::<String>()
                ));
            }
        }
        Ok(Ok(ours))
    }
}

/// Rounds between progress lines.
const LOG_EVERY: usize = 10;

/// `haares-bench versus`'s options: the cost protocol's sizes, the methods, the peers.
#[derive(clap::Args)]
pub struct VersusArgs {
    #[command(flatten)]
    model: crate::cost::family_args::FamilyArgs,
    /// Methods, as for `cost`, each measured in turn.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "standard,block-attnres,haares"
    )]
    methods: Vec<MethodChoice>,
    /// The peers to step against: PyTorch eager (`torch`) and/or compiled (`torch-compile`).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "torch,torch-compile"
    )]
    peer: Vec<PeerKind>,
    /// The peers' Python interpreter (one that can `import torch, safetensors`).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Rounds per method (each one step of ours and one of each peer).
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Rounds left out at the start (a compiled peer compiles in its first step).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Our throughput over the best PyTorch's that meets the target [default: 1.3 on a CPU,
    /// 1.0 on CUDA].
    #[arg(long)]
    target: Option<f64>,
    /// Output path without extension [default: runs/bench/versus-{backend}].
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

impl VersusArgs {
    /// The run these options describe, and where it is written.
    pub fn spec(self) -> (VersusSpec, std::path::PathBuf) {
        let mut cost = self.model.spec(self.rounds, self.warmup);
        let backend = cost.backend;
        cost.methods = self.methods;
        cost.peer = Some(self.python);
        cost.peer_modes = PeerKind::modes(&self.peer);
        cost.peer_matmul = vec![PeerMatmul::ours(backend)];
        let out = self.model.out(self.out, "versus");
        let target = self.target.unwrap_or(default_throughput(backend));
        (VersusSpec { cost, target }, out)
    }
}

/// The host's CPU model, as the first `model name` line of `/proc/cpuinfo` gives it (what
/// `lscpu` shows as "Model name" on x86); `None` where there is no such line.
pub fn host_cpu() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, name)| name.trim().to_string())
}
