//! Compiling the kernels with NVRTC, and caching what it produced: in the
//! process (per architecture and format) and on disk (keyed by a hash of the
//! source, the options and the NVRTC version). A cache that cannot be read
//! or written is never an error; the kernels are compiled again.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::sys;

use super::{Arch, KernelError, NO_NVRTC, source};

/// What NVRTC produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// Machine code for one real architecture (`nvrtcGetCUBIN`).
    Cubin,
    /// PTX for a virtual architecture, compiled by the driver when loaded
    /// (used when NVRTC is older than the GPU).
    Ptx,
}

/// Where a [`Compiled`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// NVRTC compiled it just now.
    Compiled,
    /// This process had compiled it before.
    Memory,
    /// Read from the disk cache.
    Disk,
}

/// The compiled kernel module for one architecture.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The architecture it was compiled for.
    pub arch: Arch,
    /// CUBIN or PTX.
    pub format: ImageFormat,
    /// The image (PTX text ends with its NUL byte, as the driver expects).
    pub image: Arc<[u8]>,
    /// The number of kernels (entry points) in it.
    pub kernels: usize,
    /// Where it came from.
    pub from: CacheHit,
}

/// NVRTC's version, `(major, minor)`.
///
/// # Errors
/// [`KernelError::NoNvrtc`] when the library cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    ensure_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    guarded(|| {
        // SAFETY: both pointers are to live locals; the library is present.
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
    })?
    .result()
    .map_err(|e| KernelError::NoNvrtc(format!("nvrtcVersion failed: {e:?}")))?;
    Ok((major, minor))
}

/// Compiles every kernel to a CUBIN for `arch`, or takes it from the
/// process's or the disk cache (see [`cache_dir`]).
///
/// Options: `--gpu-architecture=sm_XX --std=c++17 -default-device` (no fast
/// math: conversions must round exactly as the CPU path does).
///
/// # Errors
/// [`KernelError::NoNvrtc`] without NVRTC; [`KernelError::Compile`] with
/// NVRTC's log when it refuses the source or does not know `arch`.
pub fn compile(arch: Arch) -> Result<Compiled, KernelError> {
    compile_as(arch, ImageFormat::Cubin)
}

/// Compiles every kernel for each architecture, bypassing both caches (so
/// a broken source or toolchain shows), and reports the number of kernels
/// or the error per architecture.
pub fn check(archs: &[Arch]) -> Vec<(Arch, Result<usize, KernelError>)> {
    archs.iter().map(|&a| (a, check_one(a))).collect()
}

/// One architecture of [`check`]: a warning is an error here, so the kernels
/// stay free of them (CI runs the check with NVRTC installed).
fn check_one(arch: Arch) -> Result<usize, KernelError> {
    let (_, warnings) = run_nvrtc(arch, ImageFormat::Cubin, &source::source())?;
    if !warnings.is_empty() {
        return Err(KernelError::Compile { arch, log: format!("compiled, but NVRTC warned (the check allows no warnings):\n{warnings}") });
    }
    Ok(source::entries().len())
}

/// The disk cache: `$WM_KERNEL_CACHE` (`off` disables it), else
/// `$XDG_CACHE_HOME/wholemem/kernels`, else `~/.cache/wholemem/kernels`.
/// `None` when disabled or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(v) = wm_topology::env::WM_KERNEL_CACHE.get() {
        return if v.eq_ignore_ascii_case("off") { None } else { Some(PathBuf::from(v)) };
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("wholemem").join("kernels"))
}

/// The architectures this NVRTC compiles for, ascending (`nvrtcGetSupportedArchs`).
pub(crate) fn supported_archs() -> Result<Vec<u32>, KernelError> {
    ensure_nvrtc()?;
    let mut n: c_int = 0;
    let failed = |e| KernelError::NoNvrtc(format!("nvrtcGetSupportedArchs failed: {e:?}"));
    // SAFETY: `n` is a live local.
    guarded(|| unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) })?.result().map_err(failed)?;
    let mut v: Vec<c_int> = vec![0; n.max(0) as usize];
    // SAFETY: `v` holds the `n` entries NVRTC writes.
    guarded(|| unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) })?.result().map_err(failed)?;
    let mut v: Vec<u32> = v.into_iter().map(|a| a as u32).collect();
    v.sort_unstable();
    Ok(v)
}

