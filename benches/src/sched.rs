//! What a call spent on a CPU and what it spent waiting for one, from the
//! kernel's scheduler statistics (Linux: `/proc/self/task/*/schedstat`,
//! nanoseconds running and nanoseconds runnable but not running, per
//! thread). Summed over every thread of the process, so work the
//! communicator does on threads of its own counts too. The kernel brings
//! a thread's counters up to date at its context switches and ticks, not
//! when they are read: a figure is a mean over many calls, not one call's. On a machine whose
//! cores other jobs share, a call's wall time is its CPU time, its wait
//! for a core, and the rest: waiting on the link or on another rank.

/// Nanoseconds on a CPU, and runnable waiting for one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sched {
    pub(crate) cpu_ns: u64,
    pub(crate) wait_ns: u64,
}

impl Sched {
    /// This process's totals so far (`None` where the kernel does not say:
    /// not Linux, or no schedstat).
    pub(crate) fn now() -> Option<Self> {
        let mut total = Self::default();
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            // A thread that ended since the listing is skipped.
            let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else { continue };
            let one = Self::parse(&text)?;
            total.cpu_ns = total.cpu_ns.saturating_add(one.cpu_ns);
            total.wait_ns = total.wait_ns.saturating_add(one.wait_ns);
        }
        Some(total)
    }

    /// One thread's line: `cpu_ns wait_ns timeslices`.
    fn parse(text: &str) -> Option<Self> {
        let mut f = text.split_ascii_whitespace().map(str::parse::<u64>);
        Some(Self { cpu_ns: f.next()?.ok()?, wait_ns: f.next()?.ok()? })
    }

    /// What ran between `before` and `self` (a thread that ended meanwhile
    /// takes its time with it: never below zero).
    pub(crate) fn since(self, before: Self) -> Self {
        Self { cpu_ns: self.cpu_ns.saturating_sub(before.cpu_ns), wait_ns: self.wait_ns.saturating_sub(before.wait_ns) }
    }

    /// Adds `other` to these.
    pub(crate) fn add(&mut self, other: Self) {
        self.cpu_ns = self.cpu_ns.saturating_add(other.cpu_ns);
        self.wait_ns = self.wait_ns.saturating_add(other.wait_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedstat_line_reads_as_running_and_waiting() {
        assert_eq!(Sched::parse("1653015 200390 4\n"), Some(Sched { cpu_ns: 1_653_015, wait_ns: 200_390 }));
        assert_eq!(Sched::parse("17"), None);
        assert_eq!(Sched::parse("x 1 2"), None);
        let d = Sched { cpu_ns: 10, wait_ns: 5 }.since(Sched { cpu_ns: 4, wait_ns: 9 });
        assert_eq!(d, Sched { cpu_ns: 6, wait_ns: 0 });
    }

    /// On Linux a busy loop shows up as CPU time of this process: the
    /// count grows by a millisecond while this thread spins (given up to
    /// 60 s of wall time, which only a machine that never runs it would use).
    #[test]
    #[cfg(target_os = "linux")]
    fn spinning_counts_as_cpu_time() {
        let before = Sched::now().expect("Linux keeps schedstat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        let grown = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let d = Sched::now().expect("schedstat").since(before);
            if d.cpu_ns >= 1_000_000 || t.elapsed() > std::time::Duration::from_secs(60) {
                break d;
            }
        };
        assert!(grown.cpu_ns >= 1_000_000, "{grown:?} after {:?} of spinning", t.elapsed());
    }
}
