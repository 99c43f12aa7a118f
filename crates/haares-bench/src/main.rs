//! `haares-bench`: the paper's analytic cost quantities and the measured cost protocol.
//! See `docs/benchmarks.md`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use haares_bench::analytic::flops_table::flops_table;
use haares_bench::analytic::{params_table, sources_table};
use haares_bench::backends::dispatch;
use haares_bench::compare::paired::{PairedArgs, run_paired, write_paired_run};
use haares_bench::compare::versus::{VersusArgs, run_versus};
use haares_bench::compare::versus_report::write_versus_run;
use haares_bench::cost::{CostSpec, Family, Preset, SizeArgs, run_cost, write_cost_run};
use haares_bench::measure::worker::{KernelLog, RESULT_PREFIX, Worker, WorkerResult, WorkerTask};
use haares_bench::peer::{PeerKind, PeerMatmul};
use haares_bench::profile::anatomy::{AnatomyArgs, anatomy};
use haares_bench::profile::first_step::{FirstStepSpec, first_step_table, run_first_step};
use haares_bench::{BenchError, MethodChoice, Result};
use haares_core::ResidualMethod;
use haares_train::backend::BackendKind;
use std::path::PathBuf;
use std::time::Instant;

/// Counts allocated heap bytes: a cost worker's peak memory on the CPU backends.
#[global_allocator]
static ALLOCATOR: haares_bench::measure::heap::CountingAllocator =
    haares_bench::measure::heap::CountingAllocator;

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
    Params(#[command(flatten)] Grid),
    /// Analytic FLOPs per training token and the increment over Block AttnRes (tab:cost).
    Flops {
        #[command(flatten)]
        grid: Grid,
        /// Context length T.
        #[arg(long, default_value_t = 512)]
        seq: usize,
    },
    /// The cost protocol (sec:costprotocol): step time, throughput, peak memory, ratios between
    /// methods and model FLOP utilisation; writes `<out>.md` and `<out>.json`.
    Cost(CostArgs),
    /// Two methods' training steps alternated in one process (A B, B A, …): the median of their
    /// step-time ratio pair by pair, with a 95% interval and the target's verdict; writes
    /// `<out>.md` and `<out>.json`.
    Paired(PairedArgs),
    /// Our training step and PyTorch's (eager and compiled, each in a process of its own)
    /// alternated round by round: the median of our throughput over theirs within each round,
    /// with a 95% interval and the throughput target's verdict; writes `<out>.md` and `<out>.json`.
    Versus(VersusArgs),
    /// First-step anatomy: backend start, model init, forward, backward and update of one fresh
    /// worker per depth × method, with the kernels CubeCL compiled and autotuned; writes
    /// `<out>.md` and `<out>.json` after every worker.
    FirstStep(FirstStepArgs),
    /// The matrix products of a training step, shape by shape, on CUDA: every provider's TFLOP/s
    /// by device time and error against f64, beside PyTorch's `torch.matmul`; writes `<out>.md`
    /// and `<out>.json` (needs `--features cuda`).
    Products(haares_bench::compare::products::ProductsArgs),
    /// The GEMM peak: the best of 3 square f32 products (after one warm-up), in GFLOP/s.
    Gemm {
        /// Backend.
        #[arg(long, default_value = "flex")]
        backend: BackendKind,
        /// Matrix size n.
        #[arg(long, default_value_t = 1024)]
        size: usize,
    },
    /// Where a steady CPU training step's time goes, operation by operation (forward and
    /// backward of every operation, what lies outside them, the update), beside PyTorch
    /// eager's `torch.profiler` table of the same step with `--peer`.
    Anatomy(AnatomyArgs),
    /// One measurement of `cost`, in its own process (used by `cost`).
    #[command(hide = true)]
    CostWorker {
        /// Backend.
        #[arg(long)]
        backend: BackendKind,
        /// The task, as JSON.
        #[arg(long)]
        task: String,
    },
}

