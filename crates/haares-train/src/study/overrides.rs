//! Command-line changes to runs: fields set for every run, grid axes replaced, and a single
//! run's config read from a file.

use std::collections::BTreeMap;
use std::path::Path;

use toml::{Table, Value};

use crate::config::RunConfig;
use crate::error::{Result, TrainError};

/// Command-line changes to a study's runs.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// Run-config fields set for every run (`--steps`, `--set key=value`, …).
    pub fields: Table,
    /// Grid axes replaced (`--layers 12,24`, `--seeds 42`, `--methods …`).
    pub axes: BTreeMap<String, Vec<Value>>,
}

impl Overrides {
    /// Sets a field, refusing a second, different value for the same field.
    pub fn set(&mut self, key: &str, value: Value) -> Result<()> {
        if let Some(previous) = self.fields.get(key).filter(|v| **v != value) {
            return Err(conflict(key, previous, &value));
        }
        if let Some(values) = self.axes.get(key) {
            return Err(conflict(key, &Value::Array(values.clone()), &value));
        }
        self.fields.insert(key.to_string(), value);
        Ok(())
    }

    /// Replaces a grid axis, refusing one that is also set as a field.
    pub fn set_axis(&mut self, key: &str, values: Vec<Value>) -> Result<()> {
        if values.is_empty() {
            return Err(TrainError::Config(format!(
                "`--{key}` needs at least one value"
            )));
        }
        if let Some(previous) = self.fields.get(key) {
            return Err(conflict(key, previous, &Value::Array(values)));
        }
        self.axes.insert(key.to_string(), values);
        Ok(())
    }
}

fn conflict(key: &str, a: &Value, b: &Value) -> TrainError {
    TrainError::Config(format!(
        "conflicting overrides for `{key}`: {a} and {b}; give each field once"
    ))
}

/// Parses a `key=value` override; the value is read as TOML (numbers, booleans, arrays) and
/// otherwise taken as a string.
pub fn parse_assignment(text: &str) -> Result<(String, Value)> {
    let (key, value) = text.split_once('=').ok_or_else(|| {
        TrainError::Config(format!(
            "`--set {text}` is not of the form key=value (e.g. --set steps=200)"
        ))
    })?;
    Ok((key.trim().to_string(), parse_value(value.trim())))
}

/// A command-line value as TOML: `12` → integer, `3e-4` → float, `true`, otherwise a string.
pub fn parse_value(text: &str) -> Value {
    format!("v = {text}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(text.to_string()))
}

/// A single run's config from a file — a TOML table of run-config fields, or a run's own
/// `config.json` — with command-line overrides on top (a grid override must have one value).
pub fn load_run_config(path: &Path, overrides: &Overrides) -> Result<RunConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let invalid = |e: &dyn std::fmt::Display| {
        TrainError::Config(format!("`{}` is not a run config: {e}", path.display()))
    };
    let file: Table = if path.extension().is_some_and(|e| e == "json") {
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| invalid(&e))?;
        let mut run = json.get("run").cloned().unwrap_or(json);
        drop_nulls(&mut run);
        Value::try_from(run)
            .map_err(|e| invalid(&e))?
            .as_table()
            .cloned()
            .ok_or_else(|| invalid(&"not a table"))?
    } else {
        text.parse::<Table>().map_err(|e| invalid(&e))?
    };
    let mut table = Value::try_from(RunConfig::default())
        .ok()
        .and_then(|v| v.as_table().cloned())
        .expect("the default config is a table");
    merge(&mut table, &file);
    for (key, values) in &overrides.axes {
        match values.as_slice() {
            [value] => {
                table.insert(key.clone(), value.clone());
            }
            _ => {
                return Err(TrainError::Config(format!(
                    "`train` runs one model; give one value for `{key}`, not {}",
                    values.len()
                )));
            }
        }
    }
    merge(&mut table, &overrides.fields);
    let config: RunConfig = Value::Table(table).try_into().map_err(|e| invalid(&e))?;
    config.validate()?;
    Ok(config)
}

/// Removes `null` fields (an unset option in JSON; TOML has no null, and absent means unset).
fn drop_nulls(value: &mut serde_json::Value) {
    if let serde_json::Value::Object(map) = value {
        map.retain(|_, v| !v.is_null());
        map.values_mut().for_each(drop_nulls);
    }
}

/// Merges `from` into `into`: tables key by key, every other value replaced.
pub(crate) fn merge(into: &mut Table, from: &Table) {
    for (key, value) in from {
        match (into.get_mut(key), value) {
            (Some(Value::Table(existing)), Value::Table(update)) => merge(existing, update),
            _ => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}
