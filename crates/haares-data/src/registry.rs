//! The paper's five corpora (tab:data, tab:datasetrevisions) and the embedded State of the Union
//! corpus, with their hub ids, pinned revisions, text columns and split rules.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::shards::{ReadStats, RowSource, TextColumnReader, TextRow, find_shards};

/// A dataset split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Split {
    /// Training rows.
    Train,
    /// Validation rows (the split used for checkpoint selection).
    Validation,
}

impl Split {
    /// `train` or `validation`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Validation => "validation",
        }
    }
}

/// How a dataset's rows are divided into training and validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitRule {
    /// The dataset's own splits, each a glob of shards relative to the dataset root.
    OwnSplits {
        /// Shards of the training split.
        train: String,
        /// Shards of the validation split.
        validation: String,
    },
    /// One set of shards: the first `shards` by file name; rows whose global index (counted over
    /// those shards in order; docs/decisions.md, decision 9) is divisible by `modulo` are
    /// validation.
    RowModulo {
        /// Glob of all shards.
        pattern: String,
        /// How many shards, first by file name, are used.
        shards: usize,
        /// Validation every `modulo`-th row.
        modulo: u64,
    },
}

/// A dataset of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetSpec {
    /// Short name used on the command line.
    pub name: String,
    /// Hub repository id (`owner/name`), or `None` for the embedded corpus.
    pub repo_id: Option<String>,
    /// Pinned revision (commit hash) of tab:datasetrevisions.
    pub revision: Option<String>,
    /// The text column.
    pub text_column: String,
    /// The split rule.
    pub rule: SplitRule,
}

fn own_splits(train: &str, validation: &str) -> SplitRule {
    SplitRule::OwnSplits {
        train: train.into(),
        validation: validation.into(),
    }
}

/// The datasets this crate knows, by name.
pub fn registry() -> Vec<DatasetSpec> {
    let hub = |name: &str, repo: &str, revision: &str, column: &str, rule: SplitRule| DatasetSpec {
        name: name.into(),
        repo_id: Some(repo.into()),
        revision: Some(revision.into()),
        text_column: column.into(),
        rule,
    };
    vec![
        DatasetSpec {
            name: "sotu".into(),
            repo_id: None,
            revision: None,
            text_column: "text".into(),
            rule: own_splits("data/train-*.parquet", "data/validation-*.parquet"),
        },
        hub(
            "openwebtext",
            "Skylion007/openwebtext",
            "b4325f019c648b1641a1784748667e8b74e5e064",
            "text",
            SplitRule::RowModulo {
                pattern: "**/train-*.parquet".into(),
                shards: 30,
                modulo: 10,
            },
        ),
        hub(
            "wikitext103",
            "Salesforce/wikitext",
            "b08601e04326c79dfdd32d625aee71d232d685c3",
            "text",
            own_splits(
                "wikitext-103-raw-v1/train-*.parquet",
                "wikitext-103-raw-v1/validation-*.parquet",
            ),
        ),
        hub(
            "tinystories",
            "roneneldan/TinyStories",
            "f54c09fd23315a6f9c86f9dc80f725de7d8f9c64",
            "text",
            own_splits("data/train-*.parquet", "data/validation-*.parquet"),
        ),
        // Yelp has no validation split; its 50K-row test split served for checkpoint selection
        // (app:data).
        hub(
            "yelp",
            "Yelp/yelp_review_full",
            "c1f9ee939b7d05667af864ee1cb066393154bf85",
            "text",
            own_splits(
                "yelp_review_full/train-*.parquet",
                "yelp_review_full/test-*.parquet",
            ),
        ),
        hub(
            "codesearchnet-python",
            "code-search-net/code_search_net",
            "bd0cf261e357a3eb5c8fba490d23ec1a1cd59555",
            "whole_func_string",
            own_splits("python/train-*.parquet", "python/validation-*.parquet"),
        ),
    ]
}

/// The registry entry called `name`.
pub fn dataset(name: &str) -> Result<DatasetSpec> {
    let all = registry();
    let known = all.iter().map(|d| d.name.clone()).collect();
    all.into_iter()
        .find(|d| d.name == name)
        .ok_or(DataError::UnknownDataset {
            name: name.into(),
            known,
        })
}

