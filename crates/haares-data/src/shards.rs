//! Parquet shards in the Hugging Face hub layout: discovery by glob and streaming of one text
//! column, row by row, with null and invalid-UTF-8 rows skipped and counted.

use std::fs::File;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use arrow_array::{
    ArrayRef, BinaryArray, LargeBinaryArray, LargeStringArray, StringArray, StringViewArray,
};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::error::{DataError, Result};

/// Rows decoded per Arrow batch: large enough to amortise decoding, small enough to stream.
const BATCH_ROWS: usize = 1024;

/// The shards under `root` matching `pattern` (a glob relative to `root`, e.g.
/// `data/train-*.parquet`, which also matches hash-suffixed names such as
/// `data/train-00000-of-00080-5b6a8e4d.parquet`), sorted by file name.
pub fn find_shards(root: &Path, pattern: &str) -> Result<Vec<PathBuf>> {
    let full = root.join(pattern);
    let full = full.to_string_lossy();
    let paths = glob::glob(&full).map_err(|e| DataError::Format {
        path: root.to_path_buf(),
        message: format!("invalid shard pattern `{pattern}`: {e}"),
    })?;
    let mut shards = Vec::new();
    for path in paths {
        let path =
            path.map_err(|e| DataError::io(e.path(), std::io::Error::other(e.to_string())))?;
        if path.is_file() {
            shards.push(path);
        }
    }
    shards.sort_by(|a, b| a.file_name().cmp(&b.file_name()).then_with(|| a.cmp(b)));
    if shards.is_empty() {
        return Err(DataError::NoShards {
            root: root.to_path_buf(),
            pattern: pattern.to_string(),
        });
    }
    Ok(shards)
}

/// Counts of one pass over a text column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Rows seen, skipped ones included (the global row index runs over these).
    pub rows: u64,
    /// Rows handed to the caller.
    pub delivered: u64,
    /// Null rows, skipped.
    pub null_rows: u64,
    /// Binary rows that are not valid UTF-8, skipped.
    pub invalid_utf8_rows: u64,
}

/// One row of text and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct TextRow<'a> {
    /// Index of the row over all shards in order, counting skipped rows (docs/decisions.md,
    /// decision 9).
    pub global_index: u64,
    /// Index of the shard in the list the reader was given.
    pub shard: usize,
    /// The text.
    pub text: &'a str,
}

/// Streams one text column over a list of shards, in order, without loading a shard whole.
#[derive(Debug, Clone)]
pub struct TextColumnReader {
    shards: Vec<PathBuf>,
    column: String,
}

impl TextColumnReader {
    /// A reader of `column` over `shards` (read in the given order).
    pub fn new(shards: Vec<PathBuf>, column: impl Into<String>) -> Self {
        Self {
            shards,
            column: column.into(),
        }
    }

    /// The shards, in reading order.
    pub fn shards(&self) -> &[PathBuf] {
        &self.shards
    }
}

/// A source of text rows: a column over shards, or one split of a dataset.
pub trait RowSource {
    /// Calls `visit` for every non-null, valid row in order; `ControlFlow::Break` ends the pass
    /// early (the rest of the files is not read). Stops at the first error, from the files or
    /// from `visit`.
    fn for_each_row_while(
        &self,
        visit: impl FnMut(TextRow<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<ReadStats>;

    /// Calls `visit` for every non-null, valid row in order.
    fn for_each_row(&self, mut visit: impl FnMut(TextRow<'_>) -> Result<()>) -> Result<ReadStats> {
        self.for_each_row_while(|row| visit(row).map(ControlFlow::Continue))
    }
}

impl RowSource for TextColumnReader {
    fn for_each_row_while(
        &self,
        mut visit: impl FnMut(TextRow<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<ReadStats> {
        let mut stats = ReadStats::default();
        for (shard, path) in self.shards.iter().enumerate() {
            if self
                .read_shard(path, shard, &mut stats, &mut visit)?
                .is_break()
            {
                break;
            }
        }
        Ok(stats)
    }
}

impl TextColumnReader {
    fn read_shard(
        &self,
        path: &Path,
        shard: usize,
        stats: &mut ReadStats,
        visit: &mut impl FnMut(TextRow<'_>) -> Result<ControlFlow<()>>,
    ) -> Result<ControlFlow<()>> {
        let parquet_error = |e: parquet::errors::ParquetError| DataError::Parquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_error)?;
        let schema = builder.schema().clone();
        let Some((index, field)) = schema
            .fields()
            .iter()
            .enumerate()
            .find(|(_, f)| f.name() == &self.column)
        else {
            return Err(DataError::MissingColumn {
                path: path.to_path_buf(),
                column: self.column.clone(),
                available: schema.fields().iter().map(|f| f.name().clone()).collect(),
            });
        };
        if !matches!(
            field.data_type(),
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
        ) {
            return Err(DataError::NotAStringColumn {
                path: path.to_path_buf(),
                column: self.column.clone(),
                found: field.data_type().to_string(),
            });
        }
        let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(BATCH_ROWS)
            .build()
            .map_err(parquet_error)?;
        for batch in reader {
            let batch = batch.map_err(|e| DataError::Parquet {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            if visit_column(path, &self.column, batch.column(0), shard, stats, visit)?.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

/// Text of a binary value, or `Err` when it is not UTF-8.
fn utf8(bytes: &[u8]) -> std::result::Result<&str, ()> {
    std::str::from_utf8(bytes).map_err(|_| ())
}

fn visit_column(
    path: &Path,
    name: &str,
    column: &ArrayRef,
    shard: usize,
    stats: &mut ReadStats,
    visit: &mut impl FnMut(TextRow<'_>) -> Result<ControlFlow<()>>,
) -> Result<ControlFlow<()>> {
    let any = column.as_any();
    // Each row: `None` for null, `Some(Err(()))` for bytes that are not UTF-8. Arrow string arrays
    // are valid UTF-8 by construction and are passed through without a second check.
    let mut emit = |value: Option<std::result::Result<&str, ()>>,
                    stats: &mut ReadStats|
     -> Result<ControlFlow<()>> {
        let global_index = stats.rows;
        stats.rows += 1;
        match value {
            None => stats.null_rows += 1,
            Some(Err(())) => stats.invalid_utf8_rows += 1,
            Some(Ok(text)) => {
                stats.delivered += 1;
                return visit(TextRow {
                    global_index,
                    shard,
                    text,
                });
            }
        }
        Ok(ControlFlow::Continue(()))
    };
    type Rows<'a> = Box<dyn Iterator<Item = Option<std::result::Result<&'a str, ()>>> + 'a>;
    let values: Rows<'_> = if let Some(array) = any.downcast_ref::<StringArray>() {
        Box::new(array.iter().map(|v| v.map(Ok)))
    } else if let Some(array) = any.downcast_ref::<LargeStringArray>() {
        Box::new(array.iter().map(|v| v.map(Ok)))
    } else if let Some(array) = any.downcast_ref::<StringViewArray>() {
        Box::new(array.iter().map(|v| v.map(Ok)))
    } else if let Some(array) = any.downcast_ref::<BinaryArray>() {
        Box::new(array.iter().map(|v| v.map(utf8)))
    } else if let Some(array) = any.downcast_ref::<LargeBinaryArray>() {
        Box::new(array.iter().map(|v| v.map(utf8)))
    } else {
        return Err(DataError::NotAStringColumn {
            path: path.to_path_buf(),
            column: name.to_string(),
            found: column.data_type().to_string(),
        });
    };
    for value in values {
        if emit(value, stats)?.is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}
