//! The residual methods' one spelling: every name `ResidualMethod` reads is the name it prints,
//! the paper's labels and report order, and the spellings earlier versions printed.

use haares_core::method::{METHOD_NAMES, method_label, method_rank};
use haares_core::{DetailBias, DetailSource, HaaresOptions, ResidualMethod};

fn parse(name: &str) -> ResidualMethod {
    name.parse()
        .unwrap_or_else(|e| panic!("`{name}` should parse: {e}"))
}

#[test]
fn every_listed_name_reads_as_its_method_and_prints_as_itself() {
    let expected = [
        ("standard", ResidualMethod::Standard),
        ("rezero", ResidualMethod::ReZero),
        ("layerscale", ResidualMethod::LayerScale { init: None }),
        ("block-attnres", ResidualMethod::BlockAttnRes),
        (
            "haares-duplicated-c",
            ResidualMethod::Haares(HaaresOptions::duplicated_cumulative()),
        ),
        (
            "haares-random-signs",
            ResidualMethod::Haares(HaaresOptions::random_signs(0)),
        ),
        (
            "haares-fixed-bias=0",
            ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(0.0)),
        ),
        (
            "haares-fixed-bias=-2",
            ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(-2.0)),
        ),
        (
            "haares-fixed-bias=-4",
            ResidualMethod::Haares(HaaresOptions::fixed_detail_bias(-4.0)),
        ),
        (
            "haares-no-rms-match",
            ResidualMethod::Haares(HaaresOptions::without_rms_match()),
        ),
        ("haares", ResidualMethod::haares()),
    ];
    assert_eq!(
        METHOD_NAMES,
        expected.map(|(name, _)| name).as_slice(),
        "the list and this table name the same methods in the same order"
    );
    for (name, method) in expected {
        assert_eq!(parse(name), method, "{name}");
        assert_eq!(method.to_string(), name);
        assert_eq!(method.name(), name);
    }
}

#[test]
fn values_after_the_name_round_trip() {
    let signs = parse("haares-random-signs=7");
    assert_eq!(
        signs,
        ResidualMethod::Haares(HaaresOptions::random_signs(7))
    );
    assert_eq!(signs.to_string(), "haares-random-signs=7");
    let bias = parse("haares-fixed-bias=-3.5");
    assert_eq!(
        bias.haares_options().map(|o| o.detail_bias),
        Some(DetailBias::Fixed { value: -3.5 })
    );
    assert_eq!(bias.to_string(), "haares-fixed-bias=-3.5");
    let scale = parse("layerscale=0.001");
    assert_eq!(scale, ResidualMethod::LayerScale { init: Some(0.001) });
    assert_eq!(scale.to_string(), "layerscale=0.001");
    // A value written another way reads as the same method and prints in the one spelling.
    assert_eq!(
        parse("haares-fixed-bias=-2.0").to_string(),
        "haares-fixed-bias=-2"
    );
}

#[test]
fn the_spellings_earlier_versions_printed_still_read() {
    for (old, today) in [
        ("block_attnres", "block-attnres"),
        ("haares_duplicated_c", "haares-duplicated-c"),
        ("haares_random_signs", "haares-random-signs"),
        ("haares_no_rms_match", "haares-no-rms-match"),
    ] {
        assert_eq!(parse(old), parse(today), "{old}");
        assert_eq!(parse(old).to_string(), today);
    }
}

#[test]
fn unknown_names_and_bad_values_are_refused_with_the_list_of_names() {
    for name in [
        "resnet",
        "",
        "haares-fixed-bias",
        "haares-fixed-bias=inf",
        "haares-fixed-bias=x",
        "haares-random-signs=-1",
        "standard=1",
        "haares=2",
    ] {
        let error = name.parse::<ResidualMethod>().expect_err(name).to_string();
        assert!(
            error.contains(&format!("unknown method `{name}`")),
            "{error}"
        );
        assert!(
            error.contains("block-attnres, haares-duplicated-c"),
            "{error}"
        );
    }
}

#[test]
fn options_that_are_no_named_variant_print_as_custom_and_do_not_read() {
    let custom = ResidualMethod::Haares(HaaresOptions {
        rms_gamma: 3.0,
        ..HaaresOptions::paper()
    });
    assert_eq!(custom.to_string(), "haares-custom");
    assert_eq!(custom.label(), "HAARES (custom options)");
    assert!("haares-custom".parse::<ResidualMethod>().is_err());
    let signs_without_matching = ResidualMethod::Haares(HaaresOptions {
        detail: DetailSource::RandomSigns { seed: 1 },
        rms_match: false,
        ..HaaresOptions::paper()
    });
    assert_eq!(signs_without_matching.to_string(), "haares-custom");
}

#[test]
fn labels_are_the_papers_and_unknown_names_label_themselves() {
    for (name, label) in [
        ("standard", "Standard Residual"),
        ("rezero", "ReZero"),
        ("layerscale", "LayerScale"),
        ("block-attnres", "Block AttnRes"),
        ("haares", "HAARES"),
        ("haares-duplicated-c", "Duplicated C×2"),
        ("haares-random-signs=3", "Random-sign detail"),
        ("haares-fixed-bias=-4", "Fixed detail bias -4"),
        ("haares-no-rms-match", "HAARES without RMS match"),
        ("block_attnres", "Block AttnRes"),
        ("my-method", "my-method"),
    ] {
        assert_eq!(method_label(name), label, "{name}");
    }
}

#[test]
fn reports_order_baselines_first_and_haares_last() {
    let mut names = vec![
        "haares",
        "haares-fixed-bias=-2",
        "my-method",
        "block-attnres",
        "haares-fixed-bias=0",
        "standard",
    ];
    names.sort_by_key(|name| (method_rank(name), name.to_string()));
    assert_eq!(
        names,
        [
            "standard",
            "block-attnres",
            "haares-fixed-bias=-2",
            "haares-fixed-bias=0",
            "haares",
            "my-method"
        ]
    );
}
