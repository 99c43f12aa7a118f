//! How a CPU job runs: on a thread of a Rayon pool whose other threads stay awake while it runs;
//! and glibc's allocator settings that keep freed memory ([`keep_freed_memory`]), which the
//! binaries (`haares-train`, `haares-bench`) set in `main` and a library call never does: they
//! are the whole process's.
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
/// (`RAYON_NUM_THREADS`, else one per core), with the pool's other threads kept awake
/// ([`WorkersAwake`]) until it returns. The pool ends with the call. It leaves the allocator as
/// the process has it: a program that wants the CPU step's speed calls [`keep_freed_memory`]
/// first, as the binaries do.
///
/// The backend's parallel operations inside `work` (Flex's matrix products, the routing loops)
/// then start as tasks on a pool whose threads are already awake. Called from the main thread,
/// each of them would be handed to the pool and waited for: two thread switches per operation,
/// and one thread more than there are cores. Without a pool (threads cannot be started) the work
/// runs here.
pub fn on_cpu_pool<R: Send>(work: impl FnOnce() -> R + Send) -> R {
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
/// 418 MB), allocated memory not at all. These settings are the whole process's and last until it
/// ends, so nothing in the library sets them: call this first thing in `main`, before any thread
/// starts (an arena is a thread's from its first allocation on), as `haares-train` and
/// `haares-bench` do, if the process is yours to configure.
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
/// [`std::thread::yield_now`] between looks, and after 10 ms without a task (`AWAKE_AFTER_TASK`)
/// it looks only every 0.5 ms (`IDLE_POLL`). Outside a pool, or in a pool of one thread, it does
/// nothing.
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

/// The pool's threads and the allocator's setting, watched through `/proc` and `getrusage`. Here
/// rather than among the integration tests: this test binary runs only a few short tests beside
/// them, and whether a thread sleeps is measured in wall-clock waits, which a busy machine (the
/// training tests) would blur.
#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::{keep_freed_memory, on_cpu_pool};

    /// The environment variable that marks a test run by [`passes_in_a_child`].
    const CHILD: &str = "HAARES_CPU_TEST_CHILD";

    /// The kernel's thread ids of the current pool's threads, by index (a broadcast runs on each).
    fn pool_thread_ids() -> Vec<libc::pid_t> {
        // SAFETY: `gettid` only returns the calling thread's id.
        rayon::broadcast(|_| unsafe { libc::gettid() })
    }

    /// How often a thread of this process went to sleep: its voluntary context switches. Being
    /// preempted, or giving the core up with `sched_yield`, is not counted.
    fn sleeps_of(thread: libc::pid_t) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/self/task/{thread}/status")).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap()
    }

    /// Runs the ignored test `name` of this binary alone in a child process, marked with
    /// [`CHILD`] and with `env` set (and `GLIBC_TUNABLES` removed, which would replace
    /// `keep_freed_memory`'s setting), and asserts that it ran and passed.
    fn passes_in_a_child(name: &str, env: &[(&str, &str)]) {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                name,
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .envs(env.iter().copied())
            .env_remove("GLIBC_TUNABLES")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the child ran no test:\n{stdout}"
        );
    }

    /// The marker of a test run by [`passes_in_a_child`].
    fn in_a_child() -> bool {
        std::env::var_os(CHILD).is_some()
    }

    /// A CPU job's buffers, freed and allocated again, come back without page faults on a pool
    /// thread, where each thread's own glibc arena unmapped its wholly free heaps every round
    /// ([`super::keep_freed_memory`]). Arenas are per process and taken at a thread's first
    /// allocation, so the rounds run in a child process that runs nothing else, on a pool of one
    /// thread: the harness's test thread took an arena of its own before the setting, and with
    /// one arena allowed glibc hands the pool's threads the existing arenas in turn, so of two
    /// pool threads one got the test thread's (1 run in 5 to 1 in 30 failed so, with 189,740
    /// faults). A program that sets it before starting threads, as the runners do, has the main
    /// arena only.
    #[test]
    fn freed_memory_is_reused_by_the_pool_threads() {
        passes_in_a_child(
            "cpu::tests::freed_memory_rounds_in_a_child",
            &[("RAYON_NUM_THREADS", "1")],
        );
    }

    /// Run by [`freed_memory_is_reused_by_the_pool_threads`] in a child process.
    #[test]
    #[ignore = "run in a child process by cpu::tests::freed_memory_is_reused_by_the_pool_threads"]
    fn freed_memory_rounds_in_a_child() {
        assert!(in_a_child(), "run by its parent test");
        keep_freed_memory();
        // 32 buffers of about 4 MiB live at once (128 MiB: more than one 64 MiB heap of an arena),
        // then freed, ten rounds after a first that faults them in.
        let round = || {
            let live: Vec<Vec<f32>> = (0..32)
                .map(|i| vec![1.0f32; (1 << 20) + i * 4096])
                .collect();
            std::hint::black_box(&live);
        };
        let page_faults = || {
            // SAFETY: `getrusage` fills the zeroed struct it is given.
            unsafe {
                let mut usage: libc::rusage = std::mem::zeroed();
                libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
                usage.ru_minflt
            }
        };
        let later_rounds = on_cpu_pool(|| {
            round();
            let before = page_faults();
            (0..10).for_each(|_| round());
            page_faults() - before
        });
        // One round is 32,800 pages of 4 KiB; without the setting the ten rounds faulted ≈ 200,000.
        assert!(
            later_rounds < 4096,
            "{later_rounds} page faults in ten rounds of reused buffers"
        );
    }

    /// While a CPU job runs, the pool's other threads look for its tasks instead of sleeping
    /// ([`super::WorkersAwake`]): in a stretch of serial work right after a parallel operation
    /// they do not go to sleep, where Rayon's own idle threads do. The job runs in a child process
    /// with two pool threads whatever the host has.
    #[test]
    fn the_other_threads_stay_awake_while_a_job_runs() {
        passes_in_a_child(
            "cpu::tests::awake_threads_in_a_child",
            &[("RAYON_NUM_THREADS", "2")],
        );
    }

    /// Run by [`the_other_threads_stay_awake_while_a_job_runs`] in a child process.
    #[test]
    #[ignore = "run in a child process by cpu::tests::the_other_threads_stay_awake_while_a_job_runs"]
    fn awake_threads_in_a_child() {
        assert!(in_a_child(), "run by its parent test");
        let rounds = 50;
        let sleeps_of_the_other_thread_in_serial_stretches = || {
            let threads = pool_thread_ids();
            assert_eq!(threads.len(), 2);
            let other = threads[1 - rayon::current_thread_index().unwrap()];
            let before = sleeps_of(other);
            for _ in 0..rounds {
                // A task on every thread, so that the other thread has just worked; then 1 ms of
                // this thread's serial work (a wait).
                rayon::broadcast(|_| ());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            sleeps_of(other) - before
        };
        let kept_awake = on_cpu_pool(sleeps_of_the_other_thread_in_serial_stretches);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let rayons_own = pool.install(sleeps_of_the_other_thread_in_serial_stretches);
        // Rayon's idle thread goes to sleep in each wait and is woken by the next broadcast (50–62
        // times measured on an idle machine, and as often inside a job without the loops); the
        // kept-awake one sleeps only after 10 ms without a task, which short waits never leave it
        // (0 measured, also with two and with four busy threads beside the test on 2 cores).
        // Rayon's count is given for comparison, not asserted: on a busy machine its thread spends
        // the waits in its own spin (0 of 50 with two busy threads beside it).
        assert!(
            kept_awake * 2 < rounds,
            "in {rounds} waits of 1 ms the other thread went to sleep {kept_awake} times inside \
             the job ({rayons_own} times in Rayon's own pool)"
        );
        // Inside the job the awake threads still take part in Rayon's blocking calls.
        let indices = on_cpu_pool(|| rayon::broadcast(|context| context.index()));
        assert_eq!(indices, vec![0, 1]);
    }

    /// When a job returns, the loops that kept its pool's threads awake end, and with them the
    /// pool's threads: none is left running (or spinning) in the process. Other tests may run
    /// pools of their own at the same time, so the job's threads are told apart by their ids.
    #[test]
    fn no_pool_thread_outlives_its_job() {
        let alive = |thread: &libc::pid_t| {
            std::path::Path::new(&format!("/proc/self/task/{thread}")).exists()
        };
        let (threads, names) = on_cpu_pool(|| {
            let threads = pool_thread_ids();
            let name = |thread| std::fs::read_to_string(format!("/proc/self/task/{thread}/comm"));
            let names: Vec<_> = threads.iter().map(|&t| name(t).unwrap()).collect();
            (threads, names)
        });
        assert_eq!(threads.len(), rayon::current_num_threads());
        for name in names {
            assert!(
                name.starts_with("haares-cpu-"),
                "pool thread named {name:?}"
            );
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while threads.iter().any(alive) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let left: Vec<_> = threads.iter().filter(|thread| alive(thread)).collect();
        assert!(
            left.is_empty(),
            "pool threads {left:?} still running after the job"
        );
    }
}
