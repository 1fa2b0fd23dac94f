//! Page-locked host memory (`cuMemHostAlloc`): what an asynchronous copy
//! between host and device needs to run at the host link's speed without
//! the driver staging it, and without the call waiting for it.

use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::{CuError, Gpu, check};

/// `len` bytes of page-locked host memory, zeroed, freed on drop.
#[derive(Debug)]
pub(crate) struct PinnedAlloc {
    ptr: *mut u8,
    len: usize,
    gpu: Arc<Gpu>,
}

// SAFETY: the allocation is plain host memory owned by this value (like a
// Vec<u8>); the driver calls that free it bind the context themselves.
unsafe impl Send for PinnedAlloc {}
// SAFETY: shared access only hands out `&[u8]` or raw pointers.
unsafe impl Sync for PinnedAlloc {}

impl PinnedAlloc {
    /// Allocates `len` bytes (at least one), portable to every context.
    pub(crate) fn new(gpu: &Arc<Gpu>, len: usize) -> Result<Self, CuError> {
        gpu.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the context is current; writes one host pointer.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        if p.is_null() {
            return Err(CuError { call: "cuMemHostAlloc", detail: format!("a null pointer for {len} bytes") });
        }
        let ptr = p.cast::<u8>();
        // SAFETY: the allocation holds at least `len.max(1)` bytes and is
        // ours alone; zeroing it makes every byte initialised.
        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
        Ok(Self { ptr, len, gpu: gpu.clone() })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        }
    }
}
