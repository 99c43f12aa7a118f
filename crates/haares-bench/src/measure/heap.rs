//! Peak allocated heap bytes: the CPU counterpart of the paper's peak memory
//! (sec:costprotocol: `torch.cuda.max_memory_allocated()`, "rather than reserved memory").
//!
//! A process's peak resident set size also counts what the C allocator keeps after a free and
//! the pages a fragmented heap cannot return, which depend on the order of allocations as much
//! as on what a method keeps alive. [`CountingAllocator`] wraps the system allocator and keeps
//! the bytes in use and their high-water mark; the `haares-bench` binary installs it, so a cost
//! worker reports both numbers.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static IN_USE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes in use and their peak. Install it with
/// `#[global_allocator] static A: CountingAllocator = CountingAllocator;`.
pub struct CountingAllocator;

impl CountingAllocator {
    /// Counts a successful allocation of `size` bytes.
    fn allocated(pointer: *mut u8, size: usize) -> *mut u8 {
        if !pointer.is_null() {
            INSTALLED.store(true, Ordering::Relaxed);
            Self::grew(size);
        }
        pointer
    }

    fn grew(by: usize) {
        let now = IN_USE.fetch_add(by as u64, Ordering::Relaxed) + by as u64;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }

    fn shrank(by: usize) {
        IN_USE.fetch_sub(by as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` unchanged; the counters do not touch the memory.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        Self::allocated(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        Self::allocated(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(pointer, layout) };
        Self::shrank(layout.size());
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            match new_size >= layout.size() {
                true => Self::grew(new_size - layout.size()),
                false => Self::shrank(layout.size() - new_size),
            }
        }
        moved
    }
}

/// The most heap bytes this process has had allocated at once, or `None` when
/// [`CountingAllocator`] is not the global allocator.
pub fn peak_allocated_bytes() -> Option<u64> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| PEAK.load(Ordering::Relaxed))
}

/// Heap bytes allocated now, or `None` when [`CountingAllocator`] is not the global allocator.
pub fn allocated_bytes() -> Option<u64> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| IN_USE.load(Ordering::Relaxed))
}

/// Starts a new high-water mark at the bytes allocated now, so that [`peak_allocated_bytes`]
/// afterwards measures one stretch of work.
pub fn reset_peak_allocated_bytes() {
    PEAK.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}
