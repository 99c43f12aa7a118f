//! The command-line options of a run of one family's models that starts from a cost preset:
//! `paired`'s and `versus`'s.

use std::path::PathBuf;

use super::{CostSpec, Family, Preset, SizeArgs};

/// Backend, preset, family and sizes.
#[derive(clap::Args)]
pub struct FamilyArgs {
    /// Backend: flex or ndarray on the CPU; wgpu or cuda with their feature.
    #[arg(long, default_value = "flex")]
    pub backend: String,
    /// The cost preset the sizes start from.
    #[arg(long, value_enum, default_value = "cpu")]
    preset: Preset,
    /// Family (width).
    #[arg(long, value_enum, default_value = "small")]
    family: Family,
    #[command(flatten)]
    sizes: SizeArgs,
}

impl FamilyArgs {
    /// The preset's spec on the backend, for the family and the sizes given, with `steps` steps
    /// after `warmup` in one repeat.
    pub fn spec(&self, steps: usize, warmup: usize) -> CostSpec {
        let (mut cost, _) = self.preset.spec(&self.backend);
        cost.families = Family::of(vec![self.family]);
        self.sizes.apply(&mut cost);
        (cost.steps, cost.warmup, cost.repeats) = (steps, warmup, 1);
        cost
    }

    /// `out`, or `runs/bench/<command>-<backend>`.
    pub fn out(&self, out: Option<PathBuf>, command: &str) -> PathBuf {
        out.unwrap_or_else(|| format!("runs/bench/{command}-{}", self.backend).into())
    }
}
