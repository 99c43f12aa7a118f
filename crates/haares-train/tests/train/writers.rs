//! One writer per run and a cache that follows its sources, through the real binary: a replaced
//! shard is read (not its stale cache), a second `train` on a running run is refused, a stale
//! lock of a dead process is taken over, a lock from another host is respected, a sweep skips a
//! locked run, and two processes preparing one split at once leave one valid cache file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use haares_data::embedded_corpus_dir;
use haares_data::prepared::PreparedShard;
use haares_train::run::lock::{Holder, LOCK_FILE, host_name};

use crate::common::SMALL_RUN;

/// [`SMALL_RUN`] offline and quiet.
fn small() -> Vec<&'static str> {
    [SMALL_RUN, &["--offline", "--quiet"]].concat()
}

fn train(run_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_haares-train"));
    command
        .arg("train")
        .arg("--run-dir")
        .arg(run_dir)
        .args(small())
        .args(extra);
    command
}

fn output(mut command: Command) -> (bool, String) {
    let Output { status, stderr, .. } = command.output().unwrap();
    (
        status.success(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn write_lock(run_dir: &Path, holder: &Holder) {
    std::fs::create_dir_all(run_dir).unwrap();
    std::fs::write(run_dir.join(LOCK_FILE), serde_json::to_vec(holder).unwrap()).unwrap();
}

fn holder(host: String, pid: u32) -> Holder {
    Holder {
        host,
        pid,
        started_unix_s: 1,
    }
}

/// A TinyStories-layout dataset in the hub cache `data`, made of the embedded corpus's shards.
fn tinystories(data: &Path) -> PathBuf {
    let snapshot = data
        .join("datasets--roneneldan--TinyStories/snapshots")
        .join("f54c09fd23315a6f9c86f9dc80f725de7d8f9c64/data");
    std::fs::create_dir_all(&snapshot).unwrap();
    for split in ["train", "validation"] {
        let name = format!("{split}-00000-of-00001.parquet");
        std::fs::copy(
            embedded_corpus_dir().join("data").join(&name),
            snapshot.join(&name),
        )
        .unwrap();
    }
    snapshot.join("train-00000-of-00001.parquet")
}

fn write_zero_rows(path: &Path) {
    let column = Arc::new(StringArray::from(Vec::<Option<&str>>::new())) as ArrayRef;
    let batch = RecordBatch::try_from_iter([("text", column)]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

#[test]
fn a_replaced_shard_is_read_not_its_stale_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (data, cache) = (dir.path().join("D"), dir.path().join("C"));
    let shard = tinystories(&data);
    let args = |run: &str| -> Vec<String> {
        let run_dir = dir.path().join(run);
        [
            "--datasets",
            "tinystories",
            "--data-dir",
            data.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
            "--steps",
            "2",
            "--run-dir",
            run_dir.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let mut first = Command::new(env!("CARGO_BIN_EXE_haares-train"));
    first.arg("train").args(small()).args(args("r1"));
    let (ok, stderr) = output(first);
    assert!(ok, "{stderr}");
    // Same name, zero rows: the second run must see the new file, not train on the old tokens.
    write_zero_rows(&shard);
    let mut second = Command::new(env!("CARGO_BIN_EXE_haares-train"));
    second.arg("train").args(small()).args(args("r2"));
    let (ok, stderr) = output(second);
    assert!(!ok, "trained on the stale cache: {stderr}");
    assert!(stderr.contains("tinystories"), "{stderr}");
    assert!(!dir.path().join("r2/checkpoint").exists());
}

#[test]
fn a_second_train_on_a_running_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let cache = dir.path().join("cache");
    let cache_arg = ["--cache-dir", cache.to_str().unwrap()];
    let mut first = train(&run_dir, &[&cache_arg[..], &["--steps", "100000"]].concat())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lock = run_dir.join(LOCK_FILE);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !lock.exists() {
        assert!(
            Instant::now() < deadline,
            "the first run never took its lock"
        );
        assert!(first.try_wait().unwrap().is_none(), "the first run stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (ok, stderr) = output(train(
        &run_dir,
        &[&cache_arg[..], &["--steps", "4"]].concat(),
    ));
    let _ = first.kill();
    let _ = first.wait();
    assert!(!ok, "{stderr}");
    let expected = format!(
        "is being trained by process {} on host `{}`",
        first.id(),
        host_name()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(
        stderr.contains(LOCK_FILE),
        "says which file to delete: {stderr}"
    );
}

#[test]
fn a_stale_lock_of_a_dead_process_is_taken_over_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    write_lock(&run_dir, &holder(host_name(), gone.id()));
    let cache = dir.path().join("cache");
    let (ok, stderr) = output(train(
        &run_dir,
        &["--steps", "2", "--cache-dir", cache.to_str().unwrap()],
    ));
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("no longer runs; taking it over"),
        "{stderr}"
    );
    assert!(run_dir.join("summary.json").is_file());
    assert!(!run_dir.join(LOCK_FILE).exists(), "released at the end");
}

#[test]
fn a_lock_from_another_host_is_respected() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let other = holder("another-host.invalid".into(), 1);
    write_lock(&run_dir, &other);
    let cache = dir.path().join("cache");
    let (ok, stderr) = output(train(
        &run_dir,
        &["--steps", "2", "--cache-dir", cache.to_str().unwrap()],
    ));
    assert!(!ok);
    assert!(stderr.contains("host `another-host.invalid`"), "{stderr}");
    let kept: Holder =
        serde_json::from_slice(&std::fs::read(run_dir.join(LOCK_FILE)).unwrap()).unwrap();
    assert_eq!(kept, other, "the lock is left as it was");
    assert!(!run_dir.join("config.json").exists(), "nothing written");
}

#[test]
fn a_sweep_skips_a_locked_run_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let sweep = |dry_run: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_haares-train"));
        command.args([
            "sweep",
            "depth",
            "--layers",
            "2",
            "--methods",
            "block-attnres,haares",
        ]);
        command.args([
            "--steps",
            "2",
            "--runs-dir",
            runs.to_str().unwrap(),
            "--jobs",
            "1",
        ]);
        command.args(&small()[6..]);
        if dry_run {
            command.arg("--dry-run");
        }
        command
    };
    let listing = sweep(true).output().unwrap();
    let names: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    let locked = runs.join("depth").join(&names[0]);
    let me = holder(host_name(), std::process::id());
    write_lock(&locked, &me);
    let (ok, stderr) = output(sweep(false));
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("{}: being trained by {me}, skipped", names[0])),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 being trained by other processes"),
        "{stderr}"
    );
    assert!(
        runs.join("depth")
            .join(&names[1])
            .join("summary.json")
            .is_file()
    );
    assert!(!locked.join("summary.json").exists());
}

#[test]
fn two_processes_preparing_one_split_at_once_leave_one_valid_cache_file() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let start = |name: &str| {
        train(
            &dir.path().join(name),
            &["--steps", "1", "--cache-dir", cache.to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (start("a"), start("b"));
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let files: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !files.iter().any(|f| f.contains(".tmp-")),
        "left-overs: {files:?}"
    );
    for split in ["-train-", "-validation-"] {
        let prepared: Vec<&String> = files
            .iter()
            .filter(|f| f.contains(split) && f.ends_with(".tokens"))
            .collect();
        assert_eq!(prepared.len(), 1, "{files:?}");
        let shard = PreparedShard::open(&cache.join(prepared[0])).unwrap();
        assert!(shard.len() > 100 && shard.sources() != 0);
    }
}