/// The shards of the embedded State of the Union corpus, compiled into the binary: a binary
/// copied to another machine (a GPU bundle, `cargo install`) or built in a target directory shared
/// by several checkouts still has its corpus.
const EMBEDDED_SHARDS: [(&str, &[u8]); 2] = [
    (
        "train-00000-of-00001.parquet",
        include_bytes!("../corpus/sotu/data/train-00000-of-00001.parquet"),
    ),
    (
        "validation-00000-of-00001.parquet",
        include_bytes!("../corpus/sotu/data/validation-00000-of-00001.parquet"),
    ),
];

/// The directory of the embedded State of the Union corpus in the hub layout: the crate's
/// `corpus/sotu` when its shards are there as compiled in, else a copy written once (atomically)
/// from the bytes compiled into the binary, under the temporary directory and named by their
/// length.
pub fn embedded_corpus_dir() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join("sotu");
    let holds_shards = |root: &Path| {
        EMBEDDED_SHARDS.iter().all(|(name, bytes)| {
            std::fs::metadata(root.join("data").join(name))
                .is_ok_and(|meta| meta.len() == bytes.len() as u64)
        })
    };
    if holds_shards(&source) {
        return source;
    }
    let total: usize = EMBEDDED_SHARDS.iter().map(|(_, bytes)| bytes.len()).sum();
    let copy = std::env::temp_dir().join(format!("haares-embedded-sotu-{total}"));
    if !holds_shards(&copy) && write_embedded_corpus(&copy).is_err() {
        // Unwritable: the missing source directory then gives the error, with its path.
        return source;
    }
    copy
}

/// Writes the embedded corpus's shards into `root` in the hub layout (`root/data/*.parquet`),
/// each atomically.
pub fn write_embedded_corpus(root: &Path) -> Result<()> {
    let data = root.join("data");
    std::fs::create_dir_all(&data).map_err(|e| DataError::io(&data, e))?;
    for (name, bytes) in EMBEDDED_SHARDS {
        crate::write_atomically(&data.join(name), bytes)?;
    }
    Ok(())
}

impl DatasetSpec {
    /// A reader of one split of this dataset, whose shards lie under `root` in the hub layout.
    pub fn split_reader(&self, root: &Path, split: Split) -> Result<SplitReader> {
        let (shards, modulo) = match &self.rule {
            SplitRule::OwnSplits { train, validation } => {
                let pattern = if split == Split::Train {
                    train
                } else {
                    validation
                };
                (find_shards(root, pattern)?, None)
            }
            SplitRule::RowModulo {
                pattern,
                shards,
                modulo,
            } => {
                let mut all = find_shards(root, pattern)?;
                if all.len() < *shards {
                    // Fewer shards than the rule reads is another dataset, not a smaller one:
                    // its validation rows and its prepared tokens would differ from the rule's.
                    return Err(DataError::format(
                        root,
                        format!(
                            "{} shards match `{pattern}` here, and dataset `{}` reads the first {shards} by file name: place the missing ones (the hub's files at revision {}) or download them (without --offline)",
                            all.len(),
                            self.name,
                            self.revision.as_deref().unwrap_or("embedded"),
                        ),
                    ));
                }
                all.truncate(*shards);
                (all, Some(*modulo))
            }
        };
        Ok(SplitReader {
            reader: TextColumnReader::new(shards, self.text_column.clone()),
            split,
            modulo,
        })
    }
}

/// Streams the rows of one split, applying the dataset's split rule.
#[derive(Debug, Clone)]
pub struct SplitReader {
    reader: TextColumnReader,
    split: Split,
    modulo: Option<u64>,
}

impl SplitReader {
    /// The shards read, in order.
    pub fn shards(&self) -> &[PathBuf] {
        self.reader.shards()
    }
}

impl RowSource for SplitReader {
    fn for_each_row_while(
        &self,
        mut visit: impl FnMut(TextRow<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<ReadStats> {
        let wanted = self.split == Split::Validation;
        match self.modulo {
            None => self.reader.for_each_row_while(visit),
            Some(modulo) => self.reader.for_each_row_while(|row| {
                if (row.global_index % modulo == 0) == wanted {
                    visit(row)
                } else {
                    Ok(ControlFlow::Continue(()))
                }
            }),
        }
    }
}
