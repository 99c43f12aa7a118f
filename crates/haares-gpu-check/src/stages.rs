//! The GPU check's stages and the two profiles' sizes and budgets.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::json;

use super::process::Finished;
use super::stage::{Outcome, Stage, status_of};
use super::{CheckSpec, StageStatus};

/// Every stage, in the order they run: what a short GPU window must measure first (the
/// portability suite, the products, the cost tables, the kernels' times), then the first steps,
/// the real run and the placement of runs on devices.
pub const STAGES: &[&str] = &[
    "facts",
    "portability",
    "products",
    "cost-small",
    "cost-medium",
    "compile-small",
    "kernel-times",
    "first-step",
    "first-step-deep",
    "real-run",
    "placement",
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
    /// `products`' options (after `--out`).
    products_args: &'static [&'static str],
    /// `cost`'s options of the stages `cost-small`, `cost-medium` and `compile-small`.
    costs: [&'static [&'static str]; 3],
    pub(super) real_run: RealRunSizes,
    pub(super) placement: PlacementSizes,
    /// Seconds per stage, in [`STAGES`] order.
    budgets_s: [u64; 11],
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
    /// The family `kernel-times` takes (the first-step stages take the small one).
    timed_family: &'static str,
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
    /// The paper's sizes: 48 layers, batch 16 × 512, d = 128 and 512. The first seven stages
    /// are the two calls of scripts/gpu/README.md (570 and 590 s of budget).
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
                timed_family: "medium",
            },
            // The 15 products of a d = 128 and of a d = 512 step, 20 of each by each provider,
            // with torch.matmul beside them.
            products_args: &[
                "--family",
                "small,medium",
                "--layers",
                "48",
                "--batch",
                "16",
                "--seq",
                "512",
                "--repeats",
                "20",
            ],
            costs: [GPU_COST_SMALL, GPU_COST_MEDIUM, GPU_COMPILE_SMALL],
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
            // Two calls of at most 600 s: facts, portability and products (570 s), then the cost
            // tables and kernel-times (590 s), each stage cut by its budget so that a cold
            // machine's compilation cannot push the later ones out of the call. The rest are for
            // a longer window.
            budgets_s: [30, 360, 180, 150, 180, 140, 120, 120, 180, 140, 180],
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
                timed_family: "small",
            },
            products_args: &[
                "--family",
                "small",
                "--layers",
                "2",
                "--batch",
                "2",
                "--seq",
                "16",
                "--repeats",
                "2",
            ],
            costs: [TINY_COST, TINY_COST, TINY_COST],
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
            budgets_s: [60, 300, 60, 180, 180, 180, 120, 120, 120, 240, 120],
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

/// `cost-small` on a GPU: d = 128 at 48 layers, batch 16 × 512, the three methods on their fused
/// paths, 16 steps (6 warm-up), each beside PyTorch eager at TF32.
const GPU_COST_SMALL: &[&str] = &[
    "--preset",
    "paper",
    "--family",
    "small",
    "--steps",
    "16",
    "--warmup",
    "6",
    "--repeats",
    "1",
    "--methods",
    "standard,block-attnres/fused,haares/fused",
    "--no-launches",
    "--peer",
    "torch",
    "--peer-matmul",
    "tf32",
];

/// `cost-medium`: the same at d = 512.
const GPU_COST_MEDIUM: &[&str] = &[
    "--preset",
    "paper",
    "--family",
    "medium",
    "--steps",
    "16",
    "--warmup",
    "6",
    "--repeats",
    "1",
    "--methods",
    "standard,block-attnres/fused,haares/fused",
    "--no-launches",
    "--peer",
    "torch",
    "--peer-matmul",
    "tf32",
];

