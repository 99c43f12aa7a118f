//! How jobs are dispatched: CPU jobs on a thread of a Rayon pool that their parallel operations
//! share (`cpu.rs`), and what a backend without a runner arm says.

use haares_core::TrainingBackend;
use haares_train::backend::{BackendJob, BackendKind, dispatch};
use haares_train::cpu::on_cpu_pool;
use haares_train::error::Result;

/// Where a job ran: its thread's name and its index in the current Rayon pool.
struct WhereItRan;

impl BackendJob for WhereItRan {
    type Output = (Option<String>, Option<usize>, usize);
    fn run<B: TrainingBackend>(self, _: B::Device, _: BackendKind) -> Result<Self::Output> {
        let name = std::thread::current().name().map(str::to_owned);
        Ok((
            name,
            rayon::current_thread_index(),
            rayon::current_num_threads(),
        ))
    }
}

#[test]
fn cpu_jobs_run_on_a_pool_thread_with_as_many_threads_as_rayons_own_pool() {
    for backend in [BackendKind::Flex, BackendKind::Ndarray] {
        let (name, index, threads) = dispatch(backend, WhereItRan).unwrap();
        // The test harness runs each test on a thread named after the test, outside any pool.
        assert!(
            name.as_deref()
                .is_some_and(|n| n.starts_with("haares-cpu-")),
            "{backend}: ran on {name:?}"
        );
        assert!(index.is_some(), "{backend}: not on a pool thread");
        assert_eq!(threads, rayon::current_num_threads(), "{backend}");
    }
}

#[test]
fn a_panic_in_the_pool_reaches_the_caller() {
    let outcome = std::panic::catch_unwind(|| on_cpu_pool(|| panic!("inside the pool")));
    let message = outcome.unwrap_err();
    assert_eq!(message.downcast_ref::<&str>(), Some(&"inside the pool"));
}

/// The test build has the library's wgpu (`wgpu-backend`, for the AdamW kernel's tests) without
/// the runner's `wgpu`: a backend the parser accepts that `dispatch` has no arm for names the
/// feature to rebuild with, before any device starts.
#[test]
#[cfg(all(feature = "wgpu-backend", not(feature = "wgpu")))]
fn a_backend_without_a_runner_arm_names_the_feature() {
    let kind: BackendKind = "wgpu".parse().unwrap();
    let error = dispatch(kind, WhereItRan).unwrap_err().to_string();
    assert!(
        error.contains("backend `wgpu` is not compiled into this runner")
            && error.contains("--features wgpu"),
        "{error}"
    );
}

/// The child process's marker for [`freed_memory_is_reused_by_the_pool_threads`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const FREED_MEMORY_CHILD: &str = "HAARES_FREED_MEMORY_CHILD";

/// A CPU job's buffers, freed and allocated again, come back without page faults on a pool
/// thread, where each thread's own glibc arena unmapped its wholly free heaps every round
/// (`keep_freed_memory`). Arenas are per process and taken at a thread's first allocation, so
/// the rounds run in a child process of this test binary that runs nothing else, without
/// `GLIBC_TUNABLES` (which would replace the setting).
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn freed_memory_is_reused_by_the_pool_threads() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cpu::freed_memory_rounds_in_a_child"])
        .args(["--ignored", "--test-threads=1", "--nocapture"])
        .env(FREED_MEMORY_CHILD, "1")
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

/// Run by [`freed_memory_is_reused_by_the_pool_threads`] in a child process.
#[test]
#[ignore = "run in a child process by cpu::freed_memory_is_reused_by_the_pool_threads"]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn freed_memory_rounds_in_a_child() {
    assert!(
        std::env::var_os(FREED_MEMORY_CHILD).is_some(),
        "run by its parent test"
    );
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
