//! RAII handles over the driver's memory calls: each owns one thing and
//! gives it back in `Drop`, which never panics (a failure there is ignored:
//! nothing sensible can be done with it during unwinding or teardown).
//!
//! | handle | takes | gives back |
//! |---|---|---|
//! | [`DeviceAlloc`] | `cuMemAlloc` | `cuMemFree` |
//! | [`PhysicalMemory`] | `cuMemCreate` / `cuMemImportFromShareableHandle` | `cuMemRelease` |
//! | [`AddressRange`] | `cuMemAddressReserve` | `cuMemAddressFree` |
//! | [`Mapping`] | `cuMemMap` | `cuMemUnmap` |
//! | [`IpcMapping`] | `cuIpcOpenMemHandle` | `cuIpcCloseMemHandle` |
//! | [`HostRegistration`] | `cuMemHostRegister` | `cuMemHostUnregister` |
//!
//! Owners that hold several keep them in fields ordered so that Rust's
//! declaration-order drop frees them in reverse order of creation.
//!
//! Every handle keeps its [`Gpu`] and makes that context current before
//! each driver call, `Drop` included: a handle may be used or dropped on a
//! thread that never bound a context (a copy pool or communicator thread).
//!
//! Copies go through one function, [`copy::ordered`], which enqueues them
//! on the rank's stream (the stream the kernels run on) and waits for that
//! stream: a copy starts after every kernel enqueued before it and has
//! landed when the call returns.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{CuError, Gpu, check};

/// A device address.
pub(crate) type DevPtr = u64;

fn pinned_on(ordinal: usize, exportable: bool) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain data for which all-zero is a valid value
    // (the C API documents zero as "unset" for every field).
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal as i32;
    if exportable {
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    }
    prop
}

/// The recommended VMM granularity on GPU `ordinal` for shareable memory.
pub(crate) fn vmm_granularity(ordinal: usize) -> Result<usize, CuError> {
    let prop = pinned_on(ordinal, true);
    let mut g = 0usize;
    // SAFETY: `prop` is a valid property struct; writes one usize.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, &prop, sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    })?;
    Ok(g.max(1))
}

/// Plain device memory from `cuMemAlloc`.
#[derive(Debug)]
pub(crate) struct DeviceAlloc {
    ptr: DevPtr,
    len: usize,
    gpu: Arc<Gpu>,
}

impl DeviceAlloc {
    pub(crate) fn new(gpu: &Arc<Gpu>, len: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: the context is current; writes one device address.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) })?;
        Ok(Self { ptr, len, gpu: gpu.clone() })
    }

    pub(crate) fn ptr(&self) -> DevPtr {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The 64-byte IPC handle peers open this allocation with.
    pub(crate) fn ipc_handle(&self) -> Result<[u8; 64], CuError> {
        self.gpu.bind()?;
        // SAFETY: plain data, overwritten by the call.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: `ptr` is the base of a live cuMemAlloc allocation.
        check("cuIpcGetMemHandle", unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) })?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed once.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// CUDA IPC shares whole driver blocks, and `cuMemAlloc` may carve a small
/// allocation out of a larger block: allocations peers open are rounded up
/// to this, as the CUDA programming guide recommends.
pub(crate) const IPC_ALIGN: usize = 2 << 20;

/// This rank's `cuMemAlloc`ed chunk once peers may have opened it through
/// CUDA IPC. Freeing it while a peer still has it open is undefined, so it
/// is freed only by [`free`](Self::free), which the caller calls after every
/// rank has closed its mappings; dropped any other way it is kept until the
/// process exits.
#[derive(Debug)]
pub(crate) struct SharedAlloc(Option<DeviceAlloc>);

impl SharedAlloc {
    /// `len` bytes rounded up to [`IPC_ALIGN`], with their IPC handle.
    pub(crate) fn new(gpu: &Arc<Gpu>, len: usize) -> Result<(Self, [u8; 64]), CuError> {
        let rounded = len.checked_next_multiple_of(IPC_ALIGN).ok_or_else(|| CuError {
            call: "cuMemAlloc",
            detail: format!("{len} bytes cannot be rounded up to a multiple of {IPC_ALIGN}"),
        })?;
        let a = DeviceAlloc::new(gpu, rounded)?;
        let h = a.ipc_handle()?;
        Ok((Self(Some(a)), h))
    }

    pub(crate) fn ptr(&self) -> DevPtr {
        self.0.as_ref().map_or(0, DeviceAlloc::ptr)
    }

