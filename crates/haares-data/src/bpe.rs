//! The byte-level BPE tokenizer of sec:methodology: 4096 entries trained with the Hugging Face
//! `tokenizers` backend on the first 100M raw training bytes (or all of a smaller corpus), specials
//! `<pad> <unk> <s> </s>`, saved as `tokenizer.json`, ids stored as `u16`.

use std::ops::ControlFlow;
use std::path::Path;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

use crate::char_tokenizer::normalize_newlines;
use crate::error::{DataError, Result};
use crate::prepare::{TextTokenizer, fnv1a};
use crate::registry::{DatasetSpec, Split};
use crate::shards::RowSource;

/// The special tokens, in id order.
pub const BPE_SPECIALS: [&str; 4] = ["<pad>", "<unk>", "<s>", "</s>"];
/// The paper's BPE vocabulary size.
pub const BPE_VOCAB_SIZE: usize = 4096;
/// The paper's tokenizer-training budget: the first 100M raw training bytes.
pub const BPE_TRAINING_BYTES: usize = 100_000_000;

fn tokenizer_error(what: &str) -> impl Fn(tokenizers::Error) -> DataError + '_ {
    move |e| DataError::Tokenizer(format!("{what}: {e}"))
}

/// A trained byte-level BPE tokenizer.
#[derive(Clone)]
pub struct BpeTokenizer {
    inner: Tokenizer,
    pad: u32,
}

impl std::fmt::Debug for BpeTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "BpeTokenizer {{ vocab_size: {} }}",
            self.inner.get_vocab_size(true)
        )
    }
}

impl BpeTokenizer {
    /// Trains on `rows` (already the training split) until `byte_budget` raw bytes are taken.
    pub fn train<'a>(
        rows: impl IntoIterator<Item = &'a str>,
        vocab_size: usize,
        byte_budget: usize,
        progress: bool,
    ) -> Result<Self> {
        if vocab_size > u16::MAX as usize + 1 {
            return Err(DataError::Tokenizer(format!(
                "a BPE vocabulary of {vocab_size} entries does not fit the u16 token storage"
            )));
        }
        let mut taken = 0usize;
        let mut texts = Vec::new();
        for row in rows {
            if taken >= byte_budget {
                break;
            }
            let row = &row[..floor_char_boundary(row, byte_budget - taken)];
            taken += row.len();
            texts.push(normalize_newlines(row).into_owned());
        }
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(progress)
            .special_tokens(
                BPE_SPECIALS
                    .iter()
                    .map(|s| AddedToken::from(*s, true))
                    .collect(),
            )
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build();
        let mut tokenizer = TokenizerBuilder::<
            BPE,
            NormalizerWrapper,
            PreTokenizerWrapper,
            PostProcessorWrapper,
            DecoderWrapper,
        >::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false).into()))
        .with_decoder(Some(ByteLevel::default().into()))
        .build()
        .map_err(tokenizer_error("cannot build the BPE tokenizer"))?;
        tokenizer
            .train(&mut trainer, texts.into_iter())
            .map_err(tokenizer_error("training failed"))?;
        Self::from_tokenizer(Tokenizer::from(tokenizer))
    }

    /// Trains on the first `byte_budget` bytes of a dataset's training split (the rest of the
    /// split is not read).
    pub fn train_on(
        spec: &DatasetSpec,
        root: &Path,
        vocab_size: usize,
        byte_budget: usize,
        progress: bool,
    ) -> Result<Self> {
        let mut rows = Vec::new();
        let mut taken = 0usize;
        spec.split_reader(root, Split::Train)?
            .for_each_row_while(|row| {
                if taken >= byte_budget {
                    return Ok(ControlFlow::Break(()));
                }
                taken += row.text.len();
                rows.push(row.text.to_string());
                Ok(ControlFlow::Continue(()))
            })?;
        Self::train(
            rows.iter().map(String::as_str),
            vocab_size,
            byte_budget,
            progress,
        )
    }

    fn from_tokenizer(inner: Tokenizer) -> Result<Self> {
        for (id, special) in BPE_SPECIALS.iter().enumerate() {
            if inner.token_to_id(special) != Some(id as u32) {
                return Err(DataError::Tokenizer(format!(
                    "special token {special} must have id {id}, has {:?}",
                    inner.token_to_id(special)
                )));
            }
        }
        Ok(Self { pad: 0, inner })
    }

    /// Loads a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let inner = Tokenizer::from_file(path)
            .map_err(|e| DataError::format(path, format!("not a tokenizer.json: {e}")))?;
        Self::from_tokenizer(inner)
    }

    /// Saves as `tokenizer.json` (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = self
            .inner
            .to_string(true)
            .map_err(tokenizer_error("cannot serialise"))?;
        crate::write_atomically(path, json.as_bytes())
    }

    /// Ids of a text (newlines normalised, no specials added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(normalize_newlines(text).as_ref(), false)
            .map_err(tokenizer_error("encoding failed"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of ids, specials skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(tokenizer_error("decoding failed"))
    }

    /// The underlying Hugging Face tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}

impl TextTokenizer for BpeTokenizer {
    fn kind(&self) -> &'static str {
        "bpe"
    }
    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
    fn pad_id(&self) -> u32 {
        self.pad
    }
    fn fingerprint(&self) -> u64 {
        fnv1a(self.inner.to_string(false).unwrap_or_default().as_bytes())
    }
    fn encode_row(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text)
    }
    /// Encodes in parallel with the `tokenizers` crate's batch encoder.
    fn encode_rows(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        let normalized: Vec<String> = texts
            .iter()
            .map(|t| normalize_newlines(t).into_owned())
            .collect();
        let encodings = self
            .inner
            .encode_batch(normalized, false)
            .map_err(tokenizer_error("encoding failed"))?;
        Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
    }
}

/// The largest char boundary of `s` at or below `index`.
fn floor_char_boundary(s: &str, index: usize) -> usize {
    if index >= s.len() {
        return s.len();
    }
    (0..=index)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}
