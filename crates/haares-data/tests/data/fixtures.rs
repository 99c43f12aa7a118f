//! Parquet fixtures written with the `parquet` crate.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use parquet::arrow::ArrowWriter;

/// Writes one shard with a nullable `text` column and an `id` column.
pub fn write_text_shard(path: &Path, rows: &[Option<&str>]) {
    write_columns(
        path,
        vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows.len() as i64)) as ArrayRef,
            ),
            ("text", Arc::new(StringArray::from(rows.to_vec()))),
        ],
    );
}

/// Writes one shard with a binary `text` column (to test invalid UTF-8).
pub fn write_binary_shard(path: &Path, rows: &[Option<&[u8]>]) {
    write_columns(
        path,
        vec![(
            "text",
            Arc::new(BinaryArray::from(rows.to_vec())) as ArrayRef,
        )],
    );
}

pub fn write_columns(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// A dataset with its own train and validation shards under `data/`.
pub fn fixture_spec() -> haares_data::registry::DatasetSpec {
    haares_data::registry::DatasetSpec {
        name: "fixture".into(),
        repo_id: None,
        revision: None,
        text_column: "text".into(),
        rule: haares_data::registry::SplitRule::OwnSplits {
            train: "data/train-*.parquet".into(),
            validation: "data/validation-*.parquet".into(),
        },
    }
}
