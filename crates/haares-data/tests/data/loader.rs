//! Shard discovery and streaming: hub names with hash suffixes, column selection, the
//! OpenWebText split rule, and clear errors for bad input.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array};
use haares_data::RowSource;
use haares_data::registry::{DatasetSpec, Split, SplitRule, registry};
use haares_data::{DataError, TextColumnReader, dataset, embedded_corpus_dir, find_shards};

use crate::fixtures::*;

fn rows(reader: &TextColumnReader) -> Vec<String> {
    let mut out = Vec::new();
    reader
        .for_each_row(|row| {
            out.push(row.text.to_string());
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn shards_are_globbed_in_file_name_order_with_hash_suffixes() {
    let dir = tempfile::tempdir().unwrap();
    write_text_shard(
        &dir.path().join("data/train-00001-of-00002-9f3c2a.parquet"),
        &[Some("c"), Some("d")],
    );
    write_text_shard(
        &dir.path().join("data/train-00000-of-00002-5b6a8e.parquet"),
        &[Some("a"), Some("b")],
    );
    write_text_shard(
        &dir.path().join("data/validation-00000-of-00001.parquet"),
        &[Some("v")],
    );
    let shards = find_shards(dir.path(), "data/train-*.parquet").unwrap();
    assert_eq!(shards.len(), 2);
    assert!(shards[0].ends_with("data/train-00000-of-00002-5b6a8e.parquet"));
    assert_eq!(
        rows(&TextColumnReader::new(shards, "text")),
        ["a", "b", "c", "d"]
    );
}

#[test]
fn the_text_column_is_selectable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/train-00000-of-00001.parquet");
    write_columns(
        &path,
        vec![
            (
                "docstring",
                Arc::new(arrow_array::StringArray::from(vec!["doc"])) as ArrayRef,
            ),
            (
                "whole_func_string",
                Arc::new(arrow_array::StringArray::from(vec!["def f(): pass"])),
            ),
        ],
    );
    assert_eq!(
        rows(&TextColumnReader::new(
            vec![path.clone()],
            "whole_func_string"
        )),
        ["def f(): pass"]
    );
    match TextColumnReader::new(vec![path], "text").for_each_row(|_| Ok(())) {
        Err(error @ DataError::MissingColumn { .. }) => assert!(
            error.to_string().contains("no column `text`")
                && error.to_string().contains("whole_func_string")
        ),
        other => panic!("expected a missing-column error, got {other:?}"),
    }
}

#[test]
fn openwebtext_rule_counts_rows_globally_over_the_first_shards() {
    let dir = tempfile::tempdir().unwrap();
    // 4 shards of 7 rows named r<shard>_<row>; the rule keeps the first 3 shards by name.
    for shard in 0..4 {
        let texts: Vec<String> = (0..7).map(|row| format!("r{shard}_{row}")).collect();
        let rows_ref: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        write_text_shard(
            &dir.path()
                .join(format!("plain_text/train-{shard:05}-of-00004.parquet")),
            &rows_ref,
        );
    }
    let spec = DatasetSpec {
        name: "owt-fixture".into(),
        repo_id: None,
        revision: None,
        text_column: "text".into(),
        rule: SplitRule::RowModulo {
            pattern: "**/train-*.parquet".into(),
            shards: 3,
            modulo: 10,
        },
    };
    let read = |split| {
        let mut out = Vec::new();
        spec.split_reader(dir.path(), split)
            .unwrap()
            .for_each_row(|row| {
                out.push((row.global_index, row.text.to_string()));
                Ok(())
            })
            .unwrap();
        out
    };
    let validation = read(Split::Validation);
    // Global indices 0, 10, 20 over 21 rows: shard 0 row 0, shard 1 row 3, shard 2 row 6 (not reset per shard).
    assert_eq!(
        validation,
        [
            (0, "r0_0".to_string()),
            (10, "r1_3".to_string()),
            (20, "r2_6".to_string())
        ]
    );
    let train = read(Split::Train);
    assert_eq!(train.len(), 18);
    assert!(
        train
            .iter()
            .all(|(i, text)| i % 10 != 0 && !text.starts_with("r3_")),
        "shard 3 is not among the first 3"
    );
}

#[test]
fn a_rule_that_reads_more_shards_than_are_there_is_refused_with_the_count() {
    let dir = tempfile::tempdir().unwrap();
    for shard in 0..2 {
        write_text_shard(
            &dir.path()
                .join(format!("plain_text/train-{shard:05}.parquet")),
            &[Some("a row")],
        );
    }
    let spec = DatasetSpec {
        name: "owt-fixture".into(),
        repo_id: Some("owner/name".into()),
        revision: Some("abc".into()),
        text_column: "text".into(),
        rule: SplitRule::RowModulo {
            pattern: "**/train-*.parquet".into(),
            shards: 30,
            modulo: 10,
        },
    };
    for split in [Split::Train, Split::Validation] {
        let message = spec
            .split_reader(dir.path(), split)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("2 shards match")
                && message.contains("the first 30")
                && message.contains(&dir.path().display().to_string()),
            "{message}"
        );
    }
}

#[test]
fn null_and_invalid_utf8_rows_are_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let strings = dir.path().join("a/train-00000-of-00002.parquet");
    write_text_shard(&strings, &[Some("one"), None, Some("three")]);
    let binary = dir.path().join("a/train-00001-of-00002.parquet");
    write_binary_shard(&binary, &[Some(b"ok"), Some(&[0xff, 0xfe]), None]);
    let reader = TextColumnReader::new(vec![strings, binary], "text");
    let mut seen = Vec::new();
    let stats = reader
        .for_each_row(|row| {
            seen.push((row.global_index, row.text.to_string()));
            Ok(())
        })
        .unwrap();
    assert_eq!(
        seen,
        [(0, "one".into()), (2, "three".into()), (3, "ok".into())]
    );
    assert_eq!(
        (
            stats.rows,
            stats.delivered,
            stats.null_rows,
            stats.invalid_utf8_rows
        ),
        (6, 3, 2, 1)
    );
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let message = |result: haares_data::Result<haares_data::ReadStats>| {
        result.expect_err("expected an error").to_string()
    };

    let missing = dir.path().join("gone.parquet");
    assert!(
        message(TextColumnReader::new(vec![missing], "text").for_each_row(|_| Ok(())))
            .contains("gone.parquet")
    );

    let corrupt = dir.path().join("corrupt.parquet");
    std::fs::write(&corrupt, b"PAR1 this is not parquet").unwrap();
    assert!(
        message(TextColumnReader::new(vec![corrupt], "text").for_each_row(|_| Ok(())))
            .contains("not a readable Parquet file")
    );

    let numbers = dir.path().join("numbers.parquet");
    write_columns(
        &numbers,
        vec![("text", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)],
    );
    assert!(
        message(TextColumnReader::new(vec![numbers], "text").for_each_row(|_| Ok(())))
            .contains("holds Int64, not text")
    );

    let none = find_shards(dir.path(), "data/train-*.parquet").expect_err("no shards");
    assert!(
        none.to_string()
            .contains("no Parquet shard matches `data/train-*.parquet`")
    );

    let unknown = dataset("openwebtxt").expect_err("unknown");
    assert!(
        unknown.to_string().contains("unknown dataset `openwebtxt`")
            && unknown.to_string().contains("openwebtext")
    );
}

