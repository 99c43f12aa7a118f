//! `inspect`: what the routers of a trained model do — per read site its slots and their mean
//! weights `ᾱ`, the detail mass `p_D` (eq:groupmixture), the entropy of `α` and the detail bias —
//! over a run's validation tokens or over a prompt (then also per token), with the heatmap of the
//! report ([`crate::report::heatmap::Heatmap`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::tensor::{Int, Tensor, TensorData};
use haares_core::{
    GroupMass, HaaresModel, LoadOptions, ReadSite, RoutingStatistics, RoutingTally, RoutingTrace,
    SiteStatistics, SlotKind, TrainingBackend,
};

use crate::backend::{BackendJob, BackendKind};
use crate::config::TokenizerKind;
use crate::data::{self, DataPaths, Tokenizer};
use crate::error::{Result, TrainError, write_atomically};
use crate::inference::ModelSource;
use crate::report::heatmap::Heatmap;
use crate::run::loss::{to_device, validation_pass};

/// What `inspect` reads: a model inside a run (with its config, tokeniser and data), or a bare
/// `.safetensors` file (the model alone).
pub enum Inspected {
    /// A run directory, or a model file inside one.
    Run(ModelSource),
    /// A model file with no run around it.
    Bare(PathBuf),
}

impl Inspected {
    /// A run directory or a file inside one; any other existing file as a bare model.
    pub fn resolve(path: &Path) -> Result<Self> {
        match ModelSource::resolve(path) {
            Ok(source) => Ok(Self::Run(source)),
            Err(_) if path.is_file() => Ok(Self::Bare(path.to_path_buf())),
            Err(e) => Err(e),
        }
    }

    fn model_file(&self) -> &Path {
        match self {
            Self::Run(source) => &source.model,
            Self::Bare(file) => file,
        }
    }

    /// Where the inspection is written when `--out` is not given: `<run>/inspect/`, or
    /// `<file stem>-inspect/` beside a bare file.
    pub fn default_out(&self) -> PathBuf {
        match self {
            Self::Run(source) => source.run_dir.join("inspect"),
            Self::Bare(file) => {
                let stem = file.file_stem().unwrap_or_default().to_string_lossy();
                file.with_file_name(format!("{stem}-inspect"))
            }
        }
    }
}

/// `inspect`: the routing statistics of a model and its heatmap.
pub struct InspectJob {
    /// The model.
    pub inspected: Inspected,
    /// How the model file is read.
    pub load: LoadOptions,
    /// Route this text instead of the validation split, and report it per token.
    pub prompt: Option<String>,
    /// The tokeniser's file, for a bare model (a run's own is used otherwise).
    pub tokenizer: Option<PathBuf>,
    /// Validation chunks to route (without a prompt).
    pub chunks: usize,
    /// Where the table, heatmap and per-token weights are written.
    pub out: PathBuf,
    /// Data locations (for the validation split).
    pub paths: DataPaths,
}

/// What `inspect` found; its files are in [`InspectJob::out`].
#[derive(Debug)]
pub struct Inspection {
    /// The per-site statistics.
    pub statistics: RoutingStatistics,
    /// The routing table as printed.
    pub table: String,
    /// Per-token detail mass, one row per prompt token (prompt only).
    pub per_token: Option<String>,
    /// The files written.
    pub files: Vec<PathBuf>,
}

impl BackendJob for InspectJob {
    type Output = Inspection;

    fn run<B: TrainingBackend>(self, device: B::Device, _: BackendKind) -> Result<Inspection> {
        let model_file = self.inspected.model_file().to_path_buf();
        let model =
            HaaresModel::<B::InnerBackend>::load_safetensors_with(&model_file, &device, self.load)?;
        if !model.config.method.is_routed() {
            return Err(TrainError::Config(format!(
                "`{}` is a {} model: it has no depth router, so there is no routing to inspect \
                 (routing exists for block-attnres and the haares variants)",
                model_file.display(),
                model.config.method.name()
            )));
        }
        let mut tally = RoutingTally::new();
        let mut per_token = None;
        let source = match &self.prompt {
            Some(prompt) => {
                let tokenizer = self.tokenizer()?;
                let (ids, trace) = route_prompt::<B>(&model, &tokenizer, prompt, &device)?;
                tally.add(&trace, None)?;
                per_token = Some(token_table(&tokenizer, &ids, &trace)?);
                format!("the {} tokens of the prompt", ids.len())
            }
            None => self.route_validation::<B>(&model, &mut tally, &device)?,
        };
        let statistics = tally.finish(&model);
        let title = format!(
            "{} · {} layers · N = {}: mean routing weight ᾱ over {source}",
            model.config.method.name(),
            model.config.n_layers,
            model.config.blocks
        );
        let files = self.write(&statistics, &title, per_token.as_ref())?;
        Ok(Inspection {
            table: routing_table(&title, &statistics),
            statistics,
            per_token: per_token.map(|(text, _)| text),
            files,
        })
    }
}

