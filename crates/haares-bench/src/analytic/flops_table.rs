//! The `flops` table: analytic FLOPs per training token ([`haares_core::flops`]) for every family,
//! depth and method, with HAARES's increment over Block AttnRes beside tab:cost's.

use std::fmt::Write as _;

use haares_core::flops::{FlopCount, flops_per_token, increment};
use haares_core::{ModelFamily, ResidualMethod};

/// The paper's FLOP increments of tab:cost (48 layers, N = 4, T = 512, character vocabulary),
/// by width.
pub const PAPER_INCREMENTS: [(usize, f64); 3] = [(128, 0.005), (512, 0.003), (768, 0.002)];

/// The `flops` table: forward components and training FLOPs per token for every family ×
/// depth × method, with each method's increment over Block AttnRes (when it is listed).
pub fn flops_table(
    families: &[ModelFamily],
    layers: &[usize],
    seq: usize,
    vocab: usize,
    methods: &[ResidualMethod],
) -> crate::Result<String> {
    let mut out = format!(
        "Analytic FLOPs per token at context {seq}, vocabulary {vocab} (MFLOP; forward components, \
         training = 3 × forward). Convention: docs/benchmarks.md and `haares_core::flops`.\n\n\
         | family | d | layers | method | matrices | attention | elementwise | head | routing | accumulation | RMS matching | training | vs Block AttnRes | paper |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let mega = |x: f64| format!("{:.3}", x / 1e6);
    for &family in families {
        for &l in layers {
            let count_of = |method: ResidualMethod| -> crate::Result<FlopCount> {
                let config = family.config(l, vocab, method);
                config.validate()?;
                Ok(flops_per_token(&config, seq))
            };
            let block = count_of(ResidualMethod::BlockAttnRes)?;
            for &method in methods {
                let count = count_of(method)?;
                let d = family.widths().0;
                let paper = PAPER_INCREMENTS
                    .iter()
                    .find(|(width, _)| *width == d && l == 48 && seq == 512 && vocab == 256)
                    .filter(|_| method == ResidualMethod::haares())
                    .map_or("".to_string(), |(_, inc)| format!("+{:.1}%", inc * 100.0));
                let _ = writeln!(
                    out,
                    "| {family:?} | {d} | {l} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:+.2}% | {paper} |",
                    method.label(),
                    mega(count.matrices),
                    mega(count.attention),
                    mega(count.elementwise),
                    mega(count.head),
                    mega(count.routing),
                    mega(count.accumulation),
                    mega(count.rms_matching),
                    mega(count.training()),
                    100.0 * increment(&count, &block),
                );
            }
        }
    }
    Ok(out)
}
