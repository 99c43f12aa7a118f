//! Downloads of a registry dataset from the Hugging Face hub through `hf-hub`, pinned to the
//! revision of tab:datasetrevisions, into a cache directory in the hub's own layout. Every file is
//! checked against the hub's listing (its size and SHA-256) before it is used, and a record of the
//! checked files makes a finished download need no network again (docs/data.md, "Downloads").

mod check;
mod failure;
mod progress;

use std::path::{Path, PathBuf};

use glob::{MatchOptions, Pattern};
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Repo, RepoType};
use serde::Deserialize;

use crate::error::{DataError, Result};
use crate::registry::{DatasetSpec, SplitRule};
use check::{Expected, Record};
use progress::Downloads;

/// How many times one run resumes a download whose connection dropped before it fails.
pub const RETRIES: usize = 3;

/// Where and how to download.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The cache directory (`datasets--owner--name/snapshots/<revision>/…` below it).
    pub cache_dir: PathBuf,
    /// Another endpoint than huggingface.co (a mirror), if set.
    pub endpoint: Option<String>,
    /// Report progress on stderr: a byte bar per shard and one for the total on a terminal, a
    /// line per shard otherwise.
    pub progress: bool,
}

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

/// One dataset at its pinned revision, and where its files go.
struct Target<'a> {
    spec: &'a DatasetSpec,
    repo_id: &'a str,
    revision: &'a str,
    /// `datasets--owner--name`, holding `blobs/`, `snapshots/` and `refs/`.
    repo_dir: PathBuf,
    /// The snapshot: `repo_dir/snapshots/<revision>`.
    root: PathBuf,
    endpoint: String,
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

/// The directory a dataset's files are (or would be) downloaded to: the root for
/// [`DatasetSpec::split_reader`]. Shards placed there by hand in the hub layout are used as they are.
pub fn snapshot_dir(spec: &DatasetSpec, cache_dir: &Path) -> Option<PathBuf> {
    let (repo, revision) = (spec.repo_id.as_ref()?, spec.revision.as_ref()?);
    Some(repo_dir(repo, cache_dir).join("snapshots").join(revision))
}

/// The split rule as the download record stores it: a record made under another rule does not
/// say that this rule's files are all there.
fn rule_key(spec: &DatasetSpec) -> String {
    format!("{:?}", spec.rule)
}

fn repo_dir(repo_id: &str, cache_dir: &Path) -> PathBuf {
    cache_dir.join(format!("datasets--{}", repo_id.replace('/', "--")))
}

/// Whether every file of the dataset was downloaded and checked by an earlier [`download`]:
/// then the dataset needs no network.
pub fn is_downloaded(spec: &DatasetSpec, cache_dir: &Path) -> bool {
    let (Some(repo_id), Some(revision), Some(root)) =
        (&spec.repo_id, &spec.revision, snapshot_dir(spec, cache_dir))
    else {
        return false;
    };
    Record::load(&repo_dir(repo_id, cache_dir), revision)
        .is_some_and(|r| r.is_complete_in(&root, &rule_key(spec)))
}

/// Downloads every shard the dataset's split rule reads, at its pinned revision, and returns the
/// dataset root. For a RowModulo dataset only the shards that rule uses (the first `shards` by
/// name) are fetched. Each file is checked against the listing (size, and SHA-256 where the hub
/// gives it); a file that fails the check is deleted, never used. Files already downloaded and
/// checked are not fetched again, and once all are, no request is made at all. A download cut
/// short is resumed, within the run ([`RETRIES`]) and by the next run.
///
/// Files placed by hand under [`snapshot_dir`] are checked like downloaded ones; if the hub
/// cannot be reached and nothing was ever downloaded there, they are used as they are.
pub fn download(spec: &DatasetSpec, options: &HubOptions) -> Result<PathBuf> {
    let (Some(repo_id), Some(revision), Some(root)) = (
        &spec.repo_id,
        &spec.revision,
        snapshot_dir(spec, &options.cache_dir),
    ) else {
        return Err(DataError::Hub {
            message: format!("dataset `{}` is not on the hub (it is embedded)", spec.name),
        });
    };
    let endpoint = options
        .endpoint
        .clone()
        .or_else(|| std::env::var("HF_ENDPOINT").ok())
        .unwrap_or_else(|| "https://huggingface.co".into());
    let target = Target {
        spec,
        repo_id,
        revision,
        repo_dir: repo_dir(repo_id, &options.cache_dir),
        root,
        endpoint,
    };
    let rule = rule_key(spec);
    let mut record = Record::load(&target.repo_dir, revision).unwrap_or_default();
    if record.is_complete_in(&target.root, &rule) {
        return Ok(target.root);
    }
    let api = ApiBuilder::from_env()
        .with_cache_dir(options.cache_dir.clone())
        .with_endpoint(target.endpoint.clone())
        .with_progress(false)
        .with_retries(RETRIES)
        .build()
        .map_err(|e| target.failure("setting up the hub client failed", &e))?;
    let repo = api.repo(Repo::with_revision(
        repo_id.clone(),
        RepoType::Dataset,
        revision.clone(),
    ));
    let files = match target.list(&repo) {
        Ok(files) => files,
        Err(error) => {
            return target.hand_placed(record.files.is_empty()).ok_or(error);
        }
    };
    let downloads = Downloads::new(options.progress, &files);
    for (index, file) in files.iter().enumerate() {
        if record.holds(file, &target.root) {
            downloads.skip(file);
            continue;
        }
        target.fetch(&repo, file, downloads.shard(index, file))?;
        record.insert(file);
        record.save(&target.repo_dir, revision)?;
    }
    record.complete = true;
    record.rule = rule;
    record.save(&target.repo_dir, revision)?;
    downloads.finish();
    Ok(target.root)
}