/// [`compile`] producing `format`; the PTX of a virtual architecture
/// `compute_XX` when `format` is [`ImageFormat::Ptx`].
pub(crate) fn compile_as(arch: Arch, format: ImageFormat) -> Result<Compiled, KernelError> {
    static MEMORY: OnceLock<Mutex<HashMap<(Arch, ImageFormat), Compiled>>> = OnceLock::new();
    let memory = MEMORY.get_or_init(Default::default);
    if let Some(c) = memory.lock().unwrap_or_else(|e| e.into_inner()).get(&(arch, format)) {
        return Ok(Compiled { from: CacheHit::Memory, ..c.clone() });
    }
    let (image, from) = compile_through_disk(arch, format, cache_dir().as_deref())?;
    let compiled = Compiled { arch, format, image: image.into(), kernels: source::entries().len(), from };
    memory.lock().unwrap_or_else(|e| e.into_inner()).insert((arch, format), compiled.clone());
    Ok(compiled)
}

/// The name of a prebuilt CUBIN for `arch`: keyed by the source and the
/// options only, not the NVRTC version, so a machine without NVRTC can find
/// it (`wm-bench kernels --prebuild DIR`, `scripts/gpu-bundle.sh`).
fn prebuilt_name(arch: Arch) -> String {
    let src = source::source();
    let key = cache_key(&src, &options(arch, ImageFormat::Cubin), (0, 0));
    format!("wm-kernels-sm_{}-{key:016x}.prebuilt.cubin", arch.number())
}

/// Compiles every kernel for `arch` into a CUBIN in `dir` that
/// [`Kernels::load`](super::Kernels::load) uses when NVRTC is missing (a
/// GPU machine without the NVRTC library). Returns the file.
///
/// # Errors
/// NVRTC's errors; writing the file.
pub fn prebuild(arch: Arch, dir: &Path) -> Result<PathBuf, KernelError> {
    ensure_nvrtc()?;
    let image = warned(arch, run_nvrtc(arch, ImageFormat::Cubin, &source::source())?);
    let file = dir.join(prebuilt_name(arch));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&file, &image))
        .map_err(|e| KernelError::InvalidArgument(format!("writing {}: {e}", file.display())))?;
    Ok(file)
}

/// A prebuilt CUBIN for exactly `arch` in the cache directory, for when
/// NVRTC cannot be loaded.
pub(crate) fn prebuilt(arch: Arch) -> Option<Compiled> {
    let file = cache_dir()?.join(prebuilt_name(arch));
    let image = read_cache(&file, ImageFormat::Cubin)?;
    Some(Compiled { arch, format: ImageFormat::Cubin, image: image.into(), kernels: source::entries().len(), from: CacheHit::Disk })
}

/// The image from the disk cache in `dir`, or compiled (and stored there).
fn compile_through_disk(arch: Arch, format: ImageFormat, dir: Option<&Path>) -> Result<(Vec<u8>, CacheHit), KernelError> {
    ensure_nvrtc()?;
    let src = source::source();
    let key = cache_key(&src, &options(arch, format), nvrtc_version()?);
    let file = dir.map(|d| d.join(cache_file_name(arch, format, key)));
    if let Some(image) = file.as_deref().and_then(|f| read_cache(f, format)) {
        return Ok((image, CacheHit::Disk));
    }
    let image = warned(arch, run_nvrtc(arch, format, &src)?);
    if let Some(f) = &file {
        write_cache(f, &image);
    }
    Ok((image, CacheHit::Compiled))
}