    /// Frees the chunk. Only once no peer has it open any more.
    pub(crate) fn free(mut self) {
        drop(self.0.take());
    }
}

impl Drop for SharedAlloc {
    fn drop(&mut self) {
        // Not freed through `free`: a peer may still have it open.
        if let Some(a) = self.0.take() {
            std::mem::forget(a);
        }
    }
}

/// A peer's allocation opened through CUDA IPC.
#[derive(Debug)]
pub(crate) struct IpcMapping {
    ptr: DevPtr,
    gpu: Arc<Gpu>,
}

impl IpcMapping {
    pub(crate) fn open(gpu: &Arc<Gpu>, handle: &[u8]) -> Result<Self, CuError> {
        gpu.bind()?;
        // SAFETY: plain data.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as std::ffi::c_char;
        }
        let mut ptr = 0;
        // SAFETY: the context is current; `h` is a handle exported by
        // another process of this node; writes one address.
        check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, h, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
        })?;
        Ok(Self { ptr, gpu: gpu.clone() })
    }

    pub(crate) fn ptr(&self) -> DevPtr {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuIpcOpenMemHandle and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Physical device memory from `cuMemCreate`, or imported from a peer's
/// POSIX file descriptor.
#[derive(Debug)]
pub(crate) struct PhysicalMemory {
    handle: sys::CUmemGenericAllocationHandle,
    len: usize,
    gpu: Arc<Gpu>,
}

impl PhysicalMemory {
    /// `len` bytes (a multiple of the granularity) on GPU `ordinal`,
    /// exportable as a POSIX file descriptor.
    pub(crate) fn create(gpu: &Arc<Gpu>, len: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let prop = pinned_on(gpu.ordinal, true);
        let mut handle = 0;
        // SAFETY: `prop` is valid; writes one handle.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, len, &prop, 0) })?;
        Ok(Self { handle, len, gpu: gpu.clone() })
    }

    /// A descriptor another process can import.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd, CuError> {
        self.gpu.bind()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for POSIX descriptors the driver writes one int through
        // the pointer; the handle is live.
        check("cuMemExportToShareableHandle", unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        // SAFETY: the driver handed us a fresh descriptor that nothing else
        // owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Imports a peer's memory of `len` bytes from its descriptor.
    pub(crate) fn import(gpu: &Arc<Gpu>, fd: &OwnedFd, len: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let raw = fd.try_clone().map_err(|e| CuError { call: "dup", detail: e.to_string() })?.into_raw_fd();
        let mut handle = 0;
        // SAFETY: for POSIX descriptors the "OS handle" is the descriptor
        // itself, passed by value in the pointer; writes one handle.
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                raw as usize as *mut std::ffi::c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        // SAFETY: `raw` is the duplicate made above; the driver keeps its
        // own reference, so ours is closed either way.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        check("cuMemImportFromShareableHandle", r)?;
        Ok(Self { handle, len, gpu: gpu.clone() })
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: the handle is released once; mappings keep the memory
        // alive until they are unmapped.
        let _ = unsafe { sys::cuMemRelease(self.handle) };
    }
}

/// Reserved device virtual address space.
#[derive(Debug)]
pub(crate) struct AddressRange {
    va: DevPtr,
    len: usize,
    gpu: Arc<Gpu>,
}

impl AddressRange {
    pub(crate) fn reserve(gpu: &Arc<Gpu>, len: usize, align: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let mut va = 0;
        // SAFETY: writes one address; no fixed address is requested.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut va, len, align, 0, 0) })?;
        Ok(Self { va, len, gpu: gpu.clone() })
    }

    pub(crate) fn base(&self) -> DevPtr {
        self.va
    }

    /// Maps `mem` at `offset` bytes into the range.
    pub(crate) fn map(&self, offset: usize, mem: &PhysicalMemory) -> Result<Mapping, CuError> {
        if offset.checked_add(mem.len).is_none_or(|end| end > self.len) {
            return Err(CuError {
                call: "cuMemMap",
                detail: format!("{} bytes at offset {offset} do not fit a reservation of {} bytes", mem.len, self.len),
            });
        }
        self.gpu.bind()?;
        let at = self.va + offset as u64;
        // SAFETY: [at, at + len) lies inside this reservation (checked) and
        // is not mapped yet (callers map disjoint pieces); the handle is live.
        check("cuMemMap", unsafe { sys::cuMemMap(at, mem.len, 0, mem.handle, 0) })?;
        Ok(Mapping { va: at, len: mem.len, gpu: self.gpu.clone() })
    }

    /// Lets the GPUs `ordinals` read and write `[offset, offset + len)`.
    pub(crate) fn set_access(&self, offset: usize, len: usize, ordinals: &[usize]) -> Result<(), CuError> {
        if len == 0 {
            return Ok(());
        }
        self.gpu.bind()?;
        let descs: Vec<sys::CUmemAccessDesc> = ordinals
            .iter()
            .map(|&o| {
                // SAFETY: plain data; every field is set below.
                let mut d: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
                d.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                d.location.id = o as i32;
                d.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                d
            })
            .collect();
        // SAFETY: the range is mapped (callers set access after mapping);
        // `descs` holds `descs.len()` valid descriptors.
        check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(self.va + offset as u64, len, descs.as_ptr(), descs.len()) })
    }
}