/// `compile-small`: d = 128 against `torch.compile`, the next anchor (its first steps compile for
/// tens of seconds, so 12 steps).
const GPU_COMPILE_SMALL: &[&str] = &[
    "--preset",
    "paper",
    "--family",
    "small",
    "--steps",
    "12",
    "--warmup",
    "6",
    "--repeats",
    "1",
    "--methods",
    "standard,block-attnres/fused,haares/fused",
    "--no-launches",
    "--peer",
    "torch-compile",
    "--peer-matmul",
    "tf32",
];

/// The tiny profile's cost stages: two methods at toy sizes on the CPU, in two repeats.
const TINY_COST: &[&str] = &[
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
];

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
        "products" => stage.products(),
        "cost-small" => stage.cost("cost-small", spec.profile.costs[0]),
        "cost-medium" => stage.cost("cost-medium", spec.profile.costs[1]),
        "compile-small" => stage.cost("compile-small", spec.profile.costs[2]),
        "kernel-times" => stage.first_step(spec.profile.first_step.layers[1], true),
        "first-step" => stage.first_step(spec.profile.first_step.layers[0], false),
        "first-step-deep" => stage.first_step(spec.profile.first_step.layers[1], false),
        "real-run" => super::real_run::real_run(&stage),
        "placement" => super::placement::placement(&stage),
        other => Err(format!("unknown stage `{other}`")),
    };
    result.unwrap_or_else(Outcome::failed)
}

impl Stage<'_> {
    fn bench(&self, args: &[&str]) -> Result<Finished, String> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--backend".into(), self.spec.backend.name().into()]);
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
        // The products' provider the stages' processes take (they inherit the environment).
        let products = haares_core::ops::matmul::ProductProvider::from_env()
            .map_or_else(|error| error.to_string(), |provider| provider.to_string());
        // Whether this process (and so every worker on this machine) can load cuBLAS.
        #[cfg(feature = "cuda")]
        let cublas = haares_core::ops::matmul::cublas::availability()
            .map_or_else(|why| format!(" {why}."), |()| " cuBLAS loaded.".into());
        #[cfg(not(feature = "cuda"))]
        let cublas = String::new();
        let markdown = format!(
            "```\n{}\n```\n\nGEMM {size}×{size}: {} GFLOP/s. Matrix products on CUDA \
             (`HAARES_PRODUCTS`): `{products}`.{cublas} Kernel cache: `{}`.\n",
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
                             "kernel_cache": cache, "products": products }),
            markdown,
        })
    }

    /// `haares-bench first-step` at `layers`, with `--kernel-times` where `timed` (then of the
    /// profile's timed methods): its markdown and JSON become the stage's.
    fn first_step(&self, layers: usize, timed: bool) -> Result<Outcome, String> {
        let sizes = &self.spec.profile.first_step;
        let (name, methods, family) = match timed {
            true => ("kernel-times", sizes.timed_methods, sizes.timed_family),
            false => ("first-step", sizes.methods, "small"),
        };
        let stem = self.spec.out.join(format!("{name}-{layers}"));
        let mut args = vec![
            "first-step".to_string(),
            "--family".into(),
            family.into(),
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

    /// `haares-bench products` on CUDA, into `products.md` and `products.json`: its markdown and
    /// JSON become the stage's. It measures CUDA's products only: on another backend the stage
    /// is skipped, and says so.
    fn products(&self) -> Result<Outcome, String> {
        if !self.spec.backend.is_cuda() {
            let why = format!(
                "`products` measures CUDA's matrix products, and this check runs on `{}`",
                self.spec.backend
            );
            // Every stage leaves its log, a skipped one its reason.
            std::fs::write(self.log, format!("skipped: {why}\n"))
                .map_err(|e| format!("cannot write {}: {e}", self.log.display()))?;
            return Ok(Outcome::skipped(why));
        }
        let stem = self.spec.out.join("products");
        let stem_text = stem.display().to_string();
        let mut args = vec!["products", "--out", &stem_text];
        args.extend(self.spec.profile.products_args);
        // `products` runs on the first CUDA device whatever the backend's name says.
        let finished = self.run(
            &self.spec.bench_bin,
            &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        )?;
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
