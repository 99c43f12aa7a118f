//! Two methods' training steps alternated in one process, step by step (A B, B A, A B, …), and
//! the ratio of their step times pair by pair: `haares-bench paired`.
//!
//! The cost protocol compares medians of separate processes, each a few seconds long. Where the
//! machine's speed moves on that time scale (a shared host: on the 2-core development machine
//! one run's steady steps ranged over 0.34–0.50 s, and single runs' HAARES / Block AttnRes
//! ratios over 0.83–1.11×), a 5% target cannot be read off one run. Two steps a fraction of a
//! second apart see nearly the same machine, so the ratio within a pair carries much less of
//! that drift, and the median over many pairs comes with a distribution-free confidence
//! interval that says whether a target is met, missed or not settled by the run. Memory is the
//! cost protocol's: both models live in this one process.

use std::path::Path;
use std::time::Instant;

use crate::backends::dispatch;
use haares_core::{ModelConfig, TrainingBackend};
use haares_train::backend::{BackendJob, BackendKind};
use serde::{Deserialize, Serialize};

use crate::cost::CostSpec;
use crate::error::{BenchError, Result};
use crate::measure::stats::{MedianInterval, median, median_interval};
use crate::measure::worker::Trainer;
use crate::method_choice::MethodChoice;
use crate::report_files::write_atomically_both;

/// A paired run: the cost protocol's models (its preset and sizes) for two methods.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairedSpec {
    /// Backend, preset sizes, the one family measured and the two methods (`methods[0]` over
    /// `methods[1]`); `steps` is the number of pairs and `warmup` the pairs left out.
    pub cost: CostSpec,
    /// The ratio's target: `methods[0]` / `methods[1]` at most this.
    pub target: f64,
    /// Whether the command line named the methods baseline first ([`over_baseline`] turned them
    /// round).
    #[serde(default)]
    pub reordered: bool,
}

/// The two methods as a method over its baseline: the one later in the paper's order
/// ([`haares_core::method::METHOD_NAMES`]: Standard, …, Block AttnRes, the ablations, HAARES)
/// first, whatever the order given, so that a ratio and its verdict are always about the cost a
/// method adds to its baseline (HAARES over Block AttnRes, Block AttnRes over Standard), never
/// about the inverse. Two paths of one method keep their order. Returns whether it turned them.
pub fn over_baseline(methods: &mut [MethodChoice]) -> bool {
    let rank = |choice: &MethodChoice| choice.method.report_rank();
    let turn = matches!(methods, [a, b] if rank(b) > rank(a));
    if turn {
        methods.swap(0, 1);
    }
    turn
}

impl PairedSpec {
    /// Refuses what cannot be measured, before any model is built.
    pub fn validate(&self) -> Result<()> {
        if self.cost.methods.len() != 2 || self.cost.families.len() != 1 {
            return Err(BenchError::Request(format!(
                "a paired run compares two methods of one family, not {} method(s) of {} \
                 families: e.g. --methods haares,block-attnres --family small",
                self.cost.methods.len(),
                self.cost.families.len()
            )));
        }
        if self.cost.steps < self.cost.warmup + MIN_PAIRS {
            return Err(BenchError::Request(format!(
                "--pairs {} leaves fewer than {MIN_PAIRS} pairs after --warmup {}: the median's \
                 confidence interval needs at least {MIN_PAIRS}",
                self.cost.steps, self.cost.warmup
            )));
        }
        self.cost.validate()
    }
}

/// Pairs that a 95% interval of the median needs (with 5, even the extremes cover it only 94% of
/// the time).
const MIN_PAIRS: usize = 6;

/// What a paired run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PairedRun {
    /// What was measured.
    pub spec: PairedSpec,
    /// Wall time of every step of each method, pair by pair (`step_s[m][i]`: method `m`, pair `i`).
    pub step_s: [Vec<f64>; 2],
    /// Which method stepped first in each pair (0 or 1): they alternate.
    pub first: Vec<usize>,
    /// Loss of each method's first and last step (a sanity check that both trained).
    pub losses: [(f64, f64); 2],
}

