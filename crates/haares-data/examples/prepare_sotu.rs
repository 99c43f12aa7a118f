//! Prepares the embedded corpus with both tokenisers and reports the time of each stage.
//!
//! `cargo run -p haares-data --example prepare_sotu -- [cache dir]`

use std::time::Instant;

use haares_data::bpe::{BPE_TRAINING_BYTES, BPE_VOCAB_SIZE, BpeTokenizer};
use haares_data::char_tokenizer::CharTokenizer;
use haares_data::prepare::{prepare_chunk_split, prepare_split};
use haares_data::registry::Split;
use haares_data::{dataset, embedded_corpus_dir};

fn main() -> Result<(), haares_data::DataError> {
    let cache = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("haares-prepare-sotu"));
    let (spec, root) = (dataset("sotu")?, embedded_corpus_dir());

    let start = Instant::now();
    let chars = CharTokenizer::train_on(&spec, &root, 256)?;
    println!(
        "char vocabulary: {} entries in {:.2} s",
        chars.vocab_size(),
        start.elapsed().as_secs_f64()
    );
    for split in [Split::Train, Split::Validation] {
        let (shard, report) = prepare_split(&spec, &root, split, &chars, &cache, true)?;
        println!(
            "char {}: {} chunks, cached {}, {:.2} s",
            split.name(),
            shard.len(),
            report.cached,
            report.seconds
        );
    }

    let start = Instant::now();
    let bpe = BpeTokenizer::train_on(&spec, &root, BPE_VOCAB_SIZE, BPE_TRAINING_BYTES, true)?;
    println!(
        "BPE training (4096 entries, whole training split): {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let start = Instant::now();
    let (train, validation) = prepare_chunk_split(&spec, &root, &bpe, &cache, 42, 0.05, true)?;
    println!(
        "BPE chunks: {} train, {} validation, {:.2} s",
        train.len(),
        validation.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
