//! What a downloaded file must be (the hub listing's size and SHA-256), the check against it, and
//! the record of the files of a revision that passed it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};

/// One file the split rule reads, as the hub's listing describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Expected {
    /// The repository path.
    pub path: String,
    /// Its size in bytes, where the listing gives it.
    pub size: Option<u64>,
    /// Its SHA-256 (hex), for a file stored with Git LFS, as every Parquet shard on the hub is.
    pub sha256: Option<String>,
}

/// The files of one revision that were downloaded (or found) and passed the check, kept beside
/// the hub's own folders in `datasets--owner--name/checked/<revision>.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Record {
    /// Whether every file the split rule `rule` reads is in `files`.
    pub complete: bool,
    /// The split rule the record was completed for (its `Debug` form): another rule over the
    /// same revision may read other files.
    #[serde(default)]
    pub rule: String,
    /// The checked files by repository path.
    pub files: BTreeMap<String, Expected>,
}

fn record_path(repo_dir: &Path, revision: &str) -> PathBuf {
    repo_dir.join("checked").join(format!("{revision}.json"))
}

impl Record {
    /// The record of `revision`, if one was written and can be read (an unreadable one is as
    /// good as none: the files are checked again).
    pub fn load(repo_dir: &Path, revision: &str) -> Option<Self> {
        let text = std::fs::read_to_string(record_path(repo_dir, revision)).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Writes the record atomically.
    pub fn save(&self, repo_dir: &Path, revision: &str) -> Result<()> {
        let path = record_path(repo_dir, revision);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| DataError::io(parent, e))?;
        }
        let text = serde_json::to_string_pretty(self).expect("a record serialises");
        crate::write_atomically(&path, text.as_bytes())
    }

    /// Whether the record is complete for `rule` and each of its files is still under `root` at
    /// its size.
    pub fn is_complete_in(&self, root: &Path, rule: &str) -> bool {
        self.complete
            && self.rule == rule
            && self
                .files
                .values()
                .all(|file| has_size(&root.join(&file.path), file))
    }

    /// Whether `file` was checked as the listing now describes it and is still under `root`.
    pub fn holds(&self, file: &Expected, root: &Path) -> bool {
        self.files.get(&file.path) == Some(file) && has_size(&root.join(&file.path), file)
    }

    /// Records `file` as checked.
    pub fn insert(&mut self, file: &Expected) {
        self.files.insert(file.path.clone(), file.clone());
    }
}

fn has_size(path: &Path, file: &Expected) -> bool {
    std::fs::metadata(path).is_ok_and(|m| file.size.is_none_or(|size| m.len() == size))
}

/// Checks the file at `path` against the listing: `Err` says how it differs.
pub(super) fn check(path: &Path, file: &Expected) -> std::result::Result<(), String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("it cannot be read: {e}"))?
        .len();
    if let Some(expected) = file.size
        && size != expected
    {
        return Err(format!("{size} bytes, the listing says {expected}"));
    }
    if let Some(expected) = &file.sha256 {
        let found = sha256_of(path).map_err(|e| format!("it cannot be read: {e}"))?;
        if &found != expected {
            return Err(format!("SHA-256 {found}, the listing says {expected}"));
        }
    }
    Ok(())
}

fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
