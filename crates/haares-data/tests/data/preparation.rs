//! Chunking, prepared shards, the preparation cache and the batch iterator.

use haares_data::batching::{Batch, BatchIterator, epoch_order, validation_batches};
use haares_data::char_tokenizer::{CharCounter, CharTokenizer, PAD};
use haares_data::chunking::{CHUNK_LEN, chunk_row};
use haares_data::prepare::{prepare_chunk_split, prepare_split};
use haares_data::prepared::{PreparedShard, PreparedWriter};
use haares_data::registry::Split;
use haares_data::{dataset, embedded_corpus_dir};

use crate::fixtures::{fixture_spec, write_text_shard};

#[test]
fn a_1300_token_row_gives_two_full_chunks_and_a_padded_tail() {
    let ids: Vec<u32> = (0..1300).map(|i| 4 + (i % 50)).collect();
    let chunks = chunk_row(&ids, CHUNK_LEN, PAD);
    assert_eq!(
        chunks.iter().map(|c| c.len).collect::<Vec<_>>(),
        [513, 513, 274]
    );
    assert!(chunks.iter().all(|c| c.tokens.len() == 513));
    assert_eq!(chunks[1].tokens[0], ids[513]);
    assert_eq!(&chunks[2].tokens[..274], &ids[1026..]);
    assert!(chunks[2].tokens[274..].iter().all(|&t| t == PAD));
}

#[test]
fn pieces_with_fewer_than_two_tokens_are_dropped() {
    assert!(chunk_row(&[7], CHUNK_LEN, PAD).is_empty());
    let ids: Vec<u32> = vec![5; 514];
    assert_eq!(
        chunk_row(&ids, CHUNK_LEN, PAD).len(),
        1,
        "the 1-token tail of a 514-token row predicts nothing"
    );
    assert_eq!(chunk_row(&vec![5; 515], CHUNK_LEN, PAD).len(), 2);
}

#[test]
fn rows_are_never_concatenated_and_masks_exclude_pads() {
    let dir = tempfile::tempdir().unwrap();
    let long = "x".repeat(600);
    write_text_shard(
        &dir.path().join("data/train-00000-of-00001.parquet"),
        &[Some("ab"), Some(&long), Some("c"), Some("hello")],
    );
    let mut counter = CharCounter::default();
    counter.add(&long);
    counter.add("abchello");
    let tokenizer = counter.build(256).unwrap();
    let cache = dir.path().join("cache");
    let prepare = || {
        prepare_split(
            &fixture_spec(),
            dir.path(),
            Split::Train,
            &tokenizer,
            &cache,
            false,
        )
        .unwrap()
    };
    let (shard, report) = prepare();
    // "ab" → 1 chunk; 600 x → 513 + 87; "c" dropped; "hello" → 1 chunk.
    assert_eq!(report.chunks, 4);
    assert_eq!(
        (0..4).map(|i| shard.real_len(i)).collect::<Vec<_>>(),
        [2, 513, 87, 5]
    );
    let mut tokens = Vec::new();
    shard.read_chunk(0, &mut tokens);
    assert_eq!(&tokens[..2], tokenizer.encode("ab").as_slice());
    assert!(
        tokens[2..].iter().all(|&t| t == PAD),
        "the row is padded, not followed by the next row"
    );
    let batch = validation_batches(&shard, 4).next().unwrap();
    assert_eq!(batch.seq_len, 512);
    // Real targets per chunk: len − 1.
    assert_eq!(batch.real_targets(), 1 + 512 + 86 + 4);
    for (position, (&mask, &target)) in batch.mask.iter().zip(&batch.targets).enumerate() {
        assert_eq!(mask == 0.0, target == PAD, "position {position}");
    }
    // The cache: a second preparation reuses the file.
    let (_, again) = prepare();
    assert!(again.cached && again.path == report.path);
}

#[test]
fn a_cropped_batch_keeps_each_rows_first_positions() {
    let batch = Batch {
        batch_size: 2,
        seq_len: 4,
        inputs: vec![1, 2, 3, 4, 5, 6, 7, 8],
        targets: vec![2, 3, 4, 9, 6, 7, 8, 0],
        mask: vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    };
    let two = batch.cropped(2);
    assert_eq!((two.batch_size, two.seq_len), (2, 2));
    assert_eq!(two.inputs, [1, 2, 5, 6]);
    assert_eq!(two.targets, [2, 3, 6, 7]);
    assert_eq!(two.mask, [1.0; 4]);
    assert_eq!(batch.cropped(3).real_targets(), 6);
    // A context at least as long as the rows keeps the whole batch.
    assert_eq!(batch.cropped(4), batch);
    assert_eq!(batch.cropped(600), batch);
}

#[test]
fn the_embedded_corpus_prepares_into_u8_chunks() {
    let spec = dataset("sotu").unwrap();
    let root = embedded_corpus_dir();
    let tokenizer = CharTokenizer::train_on(&spec, &root, 256).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let (shard, report) = prepare_split(
        &spec,
        &root,
        Split::Validation,
        &tokenizer,
        cache.path(),
        false,
    )
    .unwrap();
    assert!(!report.cached && shard.len() > 1000, "{report:?}");
    assert_eq!(shard.width(), haares_data::prepared::TokenWidth::U8);
}

