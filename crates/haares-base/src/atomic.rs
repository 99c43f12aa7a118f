//! The atomic file write: a reader of the target sees the old file or the new one, never half of
//! one, also when the writer is killed mid-write.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file beside `path` (same directory, so the
/// same filesystem) is written, synced and renamed over it by `tempfile`'s `persist`. Concurrent
/// writers of one file each write their own temporary file; the last rename wins. On an error the
/// temporary file is removed and `path` is untouched.
///
/// The file gets the permissions a plain `File::create` would give it (0666 less the umask on
/// Unix), not `tempfile`'s private 0600.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{}` names no file to write", path.display()),
        )
    })?;
    let mut builder = tempfile::Builder::new();
    builder.prefix(file_name).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut file = builder.tempfile_in(directory)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|error| error.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::write_atomically;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"old").unwrap();
        write_atomically(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the target remains: {names:?}");
    }

    #[test]
    fn a_failed_write_leaves_the_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no such folder").join("file");
        assert!(write_atomically(&missing, b"x").is_err());
        let target = dir.path().join("kept");
        std::fs::write(&target, b"old").unwrap();
        // A directory cannot be replaced by a file: the rename fails, the temporary goes.
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("inside"), b"").unwrap();
        assert!(write_atomically(&folder, b"x").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_readable_as_a_created_file_would_be() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let created = dir.path().join("created");
        std::fs::write(&created, b"").unwrap();
        let written = dir.path().join("written");
        write_atomically(&written, b"").unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&written), mode(&created));
    }
}
