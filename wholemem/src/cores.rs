//! The cores a rank may use for its own threads: how many the process
//! has, and how many of them are idle now.

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long an idle count is reused before `/proc/loadavg` is read again:
/// the reading costs some microseconds, and calls come every millisecond
/// or so.
pub const IDLE_REFRESH: Duration = Duration::from_millis(10);

/// The cores this process may run on (affinity and cgroup quota), as it
/// first found them: the answer reads several files, and every call asks.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Cores of this process's that nothing runs on now, the calling thread
/// counted as running ([`wm_topology::load::idle_cores`] of the machine's
/// runnable threads), at most [`IDLE_REFRESH`] old. Where the count is not
/// to be had, every other core counts as idle (the share of cores alone
/// decides, as before this count existed).
pub fn idle_threads_now() -> usize {
    static LAST: Mutex<Option<(Instant, usize)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    match *last {
        Some((at, idle)) if at.elapsed() < IDLE_REFRESH => idle,
        _ => {
            let idle =
                wm_topology::load::runnable_threads().map_or(cores().saturating_sub(1), |r| wm_topology::load::idle_cores(cores(), r));
            *last = Some((Instant::now(), idle));
            idle
        }
    }
}

thread_local! {
    /// The cap [`cap_this_thread`] set on this thread.
    static CAP: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Caps the threads that CPU-bound calls made on the calling thread use
/// (gather, scatter and sampling through
/// [`WholeMemory::compute_threads`](crate::WholeMemory::compute_threads)),
/// `WM_THREADS` included; `None` lifts the cap. Returns the cap it
/// replaces. For a thread of the caller's that has a core of its own and
/// no more: a prefetch thread beside a training step, whose calls would
/// otherwise start helpers that wait for the step's core.
pub fn cap_this_thread(threads: Option<usize>) -> Option<usize> {
    CAP.with(|c| c.replace(threads.map(|n| n.max(1))))
}

/// The cap [`cap_this_thread`] set on the calling thread, if any.
pub fn this_threads_cap() -> Option<usize> {
    CAP.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_holds_on_its_own_thread_only() {
        assert_eq!(cap_this_thread(Some(1)), None);
        assert_eq!(this_threads_cap(), Some(1));
        assert_eq!(std::thread::spawn(this_threads_cap).join().ok(), Some(None), "another thread has no cap");
        assert_eq!(cap_this_thread(Some(0)), Some(1), "the old cap comes back");
        assert_eq!(this_threads_cap(), Some(1), "a cap of 0 is one thread");
        assert_eq!(cap_this_thread(None), Some(1));
        assert_eq!(this_threads_cap(), None);
    }
}
