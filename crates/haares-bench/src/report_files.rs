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
        haares_data::write_atomically(&path, text.as_bytes())
            .map_err(|e| BenchError::file(&path, e))?;
    }
    Ok(())
}
