//! The compiled module loaded into a CUDA context, and the launches.
//!
//! This is where cudarc meets the raw device addresses of the launch
//! arguments: every launch is `unsafe`, the addresses being the caller's
//! promise.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::geometry::{self, BucketParams, CheckParams, RepeatParams, RowParams, ScanParams};
use super::nvrtc::{self, Compiled, ImageFormat};
use super::{Arch, BLOCK_THREADS, BucketArgs, CheckArgs, GatherArgs, KernelError, LaunchPlan, RepeatArgs, STATUS_OK, ScatterArgs, source};

// SAFETY: RowParams is #[repr(C)] with only u64 fields, the same fields in
// the same order as `WmRowParams` in kernels.cu, so the bytes cudarc copies
// from a reference to it are the kernel's by-value parameter.
unsafe impl DeviceRepr for RowParams {}
// SAFETY: as above, mirroring `WmBucketParams`.
unsafe impl DeviceRepr for BucketParams {}
// SAFETY: as above, mirroring `WmCheckParams`.
unsafe impl DeviceRepr for CheckParams {}
// SAFETY: as above, mirroring `WmRepeatParams`.
unsafe impl DeviceRepr for RepeatParams {}
// SAFETY: as above, mirroring `WmScanParams`.
unsafe impl DeviceRepr for ScanParams {}

/// One copy enqueued on a stream by [`Kernels::copy`]. Host memory is
/// named by raw pointers: page-locked memory (`cuMemHostAlloc`,
/// `cuMemHostRegister`) for a copy that runs asynchronously; for pageable
/// memory the driver stages the bytes itself and the call returns only once
/// the host side is done with them (host → device: after waiting for the
/// stream's earlier work; device → host: once the copy has landed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCopy {
    /// `len` bytes from host `src` to device `dst`.
    ToDevice {
        /// Device address.
        dst: u64,
        /// Host address.
        src: *const u8,
        /// Bytes.
        len: usize,
    },
    /// `len` bytes from device `src` to host `dst`.
    ToHost {
        /// Host address.
        dst: *mut u8,
        /// Device address.
        src: u64,
        /// Bytes.
        len: usize,
    },
    /// `len` bytes from device `src` to device `dst` (another process's
    /// memory opened through CUDA IPC included).
    OnDevice {
        /// Device address.
        dst: u64,
        /// Device address.
        src: u64,
        /// Bytes.
        len: usize,
    },
}

impl StreamCopy {
    /// Bytes moved.
    pub fn len(&self) -> usize {
        match *self {
            StreamCopy::ToDevice { len, .. } | StreamCopy::ToHost { len, .. } | StreamCopy::OnDevice { len, .. } => len,
        }
    }

    /// Whether it moves nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn driver(e: cudarc::driver::DriverError) -> KernelError {
    KernelError::Driver(e.to_string())
}

/// NVRTC's image for `device`: a CUBIN when it knows the architecture, else
/// PTX for the newest one it knows below it.
fn compile_for(device: Arch) -> Result<Compiled, KernelError> {
    let known = nvrtc::supported_archs()?;
    if known.contains(&device.number()) {
        return nvrtc::compile(device);
    }
    let Some(&older) = known.iter().rev().find(|&&a| a <= device.number()) else {
        return Err(KernelError::Compile { arch: device, log: format!("NVRTC knows no architecture up to {device}") });
    };
    nvrtc::compile_as(Arch { major: older / 10, minor: older % 10 }, ImageFormat::Ptx)
}

