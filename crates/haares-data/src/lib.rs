//! # haares-data
//!
//! The data pipelines of the paper (sec:methodology, app:data): Parquet shards in the Hugging Face
//! hub layout, the dataset registry with pinned revisions, character and BPE tokenisers, prepared
//! token shards and deterministic, resumable batching. The embedded State of the Union corpus
//! makes every pipeline work offline.
//!
//! In the order a user meets them:
//! 1. [`dataset`] names a [`DatasetSpec`] of the [`registry()`] (hub repository, pinned revision,
//!    split rule); its files come from [`hub::download`], from files placed by hand in the hub
//!    layout, or, for `sotu`, from [`embedded_corpus_dir`].
//! 2. A tokenizer is trained on the training split:
//!    [`CharTokenizer::train_on`](char_tokenizer::CharTokenizer::train_on) or
//!    [`BpeTokenizer::train_on`](bpe::BpeTokenizer::train_on).
//! 3. [`prepare::prepare_split`] tokenises a split once into a memory-mapped
//!    [`PreparedShard`](prepared::PreparedShard), cached under the identity of its inputs,
//!    source files included ([`sources`]).
//! 4. [`BatchIterator`](batching::BatchIterator) draws seeded, resumable training batches from
//!    it; [`validation_batches`](batching::validation_batches) is the in-order validation pass.
#![warn(missing_docs)]

/// The crate README's examples, compiled and run as doctests so that they cannot drift.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod batching;
pub mod bpe;
pub mod char_tokenizer;
pub mod chunking;
pub mod error;
pub mod hub;
#[cfg(feature = "local-hub")]
pub mod local_hub;
pub mod prepare;
pub mod prepared;
pub mod registry;
pub mod shards;
pub mod sources;

pub use error::{DataError, Result};
pub use registry::{
    DatasetSpec, Split, SplitRule, dataset, embedded_corpus_dir, registry, write_embedded_corpus,
};
pub use shards::{ReadStats, RowSource, TextColumnReader, TextRow, find_shards};

use std::path::Path;

/// Writes `bytes` to `path` atomically ([`haares_base::write_atomically`]), an error naming
/// `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    haares_base::write_atomically(path, bytes).map_err(|e| DataError::io(path, e))
}

/// A temporary path beside `path`, unique to this process and call: concurrent writers of one
/// file (processes or threads) each write their own and rename it into place.
pub fn temporary_beside(path: &Path) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}
