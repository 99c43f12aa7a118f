//! Download progress on stderr. On a terminal: a byte bar for the shard in flight under one for
//! the total. Otherwise (a log, a batch job): one line per downloaded shard. With progress off
//! (`--quiet`): nothing.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::check::Expected;

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("a valid template")
        .progress_chars("=> ")
}

/// The progress of one dataset's downloads.
pub(super) struct Downloads {
    /// Print a line per shard (progress on, stderr not a terminal).
    lines: bool,
    multi: MultiProgress,
    total: ProgressBar,
    count: usize,
}

impl Downloads {
    /// Progress over `files`, shown if `enabled`.
    pub fn new(enabled: bool, files: &[Expected]) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let multi = if enabled && terminal {
            MultiProgress::new()
        } else {
            MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
        };
        let total = multi.add(ProgressBar::new(files.iter().filter_map(|f| f.size).sum()));
        total.set_style(style(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        ));
        total.set_prefix(format!("{} shards", files.len()));
        Self {
            lines: enabled && !terminal,
            multi,
            total,
            count: files.len(),
        }
    }

    /// Counts a file that needs no download.
    pub fn skip(&self, file: &Expected) {
        self.total.inc(file.size.unwrap_or(0));
    }

    /// The progress of the download of `file`, the `index`-th.
    pub fn shard(&self, index: usize, file: &Expected) -> Shard<'_> {
        let bar = self.multi.add(ProgressBar::new(file.size.unwrap_or(0)));
        bar.set_style(style(
            "{prefix} {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        ));
        bar.set_prefix(format!("[{}/{}]", index + 1, self.count));
        bar.set_message(file.path.clone());
        Shard {
            downloads: self,
            bar,
            counted: Arc::default(),
            start: Instant::now(),
        }
    }

    /// Clears the bars after the last download.
    pub fn finish(self) {
        self.total.finish_and_clear();
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        let _ = self.multi.clear();
    }
}

/// The progress of one shard's download, handed to `hf-hub` (which may restart it: a resumed
/// download starts again from the bytes it kept).
#[derive(Clone)]
pub(super) struct Shard<'a> {
    downloads: &'a Downloads,
    bar: ProgressBar,
    /// The bytes this shard added to the total so far.
    counted: Arc<AtomicU64>,
    start: Instant,
}

impl hf_hub::api::Progress for Shard<'_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.bar.set_length(size as u64);
        self.bar.set_position(0);
        let counted = self.counted.swap(0, Ordering::Relaxed);
        let total = &self.downloads.total;
        total.set_position(total.position().saturating_sub(counted));
    }

    fn update(&mut self, bytes: usize) {
        self.bar.inc(bytes as u64);
        self.downloads.total.inc(bytes as u64);
        self.counted.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn finish(&mut self) {}
}

impl Shard<'_> {
    /// Reports the shard downloaded and checked.
    pub fn done(&self) {
        self.bar.finish_and_clear();
        if self.downloads.lines {
            let seconds = self.start.elapsed().as_secs_f64();
            let bytes = self.bar.length().unwrap_or(0);
            eprintln!(
                "downloaded {} {}: {} in {seconds:.1} s ({}/s)",
                self.bar.prefix(),
                self.bar.message(),
                HumanBytes(bytes),
                HumanBytes((bytes as f64 / seconds.max(1e-3)) as u64)
            );
        }
    }
}