/// The order [`Kernels::load`] tries: the prebuilt image for exactly
/// `device` (if there is one and the driver takes it), then NVRTC's. The
/// error of the last way tried carries what became of the first.
fn load_first<T>(
    device: Arch,
    prebuilt: impl FnOnce(Arch) -> Option<Compiled>,
    compile: impl FnOnce(Arch) -> Result<Compiled, KernelError>,
    load: impl Fn(Compiled) -> Result<T, KernelError>,
) -> Result<T, KernelError> {
    let dir = || nvrtc::cache_dir().map_or("(no cache directory: WM_KERNEL_CACHE=off)".to_owned(), |d| d.display().to_string());
    let prebuilt_note = match prebuilt(device) {
        Some(c) => match load(c) {
            Ok(k) => return Ok(k),
            Err(e) => format!("the prebuilt kernels for {device} in {} did not load: {e}", dir()),
        },
        None => format!("no prebuilt kernels for {device} in {} (wm-bench kernels --prebuild DIR, then WM_KERNEL_CACHE=DIR)", dir()),
    };
    match compile(device).and_then(load) {
        Ok(k) => Ok(k),
        Err(KernelError::NoNvrtc(why)) => Err(KernelError::NoNvrtc(format!("{why}; and {prebuilt_note}"))),
        Err(KernelError::Compile { arch, log }) => Err(KernelError::Compile { arch, log: format!("{log}\n(and {prebuilt_note})") }),
        Err(KernelError::Driver(why)) => Err(KernelError::Driver(format!("{why}; and {prebuilt_note}"))),
        Err(e) => Err(e),
    }
}

/// Every kernel, loaded into one CUDA context.
///
/// Build it once per context with [`Kernels::load`]; it is `Send + Sync`
/// and launches on any stream of that context.
#[derive(Debug)]
pub struct Kernels {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    functions: HashMap<String, CudaFunction>,
    arch: Arch,
    format: ImageFormat,
    sm_count: u32,
}