impl InspectJob {
    fn tokenizer(&self) -> Result<Tokenizer> {
        match (&self.tokenizer, &self.inspected) {
            (Some(path), _) => load_any_tokenizer(path),
            (None, Inspected::Run(source)) => source.tokenizer(),
            (None, Inspected::Bare(file)) => Err(TrainError::Config(format!(
                "`{}` is a bare model file without a run around it, so it has no tokeniser: pass \
                 --tokenizer with the tokenizer.json it was trained with",
                file.display()
            ))),
        }
    }

    /// Routes the first `chunks` validation chunks of the run's dataset; returns what was routed.
    fn route_validation<B: TrainingBackend>(
        &self,
        model: &HaaresModel<B::InnerBackend>,
        tally: &mut RoutingTally,
        device: &B::Device,
    ) -> Result<String> {
        let source = match &self.inspected {
            Inspected::Run(source) => source,
            Inspected::Bare(file) => {
                return Err(TrainError::Config(format!(
                    "`{}` is a bare model file: it has no validation split to route; pass \
                     --prompt TEXT with --tokenizer FILE, or inspect the run directory",
                    file.display()
                )));
            }
        };
        let config = source.run_config()?;
        let data = data::prepare(&config, &self.paths, false)?;
        let chunks = self.chunks.max(1).min(data.validation.len());
        for batch in validation_pass(&data.validation, config.batch_size, Some(chunks)) {
            let batch = to_device::<B::InnerBackend>(&batch, config.seq_len, device);
            let (_, trace) = model.forward_with_trace_unchecked(batch.inputs.clone());
            tally.add(&trace, Some(&batch.mask))?;
        }
        Ok(format!(
            "{} validation tokens ({chunks} chunks of `{}`)",
            tally.tokens(),
            config.dataset
        ))
    }

    /// Writes `routing.json`, the heatmap and, for a prompt, `tokens.csv` into the output folder.
    fn write(
        &self,
        statistics: &RoutingStatistics,
        title: &str,
        per_token: Option<&(String, String)>,
    ) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(&self.out).map_err(|e| TrainError::io(&self.out, e))?;
        let json = self.out.join("routing.json");
        let text = serde_json::to_vec_pretty(statistics).expect("statistics serialise");
        write_atomically(&json, &text)?;
        let heatmap = Heatmap {
            title: title.to_string(),
            panels: vec![(String::new(), statistics.clone())],
        };
        heatmap.save(&self.out, "routing")?;
        let mut files = vec![
            json,
            self.out.join("routing.svg"),
            self.out.join("routing.png"),
        ];
        if let Some((_, csv)) = per_token {
            let path = self.out.join("tokens.csv");
            write_atomically(&path, csv.as_bytes())?;
            files.push(path);
        }
        Ok(files)
    }
}

/// A tokeniser file of either kind: haares' character tokeniser, or a byte-level BPE.
fn load_any_tokenizer(path: &Path) -> Result<Tokenizer> {
    Tokenizer::load(TokenizerKind::Char, path).or_else(|char_error| {
        Tokenizer::load(TokenizerKind::Bpe, path).map_err(|bpe_error| {
            TrainError::Config(format!(
                "`{}` is neither a character tokeniser ({char_error}) nor a BPE tokenizer.json \
                 ({bpe_error}); pass the tokenizer.json of the model's run",
                path.display()
            ))
        })
    })
}

