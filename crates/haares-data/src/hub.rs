//! Downloads of a registry dataset from the Hugging Face hub through `hf-hub`, pinned to the
//! revision of tab:datasetrevisions, into a cache directory in the hub's own layout. Every file is
//! checked against the hub's listing (its size and SHA-256) before it is used, and a record of the
//! checked files makes a finished download need no network again (docs/data.md, "Downloads").

mod check;
mod failure;
mod listing;
mod owned;
mod progress;

use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Repo, RepoType};

use crate::error::{DataError, Result};
use crate::registry::DatasetSpec;
use check::{Expected, Record};
use listing::ListingError;
use progress::Downloads;

/// The retries `hf-hub` is given for a download whose connection dropped. Its loop (0.4.3) makes
/// one more than it is given: the first attempt and `RETRIES + 1` resumptions, 5 attempts in all,
/// and it returns `TooManyRetries` after the last one even when that one completed the file (the
/// complete partial file is then checked and used, never fetched again).
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
/// Files placed by hand under [`snapshot_dir`] (or linked there) are checked like downloaded
/// ones, and never deleted: one that fails the check is refused. If the hub cannot be reached
/// (no answer at all) and nothing was ever downloaded there, they are used as they are; a hub
/// that answers with an error (a status, another commit, no matching file) is that error.
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
        Err(ListingError::Unreachable(error)) => {
            return target.hand_placed(record.files.is_empty()).ok_or(error);
        }
        Err(ListingError::Answered(error)) => return Err(error),
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

    /// Downloads one file (resuming a partial download, or taking a complete one) and checks it;
    /// a download that fails the check is deleted. What the user placed is never deleted.
    fn fetch(&self, repo: &ApiRepo, file: &Expected, progress: progress::Shard<'_>) -> Result<()> {
        let path = self.root.join(&file.path);
        if path.exists() || path.is_symlink() {
            let Err(mismatch) = check::check(&path, file) else {
                return Ok(());
            };
            // A download of ours that fails the check goes; what the user placed stays.
            if !owned::remove_download(&path, &self.repo_dir) {
                return Err(DataError::Hub {
                    message: format!(
                        "{} was placed by hand and differs from the hub's file at revision {} ({mismatch}); it is left as it is: replace it by the hub's file, or delete it (a link: the link, not its target) to download the hub's",
                        path.display(),
                        self.revision
                    ),
                });
            }
        }
        if let Some(folder) = owned::linked_folder(&path, &self.repo_dir) {
            return Err(DataError::Hub {
                message: format!(
                    "{} is missing, and {} is a link placed by hand: nothing is downloaded into a linked folder. Place the hub's file at revision {} there, or replace the link by a folder to download it",
                    path.display(),
                    folder.display(),
                    self.revision
                ),
            });
        }
        if self.take_complete_partial(file, &path)? {
            progress.done();
            return Ok(());
        }
        let mut result = repo.download_with_progress(&file.path, progress.clone());
        if result.is_err() && self.take_complete_partial(file, &path)? {
            progress.done();
            return Ok(());
        }
        if failure::is_stale_partial(&result) {
            // A partial file longer than the file, or as long as it and not the file.
            self.remove_partial(file);
            result = repo.download_with_progress(&file.path, progress.clone());
        }
        let pointer = result.map_err(|e| self.explain(file, &e))?;
        if pointer != path {
            let removed = owned::remove_download(&pointer, &self.repo_dir);
            let commit = pointer
                .parent()
                .and_then(|p| p.strip_prefix(self.repo_dir.join("snapshots")).ok())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let kept = if removed {
                String::new()
            } else {
                format!(
                    "; {} was there before the download and is left as it is",
                    pointer.display()
                )
            };
            return Err(self.failure(
                &format!("downloading {} failed", file.path),
                &format!("the hub served it from commit {commit}, not the pinned revision{kept}"),
            ));
        }
        if let Err(mismatch) = check::check(&path, file) {
            owned::remove_download(&path, &self.repo_dir);
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

    /// Takes the partial download of `file` as the file when it is complete and passes the check
    /// (`hf-hub` returns `TooManyRetries` even when its last attempt completed it, and refuses to
    /// resume a complete one with 416): renamed to its blob and linked at `path`, as `hf-hub`
    /// does. A complete partial file that fails the check is deleted; a shorter one is left to
    /// resume.
    fn take_complete_partial(&self, file: &Expected, path: &Path) -> Result<bool> {
        let (Some(partial), Some(size)) = (self.partial(file), file.size) else {
            return Ok(false);
        };
        if std::fs::metadata(&partial).map_or(true, |m| m.len() != size) {
            return Ok(false);
        }
        if check::check(&partial, file).is_err() {
            let _ = std::fs::remove_file(&partial);
            return Ok(false);
        }
        let blob = partial.with_extension("");
        std::fs::rename(&partial, &blob).map_err(|e| DataError::io(&partial, e))?;
        owned::link_blob(&blob, path, &self.repo_dir).map_err(|e| DataError::io(path, e))?;
        Ok(true)
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
