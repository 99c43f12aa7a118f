//! Where a steady step's device time goes: `haares-bench first-step --kernel-times` logs every
//! launch of each worker with its device time (CubeCL's profiling log at its basic level,
//! [`crate::measure::kernel_events`]), and this module reports the second step's, by phase and by kernel.
//!
//! Each launch then runs alone: CubeCL waits for it and times it on the device. The sum is the
//! kernels' own time, without the gaps between launches, and the step's wall time in such a
//! worker is not its real one. A step's real time (the cost protocol's) minus this sum is the
//! gaps: launching and the host's work between kernels, which is what decides whether fewer
//! launches or faster kernels come next.

use std::fmt::Write as _;

use crate::measure::kernel_events::KernelTally;
use crate::measure::worker::TrainSample;

/// Kernels named per row of the table, largest device time first.
const LARGEST: usize = 5;

/// The markdown tables: per method and depth, the second step's device time by phase, its
/// launches, the mean device time per launch and the kernels that took most of it; then, for
/// each, every kernel it launched with its launches and device time (cuBLAS's products among
/// them on CUDA), from a first step's `(layers, sample)` pairs. Empty when no worker logged
/// times.
pub fn kernel_times_table(samples: &[(usize, TrainSample)]) -> String {
    let mut rows = String::new();
    let mut every_kernel = String::new();
    for (layers, sample) in samples {
        let Some(second) = sample
            .anatomy
            .as_ref()
            .and_then(|a| a.kernels.as_ref())
            .and_then(|k| k.second_step.as_ref())
        else {
            continue;
        };
        if second.iter().all(|phase| phase.device_ns == 0) {
            continue;
        }
        let mut step = KernelTally::default();
        second.iter().for_each(|phase| step.add(phase));
        let ms = |ns: u64| ns as f64 / 1e6;
        let phases: Vec<String> = second
            .iter()
            .map(|p| format!("{:.1}", ms(p.device_ns)))
            .collect();
        let _ = writeln!(
            rows,
            "| {} | {layers} | {:.1} ({}) | {} | {:.1} | {} |",
            sample.method.label(),
            ms(step.device_ns),
            phases.join(" + "),
            step.launched,
            step.device_ns as f64 / 1e3 / step.launched.max(1) as f64,
            largest_kernels(&step)
        );
        every_kernel += &kernels_table(&sample.method.label(), *layers, &step);
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\nDevice time of a steady step's kernels (the second step; `--kernel-times`): every \
         launch ran alone and was timed on the device, so this is the kernels' own time without \
         the gaps between launches. A real step (the cost protocol's) minus this is the gaps: \
         launching and the host's work between kernels.\n\n\
         | method | L | device ms (fwd + bwd + upd) | launches | µs per launch | largest shares |\n\
         |---|---|---|---|---|---|\n{rows}{every_kernel}"
    )
}

/// Every kernel of one worker's steady step, largest device time first: launches, device ms,
/// µs per launch and share of the step.
fn kernels_table(method: &str, layers: usize, step: &KernelTally) -> String {
    let mut by_time: Vec<(&String, &u64)> = step.device_ns_by_name.iter().collect();
    by_time.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut table = format!(
        "\nEvery kernel of {method}'s steady step at L = {layers}:\n\n\
         | kernel | launches | device ms | µs per launch | share |\n|---|---|---|---|---|\n"
    );
    for (name, &ns) in by_time {
        let launches = step.launched_by_name.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            table,
            "| `{name}` | {launches} | {:.3} | {:.1} | {:.1}% |",
            ns as f64 / 1e6,
            ns as f64 / 1e3 / launches.max(1) as f64,
            100.0 * ns as f64 / step.device_ns.max(1) as f64
        );
    }
    table
}