/// The families × depths × methods of an analytic table.
#[derive(clap::Args)]
struct Grid {
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
    methods: Vec<ResidualMethod>,
}

#[derive(clap::Args)]
struct CostArgs {
    /// Backend: flex, ndarray, wgpu, cuda (GPU backends need `--features wgpu|cuda`).
    #[arg(long, default_value = "flex")]
    backend: BackendKind,
    /// Preset the other options start from.
    #[arg(long, value_enum, default_value = "cpu")]
    preset: Preset,
    /// Families (widths).
    #[arg(long, value_enum, value_delimiter = ',')]
    family: Option<Vec<Family>>,
    #[command(flatten)]
    sizes: SizeArgs,
    /// Steps K per measurement.
    #[arg(long)]
    steps: Option<usize>,
    /// Steps left out of the steady-state step time.
    #[arg(long)]
    warmup: Option<usize>,
    /// Interleaved measurements per method.
    #[arg(long)]
    repeats: Option<usize>,
    /// Methods (names as in haares-train); `name/reference` or `name/fused` pins the router
    /// implementation, e.g. `block-attnres,block-attnres/reference`.
    #[arg(long, value_delimiter = ',')]
    methods: Option<Vec<MethodChoice>>,
    /// Size of the square GEMM that sets the peak.
    #[arg(long = "gemm-size")]
    gemm_size: Option<usize>,
    /// Steps between validation passes, for the routing telemetry's share of training time
    /// [default: 20, the depth study's cpu preset].
    #[arg(long)]
    validation_every: Option<usize>,
    /// Batches per validation pass, for the same share [default: 4].
    #[arg(long)]
    validation_batches: Option<usize>,
    /// Also train the same model in PyTorch between our workers, eagerly (`torch`) and/or
    /// compiled by `torch.compile` (`torch-compile`), and report throughput ratios against it;
    /// skipped, with a message, where PyTorch cannot be imported.
    #[arg(long, value_enum, value_delimiter = ',')]
    peer: Vec<PeerKind>,
    #[command(flatten)]
    targets: haares_bench::cost::targets::TargetArgs,
    /// The Python interpreter of the peer (one that can `import torch, safetensors`).
    #[arg(long, default_value = "python3")]
    python: String,
    /// The peer's matrix-product precisions on CUDA, each measured: fp32 (PyTorch's default,
    /// the paper's) and/or tf32 (what our CUDA matrix products use) [default: fp32].
    #[arg(long, value_enum, value_delimiter = ',')]
    peer_matmul: Option<Vec<PeerMatmul>>,
    /// Do not count the kernels a step launches (on wgpu and CUDA each method's count takes one
    /// more worker of two steps).
    #[arg(long)]
    no_launches: bool,
    /// Output path without extension [default: runs/bench/cost-<backend>-<preset>].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct FirstStepArgs {
    /// Backend: flex, ndarray, wgpu, cuda.
    #[arg(long, default_value = "flex")]
    backend: BackendKind,
    /// Family (width).
    #[arg(long, value_enum, default_value = "small")]
    family: Family,
    /// Depths L, measured in this order.
    #[arg(long, value_delimiter = ',', default_value = "2,12,48")]
    layers: Vec<usize>,
    /// Blocks N (must divide 2L).
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Context length.
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Steps per worker (the first and later ones to compare it with).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Methods (names as in `cost`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "standard,block-attnres,haares"
    )]
    methods: Vec<MethodChoice>,
    /// Log every launch with its device time (each kernel then runs alone) and report where a
    /// steady step's device time goes, by phase and kernel; the step times are then not real.
    #[arg(long)]
    kernel_times: bool,
    /// Output path without extension [default: runs/bench/first-step-<backend>].
    #[arg(long)]
    out: Option<PathBuf>,
}

