//! A worker's live log while it is otherwise silent: the backend's start, the model's init and
//! the first step, which on a GPU compiles and tunes kernels for minutes.
//!
//! The one CUDA cost run before the GPU check existed was stopped by its time limit inside a
//! first step that had printed nothing for 235 s, so where its time went stayed unknown. A
//! [`Heartbeat`] prints, every interval, the part in hand, how long it has run, and what CubeCL
//! has compiled and tuned so far and how long ago the last of it happened: a run killed mid-step
//! still says whether it was compiling, tuning, or waiting on something else.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::measure::kernel_events;

/// What the heartbeat thread and its owner share.
struct Shared {
    /// The part in hand, e.g. `first step: backward`, and when it began; `None` stops the thread.
    part: Mutex<Option<(String, Instant)>>,
    wake: Condvar,
}

/// Prints a progress line to stderr every `interval` until dropped.
pub struct Heartbeat {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts beating for `label` (e.g. the method), in part `part`.
    pub fn start(label: impl Into<String>, part: impl Into<String>, interval: Duration) -> Self {
        let shared = Arc::new(Shared {
            part: Mutex::new(Some((part.into(), Instant::now()))),
            wake: Condvar::new(),
        });
        let label = label.into();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || beat(&shared, &label, interval))
        };
        Self {
            shared,
            thread: Some(thread),
        }
    }

    /// The next part has begun.
    pub fn enter(&self, part: impl Into<String>) {
        let mut current = self.shared.part.lock().unwrap_or_else(|e| e.into_inner());
        if current.is_some() {
            *current = Some((part.into(), Instant::now()));
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        *self.shared.part.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn beat(shared: &Shared, label: &str, interval: Duration) {
    let mut part = shared.part.lock().unwrap_or_else(|e| e.into_inner());
    let mut keys_told = 0;
    loop {
        // Waits while beating is on: a stop that came before this wait ends it at once.
        let (next, _) = shared
            .wake
            .wait_timeout_while(part, interval, |part| part.is_some())
            .unwrap_or_else(|e| e.into_inner());
        part = next;
        let Some((name, since)) = part.as_ref() else {
            return;
        };
        eprintln!("  {label}: {}", progress_line(name, since.elapsed()));
        // Each autotune key costs a compilation of every candidate kernel: on CUDA about ten
        // NVRTC runs of a second each, so the keys are what a killed first step most needs told.
        if let Some(tally) = kernel_events::tally() {
            for key in tally.autotune_keys.iter().skip(keys_told) {
                eprintln!("  {label}:   autotuned {key}");
            }
            keys_told = tally.autotune_keys.len();
        }
    }
}

/// One heartbeat line: the part, its time so far, and CubeCL's activity when it is counted.
pub fn progress_line(part: &str, elapsed: Duration) -> String {
    let mut line = format!("{:.0} s into {part}", elapsed.as_secs_f64());
    if let Some(tally) = kernel_events::tally() {
        line += &format!(
            "; so far {} kernels compiled, {} autotune keys benchmarked",
            tally.compiled, tally.autotuned
        );
        if let Some((event, ago)) = kernel_events::last_event() {
            line += &format!("; the last {:.1} s ago: {event}", ago.as_secs_f64());
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_part_and_its_whole_seconds() {
        let line = progress_line("first step: backward", Duration::from_millis(41_600));
        assert!(line.starts_with("42 s into first step: backward"), "{line}");
    }

    #[test]
    fn a_dropped_heartbeat_stops_without_waiting_for_its_interval() {
        let started = Instant::now();
        let heartbeat = Heartbeat::start("test", "backend start", Duration::from_secs(60));
        heartbeat.enter("model init");
        drop(heartbeat);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "dropping waited for the interval"
        );
    }
}
