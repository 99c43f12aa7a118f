//! docs/library.md keeps no code of its own: each of its Rust blocks is the `foreign_decoder`
//! example's source text, line for line in order but the comments, so that the guide shows code
//! that compiles and runs in CI. The guide lives outside the crate, so a packaged build of the
//! crate cannot reach it: there this test fails and says so, never passes unread.

use std::path::PathBuf;

fn repository_file(path: &str) -> (PathBuf, String) {
    let full = crate::common::crate_dir().join("../..").join(path);
    let text = std::fs::read_to_string(&full).unwrap_or_else(|e| {
        panic!(
            "{} cannot be read ({e}): this test checks the repository's guide against the \
             example, and runs in the repository only",
            full.display()
        )
    });
    (full, text)
}

/// The guide's ```` ```rust ```` blocks, each as its code lines (trimmed, comments and blank
/// lines left out), with the line each block starts at.
fn rust_blocks(markdown: &str) -> Vec<(usize, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, Vec<String>)> = None;
    for (number, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut current, fence) {
            (None, Some(tag)) if tag.trim().starts_with("rust") => {
                current = Some((number + 1, Vec::new()));
            }
            (Some(_), Some(_)) => blocks.extend(current.take()),
            (Some((_, lines)), None) => lines.extend(code_line(line)),
            (None, _) => {}
        }
    }
    blocks
}

fn code_line(line: &str) -> Option<String> {
    let line = line.trim();
    (!line.is_empty() && !line.starts_with("//")).then(|| line.to_string())
}

/// Whether `block` is a subsequence of `source`'s code lines.
fn appears_in_order(block: &[String], source: &str) -> bool {
    let mut lines = source.lines().filter_map(code_line);
    block.iter().all(|wanted| lines.any(|line| &line == wanted))
}

#[test]
fn every_rust_block_of_the_library_guide_is_the_example_s_source() {
    let (guide, text) = repository_file("docs/library.md");
    let sources: Vec<(PathBuf, String)> = ["model.rs", "main.rs"]
        .iter()
        .map(|file| {
            repository_file(&format!(
                "crates/haares-core/examples/foreign_decoder/{file}"
            ))
        })
        .collect();
    let blocks = rust_blocks(&text);
    assert!(
        blocks.len() >= 2,
        "{}: no Rust blocks found",
        guide.display()
    );
    for (line, block) in &blocks {
        assert!(
            !block.is_empty(),
            "{}:{line}: an empty Rust block",
            guide.display()
        );
        let found = sources
            .iter()
            .any(|(_, source)| appears_in_order(block, source));
        assert!(
            found,
            "{}:{line}: this block is not the example's source text, in order:\n{}",
            guide.display(),
            block.join("\n")
        );
    }
}

#[test]
fn the_comparison_fails_on_a_line_the_example_does_not_have() {
    let source = "fn a() {\n    let x = 1;\n    // a comment\n    let y = 2;\n}\n";
    let block = |lines: &[&str]| -> Vec<String> { lines.iter().map(|l| l.to_string()).collect() };
    assert!(appears_in_order(
        &block(&["let x = 1;", "let y = 2;"]),
        source
    ));
    assert!(!appears_in_order(
        &block(&["let y = 2;", "let x = 1;"]),
        source
    ));
    assert!(!appears_in_order(&block(&["let x = 3;"]), source));
    let markdown = "text\n```rust\n// c\nlet x = 1;\n```\n```text\nnot code\n```\n";
    assert_eq!(rust_blocks(markdown), vec![(2, block(&["let x = 1;"]))]);
}