impl PairedRun {
    /// `step_s[0][i] / step_s[1][i]` for every pair after the warm-up.
    pub fn ratios(&self) -> Vec<f64> {
        let warmup = self.spec.cost.warmup;
        (self.step_s[0].iter().zip(&self.step_s[1]))
            .skip(warmup)
            .map(|(a, b)| a / b)
            .collect()
    }
}

/// What a run says of the target.
pub fn verdict(interval: &MedianInterval, target: f64) -> &'static str {
    if interval.high <= target {
        "met (the whole interval is at or below the target)"
    } else if interval.low > target {
        "not met (the whole interval is above the target)"
    } else {
        "not settled by this run (the interval contains the target): run more pairs"
    }
}

/// Runs the pairs in this process on the spec's backend.
pub fn run_paired(spec: &PairedSpec, log: impl FnMut(&str) + Send) -> Result<PairedRun> {
    spec.validate()?;
    let kind = spec.cost.backend;
    let family = spec.cost.families[0];
    let config = |m: usize| spec.cost.model(family, &spec.cost.methods[m]);
    let job = PairedJob {
        configs: [config(0)?, config(1)?],
        cost: &spec.cost,
        log,
    };
    let (step_s, first, losses) = dispatch(kind, job)?;
    Ok(PairedRun {
        spec: spec.clone(),
        step_s,
        first,
        losses,
    })
}

type PairedSteps = ([Vec<f64>; 2], Vec<usize>, [(f64, f64); 2]);

struct PairedJob<'a, L> {
    configs: [ModelConfig; 2],
    cost: &'a CostSpec,
    log: L,
}

impl<L: FnMut(&str) + Send> BackendJob for PairedJob<'_, L> {
    type Output = PairedSteps;

    fn run<B: TrainingBackend>(
        mut self,
        device: B::Device,
        _backend: BackendKind,
    ) -> haares_train::Result<PairedSteps> {
        let (batch, seq) = (self.cost.batch, self.cost.seq);
        let mut trainers = [
            Trainer::<B>::new(&self.configs[0], batch, seq, &device)?,
            Trainer::<B>::new(&self.configs[1], batch, seq, &device)?,
        ];
        let pairs = self.cost.steps;
        let mut step_s = [Vec::with_capacity(pairs), Vec::with_capacity(pairs)];
        let mut losses = [(f64::NAN, f64::NAN); 2];
        let mut first = Vec::with_capacity(pairs);
        for pair in 0..pairs {
            // Alternating who goes first cancels what the order itself costs (a cache the other
            // model's step left cold, its memory being freed).
            let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
            first.push(order[0]);
            for m in order {
                let start = Instant::now();
                let times = trainers[m].step(|_| {})?;
                step_s[m].push(start.elapsed().as_secs_f64());
                if pair == 0 {
                    losses[m].0 = times.loss;
                }
                losses[m].1 = times.loss;
            }
            if (pair + 1) % LOG_EVERY == 0 || pair + 1 == pairs {
                (self.log)(&format!(
                    "pair {}/{pairs}: {} {:.3} s, {} {:.3} s",
                    pair + 1,
                    self.cost.methods[0],
                    step_s[0][pair],
                    self.cost.methods[1],
                    step_s[1][pair]
                ));
            }
        }
        Ok((step_s, first, losses))
    }
}

/// Pairs between progress lines.
const LOG_EVERY: usize = 10;