fn first_step(args: FirstStepArgs) -> Result<String> {
    let out = args
        .out
        .unwrap_or_else(|| PathBuf::from(format!("runs/bench/first-step-{}", args.backend)));
    let spec = FirstStepSpec {
        backend: args.backend,
        family: Family::of(vec![args.family])[0],
        layers: args.layers,
        blocks: args.blocks,
        batch: args.batch,
        seq: args.seq,
        steps: args.steps,
        methods: args.methods,
        kernel_times: args.kernel_times,
    };
    let run = run_first_step(&spec, &out, |line| eprintln!("{line}"))?;
    eprintln!("wrote {0}.md and {0}.json", out.display());
    Ok(first_step_table(&run))
}

impl CostArgs {
    fn spec(self) -> (CostSpec, PathBuf) {
        let (mut spec, preset) = self.preset.spec(self.backend);
        let out = self
            .out
            .unwrap_or_else(|| PathBuf::from(format!("runs/bench/cost-{}-{preset}", self.backend)));
        if let Some(family) = self.family {
            spec.families = Family::of(family);
        }
        let set = |field: &mut usize, value: Option<usize>| {
            if let Some(value) = value {
                *field = value;
            }
        };
        self.sizes.apply(&mut spec);
        set(&mut spec.steps, self.steps);
        set(&mut spec.warmup, self.warmup);
        set(&mut spec.repeats, self.repeats);
        set(&mut spec.gemm_n, self.gemm_size);
        set(&mut spec.validation_every, self.validation_every);
        set(&mut spec.validation_batches, self.validation_batches);
        if let Some(methods) = self.methods {
            spec.methods = methods;
        }
        if !self.peer.is_empty() {
            spec.peer_modes = PeerKind::modes(&self.peer);
            spec.peer = Some(self.python);
        }
        if let Some(matmul) = self.peer_matmul {
            spec.peer_matmul = matmul;
        }
        spec.count_launches = !self.no_launches;
        spec.targets = self.targets.targets();
        (spec, out)
    }
}

fn cost(args: CostArgs) -> Result<String> {
    let (spec, out) = args.spec();
    let run = run_cost(
        &spec,
        |line| eprintln!("{line}"),
        |partial| {
            write_cost_run(partial, &out)?;
            eprintln!(
                "wrote {}.md and .json with the families so far",
                out.display()
            );
            Ok(())
        },
    )?;
    let table = write_cost_run(&run, &out)?;
    eprintln!("wrote {0}.md and {0}.json", out.display());
    Ok(table)
}

fn anatomy_command(args: AnatomyArgs) -> Result<String> {
    let (run, out) = anatomy(args)?;
    let markdown = haares_bench::profile::anatomy_report::report(&run);
    haares_bench::report_files::write_atomically_both(&out, &run, &markdown)?;
    Ok(markdown)
}

fn products(args: &haares_bench::compare::products::ProductsArgs) -> Result<String> {
    let run = haares_bench::compare::products::run_products(args, |line| eprintln!("{line}"))?;
    let table = haares_bench::compare::products::write_products_run(&run, args)?;
    eprintln!("wrote {0}.md and {0}.json", args.out.display());
    match haares_bench::compare::products::wrong_products(&run).as_slice() {
        [] => Ok(table),
        wrong => Err(BenchError::Check(format!(
            "{} (the report above has every product)",
            wrong.join("; ")
        ))),
    }
}

fn paired(args: PairedArgs) -> Result<String> {
    let (spec, out) = args.spec();
    let run = run_paired(&spec, |line| eprintln!("{line}"))?;
    let table = write_paired_run(&run, &out)?;
    eprintln!("wrote {0}.md and {0}.json", out.display());
    Ok(table)
}

