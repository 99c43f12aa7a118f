//! A run's data: its dataset located or downloaded, the tokeniser trained once per dataset and
//! cached, and the prepared train/validation shards.

use std::path::{Path, PathBuf};

use haares_data::bpe::{BPE_TRAINING_BYTES, BPE_VOCAB_SIZE, BpeTokenizer};
use haares_data::char_tokenizer::CharTokenizer;
use haares_data::hub::{self, HubOptions};
use haares_data::prepare::{prepare_chunk_split, prepare_split};
use haares_data::prepared::PreparedShard;
use haares_data::sources::fingerprint_sources;
use haares_data::{Split, dataset, embedded_corpus_dir};

use crate::config::{RunConfig, TokenizerKind};
use crate::error::{Result, TrainError};

/// Character vocabulary cap (tab:modelconfig: 256).
pub const CHAR_VOCAB_SIZE: usize = 256;

/// Where datasets and prepared data live.
#[derive(Debug, Clone)]
pub struct DataPaths {
    /// Hub cache for downloaded datasets (hub layout; shards placed there by hand are used).
    pub data_dir: PathBuf,
    /// Prepared token shards and trained tokenisers.
    pub cache_dir: PathBuf,
    /// Whether a missing dataset may be downloaded from the hub.
    pub download: bool,
}

/// A trained tokeniser of either kind.
pub enum Tokenizer {
    /// Character tokeniser.
    Char(CharTokenizer),
    /// Byte-level BPE.
    Bpe(Box<BpeTokenizer>),
}

impl Tokenizer {
    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Char(t) => t.vocab_size(),
            Self::Bpe(t) => t.inner().get_vocab_size(true),
        }
    }
    /// Ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Self::Char(t) => Ok(t.encode(text)),
            Self::Bpe(t) => Ok(t.encode(text)?),
        }
    }
    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Self::Char(t) => Ok(t.decode(ids)),
            Self::Bpe(t) => Ok(t.decode(ids)?),
        }
    }
    /// Saves to `path` (character JSON or a Hugging Face `tokenizer.json`).
    pub fn save(&self, path: &Path) -> Result<()> {
        match self {
            Self::Char(t) => Ok(t.save(path)?),
            Self::Bpe(t) => Ok(t.save(path)?),
        }
    }
    /// Loads a tokeniser of `kind` saved by [`Self::save`].
    pub fn load(kind: TokenizerKind, path: &Path) -> Result<Self> {
        Ok(match kind {
            TokenizerKind::Char => Self::Char(CharTokenizer::load(path)?),
            TokenizerKind::Bpe => Self::Bpe(Box::new(BpeTokenizer::load(path)?)),
        })
    }
    fn as_text_tokenizer(&self) -> &dyn haares_data::prepare::TextTokenizer {
        match self {
            Self::Char(t) => t,
            Self::Bpe(t) => t.as_ref(),
        }
    }
}

/// The prepared data of a run.
pub struct RunData {
    /// The tokeniser (its vocabulary sizes the model).
    pub tokenizer: Tokenizer,
    /// Training chunks.
    pub train: PreparedShard,
    /// Validation chunks.
    pub validation: PreparedShard,
}

/// The directory holding the dataset's shards: the embedded corpus for `sotu`, otherwise the hub
/// snapshot under `paths.data_dir`, downloaded and checked when allowed ([`hub::download`], which
/// makes no request once every file was checked), used as it is when not.
pub fn dataset_root(name: &str, paths: &DataPaths, progress: bool) -> Result<PathBuf> {
    let spec = dataset(name)?;
    if spec.repo_id.is_none() {
        return Ok(embedded_corpus_dir());
    }
    let snapshot = hub::snapshot_dir(&spec, &paths.data_dir)
        .ok_or_else(|| TrainError::Config(format!("dataset `{name}` has no hub location")))?;
    if !paths.download {
        return Ok(snapshot);
    }
    let options = HubOptions {
        cache_dir: paths.data_dir.clone(),
        // `HF_ENDPOINT` (a mirror) is read by the download itself.
        endpoint: None,
        progress,
    };
    Ok(hub::download(&spec, &options)?)
}

/// Trains (or loads from the cache) the run's tokeniser and prepares both splits.
pub fn prepare(config: &RunConfig, paths: &DataPaths, progress: bool) -> Result<RunData> {
    let spec = dataset(&config.dataset)?;
    let root = dataset_root(&config.dataset, paths, progress)?;
    std::fs::create_dir_all(&paths.cache_dir).map_err(|e| TrainError::io(&paths.cache_dir, e))?;
    let revision = spec.revision.as_deref().unwrap_or("embedded");
    // The tokenizer is trained on the training split: its identity includes those files.
    let train_shards = spec.split_reader(&root, Split::Train)?;
    let sources = fingerprint_sources(&root, train_shards.shards(), &paths.cache_dir)?;
    let cached = paths.cache_dir.join(format!(
        "{}-{}-{}-{:016x}-tokenizer.json",
        spec.name,
        &revision[..revision.len().min(12)],
        match config.tokenizer {
            TokenizerKind::Char => "char",
            TokenizerKind::Bpe => "bpe",
        },
        sources.value
    ));
    let tokenizer = if cached.exists() {
        Tokenizer::load(config.tokenizer, &cached)?
    } else {
        let trained = match config.tokenizer {
            TokenizerKind::Char => {
                Tokenizer::Char(CharTokenizer::train_on(&spec, &root, CHAR_VOCAB_SIZE)?)
            }
            TokenizerKind::Bpe => Tokenizer::Bpe(Box::new(BpeTokenizer::train_on(
                &spec,
                &root,
                BPE_VOCAB_SIZE,
                BPE_TRAINING_BYTES,
                progress,
            )?)),
        };
        trained.save(&cached)?;
        trained
    };
    let text = tokenizer.as_text_tokenizer();
    let (train, validation) = match config.tokenizer {
        TokenizerKind::Char => {
            let (train, _) =
                prepare_split(&spec, &root, Split::Train, text, &paths.cache_dir, progress)?;
            let (validation, _) = prepare_split(
                &spec,
                &root,
                Split::Validation,
                text,
                &paths.cache_dir,
                progress,
            )?;
            (train, validation)
        }
        // docs/decisions.md, decision 10: the BPE pipeline splits chunks, seed 42, 5% to
        // validation.
        TokenizerKind::Bpe => {
            prepare_chunk_split(&spec, &root, text, &paths.cache_dir, 42, 0.05, progress)?
        }
    };
    if train.is_empty() || validation.is_empty() {
        return Err(TrainError::Config(format!(
            "dataset `{}` prepared to {} training and {} validation chunks; both must be non-empty",
            spec.name,
            train.len(),
            validation.len()
        )));
    }
    Ok(RunData {
        tokenizer,
        train,
        validation,
    })
}
