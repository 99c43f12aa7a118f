//! Preparation: a split is tokenised once, row by row, into a [`PreparedShard`], cached under a
//! key of (dataset, revision, split rule, split, tokenizer, chunk length, source files) so a
//! second run starts at once, and a changed, added or removed shard prepares anew
//! ([`crate::sources`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use crate::char_tokenizer::{CharTokenizer, PAD};
use crate::chunking::{CHUNK_LEN, chunk_row};
use crate::error::{DataError, Result};
use crate::prepared::{PreparedShard, PreparedWriter};
use crate::registry::{DatasetSpec, Split};
use crate::shards::ReadStats;
use crate::shards::RowSource;
use crate::sources::fingerprint_sources;

/// A tokenizer the pipeline can prepare data with.
pub trait TextTokenizer {
    /// `char` or `bpe`: part of the cache key and the file name.
    fn kind(&self) -> &'static str;
    /// Number of ids.
    fn vocab_size(&self) -> usize;
    /// Id of `<pad>`.
    fn pad_id(&self) -> u32;
    /// A fingerprint of the vocabulary: two tokenizers with the same fingerprint encode alike.
    fn fingerprint(&self) -> u64;
    /// Ids of one row.
    fn encode_row(&self, text: &str) -> Result<Vec<u32>>;
    /// Ids of several rows; tokenizers that can encode in parallel override this.
    fn encode_rows(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        texts.iter().map(|text| self.encode_row(text)).collect()
    }
}

/// Rows handed to [`TextTokenizer::encode_rows`] at once.
const ROWS_PER_BATCH: usize = 512;

impl TextTokenizer for CharTokenizer {
    fn kind(&self) -> &'static str {
        "char"
    }
    fn vocab_size(&self) -> usize {
        CharTokenizer::vocab_size(self)
    }
    fn pad_id(&self) -> u32 {
        PAD
    }
    fn fingerprint(&self) -> u64 {
        fnv1a(self.chars().iter().collect::<String>().as_bytes())
    }
    fn encode_row(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.encode(text))
    }
}

/// 64-bit FNV-1a: a stable, dependency-free hash for cache keys (not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a preparation did.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareReport {
    /// The prepared file.
    pub path: PathBuf,
    /// Whether it was found in the cache.
    pub cached: bool,
    /// Row counts of the pass (zero when cached).
    pub stats: ReadStats,
    /// Chunks written.
    pub chunks: usize,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// The cache file of a split prepared with a tokenizer from source files with fingerprint
/// `sources` ([`crate::sources::fingerprint_sources`]).
pub fn cache_path(
    spec: &DatasetSpec,
    split: Split,
    tokenizer: &dyn TextTokenizer,
    sources: u64,
    cache_dir: &Path,
) -> PathBuf {
    let key = format!(
        "{}|{}|{:?}|{:?}|{}|{:016x}|{}|{sources:016x}|v2",
        spec.name,
        spec.revision.as_deref().unwrap_or("embedded"),
        spec.rule,
        split,
        tokenizer.kind(),
        tokenizer.fingerprint(),
        CHUNK_LEN
    );
    cache_dir.join(format!(
        "{}-{}-{}-{:016x}.tokens",
        spec.name,
        split.name(),
        tokenizer.kind(),
        fnv1a(key.as_bytes())
    ))
}

/// A spinner of the rows prepared so far, shown when `progress` is set.
fn preparing_bar(progress: bool, what: String) -> ProgressBar {
    let bar = if progress {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} preparing {msg} [{elapsed}] {pos} rows")
            .expect("a valid template"),
    );
    bar.set_message(what);
    bar
}

