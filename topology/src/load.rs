//! What the machine runs right now: the kernel's count of runnable threads,
//! from which a rank decides whether a second thread would find a free
//! core or queue behind other work.

/// Where the kernel reports runnable threads (the fourth field of
/// `/proc/loadavg`: `running/total`).
const LOADAVG: &str = "/proc/loadavg";

/// Threads runnable on the machine now, the reading one included: the
/// `running` of `/proc/loadavg`. `None` where the file is missing or not
/// in that format. In a container this is the host's count.
pub fn runnable_threads() -> Option<usize> {
    parse_runnable(&std::fs::read_to_string(LOADAVG).ok()?)
}

/// The `running` of a `/proc/loadavg` line (`"0.52 0.41 0.30 3/187 4242"`).
fn parse_runnable(text: &str) -> Option<usize> {
    text.split_whitespace().nth(3)?.split_once('/')?.0.parse().ok()
}

/// Cores with nothing to run when `runnable` threads (the caller among
/// them) are runnable on `cores` cores.
///
/// ```
/// use wm_topology::load::idle_cores;
/// assert_eq!(idle_cores(2, 1), 1); // only the caller: the other core is free
/// assert_eq!(idle_cores(2, 2), 0); // someone else runs on it
/// assert_eq!(idle_cores(2, 11), 0);
/// ```
pub fn idle_cores(cores: usize, runnable: usize) -> usize {
    cores.saturating_sub(runnable.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_count_is_read_from_loadavg_lines() {
        assert_eq!(parse_runnable("0.52 0.41 0.30 3/187 4242\n"), Some(3));
        assert_eq!(parse_runnable("11.61 11.72 8.37 10/185 6571"), Some(10));
        assert_eq!(parse_runnable("0.52 0.41 0.30"), None);
        assert_eq!(parse_runnable("0.52 0.41 0.30 x/187 1"), None);
        assert_eq!(parse_runnable(""), None);
    }

    #[test]
    fn this_machine_reports_at_least_the_reader() {
        // Linux always has /proc/loadavg; the reading thread is running.
        if let Some(n) = runnable_threads() {
            assert!(n >= 1, "{n} runnable threads while one reads the count");
        } else {
            assert!(!std::path::Path::new(LOADAVG).exists(), "{LOADAVG} exists but could not be read");
        }
    }
}
