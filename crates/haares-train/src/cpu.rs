//! How a CPU job runs: on a thread of a Rayon pool whose other threads stay awake while it runs,
//! with glibc's allocator keeping freed memory.
//!
//! Both are about what a training step on Flex or NdArray pays besides its arithmetic
//! (docs/notebook/cpu-speed.md, "The CPU job on Rayon's pool"). With the routing loops split over the
//! pool, the pool took a step of the cost protocol's cpu preset from 0.26 / 0.29 / 0.32 s to
//! 0.24 / 0.25 / 0.27 s (Standard / Block AttnRes / HAARES, 2 cores); the allocator's setting
//! saved a further 1–6% in one run of two and nothing measurable in the other.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Stack of each thread of [`on_cpu_pool`]'s pool. The job runs there instead of on the main
/// thread, whose stack is 8 MiB on Linux; this reserves address space, not memory.
const CPU_POOL_STACK: usize = 64 << 20;

/// Runs `work` on a thread of a Rayon pool with as many threads as Rayon's own pool would have
/// (`RAYON_NUM_THREADS`, else one per core), after [`keep_freed_memory`], with the pool's other
/// threads kept awake ([`WorkersAwake`]) until it returns.
///
/// The backend's parallel operations inside `work` (Flex's matrix products, the routing loops)
/// then start as tasks on a pool whose threads are already awake. Called from the main thread,
/// each of them would be handed to the pool and waited for: two thread switches per operation,
/// and one thread more than there are cores. Without a pool (threads cannot be started) the work
/// runs here.
pub fn on_cpu_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    keep_freed_memory();
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|index| format!("haares-cpu-{index}"))
        .stack_size(CPU_POOL_STACK)
        .build();
    match pool {
        Ok(pool) => pool.install(|| {
            let _awake = WorkersAwake::start();
            work()
        }),
        Err(error) => {
            eprintln!("warning: no CPU thread pool ({error}); the job runs on the main thread");
            work()
        }
    }
}

/// glibc's malloc hands a freed block of more than 128 KiB (at first) back to the kernel, and
/// trims its heaps when their free top passes a threshold. A training step frees and allocates
/// the same `[tokens, d]` buffers hundreds of times, so each came back as fresh pages, faulted in
/// again on first write: ≈ 3% of a step's samples, and with two threads each fault also stops the
/// other core to flush its TLB. Here blocks up to 64 MiB come from the heap, and a heap is
/// trimmed only when 1 GiB at its top is free.
///
/// Every thread also allocates from the main arena (one arena in all). A thread that is not the
/// main one otherwise gets an arena of its own, made of 64 MiB heaps, and glibc unmaps such a
/// heap as soon as it is wholly free, whatever the trim threshold. The CPU job runs on a pool
/// thread ([`on_cpu_pool`]) and a step's activations span several heaps, so without this the
/// job's last heaps were unmapped and faulted in again every step: ≈ 6,800 page faults a step at
/// the cost protocol's cpu preset (docs/notebook/cpu-speed.md). The job's few hundred allocations
/// a step contend for the one arena's lock with at most the pool's other threads.
///
/// The process keeps what it freed: peak RSS on the cpu preset rose by about 6% (HAARES 394 →
/// 418 MB), allocated memory not at all. Set before the threads it concerns first allocate: an
/// arena is a thread's from its first allocation on.
///
/// Does nothing where `GLIBC_TUNABLES` already sets malloc options (the user's choice wins), and
/// on other C libraries.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let user_set = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
        if !user_set {
            // SAFETY: mallopt only sets the allocator's parameters; every value is in range.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
        }
    }
}

/// How long a kept-awake thread goes on looking for tasks after its last one: about a training
/// step's longest stretch without a parallel operation (the optimizer's bookkeeping, a batch
/// drawn) on the cost protocol's cpu preset.
const AWAKE_AFTER_TASK: Duration = Duration::from_millis(10);

/// How often a thread that found nothing for [`AWAKE_AFTER_TASK`] looks again.
const IDLE_POLL: Duration = Duration::from_micros(500);

/// The other threads of the current Rayon pool, each running a loop that takes the pool's tasks
/// as soon as they are queued, until dropped.
///
/// Rayon puts a thread to sleep after a few dozen rounds without work (some tens of
/// microseconds), and a sleeping thread is woken by a futex call when a task is queued. A
/// training step on Flex is a few thousand parallel operations with a little serial work
/// between them, so without this the other thread slept between most operations and came late to
/// each: a `1024 × 128 · 128 × 128` product split in two bands took 178 µs (median) after 200 µs of
/// serial work, against 100 µs for one band alone, and 106 µs with this
/// (docs/notebook/cpu-speed.md, "Threads kept awake"). OpenMP, under PyTorch's and MKL's
/// parallel loops, keeps its threads spinning for a while after each region for the same reason.
///
/// Each loop takes tasks with [`rayon::yield_now`], so it runs whatever the pool is given
/// (nested joins, broadcasts) as an idle Rayon thread would; it gives its core up with
/// [`std::thread::yield_now`] between looks, and after [`AWAKE_AFTER_TASK`] without a task it
/// looks only every [`IDLE_POLL`]. Outside a pool, or in a pool of one thread, it does nothing.
pub struct WorkersAwake {
    stop: Arc<AtomicBool>,
    running: Arc<AtomicUsize>,
}

impl WorkersAwake {
    /// Starts the loops on every thread of the current pool but this one.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicUsize::new(0));
        if let Some(caller) = rayon::current_thread_index()
            && rayon::current_num_threads() > 1
        {
            running.store(rayon::current_num_threads(), Ordering::SeqCst);
            let (stop, running) = (stop.clone(), running.clone());
            rayon::spawn_broadcast(move |context| {
                if context.index() != caller {
                    take_tasks_until(&stop);
                }
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Self { stop, running }
    }
}

impl Drop for WorkersAwake {
    /// Stops the loops and waits for them to end. This thread's own copy of the broadcast runs
    /// here if it has not run yet (it ends at once), so the wait takes the pool's tasks too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        while self.running.load(Ordering::SeqCst) > 0 {
            if let Some(rayon::Yield::Idle) | None = rayon::yield_now() {
                std::thread::yield_now();
            }
        }
    }
}

/// The loop of [`WorkersAwake`] on one thread.
fn take_tasks_until(stop: &AtomicBool) {
    let mut last_task = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => last_task = Instant::now(),
            _ if last_task.elapsed() < AWAKE_AFTER_TASK => std::thread::yield_now(),
            _ => std::thread::sleep(IDLE_POLL),
        }
    }
}
