//! The errors of the benchmarks: each says what failed, where, and how to go on. The commands
//! print them and exit non-zero; a report written before the failure stays on disk.

use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can stop a measurement, a comparison or a report. New kinds may be added:
/// match with a wildcard arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum BenchError {
    /// A request that cannot be measured (a command-line value or a spec's field), refused before
    /// any worker starts.
    Request(String),
    /// A measurement's worker process could not start, failed (its own error is on stderr above),
    /// or answered with something else.
    Worker(String),
    /// The PyTorch peer could not start, failed, or answered with something else.
    Peer(String),
    /// A report, a result or an exported checkpoint could not be written or read.
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The device lacks what the measurement needs, or failed while it ran.
    Device(String),
    /// A measurement ran, and its results are wrong (a product off its reference).
    Check(String),
    /// The trainer (and through it the model or the data) failed: a run the benchmark trains.
    Train(haares_train::TrainError),
}

/// Result with a [`BenchError`].
pub type Result<T> = std::result::Result<T, BenchError>;

impl BenchError {
    /// `path` could not be written or read, for `reason`.
    pub fn file(path: &Path, reason: impl fmt::Display) -> Self {
        Self::File {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

impl BenchError {
    /// What went wrong, without the kind of error in front: what a report keeps as the reason a
    /// part of it is missing ("PyTorch peer skipped: …").
    pub fn reason(&self) -> String {
        match self {
            Self::Request(message)
            | Self::Worker(message)
            | Self::Peer(message)
            | Self::Device(message)
            | Self::Check(message) => message.clone(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(message) => write!(f, "cannot measure this request: {message}"),
            Self::Worker(message) => write!(f, "measurement worker: {message}"),
            Self::Peer(message) => write!(f, "PyTorch peer: {message}"),
            Self::File { path, reason } => write!(f, "`{}`: {reason}", path.display()),
            Self::Device(message) => write!(f, "device: {message}"),
            Self::Check(message) => write!(f, "wrong results: {message}"),
            Self::Train(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for BenchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Train(error) => Some(error),
            _ => None,
        }
    }
}

impl From<haares_train::TrainError> for BenchError {
    fn from(error: haares_train::TrainError) -> Self {
        Self::Train(error)
    }
}

impl From<haares_core::HaaresError> for BenchError {
    fn from(error: haares_core::HaaresError) -> Self {
        Self::Train(error.into())
    }
}

impl From<haares_data::DataError> for BenchError {
    fn from(error: haares_data::DataError) -> Self {
        Self::Train(error.into())
    }
}
