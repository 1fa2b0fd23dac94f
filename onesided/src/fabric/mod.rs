//! libfabric RMA reads (feature `fabric`): the safe layer over
//! `wm-fabric-sys`, and the only unsafe code of the transport.
//!
//! - **Owner.** Each rank opens a reliable-datagram endpoint of the chosen
//!   provider (`WM_FABRIC_PROVIDER`, else `FI_PROVIDER`, else `tcp`),
//!   registers its rows once for remote reads, and publishes its address,
//!   the key and the remote address of its first row in the table record.
//!   A thread drives the endpoint's progress (`fi_cq_sread` with a short
//!   timeout): providers with manual progress (tcp, shm) answer reads only
//!   while someone on the owner's side calls into them — that thread, not
//!   the rank.
//! - **Reader.** One fabric and domain per reader (`FI_THREAD_SAFE`), the
//!   owners' addresses in one address vector, and an endpoint per thread
//!   reading at a time (a pool). A call groups each owner's rows into
//!   operations of up to `rma_iov_limit` rows (`fi_readmsg`: each remote
//!   row to its place in the output), posts every operation before waiting
//!   for any, and reaps the completions. The output is registered for the
//!   call unless it lies in a buffer from
//!   [`Reader::register_recv`](crate::Reader::register_recv) (the profile
//!   counts those registrations as misses).
//!
//! Memory safety across the library boundary: a posted read writes into
//! the output until it completes, so a call never returns with reads in
//! flight — after an error it waits for every posted read to complete (or
//! fail), and past the timeout it closes the endpoint, which ends them.

//!
//! This file is the raw layer (the library's functions, `fi_info`, fabric
//! and domain, endpoints, registrations); `owner.rs` and `reader.rs` build
//! the two sides on it.

use std::ffi::{CStr, CString, c_void};
use std::ptr;

use wholemem::CommonError;
use wm_fabric_sys as fi;

use crate::{Error, Result};

mod owner;
mod reader;

pub(crate) use owner::Owner;
pub(crate) use reader::FabricTransport;

/// The libfabric API version asked for.
const API: u32 = fi::fi_version_num(1, 10);
/// Completions reaped per call.
const REAP: usize = 64;

/// libfabric's exported functions, loaded on first use.
fn api() -> Result<&'static fi::Api> {
    fi::api().map_err(|why| Error::Unsupported { what: "libfabric reads".into(), reason: why.to_owned() })
}

/// libfabric's words for an error code (negative or positive).
fn strerror(code: isize) -> String {
    let c = i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX);
    let Ok(api) = fi::api() else { return format!("error {code}") };
    // SAFETY: fi_strerror returns a static NUL-terminated string for any code.
    let s = unsafe { (api.fi_strerror)(c) };
    if s.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    format!("{} ({code})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
}

fn check(call: &'static str, ret: isize) -> Result<()> {
    if ret < 0 { Err(Error::Fabric { call, detail: strerror(ret) }) } else { Ok(()) }
}

/// The provider asked for: `WM_FABRIC_PROVIDER`, else the first of
/// `FI_PROVIDER`, else `tcp`.
pub(crate) fn provider() -> String {
    if let Some(p) = wm_topology::env::WM_FABRIC_PROVIDER.get() {
        return p.trim().to_owned();
    }
    match std::env::var("FI_PROVIDER") {
        Ok(p) if !p.trim().is_empty() => p.split(',').next().unwrap_or("tcp").trim().to_owned(),
        _ => "tcp".to_owned(),
    }
}

/// Whether the environment names a provider (then automatic choice takes
/// libfabric across nodes).
pub(crate) fn provider_named() -> bool {
    wm_topology::env::WM_FABRIC_PROVIDER.get().is_some() || std::env::var("FI_PROVIDER").is_ok_and(|p| !p.trim().is_empty())
}

/// An `fi_info` list this process owns.
struct Info(*mut fi::fi_info, &'static fi::Api);

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo (or fi_dupinfo) and is
        // freed once.
        unsafe { (self.1.fi_freeinfo)(self.0) };
    }
}

