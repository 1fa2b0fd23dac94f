//! The cores a rank may use for its own threads: how many the process
//! has, and how many of them are idle now.

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
