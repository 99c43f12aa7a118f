//! What a run hands back from a GPU machine that returns only a few files of bounded size from
//! its output folder, where a full check writes dozens (docs/notebook/gpu-check.md has a run that
//! lost files so). After every stage the check folder is packed into
//! a few files: `summary.md` (a copy, to read first), `results.tar.gz` (the whole folder,
//! `summary.json` included), and the kernel cache as `kernel-cache.tar.gz.0`, `.1`, … (parts of at
//! most [`PART_BYTES`]), so the next machine can start from this one's compiled and tuned kernels
//! (docs/benchmarks.md, "The GPU check"). Two such folders (`overlap.sh`) stay within the 8 files.

use std::path::Path;
use std::process::Command;

/// The largest part of the kernel cache's archive: under the 16 MiB a returned file may have.
pub const PART_BYTES: usize = 15 * 1024 * 1024;

/// At most this many parts: with the other two files and another check's two beside it
/// (`overlap.sh`), within the 8 returned.
pub const MAX_PARTS: usize = 4;

/// The archive's name; its parts add `.0`, `.1`, ….
pub const KERNEL_CACHE_ARCHIVE: &str = "kernel-cache.tar.gz";

/// Packs the check folder `raw` (and the kernel cache, when it holds anything) into `into`.
/// Each file is replaced whole. A kernel cache too large to hand back is skipped with a message;
/// it is never needed for the results.
pub fn pack(raw: &Path, into: &Path, kernel_cache: &Path) -> Result<(), String> {
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
        write_parts(into, &archive)?;
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
fn write_parts(into: &Path, archive: &[u8]) -> Result<(), String> {
    let parts = archive.len().div_ceil(PART_BYTES);
    if parts > MAX_PARTS {
        eprintln!(
            "[gpu-check] the kernel cache packs to {} bytes, more than {MAX_PARTS} parts of \
             {PART_BYTES} bytes hand back; it is not packed",
            archive.len()
        );
        return Ok(());
    }
    for (index, part) in archive.chunks(PART_BYTES).enumerate() {
        let path = into.join(format!("{KERNEL_CACHE_ARCHIVE}.{index}"));
        haares_data::write_atomically(&path, part).map_err(|e| e.to_string())?;
    }
    for stale in parts..MAX_PARTS {
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
        let archive: Vec<u8> = (0..PART_BYTES + 10).map(|i| (i % 251) as u8).collect();
        write_parts(dir.path(), &archive).unwrap();
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
}