/// The first provider matching `provider` for RMA reads on a
/// reliable-datagram endpoint; `node` (with `FI_SOURCE`) is the local
/// address to use, where the provider takes one.
fn getinfo(provider: &str, node: Option<&str>) -> Result<Info> {
    let api = api()?;
    let name = CString::new(provider).map_err(|_| Error::Common(CommonError::InvalidArgument(format!("provider name {provider:?}"))))?;
    let node_c = node.map(CString::new).transpose().map_err(|_| Error::Common(CommonError::InvalidArgument("address".into())))?;
    // SAFETY: fi_dupinfo(NULL) (what fi_allocinfo is) returns a zeroed info
    // with its attribute structs allocated, or null; every field written
    // below belongs to it, and `prov_name` is a malloc'ed copy that
    // fi_freeinfo releases.
    unsafe {
        let hints = (api.fi_dupinfo)(ptr::null());
        if hints.is_null() {
            return Err(Error::Fabric { call: "fi_allocinfo", detail: "out of memory".into() });
        }
        let hints = Info(hints, api);
        let h = &mut *hints.0;
        (*h.ep_attr).type_ = fi::fi_ep_type_FI_EP_RDM;
        h.caps = u64::from(fi::FI_RMA | fi::FI_READ | fi::FI_REMOTE_READ);
        h.mode = fi::FI_CONTEXT | fi::FI_CONTEXT2;
        let d = &mut *h.domain_attr;
        d.mr_mode = (fi::FI_MR_LOCAL | fi::FI_MR_VIRT_ADDR | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY) as i32;
        d.threading = fi::fi_threading_FI_THREAD_SAFE;
        d.av_type = fi::fi_av_type_FI_AV_TABLE;
        (*h.fabric_attr).prov_name = libc::strdup(name.as_ptr());
        let mut info = ptr::null_mut();
        let flags = if node.is_some() { fi::FI_SOURCE } else { 0 };
        let r = (api.fi_getinfo)(API, node_c.as_ref().map_or(ptr::null(), |c| c.as_ptr()), ptr::null(), flags, hints.0, &mut info);
        if r != 0 || info.is_null() {
            return Err(Error::Fabric {
                call: "fi_getinfo",
                detail: format!("no provider {provider:?} offers RMA reads on a reliable-datagram endpoint here: {}", strerror(r as isize)),
            });
        }
        Ok(Info(info, api))
    }
}

/// An open fabric, domain and address vector, and what the provider said.
struct Fabric {
    fabric: *mut fi::fid_fabric,
    domain: *mut fi::fid_domain,
    av: *mut fi::fid_av,
    info: Info,
    mr_mode: u32,
    /// Rows per operation: the smaller of the local and remote iovec limits.
    per_op: usize,
    /// Operations the transmit queue holds.
    tx_size: usize,
    provider: String,
}

// SAFETY: the domain is opened FI_THREAD_SAFE (or used under the pool's
// discipline of one endpoint per thread); the handles are plain pointers
// libfabric allows any thread to use.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once, children (endpoints, MRs)
        // closed before by their owners' drops.
        unsafe {
            if !self.av.is_null() {
                fi::fi_close(&mut (*self.av).fid);
            }
            if !self.domain.is_null() {
                fi::fi_close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                fi::fi_close(&mut (*self.fabric).fid);
            }
        }
    }
}

impl Fabric {
    fn open(provider: &str, node: Option<&str>) -> Result<Self> {
        let info = getinfo(provider, node)?;
        let mut f = Fabric {
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            av: ptr::null_mut(),
            info,
            mr_mode: 0,
            per_op: 1,
            tx_size: 1,
            provider: String::new(),
        };
        // SAFETY: `info.0` is a valid fi_info from fi_getinfo; the out
        // pointers are this struct's fields, closed in Drop if set.
        unsafe {
            let i = &*f.info.0;
            check("fi_fabric", (f.info.1.fi_fabric)(i.fabric_attr, &mut f.fabric, ptr::null_mut()) as isize)?;
            check("fi_domain", fi::fi_domain(f.fabric, f.info.0, &mut f.domain, ptr::null_mut()) as isize)?;
            let mut av_attr = fi::fi_av_attr { type_: fi::fi_av_type_FI_AV_TABLE, ..Default::default() };
            check("fi_av_open", fi::fi_av_open(f.domain, &mut av_attr, &mut f.av, ptr::null_mut()) as isize)?;
            f.mr_mode = (*i.domain_attr).mr_mode as u32;
            let tx = &*i.tx_attr;
            f.per_op = tx.iov_limit.min(tx.rma_iov_limit).clamp(1, 64);
            f.tx_size = tx.size.clamp(1, 1 << 16);
            let p = (*i.fabric_attr).prov_name;
            f.provider = if p.is_null() { provider.to_owned() } else { CStr::from_ptr(p).to_string_lossy().into_owned() };
        }
        Ok(f)
    }

    fn virt_addr(&self) -> bool {
        self.mr_mode & fi::FI_MR_VIRT_ADDR != 0
    }

    fn prov_key(&self) -> bool {
        self.mr_mode & fi::FI_MR_PROV_KEY != 0
    }
}

/// An endpoint with its completion queue.
struct Endpoint {
    ep: *mut fi::fid_ep,
    cq: *mut fi::fid_cq,
}

// SAFETY: an endpoint is used by one thread at a time (the owner's
// progress thread, or the reader thread that took it from the pool).
unsafe impl Send for Endpoint {}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: opened by `open`; closing the endpoint ends its
        // operations before its queue goes.
        unsafe {
            if !self.ep.is_null() {
                fi::fi_close(&mut (*self.ep).fid);
            }
            if !self.cq.is_null() {
                fi::fi_close(&mut (*self.cq).fid);
            }
        }
    }
}

