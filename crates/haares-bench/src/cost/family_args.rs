//! The command-line options of a run that starts from a cost preset: its families, the preset
//! and the sizes that replace the preset's (`cost`'s), and one family's (`paired`'s and
//! `versus`'s).

use std::path::PathBuf;

use haares_core::ModelFamily;
use haares_train::backend::BackendKind;

use crate::cost::CostSpec;

/// Backend, preset, family and sizes.
#[derive(clap::Args)]
pub struct FamilyArgs {
    /// Backend: flex or ndarray on the CPU; wgpu or cuda with their feature.
    #[arg(long, default_value = "flex")]
    pub backend: BackendKind,
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
        let (mut cost, _) = self.preset.spec(self.backend);
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

/// A model family on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Family {
    /// d = 128.
    Small,
    /// d = 512.
    Medium,
    /// d = 768.
    Large,
}

impl Family {
    /// The families named.
    pub fn of(families: Vec<Family>) -> Vec<ModelFamily> {
        families
            .into_iter()
            .map(|f| match f {
                Family::Small => ModelFamily::Small,
                Family::Medium => ModelFamily::Medium,
                Family::Large => ModelFamily::Large,
            })
            .collect()
    }
}

/// The sizes a cost-protocol run (or a paired run) starts from.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Preset {
    /// Small widths at 12 layers, batch 8 × 128, 12 steps × 2 repeats: minutes on a 2-core CPU.
    Cpu,
    /// tab:cost: d = 128/512/768 at 48 layers, batch 16 × 512, 2K steps (a GPU).
    Paper,
}

impl Preset {
    /// The preset's spec on `backend`, and its name.
    pub fn spec(self, backend: BackendKind) -> (CostSpec, &'static str) {
        match self {
            Preset::Cpu => (CostSpec::cpu(backend), "cpu"),
            Preset::Paper => (CostSpec::paper(backend), "paper"),
        }
    }
}

/// The model sizes `cost`, `paired` and `versus` take on the command line, each replacing its preset's.
#[derive(clap::Args)]
pub struct SizeArgs {
    /// Depth L [default: the preset's].
    #[arg(long)]
    layers: Option<usize>,
    /// Blocks N, which must divide 2L [default: the preset's].
    #[arg(long)]
    blocks: Option<usize>,
    /// Rows per batch [default: the preset's].
    #[arg(long)]
    batch: Option<usize>,
    /// Context length [default: the preset's].
    #[arg(long)]
    seq: Option<usize>,
}

impl SizeArgs {
    /// `spec` with the sizes given here.
    pub fn apply(&self, spec: &mut CostSpec) {
        spec.layers = self.layers.unwrap_or(spec.layers);
        spec.blocks = self.blocks.unwrap_or(spec.blocks);
        spec.batch = self.batch.unwrap_or(spec.batch);
        spec.seq = self.seq.unwrap_or(spec.seq);
    }
}
