//! The one place where CUDA driver status codes become results, and where
//! this process finds its driver and binds its GPU.
//!
//! cudarc loads libcuda at its first call and *panics* when it cannot, so
//! every path into the driver goes through [`status`] first, which asks
//! `is_culib_present()` before anything else.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, sys};

/// A driver call that failed: which call, and the driver's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {detail}")]
pub(crate) struct CuError {
    pub(crate) call: &'static str,
    pub(crate) detail: String,
}

impl From<CuError> for crate::Error {
    fn from(e: CuError) -> Self {
        crate::Error::Cuda { call: e.call, detail: e.detail }
    }
}

/// Turns a status code into a result naming the call.
pub(crate) fn check(call: &'static str, r: sys::CUresult) -> Result<(), CuError> {
    r.result().map_err(|e| CuError { call, detail: format!("{e:?}") })
}

/// Wraps cudarc's safe-layer errors the same way.
pub(crate) fn wrap(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> CuError {
    move |e| CuError { call, detail: format!("{e:?}") }
}

/// The oldest driver whose API the bindings (CUDA 12.8 headers) are used
/// against: every entry point we call exists from 12.0 on.
const MIN_DRIVER: i32 = 12000;

/// Whether this process can use CUDA: the number of GPUs the driver sees,
/// or why not. Probed once; never panics.
pub fn status() -> Result<usize, String> {
    static STATUS: OnceLock<Result<usize, String>> = OnceLock::new();
    STATUS.get_or_init(probe).clone()
}

fn probe() -> Result<usize, String> {
    // SAFETY: only tries to open the library; no driver entry point is
    // called.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver on this host (libcuda.so.1 could not be loaded)".into());
    }
    // SAFETY: cuInit has no preconditions and the library is present.
    check("cuInit", unsafe { sys::cuInit(0) }).map_err(|e| format!("the CUDA driver did not start: {e}"))?;
    let mut version = 0;
    // SAFETY: writes one int through a valid pointer.
    check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) }).map_err(|e| e.to_string())?;
    if version < MIN_DRIVER {
        return Err(format!("the CUDA driver is version {}.{}; wholemem needs 12.0 or newer", version / 1000, version % 1000 / 10));
    }
    let mut count = 0;
    // SAFETY: writes one int through a valid pointer; the driver is up.
    check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut count) }).map_err(|e| e.to_string())?;
    if count <= 0 {
        return Err("the CUDA driver sees no GPU on this host".into());
    }
    Ok(count as usize)
}

/// The PCI bus id of CUDA device `ordinal`, upper case
/// (`0000:65:00.0`).
pub(crate) fn bus_id(ordinal: usize) -> Result<String, CuError> {
    let mut dev = 0;
    // SAFETY: writes one device handle; the caller has checked `status`.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })?;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: the buffer is 32 bytes and its length is passed.
    check("cuDeviceGetPCIBusId", unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) })?;
    // SAFETY: the driver wrote a NUL-terminated string into `buf`.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().to_uppercase())
}

/// The GPU this process uses: its primary context and a stream of its own.
#[derive(Debug)]
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) ordinal: usize,
    pub(crate) bus_id: String,
}

impl Gpu {
    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CuError> {
        self.ctx.bind_to_thread().map_err(wrap("cuCtxSetCurrent"))
    }
}

/// The CUDA ordinals of this process's GPUs, in PCI order: the order NVML
/// numbers them, so `WM_DEVICE` means the same GPU to both.
fn pci_order(count: usize) -> Result<Vec<(String, usize)>, CuError> {
    let mut v = (0..count).map(|o| bus_id(o).map(|b| (b, o))).collect::<Result<Vec<_>, _>>()?;
    v.sort();
    Ok(v)
}

/// Binds this process to its GPU, once: `WM_DEVICE` (an index in PCI order,
/// as NVML counts) if set, else `local_rank` modulo the GPU count. Later
/// calls return the first binding whatever `local_rank` they pass — a
/// process uses one GPU.
pub(crate) fn gpu(local_rank: usize) -> Result<Arc<Gpu>, String> {
    static GPU: OnceLock<Result<Arc<Gpu>, String>> = OnceLock::new();
    GPU.get_or_init(|| {
        let count = status()?;
        let order = pci_order(count).map_err(|e| e.to_string())?;
        let index = match wm_topology::env::WM_DEVICE.parse::<usize>()? {
            Some(i) if i >= count => return Err(format!("WM_DEVICE={i}, but this host's driver sees {count} GPU(s)")),
            Some(i) => i,
            None => local_rank % count,
        };
        let (bus_id, ordinal) = order[index].clone();
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("creating a context on GPU {index} ({bus_id}): {e:?}"))?;
        let stream = ctx.new_stream().map_err(|e| format!("creating a stream on GPU {index} ({bus_id}): {e:?}"))?;
        Ok(Arc::new(Gpu { ctx, stream, ordinal, bus_id }))
    })
    .clone()
}

/// The CUDA ordinal of the GPU with PCI bus id `bus`, as this process sees
/// it.
pub(crate) fn ordinal_of(bus: &str) -> Result<Option<usize>, String> {
    let count = status()?;
    Ok(pci_order(count).map_err(|e| e.to_string())?.into_iter().find(|(b, _)| b == bus).map(|(_, o)| o))
}

/// Whether GPU `ordinal` supports what continuous device memory needs:
/// virtual memory management and POSIX file descriptors as shareable
/// handles; else why not.
pub(crate) fn vmm_support(ordinal: usize) -> Result<(), String> {
    use sys::CUdevice_attribute::*;
    for (attr, what) in [
        (CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED, "virtual memory management (cuMemCreate/cuMemMap)"),
        (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, "POSIX file descriptors as shareable memory handles"),
    ] {
        if attribute(ordinal, attr).map_err(|e| e.to_string())? == 0 {
            return Err(format!("GPU {ordinal} ({}) does not support {what}", bus_id(ordinal).unwrap_or_default()));
        }
    }
    Ok(())
}

/// A device attribute of CUDA device `ordinal`.
pub(crate) fn attribute(ordinal: usize, attr: sys::CUdevice_attribute) -> Result<i32, CuError> {
    let mut dev = 0;
    // SAFETY: writes one device handle; the caller has checked `status`.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) })?;
    let mut v = 0;
    // SAFETY: writes one int; the handle is valid.
    check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) })?;
    Ok(v)
}

/// Whether the GPU `from` can read and write the memory of GPU `to` (CUDA
/// ordinals).
pub(crate) fn can_access_peer(from: usize, to: usize) -> Result<bool, CuError> {
    if from == to {
        return Ok(true);
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: each call writes one device handle.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut a, from as i32) })?;
    // SAFETY: as above.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut b, to as i32) })?;
    let mut yes = 0;
    // SAFETY: writes one int; both handles are valid.
    check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut yes, a, b) })?;
    Ok(yes != 0)
}
