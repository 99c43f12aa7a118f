//! Errors of the runner: each says what went wrong, where, and how to fix it.

use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can stop a run, a sweep or a report.
#[derive(Debug)]
pub enum TrainError {
    /// A command-line value or study field is invalid.
    Config(String),
    /// A model could not be built or read.
    Model(haares_core::HaaresError),
    /// A dataset could not be read or prepared.
    Data(haares_data::DataError),
    /// A file or directory could not be read or written.
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A checkpoint is missing, corrupt, or belongs to another run.
    Checkpoint(String),
    /// The loss became NaN or infinite.
    NonFinite {
        /// The step whose loss was not finite.
        step: usize,
        /// The run directory that keeps the last good checkpoint.
        run_dir: PathBuf,
    },
    /// A report could not be produced.
    Report(String),
    /// The backend reported an error while running (lost device, out of memory, …).
    Device(String),
    /// Runs of a sweep placed per device failed, each with its error; the others finished.
    RunsFailed(Vec<String>),
    /// A backward pass gave a trainable parameter no gradient (Burn 0.21's autodiff can lose a
    /// graph between threads; docs/model.md, "Gradients on several threads at once"). The step
    /// was not applied.
    LostGradient {
        /// The parameter's checkpoint name.
        parameter: String,
        /// The replica whose backward pass lost it (0 on one device).
        replica: usize,
        /// The step (1-based), where the caller knows it.
        step: Option<usize>,
    },
    /// Another process is training this run ([`crate::run::lock`]).
    Locked {
        /// The run directory's lock file.
        lock_file: PathBuf,
        /// Who holds it, in words.
        holder: String,
    },
}

/// Result with a [`TrainError`].
pub type Result<T> = std::result::Result<T, TrainError>;

impl TrainError {
    /// The same error, naming training step `step` where it is about one and does not name it.
    pub fn at_step(self, step: usize) -> Self {
        match self {
            Self::LostGradient {
                parameter,
                replica,
                step: None,
            } => Self::LostGradient {
                parameter,
                replica,
                step: Some(step),
            },
            other => other,
        }
    }

    /// An I/O error at `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl fmt::Display for TrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(message) => write!(f, "invalid configuration: {message}"),
            Self::Model(error) => write!(f, "model: {error}"),
            Self::Data(error) => write!(f, "data: {error}"),
            Self::Io { path, source } => write!(
                f,
                "cannot access `{}`: {source} (check that the directory exists and is writable)",
                path.display()
            ),
            Self::Checkpoint(message) => write!(f, "checkpoint: {message}"),
            Self::NonFinite { step, run_dir } => write!(
                f,
                "the training loss became NaN or infinite at step {step}; the run stopped and its \
                 last good checkpoint is kept in `{}` (lower the learning rate or check the data)",
                run_dir.display()
            ),
            Self::Report(message) => write!(f, "report: {message}"),
            Self::Device(message) => write!(
                f,
                "the backend failed: {message} (check the device with its own tools, or choose \
                 another with --backend)"
            ),
            Self::RunsFailed(failures) => write!(
                f,
                "{} run(s) of the sweep failed; the others ran to the end, and the report covers \
                 the runs that finished (none were written if none did). Fix the cause and run the \
                 sweep again: it trains only what is unfinished.\n  {}",
                failures.len(),
                failures.join("\n  ")
            ),
            Self::LostGradient {
                parameter,
                replica,
                step,
            } => {
                let step = step.map_or(String::new(), |step| format!(" at step {step}"));
                write!(
                    f,
                    "the backward pass of replica {replica}{step} gave parameter `{parameter}` no \
                     gradient, so the step was not applied and no checkpoint was written from it. \
                     Burn 0.21's autodiff can lose part of a graph when threads train at once \
                     (docs/model.md, \"Gradients on several threads at once\"); resume the run, \
                     and report it if it happens again"
                )
            }
            Self::Locked { lock_file, holder } => write!(
                f,
                "`{}` is being trained by {holder}; wait for it to finish, train another run \
                 directory, or delete `{}` if that process is known to be gone",
                lock_file.parent().unwrap_or(lock_file).display(),
                lock_file.display()
            ),
        }
    }
}

impl std::error::Error for TrainError {}

impl From<haares_core::HaaresError> for TrainError {
    fn from(error: haares_core::HaaresError) -> Self {
        Self::Model(error)
    }
}

impl From<haares_data::DataError> for TrainError {
    fn from(error: haares_data::DataError) -> Self {
        Self::Data(error)
    }
}

/// Writes `bytes` to `path` atomically (temporary file, sync, rename): a reader sees the old file
/// or the new one, never half of one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    Ok(haares_data::write_atomically(path, bytes)?)
}