/// The run's table: each method's median step, the ratio's median and interval, the verdict.
pub fn paired_table(run: &PairedRun) -> String {
    let cost = &run.spec.cost;
    let [a, b] = [&cost.methods[0], &cost.methods[1]];
    let warmup = cost.warmup;
    let median_of = |m: usize| median(&run.step_s[m][warmup..]);
    let mut out = format!(
        "Paired steps on `{}`: {:?} family, {} layers, N = {}, batch {} × {}, {} pairs (the \
         first {warmup} left out), the two methods alternating which steps first, fp32.\n\n\
         | method | median step (s) | loss, first → last step |\n|---|---|---|\n",
        cost.backend, cost.families[0], cost.layers, cost.blocks, cost.batch, cost.seq, cost.steps
    );
    for (m, name) in [a, b].into_iter().enumerate() {
        let (first, last) = run.losses[m];
        out.push_str(&format!(
            "| {name} | {:.4} | {first:.3} → {last:.3} |\n",
            median_of(m)
        ));
    }
    let ratios = run.ratios();
    match median_interval(&ratios) {
        Some(interval) => out.push_str(&format!(
            "\n{a} / {b}, step by step: median {:.3}× over {} pairs, 95% interval {:.3}–{:.3}× \
             (ratio of the medians: {:.3}×). Target ≤ {:.2}×: {}.\n",
            interval.median,
            ratios.len(),
            interval.low,
            interval.high,
            median_of(0) / median_of(1),
            run.spec.target,
            verdict(&interval, run.spec.target)
        )),
        None => out.push_str("\nToo few pairs for a ratio.\n"),
    }
    if run.spec.reordered {
        out.push_str(&format!(
            "\nThe command line named {b} first; a ratio here is always a method over its \
             baseline ({a} / {b}), so that the verdict is about the target's ratio, not its \
             inverse.\n"
        ));
    }
    out
}

/// Writes `run` as `<stem>.json` and its table as `<stem>.md`, atomically; returns the table.
pub fn write_paired_run(run: &PairedRun, stem: &Path) -> Result<String> {
    let table = paired_table(run);
    write_atomically_both(stem, run, &table)?;
    Ok(table)
}

/// `haares-bench paired`'s options: the cost protocol's sizes for two methods of one family.
#[derive(clap::Args)]
pub struct PairedArgs {
    #[command(flatten)]
    model: crate::cost::family_args::FamilyArgs,
    /// Pairs of steps.
    #[arg(long, default_value_t = 60)]
    pairs: usize,
    /// Pairs left out at the start.
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// The two methods (names as in `cost`, `/reference` or `/fused` allowed), in any order: the
    /// ratio is always the later in the paper's order over the earlier (HAARES over Block
    /// AttnRes, Block AttnRes over Standard); two paths of one method keep their order.
    #[arg(long, value_delimiter = ',', default_value = "haares,block-attnres")]
    methods: Vec<MethodChoice>,
    /// The ratio's target, at most [default: 1.05, as `cost`'s HAARES / Block AttnRes target].
    #[arg(long, default_value_t = 1.05)]
    target: f64,
    /// Output path without extension [default: runs/bench/paired-{backend}].
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

impl PairedArgs {
    /// The run these options describe, and where it is written.
    pub fn spec(self) -> (PairedSpec, std::path::PathBuf) {
        let mut cost = self.model.spec(self.pairs, self.warmup);
        cost.methods = self.methods;
        let reordered = over_baseline(&mut cost.methods);
        let out = self.model.out(self.out, "paired");
        let spec = PairedSpec {
            cost,
            target: self.target,
            reordered,
        };
        (spec, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_is_a_method_over_its_baseline_whatever_the_order_given() {
        let turned = |given: &[&str]| {
            let mut methods = crate::method_choice::methods(given);
            let turned = over_baseline(&mut methods);
            (methods, turned)
        };
        let pairs = [
            (
                ["block-attnres", "haares"],
                ["haares", "block-attnres"],
                true,
            ),
            (
                ["haares", "block-attnres"],
                ["haares", "block-attnres"],
                false,
            ),
            (
                ["standard", "block-attnres/fused"],
                ["block-attnres/fused", "standard"],
                true,
            ),
            (
                ["haares/fused", "haares/reference"],
                ["haares/fused", "haares/reference"],
                false,
            ),
            (
                ["haares/reference", "haares/fused"],
                ["haares/reference", "haares/fused"],
                false,
            ),
        ];
        for (given, expected, turn) in pairs {
            assert_eq!(
                turned(&given),
                (crate::method_choice::methods(&expected), turn),
                "{given:?}"
            );
        }
    }

    #[test]
    fn the_verdict_reads_the_whole_interval() {
        let interval = |low, high| MedianInterval {
            median: (low + high) / 2.0,
            low,
            high,
        };
        assert!(verdict(&interval(0.98, 1.04), 1.05).starts_with("met"));
        assert!(verdict(&interval(1.06, 1.10), 1.05).starts_with("not met"));
        assert!(verdict(&interval(1.02, 1.07), 1.05).starts_with("not settled"));
    }
}
