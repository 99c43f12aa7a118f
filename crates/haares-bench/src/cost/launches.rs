//! Kernel launches per training step. A step on a cube backend costs about what it launches:
//! at the paper's small family a CUDA step is bound by launches, not by arithmetic
//! (docs/benchmarks.md). On the cube backends the cost protocol therefore runs, per family and
//! method, one more worker of two steps that logs every launch
//! (`haares_train::kernel_cache::KernelEvents::ToLogCrateWithLaunches`), and reports its second
//! step's launches by phase. The timing workers log none: logging a launch costs the host time.

use std::fmt::Write as _;

use haares_core::ModelFamily;
use serde::{Deserialize, Serialize};

use crate::cost::{CostRun, CostSpec};
use crate::measure::worker::KernelLog;
use crate::method_choice::MethodChoice;

/// The kernels one steady training step of a method launched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchCount {
    /// The family.
    pub family: ModelFamily,
    /// The method, as in the spec.
    pub method: MethodChoice,
    /// Launches in the forward pass, the backward pass and the update.
    pub per_phase: [usize; 3],
}

impl LaunchCount {
    /// Launches in the whole step.
    pub fn total(&self) -> usize {
        self.per_phase.iter().sum()
    }
}

/// Whether `spec` counts launches: asked for, on a cube backend (the CPU backends launch no
/// kernels).
pub fn counts_launches(spec: &CostSpec) -> bool {
    spec.count_launches && spec.backend.is_cube()
}

/// The launches of `method`'s second step in `family`, from a fresh worker of two steps; `None`
/// when the worker counted none.
pub fn count_launches(
    spec: &CostSpec,
    family: ModelFamily,
    method: &MethodChoice,
) -> crate::Result<Option<LaunchCount>> {
    let sample = spec.train_worker(family, method, 2, KernelLog::Launches)?;
    let per_phase = sample
        .anatomy
        .and_then(|anatomy| anatomy.kernels)
        .and_then(|kernels| kernels.steady_launches());
    Ok(per_phase.map(|per_phase| LaunchCount {
        family,
        method: *method,
        per_phase,
    }))
}

/// The cost report's launch table, with each method's launches over Standard Residual's; nothing
/// where no launch was counted.
pub fn write_launch_section(out: &mut String, run: &CostRun) {
    if run.launches.is_empty() {
        return;
    }
    out.push_str(
        "\nKernel launches per training step (a second step, counted by a worker of its own that \
         logs every launch):\n\n\
         | family | method | forward | backward | update | per step | / Standard |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for count in &run.launches {
        let standard = run
            .launches
            .iter()
            .find(|c| c.family == count.family && c.method == "standard");
        let ratio = standard.map_or("–".into(), |s| {
            format!("{:.3}×", count.total() as f64 / s.total() as f64)
        });
        let [forward, backward, update] = count.per_phase;
        let _ = writeln!(
            out,
            "| {:?} | {} | {forward} | {backward} | {update} | {} | {ratio} |",
            count.family,
            count.method.label(),
            count.total()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haares_train::backend::BackendKind;

    fn run_with(launches: Vec<LaunchCount>) -> CostRun {
        CostRun {
            spec: CostSpec::cpu(BackendKind::Wgpu),
            gemm_flops_per_s: vec![1e9],
            samples: Vec::new(),
            training_flops: Vec::new(),
            peer: None,
            launches,
        }
    }

    #[test]
    fn the_table_gives_each_phase_the_step_and_the_ratio_to_standard() {
        let count = |method: &str, per_phase| LaunchCount {
            family: ModelFamily::Small,
            method: method.parse().unwrap(),
            per_phase,
        };
        let mut out = String::new();
        write_launch_section(
            &mut out,
            &run_with(vec![
                count("standard", [40, 50, 10]),
                count("haares/fused", [60, 70, 20]),
            ]),
        );
        assert!(
            out.contains("| Small | Standard Residual | 40 | 50 | 10 | 100 | 1.000× |"),
            "{out}"
        );
        assert!(
            out.contains("| Small | HAARES (fused) | 60 | 70 | 20 | 150 | 1.500× |"),
            "{out}"
        );
    }

    #[test]
    fn nothing_is_written_without_counts_and_cpu_backends_count_none() {
        let mut out = String::new();
        write_launch_section(&mut out, &run_with(Vec::new()));
        assert!(out.is_empty());
        assert!(!counts_launches(&CostSpec::cpu(BackendKind::Flex)));
        assert!(counts_launches(&CostSpec::cpu(BackendKind::Wgpu)));
        let off = CostSpec {
            count_launches: false,
            ..CostSpec::cpu(BackendKind::Cuda)
        };
        assert!(!counts_launches(&off));
    }
}
