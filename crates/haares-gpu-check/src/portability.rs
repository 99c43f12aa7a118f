//! The `portability` stage: the core's portability tests on the backend, each test in a process
//! of its own, a few at a time, each with its result and, when it fails, its message.
//!
//! Why not one process for the whole suite: CubeCL compiles one kernel at a time per process
//! (NVRTC on CUDA, every candidate kernel in the autotuned test build), so the suite ran
//! serially, and on a cold H200 the 480 s budget ended inside the tenth of fourteen tests; and
//! the test harness prints failure messages only once every test has run, so that cut stage said
//! which tests failed but not why. A test cut by the deadline here loses only itself.

use std::collections::VecDeque;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

use super::StageStatus;
use super::process::{Exit, run_logged};
use super::stage::{Outcome, Stage, status_of};

/// How one test ended.
#[derive(Debug, Clone, PartialEq)]
enum TestEnd {
    Passed,
    /// Its message (the panic the harness captured), or how the process ended.
    Failed(String),
    TimedOut,
    /// The deadline passed before a process was free for it.
    NotStarted,
}

impl TestEnd {
    fn word(&self) -> &'static str {
        match self {
            TestEnd::Passed => "passed",
            TestEnd::Failed(_) => "failed",
            TestEnd::TimedOut => "timed out",
            TestEnd::NotStarted => "not started",
        }
    }
}

/// Runs every test matching the profile's filter (the backend's module, `cuda::`, by default),
/// `spec.portability_jobs` processes at a time.
pub(super) fn portability(stage: &Stage) -> Result<Outcome, String> {
    let backend_module = format!("{}::", stage.spec.backend);
    let filter = stage
        .spec
        .profile
        .portability_filter
        .unwrap_or(&backend_module);
    let tests = match list_tests(stage, filter)? {
        Ok(tests) => tests,
        Err(why) => return Ok(Outcome::failed(why)),
    };
    if tests.is_empty() {
        return Ok(Outcome::failed(format!("no test matched `{filter}`")));
    }
    let jobs = stage.spec.portability_jobs.clamp(1, tests.len());
    let queue = Mutex::new((0..tests.len()).collect::<VecDeque<_>>());
    let ends = Mutex::new(vec![TestEnd::NotStarted; tests.len()]);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                while let Some(index) = next(&queue) {
                    if Instant::now() >= stage.deadline {
                        break;
                    }
                    let end = run_one(stage, &tests[index]).unwrap_or_else(TestEnd::Failed);
                    ends.lock().unwrap_or_else(|e| e.into_inner())[index] = end;
                }
            });
        }
    });
    let ends = ends.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(outcome(filter, jobs, &tests, &ends))
}

fn next(queue: &Mutex<VecDeque<usize>>) -> Option<usize> {
    queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
}

/// The names of the tests matching `filter` (`--list --format terse`); the inner error says why
/// the binary would not list them.
fn list_tests(stage: &Stage, filter: &str) -> Result<Result<Vec<String>, String>, String> {
    let mut command = Command::new(&stage.spec.portability_bin);
    command.args(["--list", "--format", "terse", filter]);
    let listed = run_logged(command, stage.deadline, stage.log, stage.name, &|| false)?;
    if listed.exit != Exit::Success {
        let why = match status_of(&listed) {
            StageStatus::Failed(why) => why,
            _ => "ran out of time".into(),
        };
        return Ok(Err(format!("listing the tests matching `{filter}`: {why}")));
    }
    Ok(Ok(listed
        .stdout
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_string)
        .collect()))
}

