//! The GPU check's stages and the two profiles' sizes and budgets.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::json;

use super::process::Finished;
use super::stage::{Outcome, Stage, status_of};
use super::{CheckSpec, StageStatus};

/// Every stage, in the order they run.
pub const STAGES: &[&str] = &[
    "facts",
    "portability",
    "first-step",
    "first-step-deep",
    "cost",
    "cost-repeats",
    "real-run",
    "placement",
    "kernel-times",
];

/// Sizes and budgets of a check.
#[derive(Debug, Clone)]
pub struct Profile {
    /// `gpu` or `tiny`.
    pub name: &'static str,
    gemm_size: usize,
    /// Test-name filter of the portability stage; `None`: the backend's own module (`cuda::`).
    pub(super) portability_filter: Option<&'static str>,
    first_step: FirstStepSizes,
    cost_args: &'static [&'static str],
    /// The `cost-repeats` stage's: the protocol's interval, from two repeats or more.
    cost_repeats_args: &'static [&'static str],
    pub(super) real_run: RealRunSizes,
    pub(super) placement: PlacementSizes,
    /// Seconds per stage, in [`STAGES`] order.
    budgets_s: [u64; 9],
}

#[derive(Debug, Clone)]
struct FirstStepSizes {
    layers: [usize; 2],
    batch: usize,
    seq: usize,
    methods: &'static str,
    /// The methods whose steady step's device time `kernel-times` splits by kernel, at the
    /// deeper of `layers`.
    timed_methods: &'static str,
}

#[derive(Debug, Clone)]
pub(super) struct RealRunSizes {
    pub(super) layers: usize,
    pub(super) steps: usize,
    pub(super) checkpoint_every: usize,
    pub(super) sets: &'static [&'static str],
}

/// The placement stage's two runs.
#[derive(Debug, Clone)]
pub(super) struct PlacementSizes {
    pub(super) layers: usize,
    pub(super) steps: usize,
    /// Steps between logged lines; the first interval (compilation) is not timed.
    pub(super) log_every: usize,
    pub(super) sets: &'static [&'static str],
}

impl Profile {
    /// The paper's small family at 12 and 48 layers, batch 16 × 512; about 16 minutes of budget
    /// in all, so run it in two calls (scripts/gpu/README.md).
    pub fn gpu() -> Self {
        Self {
            name: "gpu",
            gemm_size: 8192,
            portability_filter: None,
            first_step: FirstStepSizes {
                layers: [12, 48],
                batch: 16,
                seq: 512,
                methods: "haares",
                timed_methods: "standard,block-attnres,haares",
            },
            cost_args: &[
                "--preset",
                "paper",
                // The CUDA-speed issue's table: d = 128 and d = 512 at 48 layers, the three
                // methods on the path `Auto` takes and HAARES on both paths, each followed by
                // PyTorch eager on the same card with fp32 and with TF32 matrix products.
                "--family",
                "small,medium",
                // 16 steps (10 timed) of eight workers and twelve peer runs: about 6 minutes
                // at the untuned H200's earlier steps (0.5–1.3 s at d = 128); 30 steps of five
                // workers at d = 128 alone did not fit 300 s there.
                "--steps",
                "16",
                "--warmup",
                "6",
                "--repeats",
                "1",
                "--methods",
                "standard,block-attnres/fused,haares/reference,haares/fused",
                // The first-step stages count the launches of a steady step; eight more workers
                // would not fit this stage's budget.
                "--no-launches",
                "--peer",
                "torch",
                "--peer-matmul",
                "fp32,tf32",
            ],
            // The protocol's interval (two interleaved repeats) at both widths: the three
            // methods on their fast paths beside PyTorch eager at TF32, the precision of our
            // products on CUDA, with 8 steady steps a repeat; `cost` has the rest of the table
            // (HAARES's reference path, PyTorch at fp32) from one repeat.
            cost_repeats_args: &[
                "--preset",
                "paper",
                "--family",
                "small,medium",
                "--steps",
                "12",
                "--warmup",
                "4",
                "--repeats",
                "2",
                "--methods",
                "standard,block-attnres/fused,haares/fused",
                "--no-launches",
                "--peer",
                "torch",
                "--peer-matmul",
                "tf32",
            ],
            real_run: RealRunSizes {
                layers: 12,
                // Three runs' worth of steps in all (uninterrupted, killed at the first
                // checkpoint, resumed): 400 here, which the untuned H200's steps (a 48-layer step
                // took 2.3 s) should fit into the budget at 12 layers.
                steps: 200,
                checkpoint_every: 50,
                // The first-step stages' widths and batch: the same matrix-product shapes, so a
                // cold machine compiles and tunes them once, not again for the real run.
                sets: &[
                    "d_model=128",
                    "d_ff=1024",
                    "seq_len=512",
                    "batch_size=16",
                    "val_chunks=32",
                ],
            },
            placement: PlacementSizes {
                // The real run's model and batch (its kernels are compiled by then); 40 steps
                // per run, 30 of them timed, four runs in all: about 100 s at the untuned H200's
                // 12-layer steps.
                layers: 12,
                steps: 40,
                log_every: 10,
                sets: &["d_model=128", "d_ff=1024", "seq_len=512", "batch_size=16"],
            },
            // facts, cost and real-run fill one 600-second call; portability runs beside them
            // (overlap.sh) and may take nearly as long: 241 s on a cold H200 when it had five
            // tests, before the fused and packed kernels' checks and the matrix products where
            // a tuned build's kernels overrun (docs/decisions.md, decision 24) joined it.
            // kernel-times: three workers whose every launch waits for the device (about 1,800
            // launches a 48-layer step), after first-step-deep has compiled the kernels.
            budgets_s: [40, 480, 120, 180, 400, 400, 140, 180, 150],
        }
    }

