//! What fingerprinting a dataset's source files costs (docs/data.md): the embedded corpus
//! fingerprinted with an empty hash memo (every shard hashed) and with a warm one (sizes and
//! times checked only), and XXH3's rate over a file of the given size (default 256 MiB) written
//! to the temporary directory (read from the page cache).
//!
//! `cargo run -p haares-data --example fingerprint_cost [MiB]`

use std::time::Instant;

use haares_data::registry::Split;
use haares_data::sources::{content_hash, fingerprint_sources};
use haares_data::{dataset, embedded_corpus_dir};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib: usize = std::env::args().nth(1).map_or(Ok(256), |a| a.parse())?;
    let root = embedded_corpus_dir();
    let spec = dataset("sotu")?;
    let mut shards = spec.split_reader(&root, Split::Train)?.shards().to_vec();
    shards.extend_from_slice(spec.split_reader(&root, Split::Validation)?.shards());
    let bytes: u64 = shards
        .iter()
        .map(|s| s.metadata().map_or(0, |m| m.len()))
        .sum();
    let memo = tempfile::tempdir()?;
    for label in ["empty memo", "warm memo"] {
        let start = Instant::now();
        let fingerprint = fingerprint_sources(&root, &shards, memo.path())?;
        println!(
            "embedded corpus, {} shards, {:.2} MB, {label}: {:.3} ms (fingerprint {:016x})",
            shards.len(),
            bytes as f64 / 1e6,
            start.elapsed().as_secs_f64() * 1e3,
            fingerprint.value
        );
    }
    let big = memo.path().join("big.bin");
    std::fs::write(&big, vec![0x5au8; mib << 20])?;
    content_hash(&big)?; // once to fill the page cache
    let start = Instant::now();
    content_hash(&big)?;
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "{mib} MiB file from the page cache: {:.1} ms, {:.2} GB/s",
        seconds * 1e3,
        (mib << 20) as f64 / seconds / 1e9
    );
    Ok(())
}
