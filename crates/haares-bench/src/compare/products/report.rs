//! The `products` report: per family, a row per product with every provider's TFLOP/s by device
//! time, cuBLAS's ratio to `torch.matmul` at the same precision against the target, the errors
//! against f64, and what ordering cuBLAS's calls with CubeCL's kernels costs (host time per call
//! minus device time); then each provider's sum over a step's products.

use std::fmt::Write as _;

use super::{CaseResult, Kernels, ProductsRun};

/// `run` as markdown; `target` is the ratio to `torch.matmul` a product must reach.
pub fn markdown(run: &ProductsRun, target: f64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Matrix products of a training step\n\n{} layers, {} tokens a batch, vocabulary {}, on \
         {}; {} products per measurement after two warm-up products, device time (CUDA events). \
         PyTorch: {}. cuBLAS: {}. Errors are the largest over sampled output elements against \
         f64, relative to each element's scale `Σ_k |a_ik b_kj|`. A transposed operand (ᵀ) is a view of a \
         row-major tensor, as the backward pass hands it over.\n",
        run.layers, run.tokens, run.vocab, run.device, run.repeats, run.peer, run.cublas
    );
    for family in &run.families {
        let (d, d_ff) = family.family.widths();
        let _ = writeln!(out, "## {:?} (d = {d}, d_ff = {d_ff})\n", family.family);
        let _ = write!(out, "| product | shape | per step |");
        for kernels in Kernels::ALL {
            let _ = write!(out, " {} TFLOP/s |", kernels.name());
        }
        let _ = writeln!(
            out,
            " cuBLAS TF32 / torch TF32 | error TF32 | error fp32 | ordering µs per call |"
        );
        let _ = writeln!(out, "|{}", "---|".repeat(3 + Kernels::ALL.len() + 4));
        for case in &family.cases {
            write_case_row(&mut out, case, target);
        }
        let _ = writeln!(out);
        write_step_sums(&mut out, &family.cases);
    }
    out
}

fn write_case_row(out: &mut String, result: &CaseResult, target: f64) {
    let case = &result.case;
    let _ = write!(
        out,
        "| {} | {} | {} |",
        case.name,
        case.shape(),
        case.per_step
    );
    for kernels in Kernels::ALL {
        let _ = write!(out, " {} |", optional(result.tflops(kernels), 1));
    }
    let verdict = match ratio_to_torch(result, Kernels::CublasTf32) {
        Some(ratio) if ratio >= target => format!("{ratio:.2}× (met)"),
        Some(ratio) => format!("{ratio:.2}× (**not met**: {target}×)"),
        None => "–".into(),
    };
    let error = |kernels| result.timing(kernels).and_then(|timing| timing.error);
    let ordering = result
        .timing(Kernels::CublasTf32)
        .and_then(|timing| Some((timing.wall_s? - timing.device_s) * 1e6));
    let _ = writeln!(
        out,
        " {verdict} | {} | {} | {} |",
        scientific(error(Kernels::CublasTf32)),
        scientific(error(Kernels::CublasFp32)),
        optional(ordering, 1)
    );
}

/// `kernels`' throughput over `torch.matmul`'s at the same precision (the peer's device time
/// over ours).
pub fn ratio_to_torch(result: &CaseResult, kernels: Kernels) -> Option<f64> {
    let ours = result.timing(kernels)?;
    let peer = result.timing(kernels.torch_peer()?)?;
    Some(peer.device_s / ours.device_s)
}

/// Each provider's device time over a step's products (a product's time × its count), and
/// cuBLAS's with its ordering.
fn write_step_sums(out: &mut String, cases: &[CaseResult]) {
    let _ = writeln!(out, "Over a step's {} products:\n", step_count(cases));
    let _ = writeln!(
        out,
        "| kernels | device ms per step | host ms per step, ordering included |\n|---|---|---|"
    );
    for kernels in Kernels::ALL {
        let device = step_sum(cases, kernels, |timing| Some(timing.device_s));
        let wall = step_sum(cases, kernels, |timing| timing.wall_s);
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            kernels.name(),
            optional(device.map(|s| s * 1e3), 2),
            optional(wall.map(|s| s * 1e3), 2)
        );
    }
    let _ = writeln!(out);
}

