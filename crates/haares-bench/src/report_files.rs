//! Every command's report: a JSON file for programs and a Markdown table for people, side by
//! side, each written atomically so that a run cut short never leaves half a file.

use std::path::Path;

use serde::Serialize;

/// Writes `value` as `<stem>.json` and `table` as `<stem>.md`, each atomically, creating the
/// folder.
pub fn write_atomically_both(
    stem: &Path,
    value: &impl Serialize,
    table: &str,
) -> Result<(), String> {
    let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    }
    for (extension, text) in [("json", json.as_str()), ("md", table)] {
        let path = stem.with_extension(extension);
        haares_data::write_atomically(&path, text.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}
