//! The commands CI and the GPU scripts run name this workspace's features bare (`--features cuda`),
//! never as `haares-bench/cuda`: for a selected package with a dev-dependency on itself (core,
//! train and bench, docs/decisions.md, decision 27), cargo reads `package/feature` as the
//! dev-dependency's feature, which a build without tests leaves out, and builds the binary without
//! it, silently.

use std::path::PathBuf;

/// The crates with a dev-dependency on themselves.
const SELF_DEPENDENT: [&str; 3] = ["haares-core", "haares-train", "haares-bench"];

fn workspace() -> PathBuf {
    crate::common::crate_dir().join("../..")
}

/// The feature names of a crate's manifest: the keys of its `[features]` table.
fn features_of(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .skip_while(|line| line.trim() != "[features]")
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter_map(|line| {
            let (key, _) = line.split_once('=')?;
            let key = key.trim();
            (!key.is_empty() && !key.starts_with('#')).then(|| key.to_string())
        })
        .collect()
}

/// Every `crate/feature` of `text` that names a feature of one of `crates` as `crate/feature`
/// (a path such as `crates/haares-core/src` has no feature after the slash, or a `/` before).
fn package_feature_forms(text: &str, crates: &[(&str, Vec<String>)]) -> Vec<String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for (name, features) in crates {
            let prefix = format!("{name}/");
            for (at, _) in line.match_indices(&prefix) {
                let before = line[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || "/-_.".contains(c)) {
                    continue;
                }
                let rest = &line[at + prefix.len()..];
                let word: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == '$')
                    .collect();
                if word.starts_with('$') || features.contains(&word) {
                    found.push(format!("line {}: {prefix}{word}", number + 1));
                }
            }
        }
    }
    found
}

/// `.ci/run` and every shell script and guide under `scripts/`.
fn command_files() -> Vec<PathBuf> {
    let mut files = vec![workspace().join(".ci/run")];
    let mut folders = vec![workspace().join("scripts")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path
                .extension()
                .is_some_and(|extension| extension == "sh" || extension == "md")
            {
                files.push(path);
            }
        }
    }
    files
}

fn self_dependent_crates() -> Vec<(&'static str, Vec<String>)> {
    SELF_DEPENDENT
        .iter()
        .map(|name| {
            let manifest = workspace().join("crates").join(name).join("Cargo.toml");
            let features = features_of(&std::fs::read_to_string(manifest).unwrap());
            assert!(
                features.iter().any(|feature| feature == "wgpu"),
                "{name}: no `wgpu` feature read from its manifest: {features:?}"
            );
            (*name, features)
        })
        .collect()
}

#[test]
fn ci_and_the_gpu_scripts_name_features_bare() {
    let crates = self_dependent_crates();
    // The scan finds the form that built the GPU bundle without its backends.
    assert_eq!(
        package_feature_forms(
            "cargo build -p haares-bench --features \"haares-bench/$feature,haares-bench/autotune\"\n\
             ls crates/haares-bench/src; cargo check --features cuda,haares-core/wgpu",
            &crates
        ),
        [
            "line 1: haares-bench/$feature",
            "line 1: haares-bench/autotune",
            "line 2: haares-core/wgpu"
        ]
    );
    let files = command_files();
    assert!(files.iter().any(|file| file.ends_with("gpu/build.sh")));
    for file in files {
        let found = package_feature_forms(&std::fs::read_to_string(&file).unwrap(), &crates);
        assert!(
            found.is_empty(),
            "{}: features named as `package/feature`, which cargo gives to the package's \
             dev-dependency on itself and leaves out of a build without tests; name them bare \
             (docs/decisions.md, decision 27): {found:?}",
            file.display()
        );
    }
}
