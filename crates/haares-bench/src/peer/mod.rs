//! The PyTorch peer of the cost protocol (`haares-bench cost --peer torch,torch-compile`): the
//! same model, sizes, batch and steps trained by `peer/torch_peer.py`, a plain PyTorch script
//! written from the paper, eagerly and/or compiled by `torch.compile`, measured between the Rust
//! workers so that both see the same machine.
//!
//! The comparison is of one model: for every method a worker of ours writes the initial weights
//! (model seed 42, the ones our workers train from) and a perturbed copy with the logits we compute
//! for it on fixed tokens. The peer loads the copy, reports how far its logits are from ours, then
//! trains from the initial weights. The perturbation gives every router query, key norm, detail
//! bias and gate a non-trivial value, so a peer that routed differently could not agree by luck
//! (at initialisation the queries are zero and every slot's key is ignored).
//!
//! The Python environment is the user's: when `<python> -c "import torch"` fails the run goes on
//! without the peer and the report says how to install it.

pub mod profile;
pub mod server;
pub mod settings;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use haares_core::ModelFamily;
use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

use crate::cost::CostSpec;
use crate::error::{BenchError, Result};
use crate::measure::export::ExportTask;
use crate::measure::stats::median;
use crate::measure::worker::{RESULT_PREFIX, TrainSample, WorkerTask};
use crate::method_choice::MethodChoice;
use profile::PeerProfile;

/// The peer script, compiled in so that an installed `haares-bench` carries it.
pub const SCRIPT: &str = include_str!("../../peer/torch_peer.py");

pub use settings::{
    LOGITS_TOLERANCE, PeerKind, PeerMatmul, PeerMode, TF32_LOGITS_TOLERANCE, logits_agree,
    logits_tolerance,
};

/// What the peer measured in a cost run, or why it did not run.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PeerRun {
    /// The interpreter asked.
    pub python: String,
    /// PyTorch's version, e.g. `2.9.1+cu128`.
    pub torch_version: Option<String>,
    /// Intra-op threads the peer used.
    pub threads: Option<usize>,
    /// Inter-op threads (PyTorch's pool for independent operations).
    #[serde(default)]
    pub interop_threads: Option<usize>,
    /// Why the peer did not run, or stopped (its samples so far are kept).
    pub skipped: Option<String>,
    /// GEMM rates (FLOP/s) measured by the peer before and after the model runs.
    pub gemm_flops_per_s: Vec<f64>,
    /// Samples per family, in measurement order.
    pub samples: Vec<(ModelFamily, Vec<PeerSample>)>,
}

/// One peer measurement: a [`TrainSample`] and how far the peer's logits were from ours.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerSample {
    /// The K timed steps, as our workers report them.
    pub sample: TrainSample,
    /// `max |logits_peer − logits_haares|` on the perturbed copy.
    pub logits_max_abs_diff: f64,
    /// `max |logits_haares|` on the same tokens (the scale of the difference).
    pub logits_max_abs: f64,
    /// The precision of the peer's matrix products in this measurement.
    #[serde(default)]
    pub matmul: PeerMatmul,
    /// Eager or compiled.
    #[serde(default)]
    pub mode: PeerMode,
}

impl PeerSample {
    /// Whether the peer's logits agree with ours, whose matrix products ran at `ours`
    /// ([`logits_tolerance`]).
    pub fn agrees(&self, ours: PeerMatmul) -> bool {
        logits_agree(self.logits_max_abs_diff, self.logits_max_abs, ours)
    }
}

/// The device PyTorch runs on for a backend of ours, or why there is no peer for it.
pub fn torch_device(backend: BackendKind) -> Result<&'static str> {
    match backend {
        BackendKind::Flex | BackendKind::Ndarray => Ok("cpu"),
        BackendKind::Cuda | BackendKind::CudaFusion => Ok("cuda"),
        other => Err(BenchError::Request(format!(
            "PyTorch has no `{other}` backend to compare with; run the peer with --backend flex, \
             ndarray or cuda"
        ))),
    }
}