/// The registry against the datasets table of docs/data.md, the record users read (its revisions
/// are tab:datasetrevisions'): every dataset there with its hub repository, revision and text
/// column, and no other; a pin changed in one place and not the other fails here.
#[test]
fn registry_pins_the_revisions_the_data_guide_documents() {
    let guide = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .join("../../docs/data.md");
    let guide = std::fs::read_to_string(&guide).unwrap();
    // Rows of the table under "## Datasets": name, repository, revision, column (code spans).
    let code = |cell: &str| cell.split('`').nth(1).map(str::to_string);
    let documented: Vec<[Option<String>; 4]> = guide
        .split("## Datasets")
        .nth(1)
        .unwrap()
        .lines()
        .skip_while(|line| !line.starts_with("| name"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            [
                code(cells[1]),
                code(cells[2]),
                code(cells[3]),
                code(cells[4]),
            ]
        })
        .collect();
    let registry = registry();
    assert_eq!(
        documented.len(),
        registry.len(),
        "datasets in docs/data.md: {documented:?}"
    );
    for spec in registry {
        let row = documented
            .iter()
            .find(|row| row[0].as_deref() == Some(spec.name.as_str()))
            .unwrap_or_else(|| panic!("`{}` is not in docs/data.md's table", spec.name));
        assert_eq!(row[1], spec.repo_id, "{}: repository", spec.name);
        assert_eq!(row[2], spec.revision, "{}: revision", spec.name);
        assert_eq!(
            row[3].as_deref(),
            Some(spec.text_column.as_str()),
            "{}: text column",
            spec.name
        );
    }
}

#[test]
fn the_embedded_corpus_reads_with_the_same_loader() {
    let spec = dataset("sotu").unwrap();
    let root = embedded_corpus_dir();
    let count = |root: &std::path::Path, split| {
        let (mut rows, mut bytes) = (0, 0);
        spec.split_reader(root, split)
            .unwrap()
            .for_each_row(|row| {
                rows += 1;
                bytes += row.text.len();
                Ok(())
            })
            .unwrap();
        (rows, bytes)
    };
    let (train, validation) = (count(&root, Split::Train), count(&root, Split::Validation));
    assert!(
        train.0 > 150 && validation.0 > 15,
        "{train:?} {validation:?}"
    );
    assert!(
        train.1 + validation.1 > 10_000_000,
        "the corpus holds about 10.8 MB of text"
    );
    // The copy compiled into the binary (used where the source tree is not at hand) is the same
    // corpus, byte for byte.
    let copy = tempfile::tempdir().unwrap();
    haares_data::write_embedded_corpus(copy.path()).unwrap();
    for shard in find_shards(&root, "data/*.parquet").unwrap() {
        let name = shard.file_name().unwrap();
        let copied = std::fs::read(copy.path().join("data").join(name)).unwrap();
        assert_eq!(copied, std::fs::read(&shard).unwrap(), "{name:?}");
    }
    assert_eq!(count(copy.path(), Split::Train), train);
    assert_eq!(count(copy.path(), Split::Validation), validation);
}

#[test]
fn an_unreachable_hub_names_the_dataset_revision_and_where_to_place_shards() {
    let cache = tempfile::tempdir().unwrap();
    let spec = dataset("tinystories").unwrap();
    // Port 9 on loopback (discard) refuses the connection at once: no traffic leaves the machine.
    let options = haares_data::hub::HubOptions {
        cache_dir: cache.path().to_path_buf(),
        endpoint: Some("http://127.0.0.1:9".into()),
        progress: false,
    };
    let message = haares_data::hub::download(&spec, &options)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("roneneldan/TinyStories") && message.contains("tinystories"),
        "{message}"
    );
    assert!(
        message.contains("f54c09fd23315a6f9c86f9dc80f725de7d8f9c64"),
        "{message}"
    );
    let root = haares_data::hub::snapshot_dir(&spec, cache.path()).unwrap();
    assert!(message.contains(&root.display().to_string()), "{message}");
    assert!(
        haares_data::hub::download(&dataset("sotu").unwrap(), &options)
            .unwrap_err()
            .to_string()
            .contains("embedded")
    );
}
