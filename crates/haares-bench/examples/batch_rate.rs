//! Measures how many training batches per second the data pipeline delivers (batch × 512 from
//! the prepared embedded corpus), to check that batching is never the bottleneck of a step.
//!
//! `cargo run -p haares-bench --example batch_rate -- [batch size] [batches]`

use std::time::Instant;

use haares_data::batching::BatchIterator;
use haares_data::char_tokenizer::CharTokenizer;
use haares_data::prepare::prepare_split;
use haares_data::registry::Split;
use haares_data::{dataset, embedded_corpus_dir};

fn main() -> Result<(), haares_data::DataError> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (batch_size, batches) = (
        args.first().copied().unwrap_or(16),
        args.get(1).copied().unwrap_or(2000),
    );
    let (spec, root) = (dataset("sotu")?, embedded_corpus_dir());
    let tokenizer = CharTokenizer::train_on(&spec, &root, 256)?;
    let cache = std::env::temp_dir().join("haares-batch-rate");
    let (shard, _) = prepare_split(&spec, &root, Split::Train, &tokenizer, &cache, false)?;
    let mut iterator = BatchIterator::new(&shard, batch_size, 42)?;
    let start = Instant::now();
    let mut real = 0usize;
    for _ in 0..batches {
        real += iterator.next_batch().real_targets();
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{batches} batches of {batch_size} x 512 in {seconds:.3} s: {:.0} batches/s, {:.1} M target tokens/s ({real} real targets)",
        batches as f64 / seconds,
        (batches * batch_size * 512) as f64 / seconds / 1e6
    );
    Ok(())
}