/// The [`LARGEST`] kernels by device time: `name share% (launches)`.
fn largest_kernels(step: &KernelTally) -> String {
    let mut by_time: Vec<(&String, &u64)> = step.device_ns_by_name.iter().collect();
    by_time.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    by_time
        .iter()
        .take(LARGEST)
        .map(|&(name, &ns)| {
            let share = 100.0 * ns as f64 / step.device_ns.max(1) as f64;
            let launches = step.launched_by_name.get(name).copied().unwrap_or(0);
            format!("`{name}` {share:.0}% ({launches})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A phase's tally: `(kernel, launches, device µs)` each.
    fn phase(kernels: &[(&str, usize, u64)]) -> KernelTally {
        let mut tally = KernelTally::default();
        for &(name, launches, micros) in kernels {
            tally.launched += launches;
            tally.device_ns += micros * 1000;
            tally.launched_by_name.insert(name.into(), launches);
            tally.device_ns_by_name.insert(name.into(), micros * 1000);
        }
        tally
    }

    /// A worker's sample whose second step's phases tallied `launched`.
    pub(crate) fn sample_with(method: &str, launched: [KernelTally; 3]) -> TrainSample {
        TrainSample {
            method: method.parse().unwrap(),
            startup_s: 0.1,
            total_s: 1.0,
            step_s: vec![0.5, 0.2],
            peak_rss_bytes: None,
            peak_allocated_bytes: None,
            device_in_use_bytes: None,
            device_reserved_bytes: None,
            anatomy: Some(crate::measure::phases::Anatomy {
                backend_start_s: 0.05,
                model_init_s: 0.05,
                phase_s: vec![[0.2, 0.2, 0.1], [0.1, 0.07, 0.03]],
                kernels: Some(crate::measure::phases::KernelAnatomy {
                    backend_start: KernelTally::default(),
                    model_init: KernelTally::default(),
                    first_step: Default::default(),
                    second_step: Some(launched),
                    later_steps: KernelTally::default(),
                }),
            }),
            validation: None,
            first_loss: 5.5,
            last_loss: 5.4,
            operations: None,
            products: None,
            product_kernels: String::new(),
        }
    }

    #[test]
    fn a_steady_step_is_split_by_phase_and_its_largest_kernels_named() {
        let second = [
            phase(&[("matmul", 4, 3000), ("rms_norm", 2, 500)]),
            phase(&[("matmul", 8, 4000), ("attention_grad", 2, 1500)]),
            phase(&[("adamw", 1, 1000)]),
        ];
        let table = kernel_times_table(&[(12, sample_with("standard", second))]);
        // 3.5 + 5.5 + 1.0 ms over 17 launches: 588.2 µs each; matmul 7 of 10 ms.
        let expected = "| Standard Residual | 12 | 10.0 (3.5 + 5.5 + 1.0) | 17 | 588.2 | \
                        `matmul` 70% (12), `attention_grad` 15% (2), `adamw` 10% (1), \
                        `rms_norm` 5% (2) |";
        assert!(table.contains(expected), "{table}");
        // Every kernel, each with its own launches and time: matmul 3 + 4 ms over 12 launches.
        assert!(
            table.contains("L = 12:\n\n| kernel | launches |"),
            "the table starts its own line: {table}"
        );
        for row in [
            "| `matmul` | 12 | 7.000 | 583.3 | 70.0% |",
            "| `attention_grad` | 2 | 1.500 | 750.0 | 15.0% |",
            "| `adamw` | 1 | 1.000 | 1000.0 | 10.0% |",
            "| `rms_norm` | 2 | 0.500 | 250.0 | 5.0% |",
        ] {
            assert!(table.contains(row), "{row} in {table}");
        }
    }

    #[test]
    fn workers_without_times_give_no_table() {
        let counted = [phase(&[]), phase(&[]), phase(&[])].map(|mut tally| {
            tally.launched = 30;
            tally
        });
        assert_eq!(
            kernel_times_table(&[(12, sample_with("standard", counted))]),
            ""
        );
        assert_eq!(kernel_times_table(&[]), "");
    }
}