fn numbered_shard(dir: &std::path::Path, chunks: usize) -> PreparedShard {
    let path = dir.join("numbered.tokens");
    let mut writer = PreparedWriter::create(&path, 256, 9).unwrap();
    for i in 0..chunks {
        let tokens: Vec<u32> = (0..9).map(|j| ((i * 9 + j) % 250 + 4) as u32).collect();
        writer
            .push(&haares_data::chunking::Chunk { tokens, len: 9 })
            .unwrap();
    }
    writer.finish().unwrap()
}

#[test]
fn same_seed_same_batches_and_exact_resume() {
    let dir = tempfile::tempdir().unwrap();
    let shard = numbered_shard(dir.path(), 23);
    let run = |seed, n| {
        let mut it = BatchIterator::new(&shard, 4, seed).unwrap();
        (0..n).map(|_| it.next_batch().inputs).collect::<Vec<_>>()
    };
    assert_eq!(run(42, 12), run(42, 12));
    assert_ne!(run(42, 12), run(43, 12));
    // Stop after 7 batches (inside epoch 2), save, restore, continue: identical to one run.
    let mut it = BatchIterator::new(&shard, 4, 42).unwrap();
    let mut resumed: Vec<_> = (0..7).map(|_| it.next_batch().inputs).collect();
    let saved = serde_json::to_string(&it.position()).unwrap();
    drop(it);
    let mut it = BatchIterator::restore(&shard, serde_json::from_str(&saved).unwrap()).unwrap();
    resumed.extend((0..5).map(|_| it.next_batch().inputs));
    assert_eq!(resumed, run(42, 12));
}

#[test]
fn each_epoch_visits_every_chunk_once() {
    let order = epoch_order(100, 42, 0);
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    assert_ne!(order, (0..100).collect::<Vec<_>>());
    assert_ne!(order, epoch_order(100, 42, 1), "a new order each epoch");
}

#[test]
fn validation_covers_every_chunk_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let shard = numbered_shard(dir.path(), 10);
    let sizes: Vec<usize> = validation_batches(&shard, 4)
        .map(|b| b.batch_size)
        .collect();
    assert_eq!(sizes, [4, 4, 2]);
    let first: Vec<u32> = validation_batches(&shard, 4)
        .flat_map(|b| b.inputs.chunks(8).map(|row| row[0]).collect::<Vec<_>>())
        .collect();
    assert_eq!(
        first,
        (0..10)
            .map(|i| ((i * 9) % 250 + 4) as u32)
            .collect::<Vec<_>>()
    );
}

#[test]
fn corrupt_prepared_files_and_positions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shard = numbered_shard(dir.path(), 10);
    let mut position = BatchIterator::new(&shard, 4, 1).unwrap().position();
    position.chunks = 11;
    assert!(
        BatchIterator::restore(&shard, position)
            .unwrap_err()
            .to_string()
            .contains("prepared data changed")
    );
    assert!(BatchIterator::new(&shard, 11, 1).is_err());
    let bytes = std::fs::read(shard.path()).unwrap();
    let truncated = dir.path().join("truncated.tokens");
    std::fs::write(&truncated, &bytes[..bytes.len() - 3]).unwrap();
    assert!(
        PreparedShard::open(&truncated)
            .unwrap_err()
            .to_string()
            .contains("delete the file")
    );
    let garbage = dir.path().join("garbage.tokens");
    std::fs::write(&garbage, b"not a shard").unwrap();
    assert!(
        PreparedShard::open(&garbage)
            .unwrap_err()
            .to_string()
            .contains("bad magic")
    );
}

#[test]
fn the_chunk_split_sends_a_seeded_5_percent_to_validation() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..400).map(|i| format!("row {i} ").repeat(3)).collect();
    let rows: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
    write_text_shard(&dir.path().join("data/train-00000-of-00001.parquet"), &rows);
    let mut counter = CharCounter::default();
    texts.iter().for_each(|t| counter.add(t));
    let tokenizer = counter.build(256).unwrap();
    let cache = dir.path().join("cache");
    let (train, validation) = prepare_chunk_split(
        &fixture_spec(),
        dir.path(),
        &tokenizer,
        &cache,
        42,
        0.05,
        false,
    )
    .unwrap();
    assert_eq!((train.len(), validation.len()), (380, 20));
    let first_tokens = |shard: &PreparedShard| {
        let mut tokens = Vec::new();
        (0..shard.len())
            .map(|i| {
                shard.read_chunk(i, &mut tokens);
                tokenizer.decode(&tokens)
            })
            .collect::<Vec<_>>()
    };
    let (t, v) = (first_tokens(&train), first_tokens(&validation));
    assert!(
        v.iter().all(|x| !t.contains(x)),
        "the two splits are disjoint"
    );
    let (train2, validation2) = prepare_chunk_split(
        &fixture_spec(),
        dir.path(),
        &tokenizer,
        &dir.path().join("cache2"),
        42,
        0.05,
        false,
    )
    .unwrap();
    assert_eq!(
        (first_tokens(&train2), first_tokens(&validation2)),
        (t, v),
        "the same seed gives the same split"
    );
    let (_, other) = prepare_chunk_split(
        &fixture_spec(),
        dir.path(),
        &tokenizer,
        &cache,
        7,
        0.05,
        false,
    )
    .unwrap();
    assert_ne!(first_tokens(&other), first_tokens(&validation));
}
