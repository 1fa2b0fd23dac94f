//! The owner's side: its rows registered for remote reads, and the thread
//! that drives its endpoint.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use wm_fabric_sys as fi;

use super::{Endpoint, Fabric, Mr, provider, provider_named};
use crate::record::{FabricRecord, hex};
use crate::shm::OwnerRows;
use crate::{Error, Method, Result};

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
            // Nothing the owner posts completes here: the entries only
            // drive progress.
            let _ = s.ep.reap("progress", &mut Vec::new());
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
