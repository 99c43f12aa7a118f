//! `haares-bench first-step`: the first-step anatomy ([`crate::measure::phases`]) of one fresh
//! worker per depth × method, and whether the kernels a step compiles grow with depth.
//!
//! Every worker is a new process, as in the cost protocol, so each one compiles what its first
//! step needs (CubeCL's shared autotune and PTX caches, `haares_train::kernel_cache`, may already
//! hold results from earlier processes: the report says what this process compiled and tuned).
//! The results are rewritten after every worker, so a run cut short keeps what it measured.

use std::fmt::Write as _;
use std::path::Path;

use haares_core::ModelFamily;
use haares_train::backend::BackendKind;
use serde::{Deserialize, Serialize};

use crate::cost::CostSpec;
use crate::error::{BenchError, Result};
use crate::measure::kernel_events::KernelTally;
use crate::measure::worker::{KernelLog, TrainSample};
use crate::method_choice::MethodChoice;
use crate::profile::kernel_times::kernel_times_table;
use crate::report_files::write_atomically_both;

/// What `first-step` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FirstStepSpec {
    /// Backend.
    pub backend: BackendKind,
    /// Model family (width).
    pub family: ModelFamily,
    /// Depths L, measured in this order.
    pub layers: Vec<usize>,
    /// Blocks N.
    pub blocks: usize,
    /// Rows per batch.
    pub batch: usize,
    /// Context length.
    pub seq: usize,
    /// Steps per worker (at least 2: the first and a steady one to compare it with).
    pub steps: usize,
    /// Methods, as in the cost protocol (`name`, `name/reference`, `name/fused`).
    pub methods: Vec<MethodChoice>,
    /// Whether each worker logs every launch with its device time ([`crate::profile::kernel_times`]);
    /// otherwise it counts launches only.
    #[serde(default)]
    pub kernel_times: bool,
}

impl FirstStepSpec {
    /// The cost-protocol settings of one depth (the model is built and validated the same way).
    fn at_depth(&self, layers: usize) -> CostSpec {
        CostSpec {
            families: vec![self.family],
            layers,
            blocks: self.blocks,
            batch: self.batch,
            seq: self.seq,
            steps: self.steps,
            warmup: 1,
            methods: self.methods.clone(),
            ..CostSpec::cpu(self.backend)
        }
    }

    /// Refuses what cannot be measured, before any worker starts.
    pub fn validate(&self) -> Result<()> {
        if self.layers.is_empty() {
            return Err(BenchError::Request(
                "give at least one depth with --layers".into(),
            ));
        }
        if self.steps < 2 {
            return Err(BenchError::Request(format!(
                "--steps {} is too few: the first step is compared with later ones (use 2 or more)",
                self.steps
            )));
        }
        self.layers
            .iter()
            .try_for_each(|&layers| self.at_depth(layers).validate())
    }
}

/// Every worker's sample, by depth.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FirstStepRun {
    /// What was measured.
    pub spec: FirstStepSpec,
    /// `(layers, sample)` in measurement order.
    pub samples: Vec<(usize, TrainSample)>,
}

/// Runs one worker per depth × method, writing `<stem>.md` and `<stem>.json` after each.
pub fn run_first_step(
    spec: &FirstStepSpec,
    stem: &Path,
    mut log: impl FnMut(&str),
) -> Result<FirstStepRun> {
    spec.validate()?;
    let mut run = FirstStepRun {
        spec: spec.clone(),
        samples: Vec::new(),
    };
    for &layers in &spec.layers {
        let depth = spec.at_depth(layers);
        for method in &spec.methods {
            log(&format!("{method} at {layers} layers: starting a worker"));
            let log = match spec.kernel_times {
                true => KernelLog::Times,
                false => KernelLog::Launches,
            };
            let sample = depth.train_worker(spec.family, method, spec.steps, log)?;
            run.samples.push((layers, sample));
            write_atomically_both(stem, &run, &first_step_table(&run))?;
        }
    }
    Ok(run)
}

