//! Device phases for [`crate::profile`]: CUDA events recorded on the
//! call's stream between the phases, read once the call has waited for
//! the stream. Nothing is created or recorded unless the call is being
//! profiled, and a failure to time is never the call's failure.

use std::time::Duration;

use wholemem::device::raw::cudarc::driver::sys::CUevent_flags;
use wholemem::device::raw::cudarc::driver::{CudaEvent, CudaStream};

use crate::profile::Clock;

/// The events of one call: a start, then one per phase that ended.
pub(crate) struct Marks {
    on: bool,
    start: Option<CudaEvent>,
    ends: Vec<(&'static str, CudaEvent)>,
}

impl Marks {
    /// Starts timing on `stream` when `clock` is recording.
    pub(crate) fn start(clock: &Clock, stream: &CudaStream) -> Self {
        let on = clock.on();
        let start = if on { event(stream) } else { None };
        Self { on: on && start.is_some(), start, ends: Vec::new() }
    }

    /// Ends device phase `phase` once the stream gets here.
    pub(crate) fn mark(&mut self, phase: &'static str, stream: &CudaStream) {
        if !self.on {
            return;
        }
        match event(stream) {
            Some(e) => self.ends.push((phase, e)),
            None => self.on = false,
        }
    }

    /// Adds each phase's device time to `clock` (after the call waited for
    /// the stream, so the events have completed).
    pub(crate) fn finish(self, clock: &mut Clock) {
        let Some(mut last) = self.start.filter(|_| self.on) else { return };
        for (phase, e) in self.ends {
            if let Ok(ms) = last.elapsed_ms(&e) {
                clock.add(phase, Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3));
            }
            last = e;
        }
    }
}

/// A timing event recorded on `stream` now, or `None` when the driver
/// refuses.
fn event(stream: &CudaStream) -> Option<CudaEvent> {
    let e = stream.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).ok()?;
    e.record(stream).ok()?;
    Some(e)
}