/// Tokenises `split` of the dataset under `root` into the cache (or reuses the cached file).
/// Shows a progress bar when `progress` is set.
pub fn prepare_split(
    spec: &DatasetSpec,
    root: &Path,
    split: Split,
    tokenizer: &dyn TextTokenizer,
    cache_dir: &Path,
    progress: bool,
) -> Result<(PreparedShard, PrepareReport)> {
    let start = Instant::now();
    let reader = spec.split_reader(root, split)?;
    let sources = fingerprint_sources(root, reader.shards(), cache_dir)?.value;
    let path = cache_path(spec, split, tokenizer, sources, cache_dir);
    if let Some(shard) = open_if_from(&path, sources)? {
        let report = PrepareReport {
            path,
            cached: true,
            stats: ReadStats::default(),
            chunks: shard.len(),
            seconds: start.elapsed().as_secs_f64(),
        };
        return Ok((shard, report));
    }
    std::fs::create_dir_all(cache_dir).map_err(|e| DataError::io(cache_dir, e))?;
    let bar = preparing_bar(
        progress,
        format!("{} {} ({})", spec.name, split.name(), tokenizer.kind()),
    );
    let mut writer =
        PreparedWriter::create(&path, tokenizer.vocab_size(), CHUNK_LEN)?.with_sources(sources);
    let mut pending: Vec<String> = Vec::with_capacity(ROWS_PER_BATCH);
    let mut tokens = 0usize;
    let mut flush = |pending: &mut Vec<String>, writer: &mut PreparedWriter| -> Result<()> {
        for ids in tokenizer.encode_rows(pending)? {
            tokens += ids.len();
            chunk_row(&ids, CHUNK_LEN, tokenizer.pad_id())
                .iter()
                .try_for_each(|chunk| writer.push(chunk))?;
        }
        bar.inc(pending.len() as u64);
        pending.clear();
        Ok(())
    };
    let stats = reader.for_each_row(|row| {
        pending.push(row.text.to_string());
        if pending.len() == ROWS_PER_BATCH {
            flush(&mut pending, &mut writer)
        } else {
            Ok(())
        }
    })?;
    flush(&mut pending, &mut writer)?;
    let chunks = writer.chunks();
    let shard = writer.finish()?;
    bar.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if progress {
        eprintln!(
            "prepared {}: {chunks} chunks, {tokens} tokens in {seconds:.1} s ({:.0} tokens/s)",
            path.display(),
            tokens as f64 / seconds.max(1e-3)
        );
    }
    Ok((
        shard,
        PrepareReport {
            path,
            cached: false,
            stats,
            chunks,
            seconds,
        },
    ))
}

/// The BPE pipeline's split (docs/decisions.md, decision 10): every 513-token chunk of the training
/// source, shuffled with `seed`, the first `validation_fraction` of them to validation, the rest to
/// training (both in their original order). Returns `(train, validation)`, cached like
/// [`prepare_split`].
pub fn prepare_chunk_split(
    spec: &DatasetSpec,
    root: &Path,
    tokenizer: &dyn TextTokenizer,
    cache_dir: &Path,
    seed: u64,
    validation_fraction: f64,
    progress: bool,
) -> Result<(PreparedShard, PreparedShard)> {
    let (all, _) = prepare_split(spec, root, Split::Train, tokenizer, cache_dir, progress)?;
    let sources = all.sources();
    let stem = all
        .path()
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("chunks")
        .to_string();
    let name = |split: &str| {
        cache_dir.join(format!(
            "{stem}-chunksplit-{seed}-{validation_fraction}-{split}.tokens"
        ))
    };
    let (train_path, validation_path) = (name("train"), name("validation"));
    if let (Some(train), Some(validation)) = (
        open_if_from(&train_path, sources)?,
        open_if_from(&validation_path, sources)?,
    ) {
        return Ok((train, validation));
    }
    let order = crate::batching::epoch_order(all.len(), seed, 0);
    let validation_count = (all.len() as f64 * validation_fraction).round() as usize;
    let mut is_validation = vec![false; all.len()];
    for &chunk in &order[..validation_count] {
        is_validation[chunk] = true;
    }
    let writer = |path: &Path| {
        PreparedWriter::create(path, all.vocab_size(), all.chunk_len())
            .map(|w| w.with_sources(sources))
    };
    let (mut train, mut validation) = (writer(&train_path)?, writer(&validation_path)?);
    let mut tokens = Vec::with_capacity(all.chunk_len());
    for (chunk, to_validation) in is_validation.into_iter().enumerate() {
        all.read_chunk(chunk, &mut tokens);
        let piece = crate::chunking::Chunk {
            tokens: tokens.clone(),
            len: all.real_len(chunk),
        };
        if to_validation {
            validation.push(&piece)?
        } else {
            train.push(&piece)?
        }
    }
    let (train, validation) = (train.finish()?, validation.finish()?);
    if progress {
        for shard in [&train, &validation] {
            eprintln!(
                "prepared {}: {} chunks, drawn from {}",
                shard.path().display(),
                shard.len(),
                all.path().display()
            );
        }
    }
    Ok((train, validation))
}

/// The cached shard at `path` if it exists and was prepared from the sources `sources`; a cached
/// file from other sources (its name matched, its header does not) is prepared anew, never used.
fn open_if_from(path: &Path, sources: u64) -> Result<Option<PreparedShard>> {
    if !path.exists() {
        return Ok(None);
    }
    let shard = PreparedShard::open(path)?;
    if shard.sources() == sources {
        return Ok(Some(shard));
    }
    eprintln!(
        "warning: `{}` was prepared from other source files (fingerprint {:016x}, now {sources:016x}); \
         preparing it again",
        path.display(),
        shard.sources()
    );
    Ok(None)
}