fn options(arch: Arch, format: ImageFormat) -> Vec<String> {
    let target = match format {
        ImageFormat::Cubin => format!("--gpu-architecture=sm_{}", arch.number()),
        ImageFormat::Ptx => format!("--gpu-architecture=compute_{}", arch.number()),
    };
    vec![target, "--std=c++17".into(), "-default-device".into()]
}

/// A stable 64-bit FNV-1a hash of everything that changes the image.
pub(crate) fn cache_key(src: &str, options: &[String], nvrtc: (i32, i32)) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(src.as_bytes());
    for o in options {
        eat(o.as_bytes());
    }
    eat(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h
}

fn cache_file_name(arch: Arch, format: ImageFormat, key: u64) -> String {
    match format {
        ImageFormat::Cubin => format!("wm-kernels-{arch}-{key:016x}.cubin"),
        ImageFormat::Ptx => format!("wm-kernels-compute_{}-{key:016x}.ptx", arch.number()),
    }
}

/// The cached image, if it is there and looks whole.
fn read_cache(file: &Path, format: ImageFormat) -> Option<Vec<u8>> {
    let image = std::fs::read(file).ok()?;
    let whole = match format {
        ImageFormat::Cubin => image.starts_with(b"\x7fELF"),
        ImageFormat::Ptx => image.last() == Some(&0) && image.windows(8).any(|w| w == b".version"),
    };
    whole.then_some(image)
}

/// Writes the image next to its final name and renames it into place, so a
/// concurrent reader (another rank) never sees half a file. Failures are ignored.
fn write_cache(file: &Path, image: &[u8]) {
    let Some(dir) = file.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Fails with [`KernelError::NoNvrtc`] unless libnvrtc can be loaded
/// (cudarc panics on the first call otherwise).
fn ensure_nvrtc() -> Result<(), KernelError> {
    // SAFETY: is_culib_present only tries to dlopen the library's candidate names.
    if unsafe { sys::is_culib_present() } { Ok(()) } else { Err(KernelError::NoNvrtc(NO_NVRTC.into())) }
}

/// Runs an NVRTC call, turning cudarc's panic for a symbol the loaded
/// library lacks (an NVRTC too old) into an error.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, KernelError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        KernelError::NoNvrtc(format!("NVRTC is unusable: {msg}"))
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed once, here.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

/// Compiles `src` once, with no cache.
/// The image of a compile whose warnings (if any) go to standard error: a
/// warning never stops a job, but it is not hidden (and `check` refuses it).
fn warned(arch: Arch, (image, warnings): (Vec<u8>, String)) -> Vec<u8> {
    if !warnings.is_empty() {
        eprintln!("wholemem: NVRTC warned while compiling the kernels for {arch}:\n{warnings}");
    }
    image
}

/// Compiles `src`: the image and NVRTC's warnings (empty when it had none).
fn run_nvrtc(arch: Arch, format: ImageFormat, src: &str) -> Result<(Vec<u8>, String), KernelError> {
    ensure_nvrtc()?;
    if format == ImageFormat::Cubin {
        let known = supported_archs()?;
        if !known.contains(&arch.number()) {
            let (major, minor) = nvrtc_version()?;
            let list: Vec<String> = known.iter().map(|a| format!("sm_{a}")).collect();
            return Err(KernelError::Compile {
                arch,
                log: format!("NVRTC {major}.{minor} does not compile for {arch}; it knows {}", list.join(", ")),
            });
        }
    }
    let opts = options(arch, format);
    guarded(|| compile_program(arch, format, src, &opts))?
}

fn compile_program(arch: Arch, format: ImageFormat, src: &str, opts: &[String]) -> Result<(Vec<u8>, String), KernelError> {
    let nvrtc_err = |what: &str, r: sys::nvrtcResult| KernelError::Compile { arch, log: format!("{what} failed: {}", error_string(r)) };
    let c_src = CString::new(src).map_err(|_| KernelError::Compile { arch, log: "the source contains a NUL byte".into() })?;
    let name = c"wholemem_kernels.cu";
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: the strings are NUL-terminated and outlive the call; no headers are passed (count 0, null arrays).
    let r = unsafe { sys::nvrtcCreateProgram(&mut prog, c_src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(nvrtc_err("nvrtcCreateProgram", r));
    }
    let prog = Program(prog);
    let c_opts: Vec<CString> = opts.iter().map(|o| CString::new(o.as_str()).expect("options have no NUL")).collect();
    let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `ptrs` holds `ptrs.len()` pointers to NUL-terminated strings that outlive the call.
    let r = unsafe { sys::nvrtcCompileProgram(prog.0, ptrs.len() as c_int, ptrs.as_ptr()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelError::Compile {
            arch,
            log: format!("{} with options {}\n{}", error_string(r), opts.join(" "), program_log(&prog).trim_end()),
        });
    }
    let mut size = 0usize;
    let mut image;
    match format {
        ImageFormat::Cubin => {
            // SAFETY: `size` is a live local; the program compiled.
            let r = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(nvrtc_err("nvrtcGetCUBINSize", r));
            }
            image = vec![0u8; size];
            // SAFETY: `image` holds the `size` bytes NVRTC writes.
            let r = unsafe { sys::nvrtcGetCUBIN(prog.0, image.as_mut_ptr().cast()) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(nvrtc_err("nvrtcGetCUBIN", r));
            }
        }
        ImageFormat::Ptx => {
            // SAFETY: as above.
            let r = unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(nvrtc_err("nvrtcGetPTXSize", r));
            }
            image = vec![0u8; size];
            // SAFETY: `image` holds the `size` bytes (the text and its NUL) NVRTC writes.
            let r = unsafe { sys::nvrtcGetPTX(prog.0, image.as_mut_ptr().cast()) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(nvrtc_err("nvrtcGetPTX", r));
            }
        }
    }
    if image.is_empty() {
        return Err(KernelError::Compile { arch, log: "NVRTC produced an empty image".into() });
    }
    Ok((image, program_log(&prog).trim().to_string()))
}