/// The prompt's ids (its last `max_seq_len`) and their routing trace.
fn route_prompt<B: TrainingBackend>(
    model: &HaaresModel<B::InnerBackend>,
    tokenizer: &Tokenizer,
    prompt: &str,
    device: &B::Device,
) -> Result<(Vec<u32>, RoutingTrace<B::InnerBackend>)> {
    let ids = tokenizer.encode(prompt)?;
    if ids.is_empty() {
        return Err(TrainError::Config(
            "the prompt is empty; give a few characters with --prompt".into(),
        ));
    }
    if ids.len() > model.config.max_seq_len {
        return Err(TrainError::Config(format!(
            "the prompt has {} tokens but the model reads at most {}; shorten it",
            ids.len(),
            model.config.max_seq_len
        )));
    }
    let input: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    let tokens = Tensor::<B::InnerBackend, 2, Int>::from_data(
        TensorData::new(input, [1, ids.len()]),
        device,
    );
    let (_, trace) = model.forward_with_trace(tokens)?;
    Ok((ids, trace))
}

/// The per-token table (printed: each token's `p_D` at every site that reads a detail slot) and
/// `tokens.csv` (every weight: token, site, slot).
fn token_table<B: burn::tensor::backend::Backend>(
    tokenizer: &Tokenizer,
    ids: &[u32],
    trace: &RoutingTrace<B>,
) -> Result<(String, String)> {
    let read = |tensor: Tensor<B, 3>| -> Result<Vec<f64>> {
        tensor
            .into_data()
            .convert::<f64>()
            .into_vec::<f64>()
            .map_err(|e| TrainError::Report(format!("routing weights unreadable: {e:?}")))
    };
    let texts: Vec<String> = ids
        .iter()
        .map(|id| tokenizer.decode(&[*id]))
        .collect::<Result<_>>()?;
    let mut csv = String::from("position,token,site,slot,weight\n");
    let mut detail_columns: Vec<(String, Vec<f64>)> = Vec::new();
    for site in &trace.sites {
        let weights = read(site.weights.clone())?;
        let slots = site.slots.len();
        let label = site_label(site.site);
        let mut shares = Vec::with_capacity(texts.len());
        for (position, row) in weights.chunks(slots).enumerate() {
            for (slot, weight) in site.slots.iter().zip(row) {
                let token = texts[position].replace('"', "\"\"");
                let _ = writeln!(csv, "{position},\"{token}\",{label},{slot},{weight:.6}");
            }
            shares.push(GroupMass::of(&site.slots, row).detail());
        }
        if site.slots.iter().any(|s| s.kind == SlotKind::Detail) {
            detail_columns.push((label, shares));
        }
    }
    let mut table = String::from("p_D (%) per token and read site\n| # | token |");
    for (label, _) in &detail_columns {
        let _ = write!(table, " {label} |");
    }
    let _ = writeln!(table, "\n|---|---|{}", "---|".repeat(detail_columns.len()));
    for (position, text) in texts.iter().enumerate() {
        let _ = write!(table, "| {position} | {text:?} |");
        for (_, shares) in &detail_columns {
            let _ = write!(table, " {:.1} |", 100.0 * shares[position]);
        }
        let _ = writeln!(table);
    }
    Ok((table, csv))
}

/// `ℓ3` for event 3 (1-based), `F` for the final readout.
fn site_label(site: ReadSite) -> String {
    match site {
        ReadSite::Event { event } => format!("ℓ{}", event + 1),
        ReadSite::Final => "F".into(),
    }
}

/// The routing table: per read site its place, the weight of each slot group, `p_D`, entropy,
/// bias and every slot's mean weight.
pub fn routing_table(title: &str, statistics: &RoutingStatistics) -> String {
    let mut table = format!("{title}\n\n");
    table.push_str(
        "| site | n | r | S | e | C done | D̂ done | C active | D̂ active | p_D | H (nats) | b | slots: ᾱ |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for site in &statistics.sites {
        let SiteStatistics { groups: g, .. } = site;
        let place = |v: Option<usize>| v.map(|v| v.to_string()).unwrap_or_else(|| "–".into());
        let slots: Vec<String> = site
            .slots
            .iter()
            .zip(&site.weights)
            .map(|(slot, weight)| format!("{slot} {weight:.3}"))
            .collect();
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1}% | {:.3} | {} | {} |",
            site_label(site.site),
            place(site.block),
            place(site.position),
            site.slots.len(),
            g.embedding,
            g.completed_cumulative,
            g.completed_detail,
            g.active_cumulative,
            g.active_detail,
            100.0 * site.detail_mass,
            site.entropy,
            site.detail_bias
                .map(|b| format!("{b:.3}"))
                .unwrap_or_else(|| "–".into()),
            slots.join(", ")
        );
    }
    table
}
