//! Errors returned by `haares-core`: every message says what was wrong, where, and how to fix it.

use std::fmt;

/// Everything that can go wrong when building, running or (de)serialising a model or a residual
/// stream. New kinds may be added: match with a wildcard arm.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum HaaresError {
    /// A model configuration that cannot describe a valid model.
    InvalidConfig {
        /// The offending field (e.g. `blocks`).
        field: &'static str,
        /// What is wrong with it and how to fix it.
        message: String,
    },
    /// A residual stream configuration that cannot describe a valid stream
    /// ([`crate::stream::ResidualStreamConfig`]), or a stream whose parameters no longer match
    /// its configuration (one replaced by a parameter of another width).
    InvalidStream {
        /// The offending field (e.g. `blocks`, `routers`).
        field: &'static str,
        /// What is wrong with it and how to fix it.
        message: String,
    },
    /// A token batch the model cannot consume.
    InvalidInput(String),
    /// A checkpoint that cannot be read or does not match the model.
    Checkpoint(String),
    /// A call to a residual stream out of its order (read, write, …, finish); the message names
    /// the call the stream expected ([`crate::stream::StreamState`]).
    StreamOrder(String),
    /// A kernel's CUDA source could not be produced (`cuda_sources`, the static report's
    /// listing): no wgpu device to define it on, or CubeCL could not define or compile it.
    KernelSource(String),
}

impl HaaresError {
    pub(crate) fn config(field: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for HaaresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidConfig { field, message } => {
                write!(f, "invalid model configuration, field `{field}`: {message}")
            }
            Self::InvalidStream { field, message } => write!(
                f,
                "invalid residual stream configuration, field `{field}`: {message}"
            ),
            Self::InvalidInput(message) => write!(f, "invalid model input: {message}"),
            Self::Checkpoint(message) => write!(f, "checkpoint error: {message}"),
            Self::StreamOrder(message) => write!(f, "residual stream call out of order: {message}"),
            Self::KernelSource(message) => write!(f, "kernel source: {message}"),
        }
    }
}

impl std::error::Error for HaaresError {}

/// Shorthand for results in this crate.
pub type Result<T> = std::result::Result<T, HaaresError>;
