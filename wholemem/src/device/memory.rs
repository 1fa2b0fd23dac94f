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
}

impl PhysicalMemory {
    /// `len` bytes (a multiple of the granularity) on GPU `ordinal`,
    /// exportable as a POSIX file descriptor.
    pub(crate) fn create(ordinal: usize, len: usize) -> Result<Self, CuError> {
        let prop = pinned_on(ordinal, true);
        let mut handle = 0;
        // SAFETY: `prop` is valid; writes one handle.
        check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, len, &prop, 0) })?;
        Ok(Self { handle, len })
    }

    /// A descriptor another process can import.
    pub(crate) fn export_fd(&self) -> Result<OwnedFd, CuError> {
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
    pub(crate) fn import(fd: &OwnedFd, len: usize) -> Result<Self, CuError> {
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
        Ok(Self { handle, len })
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
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
}

impl AddressRange {
    pub(crate) fn reserve(len: usize, align: usize) -> Result<Self, CuError> {
        let mut va = 0;
        // SAFETY: writes one address; no fixed address is requested.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut va, len, align, 0, 0) })?;
        Ok(Self { va, len })
    }

    pub(crate) fn base(&self) -> DevPtr {
        self.va
    }

    /// Maps `mem` at `offset` bytes into the range.
    pub(crate) fn map(&self, offset: usize, mem: &PhysicalMemory) -> Result<Mapping, CuError> {
        assert!(offset + mem.len <= self.len, "a mapping must fit its reservation");
        let at = self.va + offset as u64;
        // SAFETY: [at, at + len) lies inside this reservation and is not
        // mapped yet (callers map disjoint pieces); the handle is live.
        check("cuMemMap", unsafe { sys::cuMemMap(at, mem.len, 0, mem.handle, 0) })?;
        Ok(Mapping { va: at, len: mem.len })
    }

    /// Lets the GPUs `ordinals` read and write `[offset, offset + len)`.
    pub(crate) fn set_access(&self, offset: usize, len: usize, ordinals: &[usize]) -> Result<(), CuError> {
        if len == 0 {
            return Ok(());
        }
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
}

impl Drop for Mapping {
    fn drop(&mut self) {
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

/// Synchronous copies between host and device (or device and device), on
/// the process's stream.
pub(crate) mod copy {
    use super::*;

    /// Host → device.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` must be device memory this process may write.
    pub(crate) unsafe fn to_device(gpu: &Gpu, dst: DevPtr, src: &[u8]) -> Result<(), CuError> {
        if src.is_empty() {
            return Ok(());
        }
        gpu.bind()?;
        // SAFETY: the caller vouches for the destination; `src` is a live
        // host slice of that length.
        check("cuMemcpyHtoD", unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) })
    }

    /// Device → host.
    ///
    /// # Safety
    /// `[src, src + dst.len())` must be device memory this process may read.
    pub(crate) unsafe fn to_host(gpu: &Gpu, dst: &mut [u8], src: DevPtr) -> Result<(), CuError> {
        if dst.is_empty() {
            return Ok(());
        }
        gpu.bind()?;
        // SAFETY: as above, the other way round.
        check("cuMemcpyDtoH", unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    /// Device → device.
    ///
    /// # Safety
    /// Both ranges must be device memory this process may use.
    pub(crate) unsafe fn device_to_device(gpu: &Gpu, dst: DevPtr, src: DevPtr, len: usize) -> Result<(), CuError> {
        if len == 0 {
            return Ok(());
        }
        gpu.bind()?;
        // SAFETY: the caller vouches for both ranges.
        check("cuMemcpyDtoD", unsafe { sys::cuMemcpyDtoD_v2(dst, src, len) })
    }
}