/// One test in its own process and working directory, with its own CubeCL cache: CubeCL keeps
/// its caches under the `target/` beside the nearest `Cargo.toml` above the working directory,
/// else under `$XDG_CACHE_HOME/cubecl`, and processes side by side must not write one cache file
/// together. Its output goes to `portability/<test>.log` in the check's folder.
fn run_one(stage: &Stage, test: &str) -> Result<TestEnd, String> {
    let scratch = tempfile::tempdir().map_err(|e| format!("cannot make a scratch folder: {e}"))?;
    let logs = stage.spec.out.join("portability");
    std::fs::create_dir_all(&logs)
        .map_err(|e| format!("cannot create `{}`: {e}", logs.display()))?;
    let log = logs.join(format!("{}.log", test.replace("::", "-")));
    let mut command = Command::new(&stage.spec.portability_bin);
    command
        .args(["--exact", test, "--test-threads", "1"])
        .current_dir(scratch.path())
        .env("XDG_CACHE_HOME", scratch.path())
        .env("CUBECL_AUTOTUNE_LEVEL", "minimal");
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // wgpu's Vulkan loader wants one; the scratch folder serves.
        command.env("XDG_RUNTIME_DIR", scratch.path());
    }
    let started = Instant::now();
    let finished = run_logged(command, stage.deadline, &log, test, &|| false)?;
    let end = match finished.exit {
        Exit::Success if finished.stdout.contains("1 passed") => TestEnd::Passed,
        Exit::Success => TestEnd::Failed("the harness ran no test of that name".into()),
        Exit::TimedOut => TestEnd::TimedOut,
        Exit::Failed(status) => TestEnd::Failed(
            failure_message(&finished.stdout).unwrap_or_else(|| format!("exited with {status}")),
        ),
        Exit::Stopped => TestEnd::Failed("stopped".into()),
    };
    append_line(
        stage.log,
        &format!(
            "{test}: {} after {:.1} s",
            end.word(),
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(end)
}

/// The panic the harness captured for a failed test: the lines after its `---- NAME stdout ----`
/// header, up to the list of failures, without the backtrace hint.
fn failure_message(stdout: &str) -> Option<String> {
    let start = stdout.find("\n---- ")?;
    let body = &stdout[start + 1..];
    let body = body.split_once('\n')?.1;
    let end = body.find("\nfailures:").unwrap_or(body.len());
    let message: Vec<&str> = body[..end]
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("note: run with"))
        .take(12)
        .collect();
    (!message.is_empty()).then(|| message.join("\n"))
}

fn append_line(log: &Path, line: &str) {
    use std::io::Write;
    if let Ok(mut file) = std::fs::File::options().create(true).append(true).open(log) {
        let _ = writeln!(file, "{line}");
    }
}

fn outcome(filter: &str, jobs: usize, tests: &[String], ends: &[TestEnd]) -> Outcome {
    let count = |word: &str| ends.iter().filter(|e| e.word() == word).count();
    let (passed, failed) = (count("passed"), count("failed"));
    let (timed_out, not_started) = (count("timed out"), count("not started"));
    let failures: Vec<&str> = tests
        .iter()
        .zip(ends)
        .filter(|(_, e)| matches!(e, TestEnd::Failed(_)))
        .map(|(t, _)| t.as_str())
        .collect();
    let status = if failed > 0 {
        StageStatus::Failed(format!(
            "{failed} of {} tests failed: {}",
            tests.len(),
            failures.join(", ")
        ))
    } else if passed < tests.len() {
        StageStatus::TimedOut
    } else {
        StageStatus::Passed
    };
    let mut markdown = format!(
        "Tests matching `{filter}`: {}, each as `portability --exact TEST` in a process of its \
         own, {jobs} at a time: {passed} passed, {failed} failed, {timed_out} timed out, \
         {not_started} not started.\n\n| test | result |\n|---|---|\n",
        tests.len()
    );
    for (test, end) in tests.iter().zip(ends) {
        markdown.push_str(&format!("| `{test}` | {} |\n", end.word()));
    }
    for (test, end) in tests.iter().zip(ends) {
        if let TestEnd::Failed(message) = end {
            markdown.push_str(&format!("\n`{test}` failed:\n```\n{message}\n```\n"));
        }
    }
    let results: Vec<_> = tests
        .iter()
        .zip(ends)
        .map(|(test, end)| {
            let message = match end {
                TestEnd::Failed(m) => Some(m.as_str()),
                _ => None,
            };
            json!({ "name": test, "result": end.word(), "message": message })
        })
        .collect();
    Outcome {
        status,
        results: json!({ "filter": filter, "jobs": jobs, "passed": passed, "failed": failed,
                         "timed_out": timed_out, "not_started": not_started,
                         "failures": failures, "tests": results }),
        markdown,
    }
}