/// The markdown report: one row per worker, then the kernels compiled by depth, then the kernels
/// a steady step launches.
pub fn first_step_table(run: &FirstStepRun) -> String {
    let spec = &run.spec;
    let mut out = format!(
        "First-step anatomy on `{}`: {:?} family, N = {}, batch {} × {}, {} steps per fresh worker \
         process. Seconds; each phase ends with a device sync. \"Excess\" is the first step \
         minus the median later step: compilation, autotuning and first allocations. Kernels: \
         compiled / autotune keys benchmarked by this process (a shared-cache hit counts as \
         neither). {}.\n\n\
         | method | L | backend start | model init | forward | backward | update | first step | \
         later step | excess | kernels at init | kernels in step 1 (fwd + bwd + upd) | autotuned in step 1 | kernels after step 1 |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        spec.backend,
        spec.family,
        spec.blocks,
        spec.batch,
        spec.seq,
        spec.steps,
        haares_train::backend::autotune_text(haares_train::backend::autotune())
    );
    for (layers, sample) in &run.samples {
        let Some(a) = &sample.anatomy else { continue };
        let first = a.phase_s.first().copied().unwrap_or([f64::NAN; 3]);
        let (first_s, steady_s) = (
            a.first_step_s().unwrap_or(f64::NAN),
            a.steady_step_s().unwrap_or(f64::NAN),
        );
        let kernels = a.kernels.as_ref().map_or(
            ["–".to_string(), "–".into(), "–".into(), "–".into()],
            |k| {
                let total = k.first_step_total();
                [
                    k.model_init.compiled.to_string(),
                    with_phases(total.compiled, k.first_step.each_ref().map(|t| t.compiled)),
                    total.autotuned.to_string(),
                    k.after_first_step().compiled.to_string(),
                ]
            },
        );
        let _ = writeln!(
            out,
            "| {} | {layers} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {first_s:.2} | {steady_s:.3} | {:.2} | {} |",
            sample.method.label(),
            a.backend_start_s,
            a.model_init_s,
            first[0],
            first[1],
            first[2],
            first_s - steady_s,
            kernels.join(" | "),
        );
    }
    out + &depth_growth(run) + &launches_by_depth(run) + &kernel_times_table(&run.samples)
}

/// `total (a + b + c)`.
fn with_phases(total: usize, phases: [usize; 3]) -> String {
    let parts: Vec<String> = phases.iter().map(usize::to_string).collect();
    format!("{total} ({})", parts.join(" + "))
}

/// Per method and depth: the kernels the second (a steady) step launched, by phase, and what
/// each added layer adds.
fn launches_by_depth(run: &FirstStepRun) -> String {
    let mut out = String::from(
        "\nKernels launched by a steady step (the second), forward + backward + update; each \
         launch was logged, which slows the host side of these workers. The per-layer figure is \
         the difference between two depths over their difference in layers.\n\n\
         | method | L | launches per step (fwd + bwd + upd) | per added layer |\n|---|---|---|---|\n",
    );
    let mut any = false;
    for method in &run.spec.methods {
        let mut previous: Option<(usize, usize)> = None;
        for (layers, sample) in run.samples.iter().filter(|(_, s)| &s.method == method) {
            let Some(launches) = sample
                .anatomy
                .as_ref()
                .and_then(|a| a.kernels.as_ref())
                .and_then(|k| k.steady_launches())
            else {
                continue;
            };
            any = true;
            let total: usize = launches.iter().sum();
            let per_layer = match previous {
                Some((l, t)) if *layers > l => {
                    format!("{:.1}", (total as f64 - t as f64) / (*layers - l) as f64)
                }
                _ => "–".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {layers} | {} | {per_layer} |",
                method.label(),
                with_phases(total, launches)
            );
            previous = Some((*layers, total));
        }
    }
    if any {
        out
    } else {
        "\nNo kernel launches were counted (a CPU backend, or a run recorded before launches were \
         counted).\n"
            .into()
    }
}

/// Per method: the kernels its first step compiled at each depth, and whether that grows.
fn depth_growth(run: &FirstStepRun) -> String {
    let mut out = String::from(
        "\nKernels compiled (and autotune keys benchmarked) by the first step, by depth. A key \
         tuned compiles its candidate kernels too: compare depths at the same autotune-cache \
         state (a second run on a warm cache tunes nothing that the first did).\n\n",
    );
    let mut any = false;
    for method in &run.spec.methods {
        let by_depth: Vec<(usize, KernelTally)> = run
            .samples
            .iter()
            .filter(|(_, s)| &s.method == method)
            .filter_map(|(l, s)| {
                let k = s.anatomy.as_ref()?.kernels.as_ref()?;
                Some((*l, k.first_step_total()))
            })
            .collect();
        if by_depth.is_empty() {
            continue;
        }
        any = true;
        let counts: Vec<String> = by_depth
            .iter()
            .map(|(l, t)| format!("{} ({} autotuned) at L = {l}", t.compiled, t.autotuned))
            .collect();
        let _ = writeln!(
            out,
            "- {}: {}: {}",
            method.label(),
            counts.join(", "),
            growth_verdict(&by_depth)
        );
    }
    if !any {
        out.push_str("- no kernel counts: this backend runs no CubeCL kernels (CPU)\n");
    }
    out
}