fn versus(args: VersusArgs) -> Result<String> {
    let (spec, out) = args.spec();
    let run = run_versus(&spec, |line| eprintln!("{line}"))?;
    let table = write_versus_run(&run, &out)?;
    eprintln!("wrote {0}.md and {0}.json", out.display());
    match &run.stopped {
        None => Ok(table),
        Some(reason) => Err(BenchError::Peer(format!(
            "{reason}; the {} method(s) measured before it are in {}.md and .json",
            run.methods.len(),
            out.display()
        ))),
    }
}

fn cost_worker(kind: BackendKind, task: &str) -> Result<String> {
    let started = Instant::now();
    let task: WorkerTask = serde_json::from_str(task).map_err(|e| {
        BenchError::Request(format!(
            "invalid worker task ({e}); `cost-worker` is started by the other commands, not by hand"
        ))
    })?;
    count_kernel_events(kind, task.kernel_log())?;
    let result = dispatch(kind, Worker { task, started })?;
    let json = serde_json::to_string(&result)
        .map_err(|e| BenchError::Worker(format!("cannot write the result as JSON: {e}")))?;
    Ok(format!("{RESULT_PREFIX}{json}\n"))
}

/// On the cube backends, CubeCL's compilations and autotune runs are counted (the first-step
/// anatomy), and every kernel launch as `launches` says; set up before the first kernel.
fn count_kernel_events(kind: BackendKind, launches: KernelLog) -> Result<()> {
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    let _ = launches;
    if kind.is_cube() {
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        {
            use haares_train::kernel_cache::{KernelEvents, configure_cube_runtime};
            let events = match launches {
                KernelLog::Off => KernelEvents::ToLogCrate,
                KernelLog::Launches => KernelEvents::ToLogCrateWithLaunches,
                KernelLog::Times => KernelEvents::ToLogCrateWithTimes,
            };
            configure_cube_runtime(events)?;
            if !haares_bench::measure::kernel_events::install() {
                return Err(BenchError::Worker(
                    "another logger was installed first: kernels cannot be counted".into(),
                ));
            }
            // cuBLAS's products are not in CubeCL's log: timed with CUDA events instead.
            #[cfg(feature = "cuda")]
            if matches!(launches, KernelLog::Times) {
                haares_core::ops::matmul::cublas::start_timing();
            }
        }
    }
    Ok(())
}

fn gemm(kind: BackendKind, size: usize) -> Result<String> {
    let task = WorkerTask::Gemm { n: size, reps: 3 };
    let worker = Worker {
        task,
        started: Instant::now(),
    };
    match dispatch(kind, worker)? {
        WorkerResult::Gemm { flops_per_s } => Ok(format!("GFLOP/s {:.1}\n", flops_per_s / 1e9)),
        _ => Err(BenchError::Worker(
            "the GEMM answered with something else".into(),
        )),
    }
}

fn main() -> ExitCode {
    // glibc's allocator keeps what a training step frees (the process is this binary's to
    // configure; the library never sets it): before any thread starts.
    haares_train::cpu::keep_freed_memory();
    let cli = Cli::parse();
    // The products' provider (HAARES_PRODUCTS) is the process's and its workers': a misspelt one
    // is refused before any work.
    if let Err(error) = haares_core::ops::matmul::ProductProvider::from_env() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Sources { layers, blocks } => sources_table(layers, &blocks),
        Command::Params(grid) => params_table(
            &Family::of(grid.family),
            &grid.layers,
            grid.vocab,
            &grid.methods,
        ),
        Command::Flops { grid, seq } => flops_table(
            &Family::of(grid.family),
            &grid.layers,
            seq,
            grid.vocab,
            &grid.methods,
        ),
        Command::Cost(args) => cost(args),
        Command::Products(args) => products(&args),
        Command::Paired(args) => paired(args),
        Command::Versus(args) => versus(args),
        Command::FirstStep(args) => first_step(args),
        Command::Gemm { backend, size } => gemm(backend, size),
        Command::Anatomy(args) => anatomy_command(args),
        Command::CostWorker { backend, task } => cost_worker(backend, &task),
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
