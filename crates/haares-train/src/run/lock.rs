//! One writer per run directory: a lock file created atomically when a run starts training and
//! removed when it stops.
//!
//! `<run dir>/run.lock` holds the holder's host, process id and start time (JSON). It is created
//! with `create_new`, which the filesystem does atomically, so of two processes starting the same
//! run one gets the lock and the other a [`TrainError::Locked`] naming the holder. A lock whose
//! holder was a process of this host that no longer exists (killed, crashed, the machine
//! rebooted) is taken over with a warning; a lock from another host is respected, since this host
//! cannot tell whether that process lives (delete the file by hand once it is known to be gone).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = "run.lock";

/// Who holds a run directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// Host name.
    pub host: String,
    /// Process id on that host.
    pub pid: u32,
    /// Unix seconds when it took the lock.
    pub started_unix_s: u64,
}

impl Holder {
    /// This process, now.
    pub fn this_process() -> Self {
        Self {
            host: host_name(),
            pid: std::process::id(),
            started_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// Whether the holder is known to be gone: a process of this host that does not exist.
    fn is_gone(&self) -> bool {
        self.host == host_name() && !process_exists(self.pid)
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} on host `{}` (since Unix time {})",
            self.pid, self.host, self.started_unix_s
        )
    }
}

/// A held run directory; dropping it releases the lock.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
}

impl RunLock {
    /// Takes `run_dir`'s lock (the directory must exist), taking over a lock of a process of this
    /// host that no longer exists.
    pub fn acquire(run_dir: &Path) -> Result<Self> {
        let path = run_dir.join(LOCK_FILE);
        let me = Holder::this_process();
        // Two attempts: the second after removing a lock whose holder is gone.
        for _ in 0..2 {
            match create_lock(&path, &me) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(TrainError::io(&path, e)),
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let holder: Option<Holder> = serde_json::from_str(&text).ok();
            match holder {
                Some(holder) if holder.is_gone() => {
                    eprintln!(
                        "warning: `{}` was left by {holder}, which no longer runs; taking it over",
                        path.display()
                    );
                    // Only the file read above is removed: a lock taken meanwhile is kept.
                    if std::fs::read_to_string(&path).unwrap_or_default() == text {
                        let _ = std::fs::remove_file(&path);
                    }
                }
                Some(holder) => {
                    return Err(TrainError::Locked {
                        lock_file: path.clone(),
                        holder: holder.to_string(),
                    });
                }
                None => {
                    return Err(TrainError::Locked {
                        lock_file: path.clone(),
                        holder: "an unreadable lock file (being written, or damaged)".into(),
                    });
                }
            }
        }
        Err(TrainError::Locked {
            lock_file: path.clone(),
            holder: "another process that took it over at the same moment".into(),
        })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Creates the lock file with `holder` in it, failing with `AlreadyExists` if there is one.
fn create_lock(path: &Path, holder: &Holder) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let json = serde_json::to_vec(holder).expect("a holder serialises");
    file.write_all(&json)?;
    file.sync_all()
}

/// This machine's host name (Linux: the kernel's; elsewhere `$HOSTNAME`, or `unknown`).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Whether a process with this id exists on this host. Where that cannot be told (no `/proc`),
/// it is assumed to exist, so a lock is never taken from a live run.
fn process_exists(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.is_dir() || proc.join(pid.to_string()).exists()
}