impl Drop for AddressRange {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: reserved by us, freed once, after its mappings (owners
        // drop mappings first).
        let _ = unsafe { sys::cuMemAddressFree(self.va, self.len) };
    }
}

/// Physical memory mapped into a reserved range.
#[derive(Debug)]
pub(crate) struct Mapping {
    va: DevPtr,
    len: usize,
    gpu: Arc<Gpu>,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: this exact piece was mapped by us and is unmapped once.
        let _ = unsafe { sys::cuMemUnmap(self.va, self.len) };
    }
}

/// Host memory page-locked and mapped for the GPU, so kernels read it
/// directly.
#[derive(Debug)]
pub(crate) struct HostRegistration {
    host: usize,
    dev: DevPtr,
    gpu: Arc<Gpu>,
}

impl HostRegistration {
    /// # Safety
    /// `[ptr, ptr + len)` must be mapped host memory that outlives the
    /// registration.
    pub(crate) unsafe fn new(gpu: &Arc<Gpu>, ptr: *mut u8, len: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the caller promises the range is mapped and outlives us.
        check("cuMemHostRegister", unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) })?;
        let mut dev = 0;
        // SAFETY: `ptr` was just registered with DEVICEMAP.
        let r = check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr.cast(), 0) });
        let reg = Self { host: ptr as usize, dev, gpu: gpu.clone() };
        r.map(|()| reg)
    }

    /// The device address of the registered range's first byte.
    pub(crate) fn device_ptr(&self) -> DevPtr {
        self.dev
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: registered by us, unregistered once, before the host
            // mapping goes (owners drop registrations first).
            let _ = unsafe { sys::cuMemHostUnregister(self.host as *mut std::ffi::c_void) };
        }
    }
}

/// Copies between host and device (or device and device), ordered with the
/// kernels: every one goes through [`ordered`](copy::ordered).
pub(crate) mod copy {
    use super::*;

    /// One copy, by direction.
    #[derive(Debug)]
    pub(crate) enum Copy<'a> {
        /// Host → device.
        ToDevice { dst: DevPtr, src: &'a [u8] },
        /// Device → host.
        ToHost { dst: &'a mut [u8], src: DevPtr },
        /// Device → device.
        OnDevice { dst: DevPtr, src: DevPtr, len: usize },
    }

    impl Copy<'_> {
        /// Bytes moved.
        pub(crate) fn len(&self) -> usize {
            match self {
                Copy::ToDevice { src, .. } => src.len(),
                Copy::ToHost { dst, .. } => dst.len(),
                Copy::OnDevice { len, .. } => *len,
            }
        }
    }

    /// What [`ordered`] needs of the driver. [`Gpu`] is the real one; the
    /// tests record the calls instead.
    pub(crate) trait CopyEngine {
        /// A stream handle.
        type Stream: std::marker::Copy;
        /// The rank's stream: the one its kernels run on.
        fn stream(&self) -> Self::Stream;
        /// Makes the context current on the calling thread.
        fn bind(&self) -> Result<(), CuError>;
        /// Enqueues `op` on `stream`, asynchronously.
        ///
        /// # Safety
        /// The device ranges of `op` are memory this process may use, for
        /// its length; the host buffer lives until the stream has passed
        /// the copy.
        unsafe fn enqueue(&self, op: &mut Copy<'_>, stream: Self::Stream) -> Result<(), CuError>;
        /// Waits until `stream` has passed everything enqueued on it.
        fn synchronize(&self, stream: Self::Stream) -> Result<(), CuError>;
    }

