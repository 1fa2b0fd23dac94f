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

use std::ffi::{CStr, CString, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wm_fabric_sys as fi;
use wm_gather::RowLayout;
use wm_gather::rows::{RowSource, gather_from};

use crate::profile::{Counters, Span, timed};
use crate::reader::Origin;
use crate::record::{Checked, FabricRecord, TableRecord, hex, unhex};
use crate::shm::OwnerRows;
use crate::transport::{ReadRequest, Registration, Transport};
use crate::{Error, Method, Result};

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
    let name = CString::new(provider).map_err(|_| Error::InvalidArgument(format!("provider name {provider:?}")))?;
    let node_c = node.map(CString::new).transpose().map_err(|_| Error::InvalidArgument("address".into()))?;
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

    /// Reaps up to [`REAP`] completions: how many, or an error entry.
    fn reap(&self, what: &str) -> Result<usize> {
        let mut entries = [fi::fi_cq_entry::default(); REAP];
        // SAFETY: the queue is open and of the context format; `entries`
        // holds REAP of them.
        let r = unsafe { fi::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), REAP) };
        if r >= 0 {
            return Ok(r as usize);
        }
        if r == -(fi::FI_EAGAIN as isize) {
            return Ok(0);
        }
        if r == -(fi::FI_EAVAIL as isize) {
            let mut err = fi::fi_cq_err_entry::default();
            // SAFETY: an error entry is available; `err` is a valid buffer.
            let n = unsafe { fi::fi_cq_readerr(self.cq, &mut err, 0) };
            let mut text = [0 as std::ffi::c_char; 256];
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

// ---------------------------------------------------------------- owner

/// A rank's rows registered for remote reads, and the thread that drives
/// its endpoint.
#[derive(Debug)]
pub(crate) struct Owner {
    record: FabricRecord,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the progress thread holds (dropped there, after the loop).
struct Serving {
    // Field order is drop order: the registration, the endpoint, the
    // fabric, then the rows.
    _mr: Mr,
    ep: Endpoint,
    _fabric: Fabric,
    _rows: Arc<OwnerRows>,
}

impl std::fmt::Debug for Serving {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Serving")
    }
}

impl Owner {
    /// Registers `rows` for remote reads when the method asks for
    /// libfabric (named, or automatic with a provider named); `None`
    /// otherwise or for a rank without rows.
    pub(crate) fn for_table(method: Option<Method>, rows: &Arc<OwnerRows>, ip: std::net::IpAddr) -> Result<Option<Self>> {
        let wanted = method == Some(Method::Fabric) || (method.is_none() && provider_named());
        if !wanted || rows.bytes() == 0 {
            return Ok(None);
        }
        let provider = provider();
        let node = (!provider.starts_with("shm")).then(|| ip.to_string());
        let fabric = Fabric::open(&provider, node.as_deref())?;
        let ep = Endpoint::open(&fabric, true)?;
        // SAFETY: `rows` is kept alive (read-only mapped) by `Serving`,
        // which drops the registration first.
        let mr = unsafe { Mr::register(&fabric, rows.first_row(), rows.bytes(), fi::FI_REMOTE_READ, 0) }?;
        let record = FabricRecord {
            provider: fabric.provider.clone(),
            addr: hex(&ep.name()?),
            key: if fabric.prov_key() { mr.key() } else { 0 },
            base: if fabric.virt_addr() { rows.first_row() as u64 } else { 0 },
        };
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving { _mr: mr, ep, _fabric: fabric, _rows: rows.clone() };
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wm-onesided-fabric".into())
            .spawn(move || progress(&serving, &s2))
            .map_err(|e| Error::io("starting the libfabric progress thread", e))?;
        Ok(Some(Self { record, stop, thread: Some(thread) }))
    }

    /// What readers need to reach these rows.
    pub(crate) fn record(&self) -> FabricRecord {
        self.record.clone()
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Drives the owner's endpoint until told to stop: providers with manual
/// progress answer remote reads only inside such calls.
fn progress(s: &Serving, stop: &AtomicBool) {
    let mut entry = fi::fi_cq_entry::default();
    let mut blocking = true;
    while !stop.load(Ordering::Acquire) {
        if blocking {
            // SAFETY: the queue is open (with a wait object) while `s` lives.
            let r = unsafe { fi::fi_cq_sread(s.ep.cq, (&raw mut entry).cast(), 1, ptr::null(), 100) };
            if r == -(fi::FI_ENOSYS as isize) {
                blocking = false;
            }
        } else {
            let _ = s.ep.reap("progress");
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

// ---------------------------------------------------------------- reader

/// One owner as a reader reaches it.
#[derive(Debug, Clone, Copy)]
struct Remote {
    addr: fi::fi_addr_t,
    base: u64,
    key: u64,
}

/// A destination buffer registered once.
#[derive(Debug, Clone, Copy)]
struct Registered {
    start: usize,
    len: usize,
    desc: usize,
    id: u64,
}

struct Shared {
    fabric: Fabric,
    recv: Mutex<Vec<Registered>>,
    next: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// A key no other registration of this domain has (providers without
    /// `FI_MR_PROV_KEY` take the key asked for, and refuse a repeat).
    fn key(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fabric({})", self.fabric.provider)
    }
}

/// An endpoint a reader thread uses, with its staging buffer.
struct Ctx {
    ep: Endpoint,
    /// A staging buffer and its registration (dropped first: tuple order).
    staging: Option<(Mr, Vec<u8>)>,
}

/// The libfabric transport of one reader (shared by its clones).
pub(crate) struct FabricTransport {
    table: String,
    // Field order is drop order: endpoints before the domain.
    pool: Mutex<Vec<Ctx>>,
    shared: Arc<Shared>,
    owners: Vec<Option<Remote>>,
    first: Vec<usize>,
    row_bytes: usize,
    timeout: Duration,
}

impl std::fmt::Debug for FabricTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FabricTransport({:?}, {})", self.table, self.shared.fabric.provider)
    }
}

impl FabricTransport {
    /// Opens a fabric of the owners' provider and inserts the addresses of
    /// the owners whose rows come this way.
    pub(crate) fn new(record: &TableRecord, c: &Checked, first: &[usize], methods: &[Method], origin: &Origin) -> Result<Self> {
        let routed: Vec<usize> = (0..methods.len()).filter(|&r| methods[r] == Method::Fabric && c.partition.count(r) > 0).collect();
        let provider = routed
            .iter()
            .find_map(|&r| record.owners[r].fabric.as_ref().map(|f| f.provider.clone()))
            .ok_or_else(|| Error::InvalidArgument("no owner registered its rows with libfabric".into()))?;
        if let Some(&r) = routed.iter().find(|&&r| record.owners[r].fabric.as_ref().is_none_or(|f| f.provider != provider)) {
            return Err(Error::Unsupported {
                what: format!("libfabric reads of table {:?}", record.name),
                reason: format!("rank {} registered its rows with another provider than {provider:?}", record.owners[r].rank),
            });
        }
        let ip = wm_comm::Rendezvous::advertised_ip(None)?;
        let node = (!provider.starts_with("shm")).then(|| ip.to_string());
        let fabric = Fabric::open(&provider, node.as_deref())?;
        let mut owners = vec![None; methods.len()];
        for &r in &routed {
            let o = &record.owners[r];
            let f = o.fabric.as_ref().ok_or_else(|| Error::InvalidArgument("no libfabric record".into()))?;
            let bytes = unhex(&f.addr)
                .ok_or_else(|| Error::Malformed { from: format!("rank {}", o.rank), detail: "its libfabric address".into() })?;
            let mut addr: fi::fi_addr_t = 0;
            // SAFETY: the av is open; `bytes` holds one address of the
            // provider's format (as fi_getname gave it; a wrong one is
            // refused by the provider); `addr` receives one entry.
            let n = unsafe { fi::fi_av_insert(fabric.av, bytes.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
            if n != 1 {
                return Err(Error::Fabric { call: "fi_av_insert", detail: format!("rank {}'s address: {}", o.rank, strerror(n as isize)) });
            }
            owners[r] = Some(Remote { addr, base: f.base, key: f.key });
        }
        Ok(Self {
            table: record.name.clone(),
            pool: Mutex::new(Vec::new()),
            shared: Arc::new(Shared { fabric, recv: Mutex::new(Vec::new()), next: Default::default() }),
            owners,
            first: first.to_vec(),
            row_bytes: c.row_bytes,
            timeout: origin.id.timeout,
        })
    }

    fn take(&self) -> Result<Ctx> {
        let idle = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(c) => Ok(c),
            None => Ok(Ctx { ep: Endpoint::open(&self.shared.fabric, false)?, staging: None }),
        }
    }

    /// The registration covering `len` bytes at `start`, if one does.
    fn registered(&self, start: usize, len: usize) -> Option<usize> {
        let regs = self.shared.recv.lock().unwrap_or_else(|p| p.into_inner());
        regs.iter().find(|r| r.start <= start && start + len <= r.start + r.len).map(|r| r.desc)
    }
}

/// A buffer registered with a reader's fabric; undone on drop.
struct Recv {
    // Field order is drop order: the registration before the domain.
    _mr: Mr,
    shared: Arc<Shared>,
    id: u64,
}

impl std::fmt::Debug for Recv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recv({})", self.id)
    }
}

impl Drop for Recv {
    fn drop(&mut self) {
        self.shared.recv.lock().unwrap_or_else(|p| p.into_inner()).retain(|r| r.id != self.id);
    }
}

impl Registration for Recv {}

/// One call's operations, with everything they point at: kept at fixed
/// addresses until every operation has completed.
struct Ops {
    iov: Vec<fi::iovec>,
    desc: Vec<*mut c_void>,
    rma: Vec<fi::fi_rma_iov>,
    ctx: Vec<fi::fi_context2>,
    msgs: Vec<fi::fi_msg_rma>,
}

impl Transport for FabricTransport {
    fn method(&self) -> Method {
        Method::Fabric
    }

    fn register(&self, buf: &mut [u8]) -> Result<Option<Box<dyn Registration>>> {
        if buf.is_empty() {
            return Ok(None);
        }
        let id = self.shared.key();
        // SAFETY: the RecvBuffer that owns `buf` drops this registration
        // before its memory (see `RecvBuffer`).
        let mr = unsafe { Mr::register(&self.shared.fabric, buf.as_ptr(), buf.len(), fi::FI_READ, id) }?;
        let r = Registered { start: buf.as_ptr() as usize, len: buf.len(), desc: mr.desc() as usize, id };
        self.shared.recv.lock().unwrap_or_else(|p| p.into_inner()).push(r);
        Ok(Some(Box::new(Recv { _mr: mr, shared: self.shared.clone(), id })))
    }

    fn read(&self, req: &mut ReadRequest<'_>, profile: Option<&Counters>) -> Result<()> {
        let n = req.rows.len();
        if n == 0 {
            return Ok(());
        }
        let mut ctx = timed(profile, Span::LockWait, || self.take())?;
        let (skip, len) = (req.layout.skip_bytes(), req.layout.bytes());
        let direct = req.out_dtype == req.layout.dtype();
        // Where the rows land: the output itself, or the staging buffer
        // (registered with it, once per size).
        let (dest, desc, _call_mr): (*mut u8, *mut c_void, Option<Mr>) = if direct {
            let out = &mut *req.out;
            match self.registered(out.as_ptr() as usize, out.len()) {
                Some(d) => (out.as_mut_ptr(), d as *mut c_void, None),
                None => {
                    let t = std::time::Instant::now();
                    // SAFETY: `out` outlives the call, and the call waits
                    // for every read before it returns (and drops this).
                    let mr = unsafe { Mr::register(&self.shared.fabric, out.as_ptr(), out.len(), fi::FI_READ, self.shared.key()) };
                    if let Some(p) = profile {
                        p.add(Span::Mr, t);
                        p.miss();
                    }
                    let mr = mr?;
                    (out.as_mut_ptr(), mr.desc(), Some(mr))
                }
            }
        } else {
            let need = n * len;
            if ctx.staging.as_ref().is_none_or(|(_, b)| b.len() < need) {
                ctx.staging = None;
                let mut b = vec![0u8; need.next_power_of_two()];
                let t = std::time::Instant::now();
                // SAFETY: the buffer lives in `ctx.staging` beside its
                // registration, which is dropped before it (tuple order).
                let mr = unsafe { Mr::register(&self.shared.fabric, b.as_mut_ptr(), b.len(), fi::FI_READ, self.shared.key()) };
                if let Some(p) = profile {
                    p.add(Span::Mr, t);
                }
                ctx.staging = Some((mr?, b));
            }
            let (mr, b) = ctx.staging.as_mut().ok_or_else(|| Error::InvalidArgument("no staging buffer".into()))?;
            (b.as_mut_ptr(), mr.desc(), None)
        };
        // Where row k of the request lands.
        let out_row = if direct { len } else { 0 };
        let place = |k: usize| -> *mut u8 {
            if direct { dest.wrapping_add(req.slots.map_or(k, |s| s[k]) * out_row) } else { dest.wrapping_add(k * len) }
        };
        // Each owner's rows in request order, in operations of `per_op`.
        let per_op = self.shared.fabric.per_op;
        let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); self.owners.len()];
        for (k, &o) in req.owners.iter().enumerate() {
            by_owner[o].push(k);
        }
        let ops_count: usize = by_owner.iter().map(|v| v.len().div_ceil(per_op)).sum();
        let mut ops = Ops {
            iov: Vec::with_capacity(n),
            desc: vec![desc; n],
            rma: Vec::with_capacity(n),
            ctx: vec![fi::fi_context2::default(); ops_count],
            msgs: Vec::with_capacity(ops_count),
        };
        let mut spans: Vec<(usize, usize, fi::fi_addr_t)> = Vec::with_capacity(ops_count);
        for (o, ks) in by_owner.iter().enumerate() {
            if ks.is_empty() {
                continue;
            }
            let r = self.owners[o]
                .ok_or_else(|| Error::InvalidArgument(format!("rows of owner {o} routed to libfabric, which does not reach it")))?;
            for chunk in ks.chunks(per_op) {
                let at = ops.iov.len();
                for &k in chunk {
                    let local = req.rows[k] - self.first[o];
                    ops.iov.push(fi::iovec { iov_base: place(k).cast(), iov_len: len });
                    ops.rma.push(fi::fi_rma_iov { addr: r.base + (local * self.row_bytes + skip) as u64, len, key: r.key });
                }
                spans.push((at, chunk.len(), r.addr));
            }
        }
        for (i, &(at, count, addr)) in spans.iter().enumerate() {
            let context = (&raw mut ops.ctx[i]).cast();
            ops.msgs.push(fi::fi_msg_rma {
                msg_iov: ops.iov[at..].as_ptr(),
                desc: ops.desc[at..].as_mut_ptr(),
                iov_count: count,
                addr,
                rma_iov: ops.rma[at..].as_ptr(),
                rma_iov_count: count,
                context,
                data: 0,
            });
        }
        let (failed, in_flight) = self.post_and_wait(&ctx.ep, &ops, profile);
        match failed {
            None => {}
            Some(e) => {
                if in_flight {
                    // Closing the endpoint ends its reads: nothing writes
                    // into the output after this call returns.
                    drop(ctx);
                } else {
                    self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(ctx);
                }
                return Err(e);
            }
        }
        if !direct {
            let staged = ctx.staging.as_ref().map(|(_, b)| &b[..n * len]).unwrap_or_default();
            let src = RowSource::from_slice(staged, len)?;
            let order: Vec<usize> = (0..n).collect();
            let layout = RowLayout::new(req.layout.dtype(), req.layout.cols(), 0)?;
            let slots: Vec<usize> = (0..n).map(|k| req.slots.map_or(k, |s| s[k])).collect();
            timed(profile, Span::Copy, || gather_from(&src, &layout, &order, Some(&slots), req.out, req.out_dtype, 1))?;
        }
        self.pool.lock().unwrap_or_else(|p| p.into_inner()).push(ctx);
        Ok(())
    }
}

impl FabricTransport {
    /// Posts every operation, reaping completions whenever the queue is
    /// full, then waits for the rest. Returns the first error, and whether
    /// reads may still be in flight (then the endpoint must be closed).
    fn post_and_wait(&self, ep: &Endpoint, ops: &Ops, profile: Option<&Counters>) -> (Option<Error>, bool) {
        let deadline = Instant::now() + self.timeout;
        let total = ops.msgs.len();
        let (mut posted, mut done) = (0usize, 0usize);
        let mut first_err: Option<Error> = None;
        let t = Instant::now();
        while posted < total && first_err.is_none() {
            // SAFETY: the message and everything it points at (`ops`, the
            // destination registered or staged) stay in place until its
            // completion is reaped below; the endpoint is this thread's.
            let r = unsafe { fi::fi_readmsg(ep.ep, &ops.msgs[posted], 0) };
            if r == 0 {
                posted += 1;
            } else if r == -(fi::FI_EAGAIN as isize) {
                match ep.reap("reading rows") {
                    Ok(k) => done += k,
                    Err(e) => first_err = Some(e),
                }
                if Instant::now() > deadline {
                    first_err.get_or_insert(Error::Timeout {
                        what: format!("posting libfabric reads of table {:?}", self.table),
                        secs: self.timeout.as_secs_f64(),
                    });
                }
            } else {
                first_err = Some(Error::Fabric { call: "fi_readmsg", detail: strerror(r) });
            }
        }
        if let Some(p) = profile {
            p.add(Span::Post, t);
        }
        let t = Instant::now();
        let mut spins = 0u32;
        while done < posted {
            match ep.reap("reading rows") {
                Ok(0) => {
                    if Instant::now() > deadline {
                        let e = first_err.unwrap_or(Error::Timeout {
                            what: format!("libfabric reads of table {:?} ({} of {total} done)", self.table, done),
                            secs: self.timeout.as_secs_f64(),
                        });
                        return (Some(e), true);
                    }
                    spins += 1;
                    if spins % 1024 == 0 {
                        std::thread::yield_now();
                    }
                }
                Ok(k) => done += k,
                // An error entry completes its operation.
                Err(e) => {
                    done += 1;
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(p) = profile {
            p.add(Span::Wait, t);
        }
        (first_err, false)
    }
}
