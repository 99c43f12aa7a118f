//! One measurement in a process of its own: the task a worker is given and what it answers
//! ([`worker`]), and what it records on the way: the phases of each step ([`phases`]), the
//! allocator's and the device's peak memory ([`heap`], [`device_memory`]), CubeCL's compilation
//! and launch events ([`kernel_events`]), the checkpoint a PyTorch peer starts from ([`export`]),
//! a heartbeat while the first step compiles ([`heartbeat`]), and the statistics of its samples
//! ([`stats`]).

pub mod device_memory;
pub mod export;
pub mod heap;
pub mod heartbeat;
pub mod kernel_events;
pub mod phases;
pub mod stats;
pub mod worker;

use std::process::{Command, Stdio};

use haares_train::backend::BackendKind;
use worker::{RESULT_PREFIX, WorkerResult, WorkerTask};

use crate::error::{BenchError, Result};

/// Runs one task in a fresh `haares-bench cost-worker` process and reads its answer.
pub fn run_worker(backend: BackendKind, task: &WorkerTask) -> Result<WorkerResult> {
    let worker = |message: String| BenchError::Worker(message);
    let exe = std::env::current_exe().map_err(|e| {
        worker(format!(
            "cannot find this executable to start it again: {e}"
        ))
    })?;
    let task_json = serde_json::to_string(task)
        .map_err(|e| worker(format!("cannot write the task as JSON: {e}")))?;
    // The worker's stderr goes straight to ours: its progress and, if it fails, its error.
    let output = Command::new(&exe)
        .args([
            "cost-worker",
            "--backend",
            backend.name(),
            "--task",
            &task_json,
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| worker(format!("cannot start `{}`: {e}", exe.display())))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let answer = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
    match (output.status.success(), answer) {
        (true, Some(json)) => serde_json::from_str(json)
            .map_err(|e| worker(format!("its answer is not valid JSON ({e}): {json}"))),
        _ => Err(worker(format!(
            "a measurement failed ({}); the worker's error is above",
            output.status
        ))),
    }
}