/// Products a step takes.
pub fn step_count(cases: &[CaseResult]) -> usize {
    cases.iter().map(|result| result.case.per_step).sum()
}

/// `Σ per_step × seconds` over every case `kernels` measured, or `None` if it missed one.
pub fn step_sum(
    cases: &[CaseResult],
    kernels: Kernels,
    seconds: impl Fn(&super::Timing) -> Option<f64>,
) -> Option<f64> {
    cases
        .iter()
        .map(|result| {
            let timing = result.timing(kernels)?;
            Some(seconds(timing)? * result.case.per_step as f64)
        })
        .sum()
}

fn optional(value: Option<f64>, decimals: usize) -> String {
    value.map_or("–".into(), |value| format!("{value:.decimals$}"))
}

fn scientific(value: Option<f64>) -> String {
    value.map_or("–".into(), |value| format!("{value:.1e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::products::{FamilyProducts, ProductCase, Timing, step_products};
    use haares_core::ModelFamily;

    fn timing(kernels: Kernels, device_s: f64, wall_s: Option<f64>, error: Option<f64>) -> Timing {
        Timing {
            kernels,
            device_s,
            wall_s,
            error,
        }
    }

    /// A case of 2·64·128·32 = 524,288 FLOPs taken `per_step` times.
    fn case(name: &str, per_step: usize) -> ProductCase {
        ProductCase {
            name: name.into(),
            m: 64,
            k: 128,
            n: 32,
            lhs_transposed: true,
            rhs_transposed: false,
            per_step,
        }
    }

    #[test]
    fn the_report_gives_rates_ratios_verdicts_and_step_sums() {
        let fast = CaseResult {
            case: case("QKV ∂W", 48),
            timings: vec![
                // 524,288 FLOPs in 1 µs: 0.5 TFLOP/s; torch 1.25 µs: cuBLAS at 1.25× torch.
                timing(Kernels::CublasTf32, 1e-6, Some(4e-6), Some(3e-4)),
                timing(Kernels::CublasFp32, 2e-6, Some(5e-6), Some(2e-7)),
                timing(Kernels::TorchTf32, 1.25e-6, None, None),
            ],
        };
        let slow = CaseResult {
            case: case("head ∂E", 1),
            timings: vec![
                // Half of torch's rate: below the 0.8 target.
                timing(Kernels::CublasTf32, 2e-6, Some(4e-6), None),
                timing(Kernels::TorchTf32, 1e-6, None, None),
            ],
        };
        let near = |got: Option<f64>, want: f64| got.is_some_and(|got| (got - want).abs() < 1e-12);
        assert!(near(ratio_to_torch(&fast, Kernels::CublasTf32), 1.25));
        assert!(near(ratio_to_torch(&slow, Kernels::CublasTf32), 0.5));
        assert_eq!(
            ratio_to_torch(&slow, Kernels::CublasFp32),
            None,
            "no fp32 peer timed"
        );
        let cases = vec![fast, slow];
        // 48 × 1 µs + 1 × 2 µs of device time, 48 × 4 µs + 4 µs of host time.
        let device = step_sum(&cases, Kernels::CublasTf32, |t| Some(t.device_s)).unwrap();
        assert!((device - 50e-6).abs() < 1e-15, "{device}");
        assert_eq!(
            step_sum(&cases, Kernels::CublasFp32, |t| Some(t.device_s)),
            None
        );
        assert_eq!(step_count(&cases), 49);
        let run = ProductsRun {
            layers: 48,
            tokens: 8192,
            vocab: 256,
            repeats: 20,
            device: "a stand-in card".into(),
            peer: "PyTorch 0.0 on a stand-in card".into(),
            cublas: "loaded".into(),
            families: vec![FamilyProducts {
                family: ModelFamily::Medium,
                cases,
            }],
        };
        let markdown = markdown(&run, 0.8);
        for expected in [
            "## Medium (d = 512, d_ff = 2048)",
            "| QKV ∂W | 64×128ᵀ · 128×32 | 48 | 0.5 | 0.3 | – | – | 0.4 | – | 1.25× (met) | 3.0e-4 | 2.0e-7 | 3.0 |",
            "| head ∂E | 64×128ᵀ · 128×32 | 1 | 0.3 | – | – | – | 0.5 | – | 0.50× (**not met**: 0.8×) | – | – | 2.0 |",
            "Over a step's 49 products:",
            "| cuBLAS TF32 | 0.05 | 0.20 |",
        ] {
            assert!(markdown.contains(expected), "{expected}\n{markdown}");
        }
    }

    #[test]
    fn a_product_off_by_more_than_its_precision_allows_is_named() {
        let result = |errors: [f64; 3]| CaseResult {
            case: case("down ∂x", 48),
            timings: vec![
                timing(Kernels::CublasTf32, 1e-6, None, Some(errors[0])),
                timing(Kernels::CublasFp32, 1e-6, None, Some(errors[1])),
                timing(Kernels::CubekAuto, 1e-6, None, Some(errors[2])),
                timing(Kernels::TorchTf32, 1e-6, None, None),
            ],
        };
        let run = |errors| ProductsRun {
            layers: 48,
            tokens: 8192,
            vocab: 256,
            repeats: 20,
            device: "a stand-in card".into(),
            peer: "none".into(),
            cublas: "loaded".into(),
            families: vec![FamilyProducts {
                family: ModelFamily::Small,
                cases: vec![result(errors)],
            }],
        };
        // TF32's rounding (4.9e-4 of an operand) is within 2e-3; f32's within 1e-5.
        assert!(crate::compare::products::wrong_products(&run([1e-3, 5e-6, 1.5e-3])).is_empty());
        // A stage read past the operands is off by percents; an f32 product taken in TF32 by 1e-4.
        let wrong = crate::compare::products::wrong_products(&run([0.03, 1e-4, f64::NAN]));
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(
            wrong[0].starts_with("Small down ∂x by cuBLAS TF32: 3.0e-2"),
            "{wrong:?}"
        );
        assert!(
            wrong[1].contains("cuBLAS fp32") && wrong[2].contains("cubek Auto: NaN"),
            "{wrong:?}"
        );
    }

    #[test]
    fn a_step_has_twelve_products_a_layer_and_three_for_the_head() {
        let cases = step_products(ModelFamily::Medium, 48, 8192, 256);
        // 12 · 48 + 3 = 579, the launches of cubek's product kernel a 48-layer step counted on
        // an H200 (docs/benchmarks.md).
        assert_eq!(cases.iter().map(|c| c.per_step).sum::<usize>(), 579);
        assert_eq!(cases.len(), 15);
        // The packed gate and up projection's weight gradient: `xᵀ ∂Y`, `[512, 8192] · [8192, 4096]`.
        let gate_up = cases.iter().find(|c| c.name == "gate/up ∂W").unwrap();
        assert_eq!((gate_up.m, gate_up.k, gate_up.n), (512, 8192, 4096));
        assert!(gate_up.lhs_transposed && !gate_up.rhs_transposed);
        // The tied head: `h Eᵀ`, the embedding read transposed.
        let head = cases.iter().find(|c| c.name == "head forward").unwrap();
        assert_eq!(
            (head.m, head.k, head.n, head.rhs_transposed),
            (8192, 512, 256, true)
        );
        // Every contraction a multiple of two 32-deep stages: cubek's double-buffered kernel is
        // measured at every shape of the paper's families.
        for family in [ModelFamily::Small, ModelFamily::Medium] {
            assert!(
                step_products(family, 48, 8192, 256)
                    .iter()
                    .all(|c| c.k % 64 == 0)
            );
        }
    }
}