/// `script` written as `name` into a private temporary folder, which is deleted when the folder
/// is dropped; the folder and the script's path.
pub(crate) fn write_script(name: &str, script: &str) -> Result<(tempfile::TempDir, PathBuf)> {
    let folder = tempfile::Builder::new()
        .prefix("haares-peer-")
        .tempdir()
        .map_err(|e| {
            BenchError::Peer(format!(
                "cannot create a temporary folder for the peer script ({e}); check TMPDIR"
            ))
        })?;
    let path = folder.path().join(name);
    std::fs::write(&path, script).map_err(|e| BenchError::file(&path, e))?;
    Ok((folder, path))
}

/// A started peer: the script written to a private folder, the interpreter checked.
pub struct Peer {
    python: String,
    device: &'static str,
    folder: tempfile::TempDir,
}

impl Peer {
    /// Writes the script and asks the interpreter for PyTorch; `Err` says why the peer cannot
    /// run and how to fix that.
    pub fn start(python: &str, backend: BackendKind) -> Result<(Self, PeerRun)> {
        let device = torch_device(backend)?;
        let (folder, _) = write_script("torch_peer.py", SCRIPT)?;
        let peer = Self {
            python: python.to_string(),
            device,
            folder,
        };
        let version: serde_json::Value = peer.run(&["version"]).map_err(|e| {
            let e = e.reason();
            BenchError::Peer(format!(
                "`{python} -c \"import torch, safetensors\"` must work for the peer, and it does \
                 not ({e}). Install PyTorch (https://pytorch.org/get-started/locally/, e.g. \
                 `pip install torch safetensors`) or pass --python with an interpreter that has it"
            ))
        })?;
        if device == "cuda" && version["cuda"] != serde_json::Value::Bool(true) {
            return Err(BenchError::Peer(format!(
                "`{python}` has a PyTorch without CUDA ({version}); install a CUDA build of \
                 PyTorch or pass --python with an interpreter that has one"
            )));
        }
        let run = PeerRun {
            python: python.to_string(),
            torch_version: version["torch"].as_str().map(String::from),
            threads: version["threads"].as_u64().map(|t| t as usize),
            interop_threads: version["interop_threads"].as_u64().map(|t| t as usize),
            ..PeerRun::default()
        };
        Ok((peer, run))
    }

    /// The peer's GEMM rate (FLOP/s), best of 3 square `n × n` f32 products at `matmul`.
    pub fn gemm(&self, n: usize, matmul: PeerMatmul) -> Result<f64> {
        let precision = format!("--matmul={}", matmul.label().to_lowercase());
        let answer = self.run(&["gemm", "--size", &n.to_string(), &precision])?;
        answer["flops_per_s"]
            .as_f64()
            .ok_or_else(|| BenchError::Peer(format!("its GEMM answer has no rate: {answer}")))
    }

    /// K training steps of the model a worker of ours exported to `export` (see [`ExportTask`]),
    /// at `setting` (precision, eager or compiled).
    pub fn train(
        &self,
        export: &ExportTask,
        method: &MethodChoice,
        (batch, seq, steps): (usize, usize, usize),
        setting: (PeerMatmul, PeerMode),
    ) -> Result<PeerSample> {
        let mut args = vec!["train".to_string(), format!("--steps={steps}")];
        args.extend(model_args(export, method, (batch, seq), setting));
        let answer = self.run(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        let sample: PeerSample = serde_json::from_value(answer)
            .map_err(|e| BenchError::Peer(format!("its training answer is malformed: {e}")))?;
        Ok(PeerSample {
            mode: setting.1,
            ..sample
        })
    }

    /// A steady eager step of the model a worker of ours exported, under `torch.profiler`
    /// (`haares-bench anatomy`).
    pub fn profile(
        &self,
        export: &ExportTask,
        (batch, seq): (usize, usize),
        (steps, warmup): (usize, usize),
    ) -> Result<PeerProfile> {
        let answer = self.run(&[
            "profile",
            &format!("--checkpoint={}", export.initial.display()),
            &format!("--batch={batch}"),
            &format!("--seq={seq}"),
            &format!("--steps={steps}"),
            &format!("--warmup={warmup}"),
        ])?;
        serde_json::from_value(answer)
            .map_err(|e| BenchError::Peer(format!("its profile is malformed: {e}")))
    }

    /// Where a method's exported files go.
    pub fn export_paths(
        &self,
        family: ModelFamily,
        method: &MethodChoice,
    ) -> (PathBuf, PathBuf, PathBuf) {
        let stem = format!("{family:?}-{}", method.to_string().replace('/', "-"));
        let file = |suffix: &str| self.folder.path().join(format!("{stem}{suffix}"));
        (
            file(".initial.safetensors"),
            file(".perturbed.safetensors"),
            file(".reference.json"),
        )
    }

    /// The interpreter running the peer script in `mode` with `args` (the device added).
    pub(crate) fn command(&self, mode: &str, args: &[String]) -> Command {
        let mut command = Command::new(&self.python);
        command
            .arg(self.folder.path().join("torch_peer.py"))
            .arg(mode)
            .args(args)
            .arg(format!("--device={}", self.device));
        command
    }

    /// The interpreter asked for.
    pub(crate) fn python(&self) -> &str {
        &self.python
    }

    fn run(&self, args: &[&str]) -> Result<serde_json::Value> {
        let (mode, rest) = args
            .split_first()
            .ok_or_else(|| BenchError::Peer("no mode to run the script in".into()))?;
        let rest: Vec<String> = rest.iter().map(|a| a.to_string()).collect();
        let output = self
            .command(mode, &rest)
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| BenchError::Peer(format!("cannot start `{}`: {e}", self.python)))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let answer = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
        match (output.status.success(), answer) {
            (true, Some(json)) => serde_json::from_str(json)
                .map_err(|e| BenchError::Peer(format!("its answer is not JSON ({e}): {json}"))),
            _ => {
                let stderr = String::from_utf8_lossy(&output.stderr);
                let last = stderr.lines().last().unwrap_or("no message");
                Err(BenchError::Peer(format!(
                    "{} exited with {}: {last}",
                    self.python, output.status
                )))
            }
        }
    }
}