impl Target<'_> {
    fn failure(&self, what: &str, e: &dyn std::fmt::Display) -> DataError {
        DataError::Hub {
            message: format!(
                "{what} for `{}` (dataset `{}`) at revision {} from {}: {e}. Without network access, download the files of that revision elsewhere and place them under {} keeping the repository's paths",
                self.repo_id,
                self.spec.name,
                self.revision,
                self.endpoint,
                self.root.display()
            ),
        }
    }

    /// The files the split rule reads, from the listing at the pinned revision, in the order the
    /// rule takes them (by file name).
    fn list(&self, repo: &ApiRepo) -> Result<Vec<Expected>> {
        let listing: Listing = repo
            .info_request()
            .query("blobs", "true")
            .call()
            .map_err(|e| self.failure("listing the repository failed", &e))?
            .into_json()
            .map_err(|e| self.failure("the repository's listing is not valid JSON", &e))?;
        if listing.sha != self.revision {
            return Err(DataError::Hub {
                message: format!(
                    "{} resolved revision {} of `{}` (dataset `{}`) to commit {}: the registry pins commits, and this hub does not serve the pinned one",
                    self.endpoint, self.revision, self.repo_id, self.spec.name, listing.sha
                ),
            });
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
        if let SplitRule::RowModulo { shards, .. } = self.spec.rule {
            files.truncate(shards);
        }
        if files.is_empty() {
            return Err(self.failure(
                "finding shards failed",
                &"no file of the listing matches the dataset's patterns",
            ));
        }
        Ok(files)
    }

    /// The snapshot as it is, when the hub cannot be reached and its files were placed by hand
    /// (`never_downloaded`: no download ever recorded a file there).
    fn hand_placed(&self, never_downloaded: bool) -> Option<PathBuf> {
        let has_files = std::fs::read_dir(&self.root).is_ok_and(|mut d| d.next().is_some());
        (never_downloaded && has_files).then(|| {
            eprintln!(
                "warning: the hub could not be reached; using the files placed under {} as they are, unchecked",
                self.root.display()
            );
            self.root.clone()
        })
    }

    /// Downloads one file (resuming a partial download) and checks it; a file that fails the
    /// check is deleted.
    fn fetch(&self, repo: &ApiRepo, file: &Expected, progress: progress::Shard<'_>) -> Result<()> {
        let path = self.root.join(&file.path);
        if path.exists() || path.is_symlink() {
            match check::check(&path, file) {
                Ok(()) => return Ok(()),
                Err(mismatch) if !path.is_symlink() => {
                    return Err(DataError::Hub {
                        message: format!(
                            "{} was placed by hand and differs from the hub's file at revision {} ({mismatch}); delete it to download the hub's",
                            path.display(),
                            self.revision
                        ),
                    });
                }
                Err(_) => check::remove_download(&path),
            }
        }
        let mut result = repo.download_with_progress(&file.path, progress.clone());
        if failure::is_stale_partial(&result) {
            // A partial file longer than the file, or as long as it: start that file again.
            self.remove_partial(file);
            result = repo.download_with_progress(&file.path, progress.clone());
        }
        let pointer = result.map_err(|e| self.explain(file, &e))?;
        if pointer != path {
            check::remove_download(&pointer);
            return Err(self.failure(
                &format!("downloading {} failed", file.path),
                &format!(
                    "the hub served it from commit {}, not the pinned revision",
                    pointer
                        .parent()
                        .and_then(|p| p.strip_prefix(self.repo_dir.join("snapshots")).ok())
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ),
            ));
        }
        if let Err(mismatch) = check::check(&path, file) {
            check::remove_download(&path);
            return Err(DataError::Hub {
                message: format!(
                    "{} from `{}` at revision {} is not the file the hub lists ({mismatch}); the bad copy was deleted, so rerun to download it again",
                    file.path, self.repo_id, self.revision
                ),
            });
        }
        progress.done();
        Ok(())
    }

    /// Where `hf-hub` keeps the partial download of `file` (its blob is named by the ETag, which
    /// for an LFS file is its SHA-256).
    fn partial(&self, file: &Expected) -> Option<PathBuf> {
        let sha = file.sha256.as_ref()?;
        Some(self.repo_dir.join("blobs").join(format!("{sha}.part")))
    }

    fn remove_partial(&self, file: &Expected) {
        if let Some(partial) = self.partial(file) {
            let _ = std::fs::remove_file(partial);
        }
    }

    fn explain(&self, file: &Expected, error: &ApiError) -> DataError {
        let kept = self
            .partial(file)
            .and_then(|p| Some((std::fs::metadata(&p).ok()?.len(), p)));
        DataError::Hub {
            message: failure::explain(error, file, kept, self),
        }
    }
}
