//! Device time of cuBLAS's products: CUDA events around each product's calls, summed over every
//! thread while timing is on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cudarc::driver::result as driver;
use cudarc::driver::sys as cuda;

/// Device time of cuBLAS's products while [`start_timing`] is on: CubeCL's launch log and its
/// profiler do not see them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlasTimes {
    /// `gemmStridedBatched` calls.
    pub calls: u64,
    /// Their device time in seconds, from CUDA events around each product's calls.
    pub seconds: f64,
}

static TIMING: AtomicBool = AtomicBool::new(false);
static TIMED_CALLS: AtomicU64 = AtomicU64::new(0);
static TIMED_NANOS: AtomicU64 = AtomicU64::new(0);

/// Times every cuBLAS product from now on with CUDA events, over every thread.
pub fn start_timing() {
    TIMED_CALLS.store(0, Ordering::Relaxed);
    TIMED_NANOS.store(0, Ordering::Relaxed);
    TIMING.store(true, Ordering::Relaxed);
}

/// Whether products are being timed.
pub fn is_timing() -> bool {
    TIMING.load(Ordering::Relaxed)
}

/// What has been timed since [`start_timing`], timing going on: a running total, which a reader
/// that wants a stretch's share takes the difference of.
pub fn timed_so_far() -> BlasTimes {
    BlasTimes {
        calls: TIMED_CALLS.load(Ordering::Relaxed),
        seconds: TIMED_NANOS.load(Ordering::Relaxed) as f64 * 1e-9,
    }
}

/// Stops timing and returns what was timed since [`start_timing`].
pub fn stop_timing() -> BlasTimes {
    TIMING.store(false, Ordering::Relaxed);
    BlasTimes {
        calls: TIMED_CALLS.swap(0, Ordering::Relaxed),
        seconds: TIMED_NANOS.swap(0, Ordering::Relaxed) as f64 * 1e-9,
    }
}

/// Two events around one product's calls, when timing is on.
pub(super) struct DeviceTimer {
    start: cuda::CUevent,
    end: Option<cuda::CUevent>,
}

impl DeviceTimer {
    pub(super) fn start(stream: cuda::CUstream) -> Option<Self> {
        if !TIMING.load(Ordering::Relaxed) {
            return None;
        }
        let timer = Self {
            start: event()?,
            end: None,
        };
        // SAFETY: a fresh event recorded on this handle's stream.
        unsafe { driver::event::record(timer.start, stream) }.ok()?;
        Some(timer)
    }

    /// Records the end behind the calls on `stream`.
    pub(super) fn end(mut self, stream: cuda::CUstream) -> Option<Self> {
        let end = self.end.insert(event()?);
        // SAFETY: a fresh event recorded on this handle's stream.
        unsafe { driver::event::record(*end, stream) }.ok()?;
        Some(self)
    }

    /// Adds the time between the events once the stream has finished (the caller synchronised
    /// it); a failed event loses one sample, never the product.
    pub(super) fn add(self, calls: usize) {
        let Some(end) = self.end else { return };
        // SAFETY: both events were recorded on a stream that has finished.
        if let Ok(milliseconds) = unsafe { driver::event::elapsed(self.start, end) } {
            TIMED_CALLS.fetch_add(calls as u64, Ordering::Relaxed);
            TIMED_NANOS.fetch_add((f64::from(milliseconds) * 1e6) as u64, Ordering::Relaxed);
        }
    }
}

impl Drop for DeviceTimer {
    fn drop(&mut self) {
        // SAFETY: events created by `event` and destroyed once.
        unsafe {
            let _ = driver::event::destroy(self.start);
            if let Some(end) = self.end {
                let _ = driver::event::destroy(end);
            }
        }
    }
}

fn event() -> Option<cuda::CUevent> {
    driver::event::create(cuda::CUevent_flags::CU_EVENT_DEFAULT).ok()
}