    /// The same stages at toy sizes: about 10 s on a 2-core CPU (CI runs it on NdArray).
    pub fn tiny() -> Self {
        Self {
            name: "tiny",
            gemm_size: 64,
            portability_filter: Some("ndarray_f32"),
            first_step: FirstStepSizes {
                layers: [2, 4],
                batch: 2,
                seq: 16,
                methods: "standard,haares",
                timed_methods: "standard,haares",
            },
            cost_args: &[
                "--preset",
                "cpu",
                "--layers",
                "2",
                "--batch",
                "2",
                "--seq",
                "16",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--repeats",
                "1",
                "--gemm-size",
                "64",
                "--methods",
                "standard,haares/reference,haares/fused",
            ],
            cost_repeats_args: &[
                "--preset",
                "cpu",
                "--layers",
                "2",
                "--batch",
                "2",
                "--seq",
                "16",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--repeats",
                "2",
                "--gemm-size",
                "64",
                "--methods",
                "standard,haares/fused",
            ],
            real_run: RealRunSizes {
                layers: 2,
                // Enough steps after the first checkpoint for the kill to land before the end.
                steps: 240,
                checkpoint_every: 80,
                sets: &[
                    "d_model=32",
                    "d_ff=64",
                    "seq_len=32",
                    "batch_size=4",
                    "val_chunks=4",
                ],
            },
            placement: PlacementSizes {
                layers: 2,
                steps: 40,
                log_every: 10,
                sets: &["d_model=32", "d_ff=64", "seq_len=32", "batch_size=4"],
            },
            budgets_s: [60, 300, 120, 120, 180, 180, 240, 120, 120],
        }
    }

    /// The profile's budget of `stage` in seconds.
    pub fn budget_s(&self, stage: &str) -> u64 {
        STAGES
            .iter()
            .position(|s| *s == stage)
            .map_or(60, |i| self.budgets_s[i])
    }
}

/// Runs stage `name`; every command it starts shares `deadline` and appends to `log`.
pub fn run_stage(name: &str, spec: &CheckSpec, deadline: Instant, log: &Path) -> Outcome {
    let stage = Stage {
        spec,
        deadline,
        log,
        name,
    };
    let result = match name {
        "facts" => stage.facts(),
        "portability" => super::portability::portability(&stage),
        "first-step" => stage.first_step(spec.profile.first_step.layers[0], false),
        "first-step-deep" => stage.first_step(spec.profile.first_step.layers[1], false),
        "kernel-times" => stage.first_step(spec.profile.first_step.layers[1], true),
        "cost" => stage.cost("cost", spec.profile.cost_args),
        "cost-repeats" => stage.cost("cost-repeats", spec.profile.cost_repeats_args),
        "real-run" => super::real_run::real_run(&stage),
        "placement" => super::placement::placement(&stage),
        other => Err(format!("unknown stage `{other}`")),
    };
    result.unwrap_or_else(Outcome::failed)
}

