//! The preparation cache follows its source files: a changed, added or removed shard prepares
//! anew, a touched but unchanged one keeps the cache, and a cached file whose header names other
//! sources is never used.

use std::path::Path;
use std::time::{Duration, SystemTime};

use haares_data::char_tokenizer::{CharCounter, CharTokenizer};
use haares_data::prepare::{PrepareReport, cache_path, prepare_split};
use haares_data::prepared::{PreparedShard, PreparedWriter};
use haares_data::registry::Split;
use haares_data::sources::fingerprint_sources;

use crate::fixtures::{fixture_spec, write_text_shard};

fn tokenizer() -> CharTokenizer {
    let mut counter = CharCounter::default();
    counter.add("abcdefghijklmnopqrstuvwxyz ");
    counter.build(256).unwrap()
}

fn prepare(root: &Path) -> (PreparedShard, PrepareReport) {
    let cache = root.join("cache");
    prepare_split(
        &fixture_spec(),
        root,
        Split::Train,
        &tokenizer(),
        &cache,
        false,
    )
    .unwrap()
}

fn shard(root: &Path, name: &str) -> std::path::PathBuf {
    root.join("data").join(name)
}

#[test]
fn a_changed_added_or_removed_shard_prepares_anew_and_a_touched_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let first = shard(root, "train-00000-of-00002.parquet");
    write_text_shard(&first, &[Some("alpha"), Some("beta")]);
    let (original, report) = prepare(root);
    assert!(!report.cached);
    assert_eq!(original.len(), 2);

    // Touched, not changed: the same cache file at once.
    let later = SystemTime::now() + Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&first)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let (_, touched) = prepare(root);
    assert!(touched.cached && touched.path == report.path, "{touched:?}");

    // Replaced under the same name, by a file with other rows: prepared anew from the new rows.
    write_text_shard(&first, &[Some("gamma")]);
    let (changed, changed_report) = prepare(root);
    assert!(!changed_report.cached && changed_report.path != report.path);
    assert_eq!(changed.len(), 1);

    // A shard added, then removed again: each prepares anew; the removal finds the earlier file.
    let second = shard(root, "train-00001-of-00002.parquet");
    write_text_shard(&second, &[Some("delta"), Some("epsilon")]);
    let (added, added_report) = prepare(root);
    assert!(!added_report.cached);
    assert_eq!(added.len(), 3);
    std::fs::remove_file(&second).unwrap();
    let (removed, removed_report) = prepare(root);
    assert!(removed_report.cached && removed_report.path == changed_report.path);
    assert_eq!(removed.len(), 1);
    assert_eq!(removed.sources(), changed.sources());
}

#[test]
fn a_cached_file_from_other_sources_is_prepared_again_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let file = shard(root, "train-00000-of-00001.parquet");
    write_text_shard(&file, &[Some("alpha"), Some("beta"), Some("gamma")]);
    let cache = root.join("cache");
    let spec = fixture_spec();
    let sources = fingerprint_sources(root, &[file], &cache).unwrap();
    let tokenizer = tokenizer();
    // A file under the expected name whose header records other sources (copied by hand, say).
    let path = cache_path(&spec, Split::Train, &tokenizer, sources.value, &cache);
    let stranger = PreparedWriter::create(&path, 256, 513)
        .unwrap()
        .with_sources(sources.value ^ 1);
    assert_eq!(stranger.finish().unwrap().len(), 0);

    let (prepared, report) = prepare(root);
    assert!(!report.cached && report.path == path);
    assert_eq!(prepared.len(), 3);
    assert_eq!(prepared.sources(), sources.value);
    assert_eq!(PreparedShard::open(&path).unwrap().sources(), sources.value);
}

#[test]
fn fingerprints_name_each_file_by_its_relative_path_size_and_content() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (a, b) = (shard(root, "a.parquet"), shard(root, "b.parquet"));
    write_text_shard(&a, &[Some("same")]);
    write_text_shard(&b, &[Some("same")]);
    let cache = root.join("cache");
    let both = fingerprint_sources(root, &[a.clone(), b.clone()], &cache).unwrap();
    assert_eq!(both.files[0].path, "data/a.parquet");
    assert_eq!(both.files[0].bytes, std::fs::metadata(&a).unwrap().len());
    // Equal content, equal hash; but the list's fingerprint depends on names and order.
    assert_eq!(both.files[0].hash, both.files[1].hash);
    let swapped = fingerprint_sources(root, &[b, a.clone()], &cache).unwrap();
    assert_ne!(both.value, swapped.value);
    // The remembered hash is reused while size and time match, and not after a change.
    assert!(cache.join("source-hashes.json").is_file());
    write_text_shard(&a, &[Some("other")]);
    let again = fingerprint_sources(root, &[a], &cache).unwrap();
    assert_ne!(again.files[0].hash, both.files[0].hash);
}
