//! The analytic commands reproduce the paper's tables, through the real binary.

use crate::common::bench;

#[test]
fn sources_reproduces_tab_sourcecounts() {
    let (ok, table, _) = bench(&["sources", "--layers", "48", "--blocks", "4,6,8"]);
    assert!(ok);
    // tab:sourcecounts: 3.46/5 vs 5.92/9 (N = 4), 4.44/7 vs 7.88/13 (N = 6), 5.42/9 vs 9.83/17 (N = 8).
    for row in [
        "| 4 | 24 | 3.46 | 5 | 5.92 | 9 | 5 |",
        "| 6 | 16 | 4.44 | 7 | 7.88 | 13 | 7 |",
        "| 8 | 12 | 5.42 | 9 | 9.83 | 17 | 9 |",
    ] {
        assert!(table.contains(row), "missing `{row}` in\n{table}");
    }
}

#[test]
fn params_reproduces_the_papers_48_layer_counts() {
    let (ok, table, _) = bench(&["params", "--methods", "haares"]);
    assert!(ok);
    // tab:modelconfig: ≈ 22.0M, 201.3M, 453.0M attention + MLP weights at 48 layers.
    for (family, millions) in [("Small", "22,0"), ("Medium", "201,3"), ("Large", "452,9")] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {family} | 48 | HAARES |")))
            .unwrap();
        let matrices = row.split('|').nth(4).unwrap().trim();
        assert!(matrices.starts_with(millions), "{family}: {matrices}");
    }
    let (ok, table, _) = bench(&[
        "params",
        "--family",
        "medium",
        "--vocab",
        "4096",
        "--methods",
        "block-attnres",
    ]);
    assert!(ok);
    let row = table
        .lines()
        .find(|l| l.starts_with("| Medium | 48 |"))
        .unwrap();
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    let (matrices, embedding): (usize, usize) = (
        cells[4].replace(',', "").parse().unwrap(),
        cells[5].replace(',', "").parse().unwrap(),
    );
    assert_eq!(embedding, 4096 * 512);
    assert_eq!(
        ((matrices + embedding) as f64 / 1e5).round() / 10.0,
        203.4,
        "the paper's BPE figure"
    );
}

#[test]
fn bad_arguments_give_clear_errors() {
    let (ok, _, stderr) = bench(&["sources", "--layers", "48", "--blocks", "5"]);
    assert!(
        !ok && stderr.contains("N = 5 must divide 2L = 96"),
        "{stderr}"
    );
    let (ok, _, stderr) = bench(&["params", "--methods", "resnet"]);
    assert!(
        !ok && stderr.contains("unknown method `resnet`"),
        "{stderr}"
    );
    let (ok, _, stderr) = bench(&["params", "--family", "huge"]);
    assert!(!ok && stderr.contains("huge"), "{stderr}");
}
