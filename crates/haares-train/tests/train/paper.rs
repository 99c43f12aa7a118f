//! The paper's values as data (`experiments/paper/`, `haares_train::study::paper`): each built-in
//! study's tables load, and the transcription agrees with itself wherever the paper gives a number
//! twice: each seed mean and sample SD from the seed cells (means rounded half up), each Δ from the
//! two means, each paired reduction of tab:pairdiffs from the seed cells, each per-seed perplexity
//! from exp(loss) to the printed rounding, each mean perplexity as the mean of the per-seed ones.

use haares_train::study::paper::{PaperCell, PaperTable, parse_paper_table};
use haares_train::study::{BUILTIN_STUDIES, load_study};

fn tables() -> Vec<PaperTable> {
    haares_train::study::paper::BUILTIN_PAPER_TABLES
        .iter()
        .map(|(name, text)| parse_paper_table(name, text).unwrap())
        .collect()
}

/// `value` in units of its last printed digit (`digits` decimals).
fn units(value: f64, digits: i32) -> i64 {
    (value * 10f64.powi(digits)).round() as i64
}

/// The mean of `values` (in printed units) rounded half up to the same unit.
fn mean_half_up(values: &[i64]) -> i64 {
    let (sum, n) = (values.iter().sum::<i64>(), values.len() as i64);
    (2 * sum + n).div_euclid(2 * n)
}

/// The cells of one setting and method: the seeds, and the mean row if any.
fn groups(table: &PaperTable) -> Vec<(Vec<&PaperCell>, Option<&PaperCell>)> {
    let key = |c: &PaperCell| {
        (
            c.dataset.clone(),
            c.d_model,
            c.layers,
            c.blocks,
            c.tokenizer.clone(),
            c.method.clone(),
        )
    };
    let mut out: Vec<(Vec<&PaperCell>, Option<&PaperCell>)> = Vec::new();
    let mut keys = Vec::new();
    for cell in &table.cells {
        let k = key(cell);
        let at = keys
            .iter()
            .position(|known| *known == k)
            .unwrap_or_else(|| {
                keys.push(k);
                out.push((Vec::new(), None));
                out.len() - 1
            });
        match cell.seed {
            Some(_) => out[at].0.push(cell),
            None => out[at].1 = Some(cell),
        }
    }
    out
}

fn describe(cell: &PaperCell, label: &str) -> String {
    format!(
        "{label}: {} {:?} d={:?} L={:?} N={:?} {:?} seed {:?}",
        cell.method,
        cell.dataset,
        cell.d_model,
        cell.layers,
        cell.blocks,
        cell.tokenizer,
        cell.seed
    )
}

#[test]
fn every_builtin_study_names_tables_that_load_and_hold_its_own() {
    for (name, _) in BUILTIN_STUDIES {
        let study = load_study(name).unwrap();
        let tables = study.paper_tables().unwrap();
        assert!(!tables.is_empty(), "{name} names no table of the paper");
        assert!(
            tables.iter().any(|t| t.label == study.paper_table),
            "{name}: its table {} is not among {:?}",
            study.paper_table,
            tables.iter().map(|t| &t.label).collect::<Vec<_>>()
        );
        for table in &tables {
            for cell in &table.cells {
                cell.method
                    .parse::<haares_core::ResidualMethod>()
                    .unwrap_or_else(|e| panic!("{}: {e}", describe(cell, &table.label)));
            }
        }
    }
}

