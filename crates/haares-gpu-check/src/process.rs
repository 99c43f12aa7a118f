//! A child process under a deadline: its output streamed to our stderr and to a log file as it
//! comes, and its whole process group (cost workers included) killed when time runs out.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It exited with status 0.
    Success,
    /// It exited otherwise (the status, in words).
    Failed(String),
    /// The deadline passed; it was killed.
    TimedOut,
    /// `stop_when` said so; it was killed (a deliberate kill).
    Stopped,
}

/// A finished child: how it ended and its stdout.
#[derive(Debug, Clone)]
pub struct Finished {
    /// How it ended.
    pub exit: Exit,
    /// Everything it printed on stdout.
    pub stdout: String,
}

/// Runs `command` until it exits, `deadline` passes or `stop_when` returns true (checked every
/// 100 ms). Its stdout and stderr are appended to `log` and echoed to our stderr, each line
/// prefixed with `label`.
pub fn run_logged(
    mut command: Command,
    deadline: Instant,
    log: &Path,
    label: &str,
    stop_when: &dyn Fn() -> bool,
) -> Result<Finished, String> {
    let log_file = File::options()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open the log `{}`: {e}", log.display()))?;
    let log_file = Arc::new(Mutex::new(log_file));
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        // Its own process group, so that a kill reaches the workers it starts.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start `{:?}`: {e}", command.get_program()))?;
    let stdout_text = Arc::new(Mutex::new(String::new()));
    let readers = [
        echo(
            child.stdout.take(),
            &log_file,
            label,
            Some(stdout_text.clone()),
        ),
        echo(child.stderr.take(), &log_file, label, None),
    ];
    let exit = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break if status.success() {
                Exit::Success
            } else {
                Exit::Failed(status.to_string())
            };
        }
        let stop = if Instant::now() >= deadline {
            Some(Exit::TimedOut)
        } else if stop_when() {
            Some(Exit::Stopped)
        } else {
            None
        };
        if let Some(exit) = stop {
            kill_group(child.id());
            let _ = child.wait();
            break exit;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for reader in readers {
        let _ = reader.join();
    }
    let stdout = stdout_text
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(Finished { exit, stdout })
}

/// SIGKILL to the child's whole process group (the child leads it).
fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Copies `stream` line by line to the log and our stderr (and into `keep`) on its own thread.
fn echo(
    stream: Option<impl Read + Send + 'static>,
    log: &Arc<Mutex<File>>,
    label: &str,
    keep: Option<Arc<Mutex<String>>>,
) -> std::thread::JoinHandle<()> {
    let (log, label) = (log.clone(), label.to_string());
    std::thread::spawn(move || {
        let Some(stream) = stream else { return };
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            eprintln!("  [{label}] {line}");
            let _ = writeln!(log.lock().unwrap_or_else(|e| e.into_inner()), "{line}");
            if let Some(keep) = &keep {
                let mut keep = keep.lock().unwrap_or_else(|e| e.into_inner());
                keep.push_str(&line);
                keep.push('\n');
            }
        }
    })
}
