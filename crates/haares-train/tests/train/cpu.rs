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

/// A library call leaves the host process's allocator as it was: after a job dispatched to the
/// CPU pool, a 1 MiB block is still mmapped, as under glibc's defaults (threshold 128 KiB), where
/// `keep_freed_memory` would serve it from the heap. In a child process, so that nothing else in
/// this binary has touched the allocator's settings.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn a_dispatched_job_leaves_the_allocator_settings_alone() {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cpu::allocator_after_a_dispatch_in_a_child",
            "--ignored",
            "--test-threads=1",
        ])
        .env("HAARES_ALLOCATOR_CHILD", "1")
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

/// Run by [`a_dispatched_job_leaves_the_allocator_settings_alone`] in a child process.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[ignore = "run in a child process by cpu::a_dispatched_job_leaves_the_allocator_settings_alone"]
fn allocator_after_a_dispatch_in_a_child() {
    assert!(
        std::env::var_os("HAARES_ALLOCATOR_CHILD").is_some(),
        "run by its parent test"
    );
    dispatch(BackendKind::Ndarray, WhereItRan).unwrap();
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let mmapped = || unsafe { libc::mallinfo2().hblks };
    let before = mmapped();
    let block = std::hint::black_box(vec![1u8; 1 << 20]);
    assert!(
        mmapped() > before,
        "a 1 MiB block came from the heap: the allocator was reconfigured"
    );
    drop(block);
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

/// A backend in a JSON spec (the bench's workers, the GPU check's summary) is the name the
/// command line takes, and reads back in any build, this test build's (no CUDA, no fusion)
/// among them; an unknown one is refused with the names it could have been, and `cpu` stays
/// Flex's alias. Parsing for this build's use refuses what it lacks, naming the feature.
#[test]
fn backends_are_written_by_name_and_read_as_the_command_line_reads_them() {
    let every = [
        (BackendKind::Flex, "\"flex\""),
        (BackendKind::Ndarray, "\"ndarray\""),
        (BackendKind::Wgpu, "\"wgpu\""),
        (BackendKind::Cuda, "\"cuda\""),
        (BackendKind::WgpuFusion, "\"wgpu-fusion\""),
        (BackendKind::CudaFusion, "\"cuda-fusion\""),
    ];
    for (kind, json) in every {
        assert_eq!(serde_json::to_string(&kind).unwrap(), json);
        assert_eq!(serde_json::from_str::<BackendKind>(json).unwrap(), kind);
    }
    assert_eq!(
        serde_json::from_str::<BackendKind>("\"cpu\"").unwrap(),
        BackendKind::Flex
    );
    let error = serde_json::from_str::<BackendKind>("\"tpu\"")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("unknown backend `tpu`") && error.contains("cuda-fusion"),
        "{error}"
    );
    assert!(BackendKind::CudaFusion.is_cuda() && !BackendKind::Wgpu.is_cuda());
    #[cfg(not(feature = "cuda-backend"))]
    {
        let error = "cuda".parse::<BackendKind>().unwrap_err().to_string();
        assert!(
            error.contains("not compiled into this build") && error.contains("--features cuda"),
            "{error}"
        );
    }
}
