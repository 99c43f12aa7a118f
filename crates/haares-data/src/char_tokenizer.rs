//! The character tokenizer of sec:methodology: ids 0–3 are `<pad> <unk> <bos> <eos>`, then the
//! most frequent characters of the training split (ties by code point, docs/decisions.md, decision
//! 8).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DataError, Result};
use crate::registry::{DatasetSpec, Split};
use crate::shards::RowSource;
use crate::write_atomically;

/// The special tokens, in id order.
pub const CHAR_SPECIALS: [&str; 4] = ["<pad>", "<unk>", "<bos>", "<eos>"];
/// Id of `<pad>`.
pub const PAD: u32 = 0;
/// Id of `<unk>`.
pub const UNK: u32 = 1;

/// `\r\n` and lone `\r` become `\n` (sec:methodology; docs/decisions.md, decision 8).
pub fn normalize_newlines(text: &str) -> Cow<'_, str> {
    if text.contains('\r') {
        Cow::Owned(text.replace("\r\n", "\n").replace('\r', "\n"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Counts characters of the training split, after newline normalisation.
#[derive(Debug, Clone, Default)]
pub struct CharCounter {
    counts: HashMap<char, u64>,
}

impl CharCounter {
    /// Adds one row.
    pub fn add(&mut self, text: &str) {
        for c in normalize_newlines(text).chars() {
            *self.counts.entry(c).or_default() += 1;
        }
    }

    /// The tokenizer of the `vocab_size − 4` most frequent characters (fewer when the corpus has
    /// fewer distinct characters); ties break by code point.
    pub fn build(&self, vocab_size: usize) -> Result<CharTokenizer> {
        if vocab_size <= CHAR_SPECIALS.len() {
            return Err(DataError::Tokenizer(format!(
                "a character vocabulary needs more than the {} specials, got {vocab_size}",
                CHAR_SPECIALS.len()
            )));
        }
        let mut ranked: Vec<(char, u64)> = self.counts.iter().map(|(c, n)| (*c, *n)).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(vocab_size - CHAR_SPECIALS.len());
        Ok(CharTokenizer::from_chars(
            ranked.into_iter().map(|(c, _)| c).collect(),
        ))
    }
}

/// A character vocabulary: specials, then characters by rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharTokenizer {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

#[derive(Serialize, Deserialize)]
struct CharVocabFile {
    specials: Vec<String>,
    chars: Vec<String>,
}

impl CharTokenizer {
    fn from_chars(chars: Vec<char>) -> Self {
        let ids = chars
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, (i + CHAR_SPECIALS.len()) as u32))
            .collect();
        Self { chars, ids }
    }

    /// Counts the characters of a dataset's training split and keeps the `vocab_size − 4` most
    /// frequent (the paper: `vocab_size = 256`).
    pub fn train_on(spec: &DatasetSpec, root: &Path, vocab_size: usize) -> Result<Self> {
        let mut counter = CharCounter::default();
        spec.split_reader(root, Split::Train)?.for_each_row(|row| {
            counter.add(row.text);
            Ok(())
        })?;
        counter.build(vocab_size)
    }

    /// Number of ids, specials included.
    pub fn vocab_size(&self) -> usize {
        CHAR_SPECIALS.len() + self.chars.len()
    }

    /// The characters with ids 4, 5, …
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// Ids of a text after newline normalisation; characters outside the vocabulary map to `<unk>`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        normalize_newlines(text)
            .chars()
            .map(|c| self.ids.get(&c).copied().unwrap_or(UNK))
            .collect()
    }

    /// Text of ids: specials are dropped, `<unk>` shows as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .filter_map(|&id| match id {
                UNK => Some('\u{FFFD}'),
                id if (id as usize) < CHAR_SPECIALS.len() => None,
                id => self.chars.get(id as usize - CHAR_SPECIALS.len()).copied(),
            })
            .collect()
    }

    /// Writes the vocabulary as JSON (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        let file = CharVocabFile {
            specials: CHAR_SPECIALS.iter().map(|s| s.to_string()).collect(),
            chars: self.chars.iter().map(|c| c.to_string()).collect(),
        };
        let json =
            serde_json::to_vec_pretty(&file).map_err(|e| DataError::Tokenizer(e.to_string()))?;
        write_atomically(path, &json)
    }

    /// Reads a vocabulary written by [`save`](Self::save).
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        let file: CharVocabFile = serde_json::from_slice(&bytes)
            .map_err(|e| DataError::format(path, format!("not a character vocabulary: {e}")))?;
        if file.specials != CHAR_SPECIALS {
            return Err(DataError::format(
                path,
                format!(
                    "specials are {:?}, expected {CHAR_SPECIALS:?}",
                    file.specials
                ),
            ));
        }
        let mut chars = Vec::with_capacity(file.chars.len());
        for entry in &file.chars {
            let mut it = entry.chars();
            match (it.next(), it.next()) {
                (Some(c), None) => chars.push(c),
                _ => {
                    return Err(DataError::format(
                        path,
                        format!("vocabulary entry {entry:?} is not one character"),
                    ));
                }
            }
        }
        Ok(Self::from_chars(chars))
    }
}
