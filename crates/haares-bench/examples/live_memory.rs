//! What a training step holds at its peak, per method, on NdArray: the heap bytes allocated
//! when the forward pass ends (the autodiff graph's saved tensors, which the backward pass then
//! frees) and the peak over forward and backward. Seconds per method, against minutes for the
//! cost protocol, and deterministic: the tool for finding where a method's memory goes.
//!
//! `cargo run -p haares-bench --example live_memory -- [method …]` (default: standard,
//! block-attnres, haares; `name/reference` pins the routing path), at the `cpu` preset's model
//! and batch. Each method runs in its own process, so that one's peak does not hide another's.

use std::process::Command;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Int, Tensor, TensorData};
use haares_bench::cost::CostSpec;
use haares_bench::heap::{CountingAllocator, allocated_bytes, peak_allocated_bytes};
use haares_core::ModelFamily;
use haares_train::learner::init_model;
use haares_train::loss::{DeviceBatch, mean_cross_entropy};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

type Ad = Autodiff<NdArray>;

const CHILD_FLAG: &str = "--one";

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, method] = args.as_slice()
        && flag == CHILD_FLAG
    {
        return measure(method);
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

fn measure(method: &str) -> Result<(), String> {
    let spec = CostSpec::cpu("ndarray");
    let config = spec.model(ModelFamily::Small, method)?;
    let device = Default::default();
    let model = init_model::<Ad>(&config, 42, &device).map_err(|e| e.to_string())?;
    let (batch, seq) = (spec.batch, spec.seq);
    let ids = |offset: usize| -> Tensor<Ad, 2, Int> {
        let ids: Vec<i64> = (0..batch * seq)
            .map(|i| ((i * 7919 + offset) % config.vocab_size) as i64)
            .collect();
        Tensor::from_data(TensorData::new(ids, [batch, seq]), &device)
    };
    let data = DeviceBatch {
        inputs: ids(0),
        targets: ids(1),
        mask: Tensor::ones([batch, seq], &device),
        real_targets: batch * seq,
    };
    let megabytes = |bytes: Option<u64>| bytes.unwrap_or(0) as f64 / 1e6;
    let loss = mean_cross_entropy(&model, &data);
    let _ = loss.clone().into_scalar();
    let after_forward = allocated_bytes();
    drop(loss.backward());
    println!(
        "| {method} | {:.1} | {:.1} |",
        megabytes(after_forward),
        megabytes(peak_allocated_bytes())
    );
    Ok(())
}
