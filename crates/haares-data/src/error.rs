//! Errors of the data pipelines. Every message says what is wrong, where, and how to fix it.

use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can go wrong while finding, reading, tokenising or batching data.
#[derive(Debug)]
pub enum DataError {
    /// A file could not be read or written.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A Parquet file is corrupt or unreadable.
    Parquet {
        /// The file.
        path: PathBuf,
        /// The reader's message.
        message: String,
    },
    /// The text column is not in a shard.
    MissingColumn {
        /// The shard.
        path: PathBuf,
        /// The requested column.
        column: String,
        /// The columns the shard has.
        available: Vec<String>,
    },
    /// The text column does not hold strings.
    NotAStringColumn {
        /// The shard.
        path: PathBuf,
        /// The column.
        column: String,
        /// Its Arrow type.
        found: String,
    },
    /// No shard matched a split's pattern.
    NoShards {
        /// The directory searched.
        root: PathBuf,
        /// The glob pattern.
        pattern: String,
    },
    /// A dataset name the registry does not know.
    UnknownDataset {
        /// The requested name.
        name: String,
        /// The known names.
        known: Vec<String>,
    },
    /// A download from the Hugging Face hub failed.
    Hub {
        /// What the message is about (dataset, revision, file) and how to place the shards by hand.
        message: String,
    },
    /// A tokenizer could not be built, trained, saved or loaded, or does not fit its id type.
    Tokenizer(String),
    /// A prepared token shard or batch position is invalid.
    Format {
        /// The file (or a description of the object).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl DataError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn format(path: &Path, message: impl Into<String>) -> Self {
        Self::Format {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } if is_out_of_space(source) => write!(
                f,
                "{}: the disk is full ({source}); free space or choose another --cache-dir or --data-dir, then rerun: nothing half-written is kept or used",
                path.display()
            ),
            Self::Io { path, source } if is_file_size_limit(source) => write!(
                f,
                "{}: a file size limit stopped the write ({source}): the process may not write files this large (`ulimit -f`, or the job scheduler's limit); raise it, for example `ulimit -f unlimited`, then rerun: nothing half-written is kept or used",
                path.display()
            ),
            Self::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Self::Parquet { path, message } => write!(
                f,
                "{}: not a readable Parquet file ({message}); re-download the shard or delete it so it is fetched again",
                path.display()
            ),
            Self::MissingColumn {
                path,
                column,
                available,
            } => write!(
                f,
                "{}: no column `{column}` (the shard has {available:?}); choose the text column with `--text-column`",
                path.display()
            ),
            Self::NotAStringColumn {
                path,
                column,
                found,
            } => write!(
                f,
                "{}: column `{column}` holds {found}, not text; choose a string column with `--text-column`",
                path.display()
            ),
            Self::NoShards { root, pattern } => write!(
                f,
                "no Parquet shard matches `{pattern}` under {}; place the dataset's shards there in the hub layout or fix the pattern",
                root.display()
            ),
            Self::UnknownDataset { name, known } => write!(
                f,
                "unknown dataset `{name}`; known datasets: {}",
                known.join(", ")
            ),
            Self::Hub { message } => write!(f, "Hugging Face hub: {message}"),
            Self::Tokenizer(message) => write!(f, "tokenizer: {message}"),
            Self::Format { path, message } => write!(f, "{}: {message}", path.display()),
        }
    }
}

impl std::error::Error for DataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Whether an I/O error means the disk (or the quota, or the process's file size limit) has no
/// room left.
pub(crate) fn is_out_of_space(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded
    )
}

/// Whether `error` is a limit on the size of one file (`EFBIG`: `ulimit -f`), which is not a full
/// disk: freeing space does not help, raising the limit does.
pub(crate) fn is_file_size_limit(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::FileTooLarge
}

/// Shorthand for results in this crate.
pub type Result<T> = std::result::Result<T, DataError>;