    impl CopyEngine for Gpu {
        type Stream = sys::CUstream;

        fn stream(&self) -> sys::CUstream {
            self.stream.cu_stream()
        }

        fn bind(&self) -> Result<(), CuError> {
            Gpu::bind(self)
        }

        unsafe fn enqueue(&self, op: &mut Copy<'_>, s: sys::CUstream) -> Result<(), CuError> {
            match op {
                Copy::ToDevice { dst, src } => {
                    // SAFETY: the caller vouches for the device range; the
                    // host slice is live for its length and outlives the
                    // copy (`ordered` waits for the stream before returning).
                    check("cuMemcpyHtoDAsync", unsafe { sys::cuMemcpyHtoDAsync_v2(*dst, src.as_ptr().cast(), src.len(), s) })
                }
                Copy::ToHost { dst, src } => {
                    // SAFETY: as above, the other way round.
                    check("cuMemcpyDtoHAsync", unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), *src, dst.len(), s) })
                }
                Copy::OnDevice { dst, src, len } => {
                    // SAFETY: the caller vouches for both device ranges.
                    check("cuMemcpyDtoDAsync", unsafe { sys::cuMemcpyDtoDAsync_v2(*dst, *src, *len, s) })
                }
            }
        }

        fn synchronize(&self, s: sys::CUstream) -> Result<(), CuError> {
            // SAFETY: `s` is this Gpu's stream (`ordered` passes what
            // `stream()` gave), live, and its context is current.
            check("cuStreamSynchronize", unsafe { sys::cuStreamSynchronize(s) })
        }
    }

    /// The one way wholemem copies: binds the context to this thread,
    /// enqueues the copy on the rank's stream — after every kernel already
    /// enqueued there, which the legacy default stream would not wait for,
    /// cudarc's streams being non-blocking — and waits for the stream, so
    /// the bytes have landed (and a host buffer may be reused) when it
    /// returns. Nothing is called for an empty copy.
    ///
    /// # Safety
    /// The device ranges of `op` are memory this process may use, for the
    /// copy's length.
    pub(crate) unsafe fn ordered<E: CopyEngine + ?Sized>(engine: &E, mut op: Copy<'_>) -> Result<(), CuError> {
        if op.len() == 0 {
            return Ok(());
        }
        let stream = engine.stream();
        engine.bind()?;
        // SAFETY: forwarded; the host buffer outlives the wait below.
        unsafe { engine.enqueue(&mut op, stream) }?;
        engine.synchronize(stream)
    }

    /// Host → device.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` must be device memory this process may write.
    pub(crate) unsafe fn to_device<E: CopyEngine + ?Sized>(e: &E, dst: DevPtr, src: &[u8]) -> Result<(), CuError> {
        // SAFETY: forwarded.
        unsafe { ordered(e, Copy::ToDevice { dst, src }) }
    }

    /// Device → host.
    ///
    /// # Safety
    /// `[src, src + dst.len())` must be device memory this process may read.
    pub(crate) unsafe fn to_host<E: CopyEngine + ?Sized>(e: &E, dst: &mut [u8], src: DevPtr) -> Result<(), CuError> {
        // SAFETY: forwarded.
        unsafe { ordered(e, Copy::ToHost { dst, src }) }
    }

    /// Device → device.
    ///
    /// # Safety
    /// Both ranges must be device memory this process may use.
    pub(crate) unsafe fn device_to_device<E: CopyEngine + ?Sized>(e: &E, dst: DevPtr, src: DevPtr, len: usize) -> Result<(), CuError> {
        // SAFETY: forwarded.
        unsafe { ordered(e, Copy::OnDevice { dst, src, len }) }
    }

    #[cfg(test)]
    mod tests {
        use std::cell::RefCell;

        use super::*;

        /// What a copy asked of the driver.
        #[derive(Debug, Clone, PartialEq, Eq)]
        enum Call {
            Bind,
            Enqueue { what: &'static str, stream: usize, len: usize },
            Synchronize { stream: usize },
        }

        /// A driver that records, and can fail one step.
        struct Recorder {
            stream: usize,
            calls: RefCell<Vec<Call>>,
            fail_enqueue: bool,
        }

        impl Recorder {
            fn new(stream: usize) -> Self {
                Self { stream, calls: RefCell::new(Vec::new()), fail_enqueue: false }
            }
        }

        impl CopyEngine for Recorder {
            type Stream = usize;
            fn stream(&self) -> usize {
                self.stream
            }
            fn bind(&self) -> Result<(), CuError> {
                self.calls.borrow_mut().push(Call::Bind);
                Ok(())
            }
            unsafe fn enqueue(&self, op: &mut Copy<'_>, stream: usize) -> Result<(), CuError> {
                let what = match op {
                    Copy::ToDevice { .. } => "htod",
                    Copy::ToHost { dst, .. } => {
                        dst.fill(7);
                        "dtoh"
                    }
                    Copy::OnDevice { .. } => "dtod",
                };
                if self.fail_enqueue {
                    return Err(CuError { call: "cuMemcpyAsync", detail: "CUDA_ERROR_ILLEGAL_ADDRESS".into() });
                }
                self.calls.borrow_mut().push(Call::Enqueue { what, stream, len: op.len() });
                Ok(())
            }
            fn synchronize(&self, stream: usize) -> Result<(), CuError> {
                self.calls.borrow_mut().push(Call::Synchronize { stream });
                Ok(())
            }
        }

        #[test]
        fn every_copy_binds_enqueues_on_the_rank_stream_and_waits_for_it() {
            let e = Recorder::new(0x5eed);
            let mut out = [0u8; 5];
            // SAFETY: the recorder touches no device memory.
            unsafe {
                to_device(&e, 0x1000, &[1, 2, 3]).unwrap();
                to_host(&e, &mut out, 0x2000).unwrap();
                device_to_device(&e, 0x3000, 0x4000, 64).unwrap();
            }
            let s = 0x5eed;
            let step = |what, len| vec![Call::Bind, Call::Enqueue { what, stream: s, len }, Call::Synchronize { stream: s }];
            let want: Vec<Call> = [step("htod", 3), step("dtoh", 5), step("dtod", 64)].concat();
            assert_eq!(*e.calls.borrow(), want);
            assert_eq!(out, [7; 5], "the host buffer holds the copy when the call returns");
        }

        /// Every driver copy in the workspace's sources, by file: only the
        /// engine behind `ordered` and the kernel layer (which copies on the
        /// stream it launches on, then waits for it) may call one.
        #[test]
        fn no_copy_in_the_workspace_bypasses_the_ordered_path() {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let allowed = [
                ("wholemem/src/device/memory.rs", "the engine behind copy::ordered"),
                ("gather/src/cuda/launch.rs", "Kernels::bucket: on its launch stream, then synchronised"),
                ("gather/src/cuda/gpu_check.rs", "a test on its own stream (cudarc's stream copies)"),
            ];
            let needles = [
                "cuMemcpy",
                "memcpy_htod",
                "memcpy_dtoh",
                "memcpy_dtod",
                "clone_htod",
                "clone_dtoh",
                "clone_dtod",
                "htod_copy",
                "dtoh_sync",
            ];
            let mut stack = vec![root.clone()];
            let mut offenders = Vec::new();
            let mut seen = 0;
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap().flatten() {
                    let path = e.path();
                    let name = e.file_name().to_string_lossy().into_owned();
                    if path.is_dir() {
                        if !name.starts_with('.') && name != "target" && name != "gpu-bundle" {
                            stack.push(path);
                        }
                        continue;
                    }
                    if !name.ends_with(".rs") {
                        continue;
                    }
                    seen += 1;
                    let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    if needles.iter().any(|n| text.contains(n)) && !allowed.iter().any(|(f, _)| *f == rel) {
                        offenders.push(rel);
                    }
                }
            }
            assert!(seen > 50, "only {seen} Rust files found under {}", root.display());
            assert!(offenders.is_empty(), "driver copies outside copy::ordered: {offenders:?}");
        }

        #[test]
        fn an_empty_copy_calls_nothing_and_a_failed_enqueue_is_not_waited_for() {
            let e = Recorder::new(1);
            // SAFETY: as above.
            unsafe {
                to_device(&e, 0, &[]).unwrap();
                to_host(&e, &mut [], 0).unwrap();
                device_to_device(&e, 0, 0, 0).unwrap();
            }
            assert!(e.calls.borrow().is_empty());
            let e = Recorder { fail_enqueue: true, ..Recorder::new(1) };
            // SAFETY: as above.
            let err = unsafe { to_device(&e, 0x1000, &[1]) }.unwrap_err();
            assert!(err.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{err}");
            assert_eq!(*e.calls.borrow(), vec![Call::Bind]);
        }
    }
}
