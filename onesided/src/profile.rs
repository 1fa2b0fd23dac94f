//! What a reader's calls cost, kept when `WM_PROFILE=1` (the fields of
//! DDStore's `get_profile`, plus the local copies).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A reader's counters since it was opened (shared by its clones).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Profile {
    /// `get` and `get_batch` calls.
    pub calls: u64,
    /// Rows read.
    pub rows: u64,
    /// Output bytes written.
    pub bytes: u64,
    /// Seconds waiting for a connection or endpoint held by another thread
    /// (and opening new ones).
    pub lock_wait_s: f64,
    /// Seconds registering destination memory (libfabric).
    pub mr_s: f64,
    /// Destination buffers that had to be registered for one call (not
    /// registered with [`Reader::register_recv`](crate::Reader::register_recv)).
    pub mr_misses: u64,
    /// Seconds posting reads: sending requests, `fi_readmsg`, `MPI_Get`.
    pub post_s: f64,
    /// Seconds waiting for reads to complete: responses, completion
    /// queues, `MPI_Win_flush`.
    pub wait_s: f64,
    /// Seconds copying rows locally: from mapped portions, from received
    /// buffers into place (with conversion).
    pub copy_s: f64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    calls: AtomicU64,
    rows: AtomicU64,
    bytes: AtomicU64,
    lock_wait: AtomicU64,
    mr: AtomicU64,
    mr_misses: AtomicU64,
    post: AtomicU64,
    wait: AtomicU64,
    copy: AtomicU64,
}

/// Which time a span counts as.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Span {
    LockWait,
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    Mr,
    Post,
    Wait,
    Copy,
}

impl Counters {
    pub(crate) fn call(&self, rows: usize, bytes: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn miss(&self) {
        self.mr_misses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, span: Span, since: Instant) {
        let ns = since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        let c = match span {
            Span::LockWait => &self.lock_wait,
            Span::Mr => &self.mr,
            Span::Post => &self.post,
            Span::Wait => &self.wait,
            Span::Copy => &self.copy,
        };
        c.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Profile {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        Profile {
            calls: self.calls.load(Ordering::Relaxed),
            rows: self.rows.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            lock_wait_s: s(&self.lock_wait),
            mr_s: s(&self.mr),
            mr_misses: self.mr_misses.load(Ordering::Relaxed),
            post_s: s(&self.post),
            wait_s: s(&self.wait),
            copy_s: s(&self.copy),
        }
    }
}

/// Times a span into optional counters.
pub(crate) fn timed<T>(c: Option<&Counters>, span: Span, f: impl FnOnce() -> T) -> T {
    match c {
        None => f(),
        Some(c) => {
            let t = Instant::now();
            let r = f();
            c.add(span, t);
            r
        }
    }
}
