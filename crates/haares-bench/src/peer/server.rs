//! The PyTorch peer kept running between steps (`torch_peer.py serve`), for `haares-bench
//! versus`: it loads the model once, checks its logits against ours, then runs one training
//! step each time it is asked and answers with the step's seconds and loss. Between two asks it
//! waits on its input, idle, so that our step and its step never share the cores.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::error::{BenchError, Result};
use crate::measure::export::ExportTask;
use crate::measure::worker::RESULT_PREFIX;
use crate::method_choice::MethodChoice;
use crate::peer::{Peer, PeerMatmul, PeerMode, model_args};

/// How long a peer is given to end after its input is closed before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(10);

/// A running peer process of one method and setting.
pub struct PeerServer {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
    /// Where its stderr goes: its last line is the reason given when it fails.
    errors: PathBuf,
    /// E.g. "PyTorch compiled", for messages.
    name: String,
    /// `max |logits_peer − logits_haares|` on the perturbed copy, and `max |logits_haares|`.
    pub agreement: (f64, f64),
}

/// One step's answer.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct PeerStep {
    /// Wall time of the step as the peer timed it (batch, forward, backward, clip, update).
    pub step_s: f64,
    /// Its loss.
    pub loss: f64,
}

#[derive(Deserialize)]
struct Ready {
    logits_max_abs_diff: f64,
    logits_max_abs: f64,
}

impl PeerServer {
    /// Starts the peer on the model our worker exported to `export` (trained as `method`, on
    /// batches of `sizes = (batch, seq)`, at `setting`), its stderr written to `errors`, and waits
    /// until it has checked its logits and is ready.
    pub fn start(
        peer: &Peer,
        export: &ExportTask,
        method: &MethodChoice,
        sizes: (usize, usize),
        setting: (PeerMatmul, PeerMode),
        errors: PathBuf,
    ) -> Result<Self> {
        let name = format!("PyTorch {} ({})", setting.1.label(), method.unpinned());
        let stderr = File::create(&errors).map_err(|e| BenchError::file(&errors, e))?;
        let mut child = peer
            .command("serve", &model_args(export, method, sizes, setting))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| BenchError::Peer(format!("cannot start `{}`: {e}", peer.python())))?;
        let (input, output) = (child.stdin.take(), child.stdout.take());
        let output = output.ok_or_else(|| BenchError::Peer(format!("{name} has no stdout")))?;
        let output = BufReader::new(output);
        let mut server = Self {
            child,
            input,
            output,
            errors,
            name,
            agreement: (f64::NAN, f64::NAN),
        };
        let ready: Ready = server.answer()?;
        server.agreement = (ready.logits_max_abs_diff, ready.logits_max_abs);
        Ok(server)
    }

    /// One training step of the peer's model.
    pub fn step(&mut self) -> Result<PeerStep> {
        let sent = (self.input.as_mut()).map(|input| writeln!(input, "step").and(input.flush()));
        if !matches!(sent, Some(Ok(()))) {
            return Err(self.failure("stopped taking steps"));
        }
        self.answer()
    }

    /// The next answer on the peer's stdout (other lines are its own output).
    fn answer<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T> {
        let mut line = String::new();
        loop {
            line.clear();
            match self.output.read_line(&mut line) {
                Ok(0) | Err(_) => return Err(self.failure("exited")),
                Ok(_) => {}
            }
            if let Some(json) = line.trim_end().strip_prefix(RESULT_PREFIX) {
                return serde_json::from_str(json).map_err(|e| {
                    BenchError::Peer(format!("{}'s answer is malformed ({e}): {json}", self.name))
                });
            }
        }
    }

    /// What went wrong, with the last line the peer wrote to its stderr.
    fn failure(&mut self, what: &str) -> BenchError {
        let status = self.finish();
        let errors = std::fs::read_to_string(&self.errors).unwrap_or_default();
        let last = errors.lines().rev().find(|l| !l.trim().is_empty());
        BenchError::Peer(format!(
            "{} {what} ({status}): {}",
            self.name,
            last.unwrap_or("no message")
        ))
    }

    /// Closes the peer's input, which ends it, and waits for it (killing it after
    /// [`EXIT_GRACE`]); returns how it ended.
    fn finish(&mut self) -> String {
        drop(self.input.take());
        let started = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if started.elapsed() < EXIT_GRACE => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return "killed: it did not end".to_string();
                }
            }
        }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.finish();
    }
}
