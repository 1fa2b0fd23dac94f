//! Device memory through the CUDA driver, loaded at run time (cudarc with
//! `dynamic-loading`): one binary runs with and without a GPU.
//!
//! Three levels, as in cudarc itself: `driver` turns status codes into
//! results in exactly one place and binds this process to its GPU;
//! `memory` (and `pinned`, page-locked host memory) holds RAII handles over
//! VMM, IPC, plain allocations and host registration; `storage` builds each
//! memory type from them, collectively, and `peer` the buffers a table's
//! ranks share for their device exchanges ([`PeerBuffers`]).
//! No cudarc or driver type appears in this crate's public API except in
//! [`raw`], the documented integration point for `wm-gather`'s kernels.

pub(crate) mod driver;
pub(crate) mod memory;
pub(crate) mod peer;
pub(crate) mod pinned;
pub(crate) mod storage;

use std::sync::Arc;

use memory::{DeviceAlloc, copy};
pub use peer::PeerBuffers;
use pinned::PinnedAlloc;

use crate::CommonError;
use crate::{Error, Result, WholeMemory};

/// Whether this process can use CUDA: `Ok` with the number of GPUs the
/// driver sees, or the reason it cannot ("no CUDA driver on this host …").
/// Never panics, and asks the driver only once.
pub fn status() -> std::result::Result<usize, String> {
    driver::status()
}

/// A buffer in the memory of this rank's GPU, e.g. the ids and the output of
/// a device gather. Freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    alloc: DeviceAlloc,
}

impl DeviceBuffer {
    /// `len` bytes on the GPU that `mem` lives on (or, for host memory, the
    /// GPU this rank is bound to).
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the rank has no GPU; [`Error::Cuda`] when
    /// the driver cannot allocate.
    pub fn new(mem: &WholeMemory, len: usize) -> Result<Self> {
        let gpu = mem.gpu().ok_or_else(|| Error::Unsupported {
            what: "a device buffer".into(),
            reason: mem.no_gpu_reason().unwrap_or_else(|| "this rank is bound to no GPU".into()),
        })?;
        Ok(Self { alloc: DeviceAlloc::new(gpu, len)? })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.alloc.len() == 0
    }

    /// Its device address, for kernels.
    pub fn addr(&self) -> u64 {
        self.alloc.ptr()
    }

    /// Copies `src` to the start of the buffer.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when `src` is longer than the buffer.
    pub fn upload(&mut self, src: &[u8]) -> Result<()> {
        self.fits(src.len())?;
        // SAFETY: the buffer is ours and at least `src.len()` bytes long.
        Ok(unsafe { copy::to_device(self.gpu(), self.alloc.ptr(), src) }?)
    }

    /// Copies the start of the buffer into `dst`.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when `dst` is longer than the buffer.
    pub fn download(&self, dst: &mut [u8]) -> Result<()> {
        self.fits(dst.len())?;
        // SAFETY: as for `upload`.
        Ok(unsafe { copy::to_host(self.gpu(), dst, self.alloc.ptr()) }?)
    }

    /// Copies `len` bytes from `src` into this buffer, on the device.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when either is shorter than `len`.
    pub fn copy_from(&mut self, src: &DeviceBuffer, len: usize) -> Result<()> {
        self.fits(len)?;
        src.fits(len)?;
        // SAFETY: both buffers are ours and at least `len` bytes long.
        Ok(unsafe { copy::device_to_device(self.gpu(), self.alloc.ptr(), src.alloc.ptr(), len) }?)
    }

    fn fits(&self, n: usize) -> Result<()> {
        if n > self.len() {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "{n} bytes do not fit a device buffer of {} bytes",
                self.len()
            ))));
        }
        Ok(())
    }

    fn gpu(&self) -> &driver::Gpu {
        self.alloc.gpu()
    }
}

/// Page-locked host memory, for copies between host and device that run
/// asynchronously at the host link's speed (`cuMemHostAlloc`, portable).
/// Zeroed when allocated; freed on drop.
///
/// The buffer is plain host memory to Rust: [`as_slice`](Self::as_slice)
/// and [`as_mut_slice`](Self::as_mut_slice) read and write it. A copy the
/// GPU makes into or out of it is enqueued through its raw pointer by an
/// `unsafe` call whose caller keeps those slices away until the stream has
/// passed the copy.
#[derive(Debug)]
pub struct PinnedBuffer {
    alloc: PinnedAlloc,
}

impl PinnedBuffer {
    /// `len` bytes of page-locked memory, for the GPU `mem`'s rank uses.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the rank has no GPU; [`Error::Cuda`] when
    /// the driver cannot allocate.
    pub fn new(mem: &WholeMemory, len: usize) -> Result<Self> {
        let gpu = mem.gpu().ok_or_else(|| Error::Unsupported {
            what: "page-locked host memory".into(),
            reason: mem.no_gpu_reason().unwrap_or_else(|| "this rank is bound to no GPU".into()),
        })?;
        Ok(Self { alloc: PinnedAlloc::new(gpu, len)? })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.alloc.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.alloc.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by this value; `&self`
        // keeps writers through this API away, and device copies into it are
        // ordered by their `unsafe` callers (see the type's docs).
        unsafe { std::slice::from_raw_parts(self.alloc.ptr(), self.alloc.len()) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, with `&mut self` excluding every other access.
        unsafe { std::slice::from_raw_parts_mut(self.alloc.ptr(), self.alloc.len()) }
    }

    /// The first byte, for enqueuing a copy.
    pub fn as_ptr(&self) -> *const u8 {
        self.alloc.ptr()
    }

    /// The first byte, writable, for enqueuing a copy into it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.alloc.ptr()
    }
}

pub mod raw;

/// The GPU this rank uses for `loc` memory over a communicator whose node
/// layout gives it `local_rank`: required for device memory, optional (for
/// host registration) otherwise.
pub(crate) fn bind(local_rank: usize) -> std::result::Result<Arc<driver::Gpu>, String> {
    driver::gpu(local_rank)
}

pub(crate) use memory::HostRegistration;
pub(crate) use storage::DeviceStorage;
