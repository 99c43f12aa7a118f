//! The cuBLAS handles: one handle, stream and workspace per device and thread, made with the
//! device's primary context current, released when the thread ends.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::cublas::sys as blas;
use cudarc::driver::result as driver;
use cudarc::driver::sys as cuda;

use super::CublasFailure;

/// The workspace each handle gets: what NVIDIA recommends for Hopper (32 MiB; 4 MiB for earlier
/// cards), so that cuBLAS picks the same kernels as PyTorch's, whose default is the same.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Workspace bytes of the handles alive now, over every thread and device: cuBLAS's own device
/// memory, which CubeCL's memory statistics do not see.
pub fn workspace_bytes() -> u64 {
    WORKSPACES.load(Ordering::Relaxed)
}

static WORKSPACES: AtomicU64 = AtomicU64::new(0);

/// This thread's cuBLAS state for one device.
pub(super) struct Handle {
    ordinal: usize,
    device: cuda::CUdevice,
    context: cuda::CUcontext,
    pub(super) stream: cuda::CUstream,
    pub(super) blas: blas::cublasHandle_t,
    workspace: cuda::CUdeviceptr,
}

thread_local! {
    static HANDLES: RefCell<Vec<Handle>> = const { RefCell::new(Vec::new()) };
}

/// Runs `body` with this thread's handle for device `ordinal`, made on first use, its context
/// current.
pub(super) fn with_handle<T>(
    ordinal: usize,
    body: impl FnOnce(&Handle) -> Result<T, CublasFailure>,
) -> Result<T, CublasFailure> {
    HANDLES.with_borrow_mut(|handles| {
        let index = match handles.iter().position(|handle| handle.ordinal == ordinal) {
            Some(index) => index,
            None => {
                handles.push(Handle::new(ordinal)?);
                handles.len() - 1
            }
        };
        let handle = &handles[index];
        // SAFETY: the context is the device's primary context, retained by the handle.
        unsafe { driver::ctx::set_current(handle.context) }
            .map_err(|error| CublasFailure::Call(format!("cuCtxSetCurrent: {error:?}")))?;
        body(handle)
    })
}

impl Handle {
    fn new(ordinal: usize) -> Result<Self, CublasFailure> {
        let failed = |what: &str, error: &dyn std::fmt::Debug| {
            CublasFailure::Call(format!(
                "setting up cuBLAS on CUDA device {ordinal}: {what}: {error:?}"
            ))
        };
        driver::init().map_err(|e| failed("cuInit", &e))?;
        let device = driver::device::get(ordinal as i32).map_err(|e| failed("cuDeviceGet", &e))?;
        // From here on, `Drop` releases whatever was made (null fields are skipped).
        let mut handle = Self {
            ordinal,
            device,
            context: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            blas: std::ptr::null_mut(),
            workspace: 0,
        };
        // SAFETY: plain driver and cuBLAS set-up calls on a device that exists; each result is
        // stored in `handle` as soon as it is made, so a failure part-way releases the rest.
        unsafe {
            handle.context = driver::primary_ctx::retain(device)
                .map_err(|e| failed("cuDevicePrimaryCtxRetain", &e))?;
            driver::ctx::set_current(handle.context).map_err(|e| failed("cuCtxSetCurrent", &e))?;
            handle.stream = driver::stream::create(driver::stream::StreamKind::NonBlocking)
                .map_err(|e| failed("cuStreamCreate", &e))?;
            handle.workspace =
                driver::malloc_sync(WORKSPACE_BYTES).map_err(|e| failed("cuMemAlloc", &e))?;
            WORKSPACES.fetch_add(WORKSPACE_BYTES as u64, Ordering::Relaxed);
            let mut blas_handle = std::ptr::null_mut();
            blas::cublasCreate_v2(&mut blas_handle)
                .result()
                .map_err(|e| failed("cublasCreate", &e))?;
            handle.blas = blas_handle;
            blas::cublasSetStream_v2(handle.blas, handle.stream as blas::cudaStream_t)
                .result()
                .map_err(|e| failed("cublasSetStream", &e))?;
            blas::cublasSetWorkspace_v2(
                handle.blas,
                handle.workspace as *mut c_void,
                WORKSPACE_BYTES,
            )
            .result()
            .map_err(|e| failed("cublasSetWorkspace", &e))?;
            // The compute type of each call says whether it takes TF32; the default math mode
            // keeps `CUBLAS_COMPUTE_32F` in f32.
            blas::cublasSetMathMode(handle.blas, blas::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|e| failed("cublasSetMathMode", &e))?;
        }
        Ok(handle)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: each resource was made by `Handle::new` and is released once; errors are
        // ignored (at a thread's end the driver may already be shutting down).
        unsafe {
            if !self.context.is_null() {
                let _ = driver::ctx::set_current(self.context);
            }
            if !self.blas.is_null() {
                let _ = blas::cublasDestroy_v2(self.blas);
            }
            if self.workspace != 0 {
                let _ = driver::free_sync(self.workspace);
                WORKSPACES.fetch_sub(WORKSPACE_BYTES as u64, Ordering::Relaxed);
            }
            if !self.stream.is_null() {
                let _ = driver::stream::destroy(self.stream);
            }
            if !self.context.is_null() {
                let _ = driver::primary_ctx::release(self.device);
            }
        }
    }
}
