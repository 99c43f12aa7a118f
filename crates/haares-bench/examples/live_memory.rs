//! What a training step holds at its peak, per method, on NdArray: the heap bytes allocated
//! when the forward pass ends (the autodiff graph's saved tensors, which the backward pass then
//! frees) and the peak over the step — the cost protocol's first step (`measure::worker::Trainer`),
//! with its memory alone. Seconds per method, against minutes for the cost protocol, and
//! deterministic: the tool for finding where a method's memory goes.
//!
//! `cargo run -p haares-bench --example live_memory -- [method …]` (default: standard,
//! block-attnres, haares; `name/reference` pins the routing path), at the `cpu` preset's model
//! and batch. Each method runs in its own process, so that one's peak does not hide another's.

use std::process::Command;

use burn::backend::{Autodiff, NdArray};
use haares_bench::cost::CostSpec;
use haares_bench::measure::heap::{CountingAllocator, allocated_bytes, peak_allocated_bytes};
use haares_bench::measure::phases::Phase;
use haares_bench::measure::worker::Trainer;
use haares_core::ModelFamily;
use haares_train::backend::BackendKind;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

type Ad = Autodiff<NdArray>;

const CHILD_FLAG: &str = "--one";

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, method] = args.as_slice()
        && flag == CHILD_FLAG
    {
        return measure(method).map_err(|e| e.to_string());
    }
    let methods = match args.is_empty() {
        true => vec!["standard".into(), "block-attnres".into(), "haares".into()],
        false => args,
    };
    println!("| method | at the end of the forward pass (MB) | peak (MB) |\n|---|---|---|");
    let program = std::env::current_exe().map_err(|e| e.to_string())?;
    for method in methods {
        let status = Command::new(&program)
            .args([CHILD_FLAG, &method])
            .status()
            .map_err(|e| format!("cannot start a measurement of `{method}`: {e}"))?;
        if !status.success() {
            return Err(format!("the measurement of `{method}` failed ({status})"));
        }
    }
    Ok(())
}

fn measure(method: &str) -> haares_bench::Result<()> {
    let spec = CostSpec::cpu(BackendKind::Ndarray);
    let config = spec.model(ModelFamily::Small, &method.parse()?)?;
    let mut trainer = Trainer::<Ad>::new(&config, spec.batch, spec.seq, &Default::default())?;
    let mut after_forward = None;
    trainer.step(|phase| {
        if phase == Phase::Forward {
            after_forward = allocated_bytes();
        }
    })?;
    // `None` only if the counting allocator never ran: a 0 in the table would read as a result.
    let uncounted = || {
        haares_bench::BenchError::Worker(
            "the counting allocator saw no allocation: is it installed?".into(),
        )
    };
    let after_forward = after_forward.ok_or_else(uncounted)?;
    let peak = peak_allocated_bytes().ok_or_else(uncounted)?;
    println!(
        "| {method} | {:.1} | {:.1} |",
        after_forward as f64 / 1e6,
        peak as f64 / 1e6
    );
    Ok(())
}
