//! `haares-bench`: the paper's analytic cost quantities (and, as the bench issue lands, measured
//! costs). See `docs/benchmarks.md`.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use haares_bench::analytic::{params_table, sources_table};
use haares_core::ModelFamily;

#[derive(Parser)]
#[command(
    name = "haares-bench",
    version,
    about = "The paper's cost quantities for this implementation"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Family {
    Small,
    Medium,
    Large,
}

#[derive(Subcommand)]
enum Command {
    /// Intermediate-read source counts of Block AttnRes and HAARES (tab:sourcecounts).
    Sources {
        /// Layers L.
        #[arg(long, default_value_t = 48)]
        layers: usize,
        /// Block counts N (each must divide 2L).
        #[arg(long, value_delimiter = ',', default_value = "4,6,8")]
        blocks: Vec<usize>,
    },
    /// Parameter counts per family, depth, vocabulary and method (tab:modelconfig).
    Params {
        /// Families.
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "small,medium,large"
        )]
        family: Vec<Family>,
        /// Depths.
        #[arg(long, value_delimiter = ',', default_value = "48")]
        layers: Vec<usize>,
        /// Vocabulary size (256 characters, 4096 BPE).
        #[arg(long, default_value_t = 256)]
        vocab: usize,
        /// Methods (names as in haares-train).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "standard,block-attnres,haares"
        )]
        methods: Vec<String>,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Sources { layers, blocks } => {
            sources_table(layers, &blocks).map_err(|e| e.to_string())
        }
        Command::Params {
            family,
            layers,
            vocab,
            methods,
        } => {
            let families: Vec<ModelFamily> = family
                .into_iter()
                .map(|f| match f {
                    Family::Small => ModelFamily::Small,
                    Family::Medium => ModelFamily::Medium,
                    Family::Large => ModelFamily::Large,
                })
                .collect();
            params_table(&families, &layers, vocab, &methods)
        }
    };
    match result {
        Ok(table) => {
            print!("{table}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