fn program_log(prog: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: `size` is a live local; the program exists.
    if unsafe { sys::nvrtcGetProgramLogSize(prog.0, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut log = vec![0u8; size];
    // SAFETY: `log` holds the `size` bytes NVRTC writes, NUL included.
    if unsafe { sys::nvrtcGetProgramLog(prog.0, log.as_mut_ptr().cast()) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    CStr::from_bytes_until_nul(&log).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn error_string(r: sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string (or null).
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: non-null, static and NUL-terminated per the NVRTC API.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_changes_with_source_options_and_version() {
        let o = options(Arch::SM90, ImageFormat::Cubin);
        let k = cache_key("src", &o, (12, 8));
        assert_eq!(k, cache_key("src", &o, (12, 8)), "stable");
        assert_ne!(k, cache_key("src ", &o, (12, 8)));
        assert_ne!(k, cache_key("src", &options(Arch::SM80, ImageFormat::Cubin), (12, 8)));
        assert_ne!(k, cache_key("src", &options(Arch::SM90, ImageFormat::Ptx), (12, 8)));
        assert_ne!(k, cache_key("src", &o, (12, 9)));
        assert_eq!(o, ["--gpu-architecture=sm_90", "--std=c++17", "-default-device"]);
        // A fixed value: the key must not depend on the Rust version (unlike DefaultHasher).
        assert_eq!(cache_key("", &[], (0, 0)), cache_key("", &[], (0, 0)));
        assert_eq!(format!("{:016x}", cache_key("a", &[], (1, 2))).len(), 16);
        assert_eq!(cache_file_name(Arch::SM80, ImageFormat::Cubin, 0xab), "wm-kernels-sm_80-00000000000000ab.cubin");
    }

    #[test]
    fn a_broken_cache_file_is_a_miss() {
        let dir = std::env::temp_dir().join(format!("wm-kernel-cache-test-{}", std::process::id()));
        let f = dir.join("x.cubin");
        assert_eq!(read_cache(&f, ImageFormat::Cubin), None, "missing");
        write_cache(&f, b"\x7fELF and the rest");
        assert_eq!(read_cache(&f, ImageFormat::Cubin).as_deref(), Some(&b"\x7fELF and the rest"[..]));
        write_cache(&f, b"garbage");
        assert_eq!(read_cache(&f, ImageFormat::Cubin), None, "not an ELF file");
        let p = dir.join("x.ptx");
        write_cache(&p, b"//\n.version 8.7\n\0");
        assert!(read_cache(&p, ImageFormat::Ptx).is_some());
        write_cache(&p, b"//\n.version 8.7\n");
        assert_eq!(read_cache(&p, ImageFormat::Ptx), None, "truncated");
        // An unwritable place is silently skipped.
        write_cache(Path::new("/proc/wm-kernels/x.cubin"), b"\x7fELF");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn kernels_compile_with_nvrtc_when_present() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            // NVRTC is not a GPU: this runs where the wheel is installed (CI),
            // and skips on GPU machines without it, WM_REQUIRE_GPU or not.
            assert!(matches!(compile(Arch::SM90), Err(KernelError::NoNvrtc(m)) if m == NO_NVRTC));
            println!("SKIP kernels_compile_with_nvrtc_when_present: {NO_NVRTC}");
            return;
        }
        let n = source::entries().len();
        for (arch, r) in check(&Arch::DEFAULT_CHECK) {
            assert_eq!(r, Ok(n), "{arch}");
        }
        // Through the caches: the second call is served from memory.
        let first = compile_as(Arch::SM90, ImageFormat::Cubin).unwrap();
        assert!(first.image.starts_with(b"\x7fELF"));
        assert_eq!(first.kernels, n);
        let again = compile(Arch::SM90).unwrap();
        assert_eq!((again.from, again.image.len()), (CacheHit::Memory, first.image.len()));
        // PTX for a virtual architecture names every entry point; the disk
        // cache serves it the second time.
        let dir = std::env::temp_dir().join(format!("wm-kernel-disk-cache-{}", std::process::id()));
        let (ptx, from) = compile_through_disk(Arch::SM80, ImageFormat::Ptx, Some(&dir)).unwrap();
        assert_eq!(from, CacheHit::Compiled);
        assert_eq!(compile_through_disk(Arch::SM80, ImageFormat::Ptx, Some(&dir)).unwrap(), (ptx.clone(), CacheHit::Disk));
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&ptx);
        for e in source::entries() {
            assert!(text.contains(&format!(".entry {}(", e.name())), "{} missing from the PTX", e.name());
        }
        // A broken source fails with NVRTC's log.
        let e = run_nvrtc(Arch::SM90, ImageFormat::Cubin, &(source::source() + "\nthis is not C++;\n")).unwrap_err();
        assert!(matches!(&e, KernelError::Compile { arch, log } if *arch == Arch::SM90 && log.contains("this")), "{e}");
    }

    /// Issue 30, item 9: the kernels compiled with warnings nobody saw. The
    /// check now treats NVRTC's log of a successful compile as an error; the
    /// kernels themselves compile without one.
    #[test]
    fn kernel_warnings_are_seen_and_the_kernels_have_none() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            println!("SKIP kernel_warnings_are_seen_and_the_kernels_have_none: {NO_NVRTC}");
            return;
        }
        for arch in Arch::DEFAULT_CHECK {
            let (_, warnings) = run_nvrtc(arch, ImageFormat::Cubin, &source::source()).unwrap();
            assert_eq!(warnings, "", "{arch}");
        }
        // A source that warns (a variable never used) compiles, and says so.
        let warning = source::source() + "\n__global__ void wm_warns() { int declared_but_never_used; }\n";
        let (image, warnings) = run_nvrtc(Arch::SM90, ImageFormat::Cubin, &warning).unwrap();
        assert!(image.starts_with(b"\x7fELF") && warnings.contains("declared_but_never_used"), "{warnings}");
    }
}
