//! The identity of a split's source files, so that a prepared split or a trained tokenizer is
//! reused only while the shards it came from are the same.
//!
//! A shard's fingerprint is its path relative to the dataset root, its size and an XXH3-64 hash
//! of its whole content; a split's fingerprint hashes those of its shards in order. The content
//! hash is the only cheap check that sees every change: size and modification time miss a
//! same-size rewrite, and a modification time in the identity would discard the cache after a
//! mere `touch` or a copy. Hashing a whole shard costs a read of it (XXH3 itself runs at several
//! GB/s; docs/data.md has the measurement), so hashes are remembered in `source-hashes.json` in
//! the cache directory under the file's size and modification time: a shard is hashed again only
//! when one of those changes, and a shard touched but unchanged hashes to the same value.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_64;

use crate::error::{DataError, Result};

/// The name of the remembered-hashes file in a cache directory.
pub const HASH_MEMO: &str = "source-hashes.json";

/// One source file as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Path relative to the dataset root.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// XXH3-64 of the content.
    pub hash: u64,
}

/// A split's source files and the fingerprint of them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFingerprint {
    /// The files, in reading order.
    pub files: Vec<SourceFile>,
    /// One value for the whole list (paths, sizes, hashes, order).
    pub value: u64,
}

/// A remembered hash: valid while the file keeps this size and modification time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Remembered {
    bytes: u64,
    modified_ns: u64,
    hash: u64,
}

/// Fingerprints `shards` (files under `root`), reusing and updating the hashes remembered in
/// `cache_dir`.
pub fn fingerprint_sources(
    root: &Path,
    shards: &[PathBuf],
    cache_dir: &Path,
) -> Result<SourceFingerprint> {
    let memo_path = cache_dir.join(HASH_MEMO);
    let mut memo = read_memo(&memo_path);
    let mut changed = false;
    let mut files = Vec::with_capacity(shards.len());
    for shard in shards {
        let metadata = std::fs::metadata(shard).map_err(|e| DataError::io(shard, e))?;
        let modified_ns = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        let key = std::fs::canonicalize(shard)
            .unwrap_or_else(|_| shard.clone())
            .display()
            .to_string();
        let now = |hash| Remembered {
            bytes: metadata.len(),
            modified_ns,
            hash,
        };
        let hash = match memo.get(&key) {
            Some(r) if *r == now(r.hash) => r.hash,
            _ => {
                let hash = content_hash(shard)?;
                memo.insert(key, now(hash));
                changed = true;
                hash
            }
        };
        let relative = shard.strip_prefix(root).unwrap_or(shard);
        files.push(SourceFile {
            path: relative.to_string_lossy().replace('\\', "/"),
            bytes: metadata.len(),
            hash,
        });
    }
    if changed {
        // A lost update (two processes at once) only means hashing a file again later.
        std::fs::create_dir_all(cache_dir).map_err(|e| DataError::io(cache_dir, e))?;
        let json = serde_json::to_vec_pretty(&memo).expect("a map of numbers serialises");
        crate::write_atomically(&memo_path, &json)?;
    }
    let mut hasher = XxHash3_64::with_seed(0);
    for file in &files {
        hasher.write(file.path.as_bytes());
        hasher.write(&[0]);
        hasher.write(&file.bytes.to_le_bytes());
        hasher.write(&file.hash.to_le_bytes());
    }
    Ok(SourceFingerprint {
        value: hasher.finish(),
        files,
    })
}

/// XXH3-64 of a file's whole content, read in 1 MiB blocks.
pub fn content_hash(path: &Path) -> Result<u64> {
    let mut file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
    let mut hasher = XxHash3_64::with_seed(0);
    let mut block = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut block).map_err(|e| DataError::io(path, e))?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.write(&block[..n]);
    }
}

/// The remembered hashes; an unreadable memo is an empty one (everything is hashed again).
fn read_memo(path: &Path) -> BTreeMap<String, Remembered> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}
