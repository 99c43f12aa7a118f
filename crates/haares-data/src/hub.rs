//! Downloads of a registry dataset from the Hugging Face hub through `hf-hub`, pinned to the
//! revision of tab:datasetrevisions, into a cache directory in the hub's own layout.

use std::path::{Path, PathBuf};

use glob::{MatchOptions, Pattern};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Repo, RepoType};

use crate::error::{DataError, Result};
use crate::registry::{DatasetSpec, SplitRule};

/// Where and how to download.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// The cache directory (`datasets--owner--name/snapshots/<revision>/…` below it).
    pub cache_dir: PathBuf,
    /// Another endpoint than huggingface.co (a mirror), if set.
    pub endpoint: Option<String>,
    /// Show download progress bars.
    pub progress: bool,
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
    Some(
        cache_dir
            .join(format!("datasets--{}", repo.replace('/', "--")))
            .join("snapshots")
            .join(revision),
    )
}

/// Downloads every shard the dataset's split rule reads, at its pinned revision, and returns the
/// dataset root. Files already in the cache are not fetched again. For a RowModulo dataset only
/// the shards that rule uses (the first `shards` by name) are fetched.
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
    let failure = |what: &str, e: &dyn std::fmt::Display| DataError::Hub {
        message: format!(
            "{what} `{repo_id}` (dataset `{}`) at revision {revision} failed: {e}. Without network access, download the files of that revision elsewhere and place them under {} keeping the repository's paths",
            spec.name,
            root.display()
        ),
    };
    let mut builder = ApiBuilder::from_env()
        .with_cache_dir(options.cache_dir.clone())
        .with_progress(options.progress);
    if let Some(endpoint) = &options.endpoint {
        builder = builder.with_endpoint(endpoint.clone());
    }
    let api = builder
        .build()
        .map_err(|e| failure("setting up the hub client for", &e))?;
    let repo = api.repo(Repo::with_revision(
        repo_id.clone(),
        RepoType::Dataset,
        revision.clone(),
    ));
    let info = repo.info().map_err(|e| failure("listing", &e))?;
    let patterns = wanted_patterns(spec)?;
    let strict = MatchOptions {
        require_literal_separator: true,
        ..MatchOptions::new()
    };
    let mut files: Vec<String> = info
        .siblings
        .into_iter()
        .map(|s| s.rfilename)
        .filter(|f| patterns.iter().any(|p| p.matches_with(f, strict)))
        .collect();
    files.sort_by(|a, b| {
        Path::new(a)
            .file_name()
            .cmp(&Path::new(b).file_name())
            .then(a.cmp(b))
    });
    if let SplitRule::RowModulo { shards, .. } = spec.rule {
        files.truncate(shards);
    }
    if files.is_empty() {
        return Err(failure(
            "finding shards in",
            &"no file matches the dataset's patterns",
        ));
    }
    for file in &files {
        repo.get(file)
            .map_err(|e| failure(&format!("downloading {file} from"), &e))?;
    }
    Ok(root)
}
