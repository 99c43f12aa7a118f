//! What a failed download tells its user: the file, what happened, and what to do.

use std::path::PathBuf;

use hf_hub::api::sync::ApiError;

use super::Target;
use super::check::Expected;
use crate::error::{is_file_size_limit, is_out_of_space};

/// Whether `hf-hub` refused to resume because the partial file is not a prefix of the file: it
/// is longer than the file (`InvalidResume`), or as long as it, so no byte is left to ask for
/// (416). Either way the partial file must go.
pub(super) fn is_stale_partial<T>(result: &Result<T, ApiError>) -> bool {
    result.as_ref().err().is_some_and(stale)
}

fn stale(error: &ApiError) -> bool {
    match error {
        ApiError::InvalidResume => true,
        ApiError::RequestError(e) => matches!(**e, ureq::Error::Status(416, _)),
        ApiError::TooManyRetries(inner) => stale(inner),
        _ => false,
    }
}

/// The message for `error`, raised while downloading `file`; `kept` is the partial download left
/// for the next run to resume, with its size.
pub(super) fn explain(
    error: &ApiError,
    file: &Expected,
    kept: Option<(u64, PathBuf)>,
    target: &Target<'_>,
) -> String {
    let name = &file.path;
    let (repo, revision, endpoint) = (target.repo_id, target.revision, &target.endpoint);
    let resume = match &kept {
        Some((bytes, path)) => format!(
            "{bytes} of {} bytes are kept in {}, and the next run resumes from there",
            file.size.map_or("its".into(), |s| s.to_string()),
            path.display()
        ),
        None => "the next run downloads it again".into(),
    };
    match error {
        ApiError::TooManyRetries(inner) => {
            format!(
                "{} (after the run's retries)",
                explain(inner, file, kept, target)
            )
        }
        ApiError::RequestError(e) => match &**e {
            ureq::Error::Status(404, _) => format!(
                "{name} is not in `{repo}` at revision {revision} on {endpoint} (404 Not Found): the dataset's pinned revision or file pattern does not match this hub; nothing was written"
            ),
            ureq::Error::Status(code @ (401 | 403), _) => format!(
                "{endpoint} refused {name} of `{repo}` ({code}): the dataset may need an access token; set HF_TOKEN and rerun"
            ),
            ureq::Error::Status(code, _) => format!(
                "{endpoint} answered {code} for {name} of `{repo}` at revision {revision}: a server error; rerun later, and {resume}"
            ),
            ureq::Error::Transport(transport) => format!(
                "the connection to {endpoint} failed while downloading {name} of `{repo}` at revision {revision} ({transport}); rerun when the network is back, and {resume}"
            ),
        },
        ApiError::IoError(io) if is_out_of_space(io) => format!(
            "the disk holding {} is full while downloading {name} of `{repo}` ({io}); {} bytes are needed for it. Free space (or choose another --data-dir) and rerun: {resume}",
            target.repo_dir.display(),
            file.size.map_or("more".into(), |s| s.to_string()),
        ),
        ApiError::IoError(io) if is_file_size_limit(io) => format!(
            "a file size limit stopped writing {name} of `{repo}` under {} ({io}): the process may not write files of its {} bytes (`ulimit -f`, or the job scheduler's limit). Raise it, for example `ulimit -f unlimited`, and rerun: {resume}",
            target.repo_dir.display(),
            file.size.map_or("many".into(), |s| s.to_string()),
        ),
        ApiError::IoError(io) => format!(
            "downloading {name} of `{repo}` at revision {revision} from {endpoint} stopped ({io}): the connection dropped or the file could not be written; rerun, and {resume}"
        ),
        other => format!(
            "downloading {name} of `{repo}` at revision {revision} from {endpoint} failed ({other}); rerun, and {resume}"
        ),
    }
}
