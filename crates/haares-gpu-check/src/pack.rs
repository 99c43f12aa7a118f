//! What a run hands back from a GPU node that returns only a few files of bounded size from
//! its output folder, where a full check writes dozens. After every stage the check folder is
//! packed into a few files: `summary.md` (a copy, to read first), `results.tar.gz` (the whole
//! folder, `summary.json` included), and the kernel cache as `kernel-cache.tar.gz.0`, `.1`, …
//! (parts of at most [`PackLimits::part_bytes`]), so the next node can start from this one's
//! compiled and tuned kernels (docs/benchmarks.md, "The GPU check").

use std::path::Path;
use std::process::Command;

/// How much a packed folder may hand back: the kernel cache's archive in at most `max_parts`
/// parts of at most `part_bytes` each, beside `summary.md` and `results.tar.gz`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackLimits {
    /// The largest part of the kernel cache's archive, in bytes.
    pub part_bytes: usize,
    /// The most parts; a larger cache is not packed (it is never needed for the results).
    pub max_parts: usize,
}

impl Default for PackLimits {
    /// Parts of 15 MiB, at most 4: for a node that hands back at most 8 files of under 16 MiB,
    /// two packed folders side by side (`scripts/gpu/overlap.sh`) stay within them.
    fn default() -> Self {
        Self {
            part_bytes: 15 * 1024 * 1024,
            max_parts: 4,
        }
    }
}

/// The archive's name; its parts add `.0`, `.1`, ….
pub const KERNEL_CACHE_ARCHIVE: &str = "kernel-cache.tar.gz";

/// Packs the check folder `raw` (and the kernel cache, when it holds anything) into `into`.
/// Each file is replaced whole. A kernel cache too large to hand back is skipped with a message;
/// it is never needed for the results.
pub fn pack(
    raw: &Path,
    into: &Path,
    kernel_cache: &Path,
    limits: PackLimits,
) -> Result<(), String> {
    std::fs::create_dir_all(into)
        .map_err(|e| format!("cannot create `{}`: {e}", into.display()))?;
    let summary = raw.join("summary.md");
    let text =
        std::fs::read(&summary).map_err(|e| format!("cannot read `{}`: {e}", summary.display()))?;
    haares_data::write_atomically(&into.join("summary.md"), &text).map_err(|e| e.to_string())?;
    let results = tar_gz(raw)?;
    haares_data::write_atomically(&into.join("results.tar.gz"), &results)
        .map_err(|e| e.to_string())?;
    let holds_anything = std::fs::read_dir(kernel_cache).is_ok_and(|mut d| d.next().is_some());
    if holds_anything {
        let archive = tar_gz(kernel_cache)?;
        write_parts(into, &archive, limits)?;
    }
    Ok(())
}

/// `tar -cz` of a folder's contents, in memory.
fn tar_gz(dir: &Path) -> Result<Vec<u8>, String> {
    let output = Command::new("tar")
        .arg("-czf")
        .arg("-")
        .arg("-C")
        .arg(dir)
        .arg(".")
        .output()
        .map_err(|e| format!("cannot run `tar` to pack `{}`: {e}", dir.display()))?;
    if !output.status.success() {
        return Err(format!(
            "`tar` could not pack `{}`: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(output.stdout)
}

/// Writes `archive` as numbered parts, removing any stale parts of an earlier, larger archive.
/// Stale parts of an earlier archive are removed up to the larger of `max_parts` and the
/// default's count (an earlier run with more parts than both can leave some; the parts are
/// joined from `.0` up to the first gap, so a left part is never read).
fn write_parts(into: &Path, archive: &[u8], limits: PackLimits) -> Result<(), String> {
    let PackLimits {
        part_bytes,
        max_parts,
    } = limits;
    let parts = archive.len().div_ceil(part_bytes);
    if parts > max_parts {
        eprintln!(
            "[gpu-check] the kernel cache packs to {} bytes, more than {max_parts} parts of \
             {part_bytes} bytes (--max-parts, --part-mib); it is not packed",
            archive.len()
        );
        return Ok(());
    }
    for (index, part) in archive.chunks(part_bytes).enumerate() {
        let path = into.join(format!("{KERNEL_CACHE_ARCHIVE}.{index}"));
        haares_data::write_atomically(&path, part).map_err(|e| e.to_string())?;
    }
    for stale in parts..max_parts.max(PackLimits::default().max_parts) {
        let _ = std::fs::remove_file(into.join(format!("{KERNEL_CACHE_ARCHIVE}.{stale}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_rejoin_into_the_archive_and_stale_parts_go() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(format!("{KERNEL_CACHE_ARCHIVE}.3"));
        std::fs::write(&stale, b"old").unwrap();
        let limits = PackLimits::default();
        let archive: Vec<u8> = (0..limits.part_bytes + 10)
            .map(|i| (i % 251) as u8)
            .collect();
        write_parts(dir.path(), &archive, limits).unwrap();
        let mut joined = Vec::new();
        for index in 0..2 {
            let path = dir.path().join(format!("{KERNEL_CACHE_ARCHIVE}.{index}"));
            joined.extend(std::fs::read(path).unwrap());
        }
        assert_eq!(joined, archive);
        assert!(
            !dir.path()
                .join(format!("{KERNEL_CACHE_ARCHIVE}.2"))
                .exists()
        );
        assert!(
            !stale.exists(),
            "a stale part of an earlier archive was left"
        );
    }

    #[test]
    fn the_limits_are_the_callers() {
        let dir = tempfile::tempdir().unwrap();
        let archive: Vec<u8> = (0..25u8).collect();
        let small = PackLimits {
            part_bytes: 10,
            max_parts: 3,
        };
        write_parts(dir.path(), &archive, small).unwrap();
        let part = |index: usize| dir.path().join(format!("{KERNEL_CACHE_ARCHIVE}.{index}"));
        let sizes: Vec<u64> = (0..3)
            .map(|index| std::fs::metadata(part(index)).unwrap().len())
            .collect();
        assert_eq!(sizes, [10, 10, 5]);
        // Too large for two parts of 10 bytes: nothing new is written, and it is not an error.
        let other = tempfile::tempdir().unwrap();
        let two = PackLimits {
            part_bytes: 10,
            max_parts: 2,
        };
        write_parts(other.path(), &archive, two).unwrap();
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
