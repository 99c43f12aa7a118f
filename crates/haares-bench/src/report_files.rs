//! Every command's report: a JSON file for programs and a Markdown table for people, side by
//! side, each written atomically so that a run cut short never leaves half a file.

use std::path::Path;

use serde::Serialize;

use crate::error::{BenchError, Result};

/// Writes `value` as `<stem>.json` and `table` as `<stem>.md`, each atomically, creating the
/// folder.
pub fn write_atomically_both(stem: &Path, value: &impl Serialize, table: &str) -> Result<()> {
    let json_path = stem.with_extension("json");
    let json = serde_json::to_string_pretty(value)
        .map_err(|e| BenchError::file(&json_path, format!("cannot serialise the report: {e}")))?;
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            BenchError::file(
                dir,
                format!("cannot create the folder ({e}); check its parent"),
            )
        })?;
    }
    for (extension, text) in [("json", json.as_str()), ("md", table)] {
        let path = stem.with_extension(extension);
        haares_data::write_atomically(&path, text.as_bytes()).map_err(|e| {
            // The data crate's message names the path first; the error names it once.
            let message = e.to_string();
            let prefix = format!("{}: ", path.display());
            BenchError::file(&path, message.strip_prefix(&prefix).unwrap_or(&message))
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report whose file cannot be written is a file error that names the file once.
    #[test]
    fn a_report_that_cannot_be_written_names_its_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let stem = dir.path().join("report");
        // A folder where the JSON file goes: the rename onto it fails.
        std::fs::create_dir(stem.with_extension("json")).unwrap();
        let error = write_atomically_both(&stem, &1, "table").unwrap_err();
        let BenchError::File { path, .. } = &error else {
            panic!("not a file error: {error:?}")
        };
        assert_eq!(path, &stem.with_extension("json"));
        let text = error.to_string();
        let named = text.matches(&path.display().to_string()).count();
        assert_eq!(named, 1, "{text}");
    }
}