/// The peer's arguments for training the model a worker of ours exported to `export`, as
/// `method` (without its routing path: the peer implements each method once, plainly), on
/// batches of `batch × seq`, at `(matmul, mode)`: `train`'s and `serve`'s.
pub(crate) fn model_args(
    export: &ExportTask,
    method: &MethodChoice,
    (batch, seq): (usize, usize),
    (matmul, mode): (PeerMatmul, PeerMode),
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec![
        format!("--checkpoint={}", path(&export.initial)),
        format!("--check={}", path(&export.perturbed)),
        format!("--reference={}", path(&export.reference)),
        format!("--method={}", method.unpinned()),
        format!("--batch={batch}"),
        format!("--seq={seq}"),
        format!("--matmul={}", matmul.label().to_lowercase()),
    ];
    if mode == PeerMode::Compiled {
        args.push("--compile".into());
    }
    args
}

/// The peer's part of a cost run. A failure stops the peer, not the run: its reason is kept in
/// [`PeerRun::skipped`] and the Rust measurements go on.
pub struct PeerSession {
    peer: Option<Peer>,
    run: PeerRun,
}

impl PeerSession {
    /// Starts the peer if the spec asks for one (`None` when it does not).
    pub fn start(spec: &CostSpec, log: &mut impl FnMut(&str)) -> Option<Self> {
        let python = spec.peer.as_deref()?;
        Some(match Peer::start(python, spec.backend) {
            Ok((peer, run)) => {
                log(&format!(
                    "PyTorch peer: torch {} with {} threads, {} inter-op ({python})",
                    run.torch_version.as_deref().unwrap_or("?"),
                    run.threads.unwrap_or(0),
                    run.interop_threads.unwrap_or(0)
                ));
                Self {
                    peer: Some(peer),
                    run,
                }
            }
            Err(reason) => {
                let reason = reason.reason();
                log(&format!("PyTorch peer skipped: {reason}"));
                Self {
                    peer: None,
                    run: PeerRun {
                        python: python.to_string(),
                        skipped: Some(reason),
                        ..PeerRun::default()
                    },
                }
            }
        })
    }

    /// The peer's GEMM rate, as ours is measured (before and after the models) and at our
    /// matrix products' precision on `backend`.
    pub fn gemm(&mut self, n: usize, backend: BackendKind, log: &mut impl FnMut(&str)) {
        let Some(peer) = &self.peer else { return };
        let matmul = PeerMatmul::ours(backend);
        match peer.gemm(n, matmul) {
            Ok(rate) => {
                log(&format!(
                    "PyTorch GEMM {n}×{n} ({}): {:.1} GFLOP/s",
                    matmul.label(),
                    rate / 1e9
                ));
                self.run.gemm_flops_per_s.push(rate);
            }
            Err(e) => self.stop(e, log),
        }
    }

