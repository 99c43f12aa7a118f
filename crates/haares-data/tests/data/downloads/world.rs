//! The world of a download test: a hub on 127.0.0.1 (`haares_data::local_hub`), a cache folder,
//! the dataset spec, and what the hub was asked.

use std::path::{Path, PathBuf};

use haares_data::hub::{HubOptions, download, snapshot_dir};
use haares_data::local_hub::LocalHub;
use haares_data::{DatasetSpec, SplitRule};

pub(super) const REPO: &str = "test-owner/corpus";
pub(super) const PINNED: &str = "1111111111111111111111111111111111111111";
pub(super) const NEWER: &str = "2222222222222222222222222222222222222222";

/// A Parquet shard of about `kib` KiB of text that does not compress, different for each seed.
pub(super) fn shard(seed: u64, kib: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut word = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        format!("{:x}", state % 1_000_003)
    };
    let rows: Vec<String> = (0..kib * 16)
        .map(|_| (0..10).map(|_| word()).collect::<Vec<_>>().join(" "))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard.parquet");
    let rows: Vec<Option<&str>> = rows.iter().map(|r| Some(r.as_str())).collect();
    crate::fixtures::write_text_shard(&path, &rows);
    std::fs::read(path).unwrap()
}

pub(super) fn spec(revision: &str, rule: SplitRule) -> DatasetSpec {
    DatasetSpec {
        name: "corpus".into(),
        repo_id: Some(REPO.into()),
        revision: Some(revision.into()),
        text_column: "text".into(),
        rule,
    }
}

/// The first `shards` training shards by file name, as OpenWebText's rule reads them.
pub(super) fn first(shards: usize) -> SplitRule {
    SplitRule::RowModulo {
        pattern: "**/train-*.parquet".into(),
        shards,
        modulo: 10,
    }
}

pub(super) struct World {
    pub hub: LocalHub,
    pub cache: tempfile::TempDir,
}

impl World {
    /// A hub holding `files` at the pinned revision.
    pub fn with(files: &[(&str, Vec<u8>)]) -> Self {
        let hub = LocalHub::start().unwrap();
        hub.publish(
            REPO,
            PINNED,
            files
                .iter()
                .map(|(p, b)| (p.to_string(), b.clone()))
                .collect(),
        );
        Self {
            hub,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    pub fn options(&self) -> HubOptions {
        HubOptions {
            cache_dir: self.cache.path().to_path_buf(),
            endpoint: Some(self.hub.endpoint().to_string()),
            progress: false,
        }
    }

    pub fn download(&self, spec: &DatasetSpec) -> Result<PathBuf, String> {
        download(spec, &self.options()).map_err(|e| shown(e.to_string()))
    }

    /// The repository paths whose content was requested (not the one-byte probes).
    pub fn fetched(&self) -> Vec<String> {
        self.hub
            .requests()
            .into_iter()
            .filter(|r| r.url.starts_with("/cdn/") && r.range.as_deref() != Some("bytes=0-0"))
            .map(|r| r.url.splitn(6, '/').nth(5).unwrap_or_default().to_string())
            .collect()
    }

    /// The `Range` starts of the content requests for `path`.
    pub fn range_starts(&self, path: &str) -> Vec<u64> {
        self.hub
            .requests()
            .into_iter()
            .filter(|r| r.url.starts_with("/cdn/") && r.url.ends_with(path))
            .filter_map(|r| r.range)
            .filter(|r| r != "bytes=0-0")
            .map(|r| r["bytes=".len()..].trim_end_matches('-').parse().unwrap())
            .collect()
    }

    /// Every file below the cache directory, relative to it, links included.
    pub fn cached(&self) -> Vec<String> {
        let mut out: Vec<String> = walkdir(self.cache.path())
            .iter()
            .map(|path| {
                let relative = path.strip_prefix(self.cache.path()).unwrap();
                relative.display().to_string()
            })
            .collect();
        out.sort();
        out
    }
}

/// What the user reads, shown with `--nocapture`.
pub(super) fn shown(message: String) -> String {
    eprintln!("{message}\n");
    message
}

pub(super) fn root(world: &World, spec: &DatasetSpec) -> PathBuf {
    snapshot_dir(spec, world.cache.path()).unwrap()
}

/// What the user placed, as it was: a test compares it with what is there after a run.
pub(super) fn snapshot_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = walkdir(dir)
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap_or_default();
            (path.strip_prefix(dir).unwrap().display().to_string(), bytes)
        })
        .collect();
    files.sort();
    files
}

fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            out.extend(walkdir(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The options of a hub that cannot be reached (nothing listens on port 9 of 127.0.0.1).
pub(super) fn unreachable(cache: &Path) -> HubOptions {
    HubOptions {
        cache_dir: cache.to_path_buf(),
        endpoint: Some("http://127.0.0.1:9".into()),
        progress: false,
    }
}

/// The SHA-256 of `bytes` in hex, as the hub's listing gives it.
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