impl Endpoint {
    /// An enabled endpoint on `f`'s domain and address vector; `wait`
    /// gives its queue a wait object (for `fi_cq_sread`).
    fn open(f: &Fabric, wait: bool) -> Result<Self> {
        let mut e = Endpoint { ep: ptr::null_mut(), cq: ptr::null_mut() };
        let mut attr = fi::fi_cq_attr {
            size: f.tx_size.max(REAP) * 2,
            format: fi::fi_cq_format_FI_CQ_FORMAT_CONTEXT,
            wait_obj: if wait { fi::fi_wait_obj_FI_WAIT_UNSPEC } else { fi::fi_wait_obj_FI_WAIT_NONE },
            ..Default::default()
        };
        // SAFETY: `f` holds an open domain and av and its info; the out
        // pointers are `e`'s fields, closed in Drop if set.
        unsafe {
            check("fi_cq_open", fi::fi_cq_open(f.domain, &mut attr, &mut e.cq, ptr::null_mut()) as isize)?;
            check("fi_endpoint", fi::fi_endpoint(f.domain, f.info.0, &mut e.ep, ptr::null_mut()) as isize)?;
            check("fi_ep_bind (cq)", fi::fi_ep_bind(e.ep, &mut (*e.cq).fid, u64::from(fi::FI_TRANSMIT | fi::FI_RECV)) as isize)?;
            check("fi_ep_bind (av)", fi::fi_ep_bind(e.ep, &mut (*f.av).fid, 0) as isize)?;
            check("fi_enable", fi::fi_enable(e.ep) as isize)?;
        }
        Ok(e)
    }

    /// The endpoint's address, as peers insert it.
    fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 512];
        let mut len = buf.len();
        // SAFETY: `buf` is writable for `len` bytes; the endpoint is open.
        let r = unsafe { fi::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr().cast(), &mut len) };
        check("fi_getname", r as isize)?;
        buf.truncate(len.min(512));
        Ok(buf)
    }

    /// Reaps up to [`REAP`] completions, pushing onto `done` the context
    /// each operation was posted with. An error entry completes its
    /// operation too: its context is pushed (when the entry could be read)
    /// before the error is returned.
    fn reap(&self, what: &str, done: &mut Vec<usize>) -> Result<()> {
        let mut entries = [fi::fi_cq_entry::default(); REAP];
        // SAFETY: the queue is open and of the context format; `entries`
        // holds REAP of them.
        let r = unsafe { fi::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), REAP) };
        if r >= 0 {
            done.extend(entries[..(r as usize).min(REAP)].iter().map(|e| e.op_context as usize));
            return Ok(());
        }
        if r == -(fi::FI_EAGAIN as isize) {
            return Ok(());
        }
        if r == -(fi::FI_EAVAIL as isize) {
            let mut err = fi::fi_cq_err_entry::default();
            // SAFETY: an error entry is available; `err` is a valid buffer.
            let n = unsafe { fi::fi_cq_readerr(self.cq, &mut err, 0) };
            let mut text = [0 as std::ffi::c_char; 256];
            if n > 0 {
                done.push(err.op_context as usize);
            }
            let detail = if n > 0 {
                // SAFETY: the entry came from this queue; `text` is
                // writable for its length.
                let s = unsafe { fi::fi_cq_strerror(self.cq, err.prov_errno, err.err_data, text.as_mut_ptr(), text.len()) };
                let prov = if s.is_null() {
                    String::new()
                } else {
                    // SAFETY: non-null, NUL-terminated, in `text` or static.
                    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
                };
                format!("{what}: {} ({prov})", strerror(err.err as isize))
            } else {
                format!("{what}: an error completion that could not be read ({})", strerror(n))
            };
            return Err(Error::Fabric { call: "fi_cq_read", detail });
        }
        Err(Error::Fabric { call: "fi_cq_read", detail: format!("{what}: {}", strerror(r)) })
    }
}

/// A memory registration.
struct Mr(*mut fi::fid_mr);

// SAFETY: a registration is a handle; its descriptor and key are read
// from any thread, and it is closed once.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, closed once.
        unsafe { fi::fi_close(&mut (*self.0).fid) };
    }
}

impl Mr {
    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// The memory stays mapped until the registration is dropped.
    unsafe fn register(f: &Fabric, ptr: *const u8, len: usize, access: u32, key: u64) -> Result<Self> {
        let mut mr = ptr::null_mut();
        // SAFETY: the caller keeps the memory mapped for the registration's
        // life; the domain is open.
        let r = unsafe { fi::fi_mr_reg(f.domain, ptr.cast(), len, u64::from(access), 0, key, 0, &mut mr, ptr::null_mut()) };
        check("fi_mr_reg", r as isize)?;
        Ok(Mr(mr))
    }

    fn desc(&self) -> *mut c_void {
        // SAFETY: the registration is open.
        unsafe { fi::fi_mr_desc(self.0) }
    }

    fn key(&self) -> u64 {
        // SAFETY: the registration is open.
        unsafe { fi::fi_mr_key(self.0) }
    }
}
