//! # haares-data
//!
//! The data pipelines of the paper (sec:methodology, app:data): Parquet shards in the Hugging Face
//! hub layout, the dataset registry with pinned revisions, character and BPE tokenisers, prepared
//! token shards and deterministic, resumable batching. The embedded State of the Union corpus
//! makes every pipeline work offline.
#![warn(missing_docs)]

pub mod batching;
pub mod bpe;
pub mod char_tokenizer;
pub mod chunking;
pub mod error;
pub mod hub;
pub mod prepare;
pub mod prepared;
pub mod registry;
pub mod shards;

pub use error::{DataError, Result};
pub use registry::{DatasetSpec, Split, SplitRule, dataset, embedded_corpus_dir, registry};
pub use shards::{ReadStats, RowSource, TextColumnReader, TextRow, find_shards};

use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file beside it is written, synced and renamed
/// over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let temporary = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map_err(|e| DataError::io(path, e))
}
