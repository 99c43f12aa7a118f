//! What under a dataset's cache folder this workspace (through `hf-hub`) wrote, and may therefore
//! delete: a link under `snapshots/` into the repository's own `blobs/`, reached through real
//! folders, and the blob it points to. Anything else is the user's (a file placed by hand, a link
//! to a shared copy, a folder linked in) and is never deleted, nor is what it points to
//! (docs/decisions.md, decision 31).

use std::path::{Component, Path, PathBuf};

/// The first folder on the way from `repo_dir` down to `path`'s folder that is a symbolic link
/// (a shared copy linked in by the user), if any.
pub(super) fn linked_folder(path: &Path, repo_dir: &Path) -> Option<PathBuf> {
    let below = path.parent()?.strip_prefix(repo_dir).ok()?;
    let mut folder = repo_dir.to_path_buf();
    for part in below.components() {
        folder.push(part);
        if folder.symlink_metadata().is_ok_and(|m| m.is_symlink()) {
            return Some(folder);
        }
    }
    None
}

/// `path` with `.` and `..` resolved by its text alone (no link is followed).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The blob that `link` points to, when `link` is a symbolic link that `hf-hub` made: directly
/// into `repo_dir/blobs` (a real folder), through no linked folder. `None` for anything else.
pub(super) fn our_blob(link: &Path, repo_dir: &Path) -> Option<PathBuf> {
    if !link.symlink_metadata().ok()?.is_symlink() || linked_folder(link, repo_dir).is_some() {
        return None;
    }
    let blobs = repo_dir.join("blobs");
    if blobs.symlink_metadata().ok()?.is_symlink() {
        return None;
    }
    let target = std::fs::read_link(link).ok()?;
    let blob = lexical(&link.parent()?.join(target));
    (blob.parent() == Some(lexical(&blobs).as_path())).then_some(blob)
}

/// Deletes `link` and its blob when `hf-hub` made them ([`our_blob`]), so that the next download
/// fetches the file again; returns whether it did. Anything else is left as it is.
pub(super) fn remove_download(link: &Path, repo_dir: &Path) -> bool {
    let Some(blob) = our_blob(link, repo_dir) else {
        return false;
    };
    let _ = std::fs::remove_file(blob);
    let _ = std::fs::remove_file(link);
    true
}

/// Makes `blob` (in `repo_dir/blobs`) the file at `link`, as `hf-hub` does once a download is
/// complete: a relative symbolic link, its folders made. `link` must not exist.
pub(super) fn link_blob(blob: &Path, link: &Path, repo_dir: &Path) -> std::io::Result<()> {
    let folder = link
        .parent()
        .ok_or_else(|| std::io::Error::other("a snapshot file has a folder"))?;
    std::fs::create_dir_all(folder)?;
    let depth = folder
        .strip_prefix(repo_dir)
        .map_err(|_| std::io::Error::other("the link is below the repository's folder"))?
        .components()
        .count();
    let mut relative: PathBuf = std::iter::repeat_n("..", depth).collect();
    relative.push("blobs");
    relative.push(blob.file_name().unwrap_or_default());
    symlink(&relative, link)
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    // As `hf-hub` does where links cannot be made: the blob itself moves.
    let blob = link
        .parent()
        .map_or_else(|| target.to_path_buf(), |dir| dir.join(target));
    std::fs::rename(blob, link)
}
