//! The reader's side: one fabric and domain, pooled endpoints, reads of
//! several rows per operation, registered destinations.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wholemem::CommonError;
use wm_fabric_sys as fi;
use wm_gather::RowLayout;
use wm_gather::rows::{RowSource, gather_from};

use super::{Endpoint, Fabric, Mr, strerror};
use crate::profile::{Counters, Span, timed};
use crate::record::{Checked, TableRecord, unhex};
use crate::transport::{ReadRequest, Registration, Transport};
use crate::{Error, Method, Result};

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
    /// the owners whose rows come this way; a read waits at most `timeout`.
    pub(crate) fn new(record: &TableRecord, c: &Checked, first: &[usize], methods: &[Method], timeout: Duration) -> Result<Self> {
        let routed: Vec<usize> = (0..methods.len()).filter(|&r| methods[r] == Method::Fabric && c.partition.count(r) > 0).collect();
        let provider = routed
            .iter()
            .find_map(|&r| record.owners[r].fabric.as_ref().map(|f| f.provider.clone()))
            .ok_or_else(|| Error::Common(CommonError::InvalidArgument("no owner registered its rows with libfabric".into())))?;
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
            let f = o.fabric.as_ref().ok_or_else(|| Error::Common(CommonError::InvalidArgument("no libfabric record".into())))?;
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
            timeout,
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

    unsafe fn register(&self, buf: &mut [u8]) -> Result<Option<Box<dyn Registration>>> {
        if buf.is_empty() {
            return Ok(None);
        }
        let id = self.shared.key();
        // SAFETY: `buf` stays allocated where it is until the registration
        // (which owns the memory region) is dropped: this function's
        // contract, which `Mr::register` asks for.
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
            let (mr, b) = ctx.staging.as_mut().ok_or_else(|| Error::Common(CommonError::InvalidArgument("no staging buffer".into())))?;
            (b.as_mut_ptr(), mr.desc(), None)
        };
        // Where row k of the request lands.
        let out_row = if direct { len } else { 0 };
        let place = |k: usize| -> *mut u8 {
            if direct { dest.wrapping_add(req.slots.map_or(k, |s| s[k]) * out_row) } else { dest.wrapping_add(k * len) }
        };
        let ops = self.build_ops(req, &place, desc, len, skip)?;
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
    /// The operations of one read: each owner's rows of `req` in request
    /// order, `per_op` rows an operation, row `k` landing at `place(k)`
    /// (`len` bytes from byte `skip` of the owner's row; `desc` registers
    /// the destination).
    fn build_ops(
        &self,
        req: &ReadRequest<'_>,
        place: &dyn Fn(usize) -> *mut u8,
        desc: *mut c_void,
        len: usize,
        skip: usize,
    ) -> Result<Ops> {
        let n = req.rows.len();
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
            let r = self.owners[o].ok_or_else(|| {
                Error::Common(CommonError::InvalidArgument(format!("rows of owner {o} routed to libfabric, which does not reach it")))
            })?;
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
        Ok(ops)
    }

    /// Posts every operation, reaping completions whenever the queue is
    /// full, then waits for the rest. Returns the first error, and whether
    /// reads may still be in flight (then the endpoint must be closed).
    fn post_and_wait(&self, ep: &Endpoint, ops: &Ops, profile: Option<&Counters>) -> (Option<Error>, bool) {
        let deadline = Instant::now() + self.timeout;
        let total = ops.msgs.len();
        let mut posted = 0usize;
        let mut done = Completions::new(&ops.ctx);
        let mut reaped: Vec<usize> = Vec::new();
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
                if let Err(e) = reap(ep, &mut done, &mut reaped, &mut first_err) {
                    return (Some(e), true);
                }
                if Instant::now() > deadline {
                    first_err.get_or_insert(Error::Common(CommonError::Timeout {
                        what: format!("posting libfabric reads of table {:?}", self.table),
                        secs: self.timeout.as_secs_f64(),
                    }));
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
        loop {
            let finished = done.finished();
            if finished >= posted {
                break;
            }
            if let Err(e) = reap(ep, &mut done, &mut reaped, &mut first_err) {
                return (Some(e), true);
            }
            if done.finished() == finished {
                if Instant::now() > deadline {
                    let e = first_err.unwrap_or(Error::Common(CommonError::Timeout {
                        what: format!("libfabric reads of table {:?} ({finished} of {total} done)", self.table),
                        secs: self.timeout.as_secs_f64(),
                    }));
                    return (Some(e), true);
                }
                spins += 1;
                if spins % 1024 == 0 {
                    std::thread::yield_now();
                }
            }
        }
        if let Some(p) = profile {
            p.add(Span::Wait, t);
        }
        (first_err, false)
    }
}

/// Reaps once: the completions matched to the call's operations in
/// `done`, the first error kept in `first_err`. `Err` when a completion is
/// none of them: the endpoint is out of step and must be closed.
fn reap(ep: &Endpoint, done: &mut Completions, reaped: &mut Vec<usize>, first_err: &mut Option<Error>) -> Result<()> {
    reaped.clear();
    let r = ep.reap("reading rows", reaped);
    for &c in reaped.iter() {
        done.complete(c).map_err(|d| Error::Fabric { call: "fi_cq_read", detail: format!("reading rows: {d}") })?;
    }
    if let Err(e) = r {
        first_err.get_or_insert(e);
    }
    Ok(())
}

/// Which operations of one call have completed, each known by the context
/// it was posted with (its place in the call's `fi_context2`s): the
/// libfabric counterpart of a socket answer's request id. A completion
/// that names no operation of the call, or one already complete, is
/// refused — counting it would end the wait while a read may still be
/// writing into the output.
struct Completions {
    /// The address of the first context, and how many there are.
    base: usize,
    count: usize,
    done: Vec<bool>,
    finished: usize,
}

impl Completions {
    fn new(contexts: &[fi::fi_context2]) -> Self {
        Self { base: contexts.as_ptr() as usize, count: contexts.len(), done: vec![false; contexts.len()], finished: 0 }
    }

    /// Marks the operation posted with `context` complete.
    fn complete(&mut self, context: usize) -> std::result::Result<(), String> {
        let size = std::mem::size_of::<fi::fi_context2>();
        let at = context.wrapping_sub(self.base);
        let i = at / size;
        if context < self.base || at % size != 0 || i >= self.count {
            return Err(format!("a completion for context {context:#x}, which is none of this call's {} operations", self.count));
        }
        if std::mem::replace(&mut self.done[i], true) {
            return Err(format!("a second completion for operation {i} of {}", self.count));
        }
        self.finished += 1;
        Ok(())
    }

    /// How many operations have completed.
    fn finished(&self) -> usize {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_completions_are_matched_to_their_operations_once_each() {
        let ctx = vec![fi::fi_context2::default(); 4];
        let at = |i: usize| (&raw const ctx[i]) as usize;
        let mut c = Completions::new(&ctx);
        // In any order, each once.
        for i in [2, 0, 3] {
            c.complete(at(i)).unwrap();
        }
        assert_eq!(c.finished(), 3);
        assert!(c.complete(at(0)).unwrap_err().contains("a second completion for operation 0 of 4"));
        // Another call's context, one past the end, the middle of one, null.
        let other = [fi::fi_context2::default()];
        for bad in [(&raw const other[0]) as usize, at(3) + std::mem::size_of::<fi::fi_context2>(), at(1) + 1, 0] {
            assert!(c.complete(bad).unwrap_err().contains("none of this call's 4 operations"), "{bad:#x}");
        }
        assert_eq!(c.finished(), 3);
        c.complete(at(1)).unwrap();
        assert_eq!(c.finished(), 4);
    }
}