impl Kernels {
    /// Loads the kernels for the device of `ctx`, the first way that works:
    ///
    /// 1. the prebuilt CUBIN for exactly its architecture in the cache
    ///    directory (`wm-bench kernels --prebuild`, shipped by
    ///    `scripts/gpu-bundle.sh`): no compile, and no NVRTC needed;
    /// 2. NVRTC: a CUBIN for its compute capability (or the disk cache's),
    ///    or, when this NVRTC does not know the GPU yet, PTX for the newest
    ///    architecture it knows (compiled by the driver at load).
    ///
    /// # Errors
    /// When neither works: [`KernelError::NoNvrtc`] or
    /// [`KernelError::Compile`] (NVRTC's error), or
    /// [`KernelError::Driver`] when the driver refuses the module; the
    /// message also says what became of the prebuilt kernels.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, KernelError> {
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let device = Arch { major: major as u32, minor: minor as u32 };
        load_first(device, nvrtc::prebuilt, compile_for, |c| Self::from_image(ctx, c))
    }

    /// Loads a compiled image into `ctx` and looks up every entry point.
    fn from_image(ctx: &Arc<CudaContext>, compiled: Compiled) -> Result<Kernels, KernelError> {
        let module = ctx.load_module(Ptx::from_binary(compiled.image.to_vec())).map_err(driver)?;
        let mut functions = HashMap::new();
        for e in source::entries() {
            let name = e.name();
            let f = module.load_function(&name).map_err(driver)?;
            functions.insert(name, f);
        }
        let sm_count = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map_err(driver)?.max(1) as u32;
        Ok(Kernels { ctx: ctx.clone(), _module: module, functions, arch: compiled.arch, format: compiled.format, sm_count })
    }

    /// The architecture the loaded image was compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// CUBIN, or PTX compiled by the driver.
    pub fn format(&self) -> ImageFormat {
        self.format
    }

    /// The device's multiprocessors (the grid is sized for them).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Enqueues a gather on `stream` (nothing when `args.n_ids == 0`).
    ///
    /// # Safety
    /// On the device of `stream`, until the launch completes: `bases` and
    /// `first_rows` hold `ranks` and `ranks + 1` valid entries with
    /// `first_rows` ascending; every id is in `first_rows[0]..first_rows[ranks]`;
    /// each owner's rows are readable at `bases[r] + k * row_stride_bytes`
    /// for `dim` elements, aligned to the table's element size; `out` is
    /// writable for `n_ids` rows of `out_stride_bytes` and overlaps neither
    /// the table nor the ids. cudarc's event tracking does not see raw
    /// addresses: the caller keeps the memory alive and orders other work on
    /// it against `stream`.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] or [`KernelError::UnsupportedPair`]
    /// (checked before anything is enqueued); [`KernelError::Driver`] when
    /// the launch fails.
    pub unsafe fn gather(&self, stream: &Arc<CudaStream>, args: &GatherArgs) -> Result<(), KernelError> {
        let (plan, params) = args.plan_params(self.sm_count)?;
        // SAFETY: the caller's contract covers every address in `params`; the plan was checked.
        unsafe { self.launch_rows(stream, &plan, params) }
    }

    /// Enqueues a scatter on `stream` (nothing when `args.n_ids == 0`).
    ///
    /// # Safety
    /// As [`gather`](Self::gather) with the roles swapped: table rows are
    /// writable, `src` readable for `n_ids` rows of `src_stride_bytes`,
    /// `keep` (if not 0) readable for `n_ids` bytes. No two kept ids may
    /// name the same row (which of them lands is unspecified otherwise),
    /// and no one else may access those rows until the launch completes.
    ///
    /// # Errors
    /// As [`gather`](Self::gather).
    pub unsafe fn scatter(&self, stream: &Arc<CudaStream>, args: &ScatterArgs) -> Result<(), KernelError> {
        let (plan, params) = args.plan_params(self.sm_count)?;
        // SAFETY: the caller's contract covers every address in `params`; the plan was checked.
        unsafe { self.launch_rows(stream, &plan, params) }
    }

    /// Enqueues the first bucket step on `stream`: zeroes `counts` (also
    /// when there are no ids), writes `owner` and adds up `counts`.
    ///
    /// # Safety
    /// On the device of `stream`: `first_rows` holds `ranks + 1` ascending
    /// entries; `ids` is readable for `n_ids` ids, each in range; `owner`
    /// (`n_ids` u32) and `counts` (`ranks` u32) are writable and overlap
    /// nothing else of the launch.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] before anything is enqueued;
    /// [`KernelError::Driver`].
    pub unsafe fn bucket_count(&self, stream: &Arc<CudaStream>, args: &BucketArgs) -> Result<(), KernelError> {
        let plan = args.plan_params(self.sm_count)?;
        self.check_stream(stream)?;
        if args.counts != 0 {
            // SAFETY: `counts` is writable for `ranks` u32 by the caller's contract; the memset is ordered on `stream`.
            unsafe { cudarc::driver::result::memset_d8_async(args.counts, 0, args.ranks as usize * 4, stream.cu_stream()) }
                .map_err(driver)?;
        }
        if args.n_ids == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract covers every address in `params`.
        unsafe { self.launch(stream, &plan.count, plan.params) }
    }

    /// Enqueues the second bucket step on `stream`: every id to
    /// `out_ids[slot]`, its position to `positions[slot]`, the slot taken
    /// from its owner's cursor.
    ///
    /// # Safety
    /// As [`bucket_count`](Self::bucket_count), after it on the same ids;
    /// `cursors` holds the exclusive prefix sum of those counts; `out_ids`
    /// (`n_ids` i64) and `positions` (`n_ids` u32) are writable.
    ///
    /// # Errors
    /// As [`bucket_count`](Self::bucket_count).
    pub unsafe fn bucket_place(&self, stream: &Arc<CudaStream>, args: &BucketArgs) -> Result<(), KernelError> {
        let plan = args.plan_params(self.sm_count)?;
        // SAFETY: the caller's contract covers every address in `params`.
        unsafe { self.launch(stream, &plan.place, plan.params) }
    }

    /// Both bucket steps, with the prefix sum on the host in between (the
    /// counts are copied down, the cursors up). Returns the counts per owner
    /// after the stream has finished both kernels.
    ///
    /// # Safety
    /// As [`bucket_count`](Self::bucket_count) and
    /// [`bucket_place`](Self::bucket_place); `cursors` need not be initialised.
    ///
    /// # Errors
    /// As [`bucket_count`](Self::bucket_count).
    pub unsafe fn bucket(&self, stream: &Arc<CudaStream>, args: &BucketArgs) -> Result<Vec<u32>, KernelError> {
        self.check_stream(stream)?;
        let mut counts = vec![0u32; args.ranks as usize];
        // SAFETY: the caller's contract.
        unsafe { self.bucket_count(stream, args) }?;
        if args.n_ids == 0 {
            return Ok(counts);
        }
        // SAFETY: `counts` is `ranks` u32 on both sides and outlives the copy (synchronised below).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut counts, args.counts, stream.cu_stream()) }.map_err(driver)?;
        stream.synchronize().map_err(driver)?;
        let cursors = geometry::exclusive_prefix_sum(&counts);
        // SAFETY: `cursors` is `ranks` u32 on both sides and lives until the synchronisation below.
        unsafe { cudarc::driver::result::memcpy_htod_async(args.cursors, &cursors, stream.cu_stream()) }.map_err(driver)?;
        // SAFETY: the caller's contract; cursors are the prefix sum of these counts.
        unsafe { self.bucket_place(stream, args) }?;
        stream.synchronize().map_err(driver)?;
        Ok(counts)
    }

    /// Enqueues the range check of `args.ids` on `stream`: the status word
    /// ends as the first position of an id outside `lo..hi`, or stays as it
    /// was ([`STATUS_OK`] when the caller reset it, [`Kernels::reset_status`]).
    ///
    /// # Safety
    /// On the device of `stream`: `ids` is readable for `n_ids` ids and
    /// `status` writable for one `u64`, until the launch completes.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] before anything is enqueued;
    /// [`KernelError::Driver`].
    pub unsafe fn check_ids(&self, stream: &Arc<CudaStream>, args: &CheckArgs) -> Result<(), KernelError> {
        let (plan, params) = args.plan_params(self.sm_count)?;
        self.check_stream(stream)?;
        if args.n_ids == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract covers both addresses.
        unsafe { self.launch(stream, &plan, params) }
    }

    /// Enqueues the setting of `words` status words at `status` to
    /// [`STATUS_OK`] on `stream`.
    ///
    /// # Safety
    /// `status` is device memory of the stream's device, writable for
    /// `words` `u64`.
    ///
    /// # Errors
    /// [`KernelError::Driver`].
    pub unsafe fn reset_status(&self, stream: &Arc<CudaStream>, status: u64, words: usize) -> Result<(), KernelError> {
        debug_assert_eq!(STATUS_OK, u64::MAX, "all bits set: a byte fill of 0xff");
        // SAFETY: forwarded.
        unsafe { self.fill(stream, status, 0xff, words * 8) }
    }

    /// Enqueues the resolution of repeated ids on `stream`: the table is
    /// filled (keys empty, positions 0), `mark` records each id's highest
    /// position, `keep` writes the mask.
    ///
    /// # Safety
    /// On the device of `stream`, until the launches complete: `ids`
    /// readable for `n_ids` ids; `keys` (`capacity` u64), `vals`
    /// (`capacity` u32) and `keep` (`n_ids` u8) writable, overlapping
    /// nothing else of the launch.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] before anything is enqueued;
    /// [`KernelError::Driver`].
    pub unsafe fn resolve_repeats(&self, stream: &Arc<CudaStream>, args: &RepeatArgs) -> Result<(), KernelError> {
        let plan = args.plan_params(self.sm_count)?;
        self.check_stream(stream)?;
        if args.n_ids == 0 {
            return Ok(());
        }
        let cap = args.capacity as usize;
        // SAFETY: the caller's contract: `keys` and `vals` hold `capacity` entries.
        unsafe {
            self.fill(stream, args.keys, 0xff, cap * 8)?;
            self.fill(stream, args.vals, 0, cap * 4)?;
        }
        // SAFETY: the caller's contract covers every address of the parameters.
        unsafe {
            self.launch(stream, &plan.mark, plan.params)?;
            self.launch(stream, &plan.keep, plan.params)
        }
    }

    /// Both bucket steps and the prefix sum between them, all on `stream`
    /// with nothing waited for: `counts` (ids per owner), `cursors` (the
    /// end of each owner's bucket once `place` has run), `out_ids` and
    /// `positions` are written when the stream gets there.
    ///
    /// # Safety
    /// As [`bucket`](Self::bucket).
    ///
    /// # Errors
    /// As [`bucket_count`](Self::bucket_count).
    pub unsafe fn bucket_on_device(&self, stream: &Arc<CudaStream>, args: &BucketArgs) -> Result<(), KernelError> {
        // SAFETY: the caller's contract.
        unsafe { self.bucket_count(stream, args) }?;
        if args.n_ids == 0 {
            return Ok(());
        }
        let (plan, params) = args.scan_plan();
        // SAFETY: `counts` and `cursors` hold `ranks` u32 (the caller's contract).
        unsafe { self.launch(stream, &plan, params) }?;
        // SAFETY: the caller's contract; the cursors are the prefix sum of these counts.
        unsafe { self.bucket_place(stream, args) }
    }

    /// Enqueues one copy on `stream` (nothing for an empty one).
    ///
    /// # Safety
    /// The device ranges are memory of the stream's device (or mapped
    /// into its context) valid for `len` bytes; the host range is valid
    /// for `len` bytes until the stream has passed the copy (page-locked
    /// memory), or until the call returns (pageable memory, see
    /// [`StreamCopy`]); nothing else writes the destination meanwhile.
    ///
    /// # Errors
    /// [`KernelError::Driver`].
    pub unsafe fn copy(&self, stream: &Arc<CudaStream>, op: StreamCopy) -> Result<(), KernelError> {
        if op.is_empty() {
            return Ok(());
        }
        self.check_stream(stream)?;
        let s = stream.cu_stream();
        use cudarc::driver::sys;
        let r = match op {
            // SAFETY: the caller vouches for both ranges.
            StreamCopy::ToDevice { dst, src, len } => unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, s) },
            // SAFETY: as above.
            StreamCopy::ToHost { dst, src, len } => unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, s) },
            // SAFETY: as above.
            StreamCopy::OnDevice { dst, src, len } => unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, s) },
        };
        r.result().map_err(driver)
    }

    /// Enqueues `len` bytes of `byte` at `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` is device memory of the stream's device, writable for `len`
    /// bytes.
    ///
    /// # Errors
    /// [`KernelError::Driver`].
    pub unsafe fn fill(&self, stream: &Arc<CudaStream>, dst: u64, byte: u8, len: usize) -> Result<(), KernelError> {
        if len == 0 {
            return Ok(());
        }
        self.check_stream(stream)?;
        // SAFETY: the caller's contract; ordered on `stream`.
        unsafe { cudarc::driver::result::memset_d8_async(dst, byte, len, stream.cu_stream()) }.map_err(driver)
    }

    /// Checks that `stream` is of the kernels' context, and makes that
    /// context current on this thread (the raw memset and copies of the
    /// bucket steps need it; a thread of a pool may have none).
    fn check_stream(&self, stream: &Arc<CudaStream>) -> Result<(), KernelError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(KernelError::InvalidArgument("the stream belongs to another CUDA context than the loaded kernels".into()));
        }
        self.ctx.bind_to_thread().map_err(driver)
    }

    /// # Safety
    /// The addresses in `params` satisfy the public method's contract.
    unsafe fn launch_rows(&self, stream: &Arc<CudaStream>, plan: &LaunchPlan, params: RowParams) -> Result<(), KernelError> {
        self.check_stream(stream)?;
        if params.n_ids == 0 {
            return Ok(());
        }
        // SAFETY: forwarded.
        unsafe { self.launch(stream, plan, params) }
    }

    /// # Safety
    /// `params` is the parameter block of `plan.kernel`, with addresses that
    /// satisfy the public method's contract.
    unsafe fn launch<P: DeviceRepr>(&self, stream: &Arc<CudaStream>, plan: &LaunchPlan, params: P) -> Result<(), KernelError> {
        self.check_stream(stream)?;
        let f = self.functions.get(&plan.kernel).ok_or_else(|| KernelError::InvalidArgument(format!("no kernel named {}", plan.kernel)))?;
        let cfg = LaunchConfig { grid_dim: (plan.blocks, 1, 1), block_dim: (BLOCK_THREADS, 1, 1), shared_mem_bytes: plan.shared_bytes };
        let mut builder = stream.launch_builder(f);
        builder.arg(&params);
        // SAFETY: the kernel takes exactly one by-value parameter block of type P (see
        // source.rs); the grid is within limits (blocks <= 8 x SMs, 256 threads, shared
        // memory <= 32 KiB); the addresses inside are the caller's promise.
        unsafe { builder.launch(cfg) }.map_err(driver)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::cuda::CacheHit;

    fn image(arch: Arch, from: CacheHit) -> Compiled {
        Compiled { arch, format: ImageFormat::Cubin, image: Arc::from(&b"\x7fELF"[..]), kernels: 1, from }
    }

    const SM90: Arch = Arch::SM90;

    #[test]
    fn prebuilt_kernels_come_first_and_need_no_nvrtc() {
        let compiled = Cell::new(false);
        let got = load_first(
            SM90,
            |a| Some(image(a, CacheHit::Disk)),
            |_| {
                compiled.set(true);
                Err(KernelError::NoNvrtc("no NVRTC".into()))
            },
            |c| Ok(c.from),
        );
        assert_eq!(got, Ok(CacheHit::Disk));
        assert!(!compiled.get(), "NVRTC is not asked when the prebuilt image loads");
    }

    #[test]
    fn prebuilt_kernels_are_used_when_nvrtc_is_present_but_fails() {
        // NVRTC there but broken (too old, or its builtins library missing):
        // the prebuilt image still loads, whichever comes first.
        let broken = |a| Err(KernelError::Compile { arch: a, log: "libnvrtc-builtins.so.12.8 not found".into() });
        assert_eq!(load_first(SM90, |a| Some(image(a, CacheHit::Disk)), broken, |c| Ok(c.from)), Ok(CacheHit::Disk));
    }

    #[test]
    fn nvrtc_is_the_fallback_when_the_prebuilt_image_is_missing_or_refused() {
        let nvrtc = |a| Ok(image(a, CacheHit::Compiled));
        assert_eq!(load_first(SM90, |_| None, nvrtc, |c| Ok(c.from)), Ok(CacheHit::Compiled));
        let refuse_prebuilt = |c: Compiled| {
            if c.from == CacheHit::Disk { Err(KernelError::Driver("CUDA_ERROR_NO_BINARY_FOR_GPU".into())) } else { Ok(c.from) }
        };
        assert_eq!(load_first(SM90, |a| Some(image(a, CacheHit::Disk)), nvrtc, refuse_prebuilt), Ok(CacheHit::Compiled));
    }

    #[test]
    fn without_either_the_error_names_both() {
        let e = load_first(SM90, |_| None, |_| Err(KernelError::NoNvrtc(crate::cuda::NO_NVRTC.into())), |c| Ok(c.from)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, KernelError::NoNvrtc(_)), "{e:?}");
        assert!(text.contains("libnvrtc.so.12") && text.contains("no prebuilt kernels for sm_90"), "{text}");
        assert!(text.contains("wm-bench kernels --prebuild"), "{text}");
        let e = load_first(
            SM90,
            |a| Some(image(a, CacheHit::Disk)),
            |a| Err(KernelError::Compile { arch: a, log: "bad".into() }),
            |_| Err::<CacheHit, _>(KernelError::Driver("CUDA_ERROR_INVALID_IMAGE".into())),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("bad") && text.contains("did not load: CUDA driver: CUDA_ERROR_INVALID_IMAGE"), "{text}");
    }
}
