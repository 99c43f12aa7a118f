//! The workspace README's library example is the crate README's, which runs as a doctest
//! (`ReadmeDoctests` in lib.rs): the two must stay the same text.

/// The first ```rust block after `heading` in the markdown at `path`.
fn rust_block(path: &std::path::Path, heading: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let after = text
        .find(heading)
        .map(|at| &text[at..])
        .unwrap_or_else(|| panic!("{} has no `{heading}`", path.display()));
    let start = after.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let end = after[start..].find("\n```").expect("a closed block");
    after[start..start + end].to_string()
}

#[test]
fn the_workspace_readme_shows_the_crate_readmes_tested_example() {
    let root = crate::common::crate_dir().join("../../README.md");
    let crate_readme = crate::common::crate_dir().join("README.md");
    let shown = rust_block(&root, "## Using the crates as a library");
    let tested = rust_block(&crate_readme, "# haares-core");
    assert!(shown.contains("forward_with_trace"), "{shown}");
    assert_eq!(
        shown, tested,
        "copy the crate README's example into the workspace README"
    );
}