#[test]
fn seed_means_and_sample_sds_recompute_from_the_seed_cells() {
    let mut checked = 0;
    for table in tables() {
        for (seeds, mean) in groups(&table) {
            let (Some(mean), false) = (mean, seeds.is_empty()) else {
                continue;
            };
            let what = describe(mean, &table.label);
            let losses: Vec<i64> = seeds
                .iter()
                .filter_map(|c| c.loss)
                .map(|l| units(l, 4))
                .collect();
            if let (Some(loss), false) = (mean.loss, losses.is_empty()) {
                assert_eq!(units(loss, 4), mean_half_up(&losses), "{what}: mean loss");
                checked += 1;
            }
            if let Some(sd) = mean.sd {
                let xs: Vec<f64> = losses.iter().map(|&l| l as f64 / 1e4).collect();
                let m = xs.iter().sum::<f64>() / xs.len() as f64;
                let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
                assert_eq!(units(sd, 4), units(var.sqrt(), 4), "{what}: sample SD");
                checked += 1;
            }
            let perplexities: Vec<i64> = seeds
                .iter()
                .filter_map(|c| c.perplexity)
                .map(|p| units(p, 2))
                .collect();
            if let (Some(p), false) = (mean.perplexity, perplexities.is_empty()) {
                assert_eq!(
                    units(p, 2),
                    mean_half_up(&perplexities),
                    "{what}: mean perplexity"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} means were checked");
}

#[test]
fn per_seed_perplexities_are_exp_of_the_loss_to_the_printed_rounding() {
    let mut checked = 0;
    for table in tables() {
        for cell in table.cells.iter().filter(|c| c.seed.is_some()) {
            let (Some(loss), Some(perplexity)) = (cell.loss, cell.perplexity) else {
                continue;
            };
            // The loss is printed to four decimals: the true one is within half a unit of it.
            let bounds = [units((loss - 5e-5).exp(), 2), units((loss + 5e-5).exp(), 2)];
            assert!(
                (bounds[0]..=bounds[1]).contains(&units(perplexity, 2)),
                "{}: perplexity {perplexity}, exp(loss {loss}) rounds to {bounds:?}",
                describe(cell, &table.label)
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} perplexities were checked");
}

#[test]
fn a_cell_the_paper_prints_in_several_tables_has_one_value() {
    // tab:201m's seeds are tab:blockablation's N = 4 rows and tab:basisablation's Block AttnRes
    // and HAARES rows; tab:201m's 48-layer means are tab:depthsweep's.
    let tables = tables();
    let mut seen: Vec<(String, &PaperCell)> = Vec::new();
    let mut repeated = 0;
    for table in &tables {
        for cell in table.cells.iter().filter(|c| c.loss.is_some()) {
            let same = |other: &PaperCell| {
                (
                    &other.dataset,
                    other.d_model,
                    other.layers,
                    other.blocks,
                    &other.tokenizer,
                    &other.method,
                    other.seed,
                ) == (
                    &cell.dataset,
                    cell.d_model,
                    cell.layers,
                    cell.blocks,
                    &cell.tokenizer,
                    &cell.method,
                    cell.seed,
                )
            };
            for (label, other) in seen.iter().filter(|(_, o)| same(o)) {
                assert_eq!(
                    (other.loss, other.seed.and(other.perplexity)),
                    (cell.loss, cell.seed.and(cell.perplexity)),
                    "{} and {label}",
                    describe(cell, &table.label)
                );
                repeated += 1;
            }
            seen.push((table.label.clone(), cell));
        }
    }
    // 12 seed cells and 2 means of tab:201m in tab:blockablation, 6 seed cells and 2 means in
    // tab:basisablation (and so in both ablations: 8 more), 2 means in tab:depthsweep.
    assert!(repeated >= 20, "only {repeated} repeated cells compared");
}

#[test]
fn the_three_corrected_perplexities_are_marked() {
    let corrected: Vec<(String, Option<u64>)> = tables()
        .iter()
        .flat_map(|t| t.cells.iter().filter(|c| c.corrected))
        .map(|c| (c.method.clone(), c.seed))
        .collect();
    assert_eq!(
        corrected,
        [
            ("haares-fixed-bias=-2".to_string(), Some(123)),
            ("haares-fixed-bias=-2".to_string(), Some(2026)),
            ("haares-fixed-bias=-4".to_string(), Some(42)),
        ]
    );
}

#[test]
fn each_delta_is_haares_mean_minus_block_attnres_mean_at_its_setting() {
    let mut checked = 0;
    for table in tables() {
        for cell in table.cells.iter().filter(|c| c.delta.is_some()) {
            let block = table
                .cells
                .iter()
                .find(|b| {
                    b.method == "block-attnres"
                        && b.seed.is_none()
                        && (&b.dataset, b.d_model, b.layers, b.blocks)
                            == (&cell.dataset, cell.d_model, cell.layers, cell.blocks)
                })
                .unwrap_or_else(|| {
                    panic!("{}: no Block AttnRes mean", describe(cell, &table.label))
                });
            let (delta, haares, block) =
                (cell.delta.unwrap(), cell.loss.unwrap(), block.loss.unwrap());
            assert_eq!(
                units(delta, 4),
                units(haares, 4) - units(block, 4),
                "{}",
                describe(cell, &table.label)
            );
            checked += 1;
        }
    }
    assert_eq!(
        checked, 6,
        "tab:depthsweep's three and tab:blockablation's three"
    );
}

#[test]
fn paired_reductions_recompute_from_the_seed_cells() {
    let tables = tables();
    let seed_loss = |like: &PaperCell, method: &str, seed: u64| -> i64 {
        tables
            .iter()
            .flat_map(|t| &t.cells)
            .find(|c| {
                c.method == method
                    && c.seed == Some(seed)
                    && c.loss.is_some()
                    && (&c.dataset, c.d_model, c.layers, c.blocks, &c.tokenizer)
                        == (
                            &like.dataset,
                            like.d_model,
                            like.layers,
                            like.blocks,
                            &like.tokenizer,
                        )
            })
            .and_then(|c| c.loss)
            .map(|l| units(l, 4))
            .unwrap_or_else(|| panic!("{}: no {method} seed {seed}", describe(like, "reduction")))
    };
    let mut checked = 0;
    for table in &tables {
        for cell in table
            .cells
            .iter()
            .filter(|c| c.reduction.is_some() && c.seed.is_some())
        {
            let seed = cell.seed.unwrap();
            let expected =
                seed_loss(cell, &cell.baseline, seed) - seed_loss(cell, &cell.method, seed);
            assert_eq!(
                units(cell.reduction.unwrap(), 4),
                expected,
                "{} against {}",
                describe(cell, &table.label),
                cell.baseline
            );
            checked += 1;
        }
    }
    // tab:pairdiffs' 8 and the text's 12 (tab:blockablation's 6, tab:basisablation's 6).
    assert_eq!(checked, 20);
    // Each mean of tab:pairdiffs, from its seeds' reductions, rounded half up.
    let pairs = tables.iter().find(|t| t.label == "tab:pairdiffs").unwrap();
    for (seeds, mean) in groups(pairs) {
        let reductions: Vec<i64> = seeds
            .iter()
            .map(|c| units(c.reduction.unwrap(), 4))
            .collect();
        let mean = mean.unwrap();
        assert_eq!(
            units(mean.reduction.unwrap(), 4),
            mean_half_up(&reductions),
            "{}",
            describe(mean, "tab:pairdiffs")
        );
    }
}

#[test]
fn a_malformed_table_is_refused_with_its_name() {
    let message = parse_paper_table(
        "t.toml",
        "label = \"x\"\n[[cells]]\nmethod = \"haares\"\nloss = 1.0\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("t.toml") && message.contains("`mean = true`"),
        "{message}"
    );
    let message = parse_paper_table("t.toml", "label = \"x\"\ncells = []\nsteps = 3\n")
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("t.toml") && message.contains("steps"),
        "{message}"
    );
}

#[test]
fn a_study_given_by_its_path_finds_its_tables_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let study = dir.path().join("mine.toml");
    let (_, text) = BUILTIN_STUDIES.iter().find(|(n, _)| *n == "seeds").unwrap();
    std::fs::write(&study, text).unwrap();
    let loaded = load_study(study.to_str().unwrap()).unwrap();
    // Nothing beside it yet: the error names the file it looked for.
    let message = loaded.paper_tables().unwrap_err().to_string();
    assert!(message.contains("tab-201m.toml"), "{message}");
    std::fs::create_dir(dir.path().join("paper")).unwrap();
    for (name, text) in haares_train::study::paper::BUILTIN_PAPER_TABLES {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let labels: Vec<String> = loaded
        .paper_tables()
        .unwrap()
        .into_iter()
        .map(|t| t.label)
        .collect();
    assert_eq!(labels, ["tab:201m", "tab:timetotarget", "tab:pairdiffs"]);
}

fn table(label: &str) -> PaperTable {
    tables().into_iter().find(|t| t.label == label).unwrap()
}

/// tab:timetotarget: each target is tab:201m's Block AttnRes loss of the seed, each crossing at
/// or below it; hours and time saved follow from the steps at 14K and 17K tokens/s (the paper's
/// appendix: rounded only after calculating), and the mean row from the seeds.
#[test]
fn time_to_target_follows_from_tab_201m_and_the_throughputs() {
    let runs = table("tab:timetotarget");
    let block = table("tab:201m");
    let hours = |steps: f64, per_s: f64| 8192.0 * steps / (3600.0 * per_s);
    let block_hours = hours(30_000.0, 17_000.0);
    let seeds: Vec<&PaperCell> = runs.cells.iter().filter(|c| c.seed.is_some()).collect();
    assert_eq!(seeds.len(), 3);
    let mut exact_hours = Vec::new();
    for cell in &seeds {
        let target = block
            .cells
            .iter()
            .find(|b| b.method == "block-attnres" && b.seed == cell.seed)
            .and_then(|b| b.loss);
        assert_eq!(cell.target, target, "{}", describe(cell, &runs.label));
        assert!(cell.crossing_loss.unwrap() <= cell.target.unwrap());
        let h = hours(cell.step.unwrap() as f64, 14_000.0);
        assert_eq!(
            units(cell.hours.unwrap(), 2),
            units(h, 2),
            "{}",
            describe(cell, "hours")
        );
        assert_eq!(
            units(cell.time_saved.unwrap(), 3),
            units(1.0 - h / block_hours, 3),
            "{}",
            describe(cell, "time saved")
        );
        exact_hours.push(h);
    }
    let mean = runs.cells.iter().find(|c| c.mean).unwrap();
    let of = |f: fn(&PaperCell) -> Option<f64>, digits: i32| {
        mean_half_up(
            &seeds
                .iter()
                .map(|c| units(f(c).unwrap(), digits))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(units(mean.target.unwrap(), 4), of(|c| c.target, 4));
    assert_eq!(
        units(mean.crossing_loss.unwrap(), 4),
        of(|c| c.crossing_loss, 4)
    );
    // Printed as 19.3K: the mean step in hundreds.
    assert_eq!(
        units(mean.step.unwrap() as f64 / 1e5, 3),
        of(|c| c.step.map(|s| s as f64 / 1e5), 3)
    );
    let mean_hours = exact_hours.iter().sum::<f64>() / 3.0;
    assert_eq!(units(mean.hours.unwrap(), 2), units(mean_hours, 2));
    assert_eq!(
        units(mean.time_saved.unwrap(), 3),
        units(1.0 - mean_hours / block_hours, 3)
    );
}

/// tab:cost: each step time is 8192 tokens over the throughput, HAARES's memory increase its
/// memory over Block AttnRes's, and its time increase Block AttnRes's throughput over its own.
#[test]
fn cost_step_times_and_increases_follow_from_the_measured_values() {
    let cost = table("tab:cost");
    assert_eq!(cost.cells.len(), 6);
    for cell in &cost.cells {
        let step = 8192.0 / (1000.0 * cell.ktokens_per_s.unwrap());
        assert_eq!(
            units(cell.step_s.unwrap(), 3),
            units(step, 3),
            "{}",
            describe(cell, "step")
        );
    }
    for haares in cost.cells.iter().filter(|c| c.method == "haares") {
        let block = cost
            .cells
            .iter()
            .find(|b| b.method == "block-attnres" && b.d_model == haares.d_model)
            .unwrap();
        let what = describe(haares, &cost.label);
        let memory = haares.memory_gb.unwrap() / block.memory_gb.unwrap() - 1.0;
        assert_eq!(
            units(haares.memory_increase.unwrap(), 3),
            units(memory, 3),
            "{what}"
        );
        let time = block.ktokens_per_s.unwrap() / haares.ktokens_per_s.unwrap() - 1.0;
        assert_eq!(
            units(haares.time_increase.unwrap(), 3),
            units(time, 3),
            "{what}"
        );
    }
}
