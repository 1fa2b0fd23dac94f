//! libfabric's exported functions, looked up at run time (`dlopen`), so a
//! binary built with the `fabric` feature starts — and says why libfabric
//! is unusable — where the library is missing, and so the library's
//! dependencies load only in processes that use it.
//!
//! Debian's libfabric pulls in `libpsm_infinipath`, whose load-time
//! constructor installs handlers for SIGINT, SIGTERM, SIGSEGV and others
//! (a process that links it exits 1 on SIGTERM instead of dying of it, and
//! loses Rust's stack-overflow report). Every signal's disposition is saved
//! before the library is opened and put back after.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::{fi_fabric_attr, fi_info, fid_fabric};

/// The exported functions, from the loaded library.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    /// `fi_getinfo`.
    pub fi_getinfo: unsafe extern "C" fn(u32, *const c_char, *const c_char, u64, *const fi_info, *mut *mut fi_info) -> c_int,
    /// `fi_freeinfo`.
    pub fi_freeinfo: unsafe extern "C" fn(*mut fi_info),
    /// `fi_dupinfo` (`fi_allocinfo` is `fi_dupinfo(NULL)`).
    pub fi_dupinfo: unsafe extern "C" fn(*const fi_info) -> *mut fi_info,
    /// `fi_fabric`.
    pub fi_fabric: unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int,
    /// `fi_strerror`.
    pub fi_strerror: unsafe extern "C" fn(c_int) -> *const c_char,
    /// `fi_version`.
    pub fi_version: unsafe extern "C" fn() -> u32,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The library's functions, loading it on first use.
///
/// # Errors
/// Why libfabric cannot be used here (not installed, a symbol missing).
pub fn api() -> Result<&'static Api, &'static str> {
    API.get_or_init(load).as_ref().map_err(String::as_str)
}

/// The last `dlerror`, in words.
fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until
    // the next dl call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() { "unknown error".to_owned() } else { unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned() }
}

fn load() -> Result<Api, String> {
    let mut saved: Vec<(c_int, libc::sigaction)> = Vec::new();
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: an all-zero sigaction is a valid value to be overwritten;
        // sigaction with a null new action only reads the current one.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0 {
            saved.push((sig, old));
        }
    }
    let mut handle = std::ptr::null_mut();
    let mut why = String::new();
    for name in [c"libfabric.so.1", c"libfabric.so"] {
        // SAFETY: a NUL-terminated name; dlopen runs the library's
        // constructors, whose signal handlers are undone below.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            break;
        }
        why = dlerror();
    }
    for (sig, old) in &saved {
        // SAFETY: `old` is what sigaction reported for `sig` before.
        unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
    }
    if handle.is_null() {
        return Err(format!("libfabric cannot be loaded ({why}): install it (Debian/Ubuntu: apt-get install libfabric1)"));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: `handle` is an open library; `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if p.is_null() { Err(format!("libfabric has no {}: {}", name.to_string_lossy(), dlerror())) } else { Ok(p) }
    };
    // SAFETY: each symbol is the libfabric function of that name, whose C
    // signature the pointer type spells out (rdma/fabric.h); the library
    // stays loaded for the life of the process (never dlclose'd).
    unsafe {
        Ok(Api {
            fi_getinfo: std::mem::transmute::<*mut c_void, _>(sym(c"fi_getinfo")?),
            fi_freeinfo: std::mem::transmute::<*mut c_void, _>(sym(c"fi_freeinfo")?),
            fi_dupinfo: std::mem::transmute::<*mut c_void, _>(sym(c"fi_dupinfo")?),
            fi_fabric: std::mem::transmute::<*mut c_void, _>(sym(c"fi_fabric")?),
            fi_strerror: std::mem::transmute::<*mut c_void, _>(sym(c"fi_strerror")?),
            fi_version: std::mem::transmute::<*mut c_void, _>(sym(c"fi_version")?),
        })
    }
}
