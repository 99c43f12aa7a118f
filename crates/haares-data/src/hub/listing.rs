//! The revision's listing: which files the split rule reads, with the sizes and hashes they are
//! checked against. A hub that cannot be reached is told apart from a hub that answered: only the
//! first may lead to files placed by hand being used unchecked (docs/data.md, "Offline").

use std::path::Path;
use std::time::Duration;

use glob::{MatchOptions, Pattern};
use hf_hub::api::sync::ApiRepo;
use serde::Deserialize;

use super::Target;
use super::check::Expected;
use crate::error::{DataError, Result};
use crate::registry::{DatasetSpec, SplitRule};

/// How many times the listing is asked for when the hub answers with a server error (5xx), and
/// the wait before the first retry (doubled before each next one: 0.5 + 1 + 2 s in all).
const LISTING_ATTEMPTS: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The revision listing's part that a download needs (`?blobs=true` adds sizes and hashes).
#[derive(Debug, Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

/// Why the listing could not be had.
pub(super) enum ListingError {
    /// No answer: the connection was refused, the name did not resolve, the request timed out.
    Unreachable(DataError),
    /// The hub answered, and its answer is the error (a status, another commit, no file).
    Answered(DataError),
}

/// The files of `spec` that its split rule reads, for matching against a repository listing.
fn wanted_patterns(spec: &DatasetSpec) -> Result<Vec<Pattern>> {
    let patterns = match &spec.rule {
        SplitRule::OwnSplits { train, validation } => vec![train.clone(), validation.clone()],
        SplitRule::RowModulo { pattern, .. } => vec![pattern.clone()],
    };
    patterns
        .iter()
        .map(|p| {
            Pattern::new(p).map_err(|e| DataError::Hub {
                message: format!("dataset `{}`: invalid file pattern `{p}`: {e}", spec.name),
            })
        })
        .collect()
}

impl Target<'_> {
    /// The files the split rule reads, from the listing at the pinned revision, in the order the
    /// rule takes them (by file name). A server error is retried [`LISTING_ATTEMPTS`] times.
    pub(super) fn list(&self, repo: &ApiRepo) -> std::result::Result<Vec<Expected>, ListingError> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        let response = loop {
            match repo.info_request().query("blobs", "true").call() {
                Err(ureq::Error::Status(code, _)) if code >= 500 && attempt < LISTING_ATTEMPTS => {
                    std::thread::sleep(backoff);
                    backoff *= 2;
                    attempt += 1;
                }
                Err(error) => return Err(self.listing_failed(&error, attempt)),
                Ok(response) => break response,
            }
        };
        let listing: Listing = response.into_json().map_err(|e| {
            ListingError::Answered(self.failure("the repository's listing is not valid JSON", &e))
        })?;
        self.wanted_files(listing).map_err(ListingError::Answered)
    }

    fn listing_failed(&self, error: &ureq::Error, attempts: u32) -> ListingError {
        use ureq::ErrorKind::{ConnectionFailed, Dns, Io, ProxyConnect};
        let (repo, revision, endpoint) = (self.repo_id, self.revision, &self.endpoint);
        let message = match error {
            ureq::Error::Transport(transport)
                if matches!(transport.kind(), Dns | ConnectionFailed | Io | ProxyConnect) =>
            {
                return ListingError::Unreachable(
                    self.failure("the hub could not be reached", transport),
                );
            }
            ureq::Error::Status(404, _) => format!(
                "{endpoint} has no revision {revision} of `{repo}` (404 Not Found): the registry pins a commit this hub does not serve. Check the endpoint (HF_ENDPOINT) or the pinned revision"
            ),
            ureq::Error::Status(code @ (401 | 403), _) => format!(
                "{endpoint} refused the listing of `{repo}` at revision {revision} ({code}): the dataset may need an access token; set HF_TOKEN and rerun"
            ),
            ureq::Error::Status(code, _) if *code >= 500 => format!(
                "{endpoint} answered {code} to the listing of `{repo}` at revision {revision}, {attempts} times: a server error; rerun later"
            ),
            ureq::Error::Status(code, _) => format!(
                "{endpoint} answered {code} to the listing of `{repo}` at revision {revision}"
            ),
            ureq::Error::Transport(transport) => format!(
                "the request for the listing of `{repo}` at revision {revision} to {endpoint} failed: {transport}"
            ),
        };
        ListingError::Answered(self.answered(message))
    }

    /// An error of a hub that answered: files placed by hand are not used unchecked after it.
    pub(super) fn answered(&self, message: String) -> DataError {
        DataError::Hub {
            message: format!(
                "dataset `{}`: {message}. Files placed by hand under {} are not used while the hub answers so; to use them without the hub, run offline (haares-train's --offline)",
                self.spec.name,
                self.root.display()
            ),
        }
    }

    fn wanted_files(&self, listing: Listing) -> Result<Vec<Expected>> {
        if listing.sha != self.revision {
            return Err(self.answered(format!(
                "{} resolved revision {} of `{}` to commit {}: the registry pins commits, and this hub does not serve the pinned one",
                self.endpoint, self.revision, self.repo_id, listing.sha
            )));
        }
        let patterns = wanted_patterns(self.spec)?;
        let strict = MatchOptions {
            require_literal_separator: true,
            ..MatchOptions::new()
        };
        let mut files: Vec<Expected> = listing
            .siblings
            .into_iter()
            .filter(|s| {
                patterns
                    .iter()
                    .any(|p| p.matches_with(&s.rfilename, strict))
            })
            .map(|s| Expected {
                size: s.lfs.as_ref().map(|l| l.size).or(s.size),
                sha256: s.lfs.map(|l| l.sha256),
                path: s.rfilename,
            })
            .collect();
        files.sort_by(|a, b| {
            Path::new(&a.path)
                .file_name()
                .cmp(&Path::new(&b.path).file_name())
                .then(a.path.cmp(&b.path))
        });
        if files.is_empty() {
            return Err(self.answered(format!(
                "no file of the listing of `{}` at revision {} matches the dataset's patterns",
                self.repo_id, self.revision
            )));
        }
        let found = files.len();
        if let SplitRule::RowModulo { shards, .. } = self.spec.rule {
            if found < shards {
                return Err(self.answered(format!(
                    "the listing of `{}` at revision {} holds {found} files matching the split rule, which reads the first {shards}",
                    self.repo_id, self.revision
                )));
            }
            files.truncate(shards);
        }
        if let Some(file) = files.iter().find(|f| f.size.is_none()) {
            return Err(self.answered(format!(
                "the listing of `{}` at revision {} gives no size for {}, so it cannot be checked: the hub (or mirror) ignored `?blobs=true`",
                self.repo_id, self.revision, file.path
            )));
        }
        Ok(files)
    }
}