/// Whether a step's kernels grow with depth, each depth against the next shallower one, naming
/// the kernels that grew. Pairwise, so that a shallow model that lacks some block shapes (two
/// layers with four blocks: one sublayer per block) is told apart from growth that goes on.
fn growth_verdict(by_depth: &[(usize, KernelTally)]) -> String {
    let mut sorted: Vec<&(usize, KernelTally)> = by_depth.iter().collect();
    sorted.sort_by_key(|(layers, _)| *layers);
    let (mut grew, mut flat) = (Vec::new(), Vec::new());
    for pair in sorted.windows(2) {
        let ((shallow, fewer), (deep, more)) = (pair[0], pair[1]);
        // Tuning a key compiles its candidate kernels too, so more tuning also counts as growth.
        if more.compiled > fewer.compiled || more.autotuned > fewer.autotuned {
            let mut grown: Vec<String> = more
                .compiled_by_name
                .iter()
                .filter_map(|(name, &n)| {
                    let before = fewer.compiled_by_name.get(name).copied().unwrap_or(0);
                    (n > before).then(|| format!("{name} {before} → {n}"))
                })
                .collect();
            if more.autotuned > fewer.autotuned {
                grown.push(format!(
                    "autotune keys {} → {}",
                    fewer.autotuned, more.autotuned
                ));
            }
            grew.push(format!(
                "from L = {shallow} to {deep} ({})",
                grown.join(", ")
            ));
        } else {
            flat.push(format!("{shallow} to {deep}"));
        }
    }
    match (grew.is_empty(), flat.is_empty()) {
        (true, _) => "does not grow with depth".into(),
        (false, true) => format!("**grows with depth**: {}", grew.join("; ")),
        (false, false) => format!(
            "**grows with depth**: {}; not from L = {}",
            grew.join("; "),
            flat.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::kernel_times::tests::sample_with;

    fn tally(compiled: &[(&str, usize)], autotuned: usize) -> KernelTally {
        KernelTally {
            compiled: compiled.iter().map(|(_, n)| n).sum(),
            autotuned,
            compiled_by_name: compiled.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            ..KernelTally::default()
        }
    }

    /// A worker's sample whose second step launched `launches` kernels by phase.
    fn sample(method: &str, launches: [usize; 3]) -> TrainSample {
        let launched = launches.map(|launched| KernelTally {
            launched,
            ..KernelTally::default()
        });
        sample_with(method, launched)
    }

    #[test]
    fn launches_are_reported_by_phase_with_what_each_added_layer_adds() {
        let spec = FirstStepSpec {
            backend: BackendKind::Wgpu,
            family: ModelFamily::Small,
            layers: vec![2, 12],
            blocks: 4,
            batch: 2,
            seq: 16,
            steps: 2,
            methods: crate::method_choice::methods(&["standard"]),
            kernel_times: false,
        };
        let run = FirstStepRun {
            spec,
            samples: vec![
                (2, sample("standard", [300, 400, 100])),
                (12, sample("standard", [1300, 2400, 400])),
            ],
        };
        let table = launches_by_depth(&run);
        assert!(
            table.contains("| Standard Residual | 2 | 800 (300 + 400 + 100) | – |"),
            "{table}"
        );
        // (4,100 − 800) / 10 layers.
        assert!(
            table.contains("| Standard Residual | 12 | 4100 (1300 + 2400 + 400) | 330.0 |"),
            "{table}"
        );
        let uncounted = FirstStepRun {
            samples: vec![(2, sample("standard", [0, 0, 0]))],
            ..run
        };
        assert!(launches_by_depth(&uncounted).contains("No kernel launches were counted"));
    }

    #[test]
    fn the_same_kernels_at_every_depth_do_not_grow() {
        let same = tally(&[("Binop", 40), ("Matmul", 13)], 0);
        let by_depth = [(48, same.clone()), (2, same.clone()), (12, same)];
        assert_eq!(growth_verdict(&by_depth), "does not grow with depth");
    }

    #[test]
    fn growth_is_named_by_the_depths_and_kernels_it_happens_between() {
        let shallow = tally(&[("Binop", 40), ("Matmul", 13)], 0);
        let deep = tally(&[("Binop", 41), ("Matmul", 13)], 0);
        // Given out of order: the verdict sorts by depth.
        let by_depth = [(12, deep.clone()), (2, shallow), (48, deep)];
        assert_eq!(
            growth_verdict(&by_depth),
            "**grows with depth**: from L = 2 to 12 (Binop 40 → 41); not from L = 12 to 48"
        );
        // Growth at every step counts, and so does more autotuning with the same kernels.
        let ladder = [
            (2, tally(&[("Binop", 40)], 0)),
            (12, tally(&[("Binop", 41), ("Matmul", 13)], 0)),
            (48, tally(&[("Binop", 41), ("Matmul", 13)], 2)),
        ];
        assert_eq!(
            growth_verdict(&ladder),
            "**grows with depth**: from L = 2 to 12 (Binop 40 → 41, Matmul 0 → 13); \
             from L = 12 to 48 (autotune keys 0 → 2)"
        );
    }
}