    /// The peer's measurements of `method` at each mode and precision the spec asks for, right
    /// after ours. PyTorch has one model per method, whatever routing path of ours it is compared
    /// with (`haares/reference`, `haares/fused`), so each method is trained once per repeat and
    /// setting.
    pub fn measure(
        &mut self,
        spec: &CostSpec,
        family: ModelFamily,
        method: &MethodChoice,
        repeat: usize,
        log: &mut impl FnMut(&str),
    ) {
        let model = method.unpinned();
        let settings = spec
            .peer_modes
            .iter()
            .flat_map(|&mode| spec.peer_matmul.iter().map(move |&matmul| (matmul, mode)));
        for (matmul, mode) in settings {
            let Some(peer) = &self.peer else { return };
            if self.measured(family, &model, (matmul, mode)) > repeat {
                continue;
            }
            let (initial, perturbed, reference) = peer.export_paths(family, method);
            let export = match spec.model(family, method) {
                Ok(config) => ExportTask {
                    config,
                    initial,
                    perturbed,
                    reference,
                },
                Err(e) => return self.stop(e, log),
            };
            // The export of a family and method is the same at every repeat: written once. Its
            // reference file is written last, so its presence means all three are there.
            let exported = match export.reference.exists() {
                true => Ok(()),
                false => {
                    crate::measure::run_worker(spec.backend, &WorkerTask::Export(export.clone()))
                        .map(drop)
                }
            };
            let sizes = (spec.batch, spec.seq, spec.steps);
            let measured =
                exported.and_then(|()| peer.train(&export, &model, sizes, (matmul, mode)));
            match measured {
                Ok(sample) => {
                    log(&format!(
                        "  PyTorch {} {model} ({}): {:.3} s/step, logits within {:.1e} of ours",
                        mode.label(),
                        matmul.label(),
                        median(sample.sample.step_s.get(spec.warmup..).unwrap_or(&[])),
                        sample.logits_max_abs_diff
                    ));
                    match self.run.samples.iter_mut().find(|(f, _)| *f == family) {
                        Some((_, samples)) => samples.push(sample),
                        None => self.run.samples.push((family, vec![sample])),
                    }
                }
                Err(e) => return self.stop(e, log),
            }
        }
    }

    /// How many times the peer has trained `model` in `family` at a precision and mode.
    fn measured(
        &self,
        family: ModelFamily,
        model: &MethodChoice,
        setting: (PeerMatmul, PeerMode),
    ) -> usize {
        self.run
            .samples
            .iter()
            .filter(|(f, _)| *f == family)
            .flat_map(|(_, samples)| samples)
            .filter(|s| s.sample.method == *model && (s.matmul, s.mode) == setting)
            .count()
    }

    /// The peer's measurements so far.
    pub fn snapshot(&self) -> PeerRun {
        self.run.clone()
    }

    /// What the peer measured.
    pub fn finish(self) -> PeerRun {
        self.run
    }

    fn stop(&mut self, reason: BenchError, log: &mut impl FnMut(&str)) {
        let reason = reason.reason();
        log(&format!("PyTorch peer stopped: {reason}"));
        self.run.skipped = Some(reason);
        self.peer = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200's d = 512 HAARES logits: 0.0205 apart at scale 10.3 (TF32 against PyTorch's
    /// fp32); the same gap where ours are fp32 would be a fault, and so would 5% of the scale
    /// anywhere.
    #[test]
    fn tf32_logits_agree_to_tf32_rounding_and_fp32_ones_to_fp32_rounding() {
        let sample = |diff: f64| PeerSample {
            sample: serde_json::from_value(serde_json::json!({
                "method": "haares", "step_s": [], "first_loss": 0.0, "last_loss": 0.0,
                "startup_s": 0.0, "total_s": 0.0
            }))
            .unwrap(),
            logits_max_abs_diff: diff,
            logits_max_abs: 10.3,
            matmul: PeerMatmul::Fp32,
            mode: PeerMode::Eager,
        };
        assert!(sample(0.0205).agrees(PeerMatmul::Tf32));
        assert!(!sample(0.0205).agrees(PeerMatmul::Fp32));
        assert!(sample(5e-4).agrees(PeerMatmul::Fp32));
        assert!(!sample(0.5).agrees(PeerMatmul::Tf32));
    }
}