impl Stage<'_> {
    fn bench(&self, args: &[&str]) -> Result<Finished, String> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--backend".into(), self.spec.backend.clone()]);
        self.run(&self.spec.bench_bin, &all)
    }

    /// The device (`nvidia-smi`, where there is one) and the GEMM peak.
    fn facts(&self) -> Result<Outcome, String> {
        let query = Command::new("nvidia-smi")
            .args([
                "--query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm",
                "--format=csv",
            ])
            .output();
        let device = match query {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).to_string(),
            Ok(out) => format!(
                "nvidia-smi failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(_) => "nvidia-smi not found (no NVIDIA driver on this machine)".into(),
        };
        let size = self.spec.profile.gemm_size.to_string();
        let gemm = self.bench(&["gemm", "--size", &size])?;
        let rate = gemm
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("GFLOP/s "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        let cache = haares_train::kernel_cache::kernel_cache_dir();
        let markdown = format!(
            "```\n{}\n```\n\nGEMM {size}×{size}: {} GFLOP/s. Kernel cache: `{}`.\n",
            device.trim(),
            rate.map_or("–".into(), |r| format!("{r:.1}")),
            cache.display()
        );
        Ok(Outcome {
            status: match (status_of(&gemm), rate) {
                (StageStatus::Passed, None) => StageStatus::Failed("no GEMM rate printed".into()),
                (status, _) => status,
            },
            results: json!({ "device": device, "gemm_gflops": rate, "gemm_size": size,
                             "kernel_cache": cache }),
            markdown,
        })
    }

    /// `haares-bench first-step` at `layers`, with `--kernel-times` where `timed` (then of the
    /// profile's timed methods): its markdown and JSON become the stage's.
    fn first_step(&self, layers: usize, timed: bool) -> Result<Outcome, String> {
        let sizes = &self.spec.profile.first_step;
        let (name, methods) = match timed {
            true => ("kernel-times", sizes.timed_methods),
            false => ("first-step", sizes.methods),
        };
        let stem = self.spec.out.join(format!("{name}-{layers}"));
        let mut args = vec![
            "first-step".to_string(),
            "--family".into(),
            "small".into(),
            "--layers".into(),
            layers.to_string(),
            "--batch".into(),
            sizes.batch.to_string(),
            "--seq".into(),
            sizes.seq.to_string(),
            "--methods".into(),
            methods.into(),
            "--out".into(),
            stem.display().to_string(),
        ];
        if timed {
            args.push("--kernel-times".into());
        }
        let finished = self.bench(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
        Ok(self.with_files(status_of(&finished), &stem))
    }

    /// The cost protocol with `cost_args`, into `<name>.md` and `<name>.json`: its markdown and
    /// JSON become the stage's.
    fn cost(&self, name: &str, cost_args: &[&str]) -> Result<Outcome, String> {
        let stem = self.spec.out.join(name);
        let mut args = vec!["cost", "--out"];
        let stem_text = stem.display().to_string();
        args.push(&stem_text);
        args.extend(cost_args);
        let finished = self.bench(&args)?;
        Ok(self.with_files(status_of(&finished), &stem))
    }

    /// A stage whose command wrote `<stem>.md` and `<stem>.json` (kept even when cut short).
    fn with_files(&self, status: StageStatus, stem: &Path) -> Outcome {
        let markdown = std::fs::read_to_string(stem.with_extension("md"))
            .unwrap_or_else(|_| "(nothing was written)\n".into());
        let file = |ext: &str| {
            stem.with_extension(ext)
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
        };
        Outcome {
            status,
            results: json!({ "markdown": file("md"), "json": file("json") }),
            markdown,
        }
    }
}
