//! What a call spent on a CPU and what it spent waiting for one. The CPU
//! time is the process's CPU clock (`CLOCK_PROCESS_CPUTIME_ID`: every
//! thread, the running ones up to the moment of reading); the wait is the
//! kernel's scheduler statistics (Linux: `/proc/self/task/*/schedstat`,
//! nanoseconds runnable but not running, per thread, summed). Work the
//! communicator does on threads of its own counts too. On a machine whose
//! cores other jobs share, a call's wall time is its CPU time, its wait
//! for a core, and the rest: waiting on the link or on other ranks. (The
//! schedstat's own CPU figure is brought up to date only at a thread's
//! context switches and ticks: a call that ends without sleeping would
//! show less than it ran.)

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
        let mut wait_ns = 0u64;
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            // A thread that ended since the listing is skipped.
            let Ok(text) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else { continue };
            wait_ns = wait_ns.saturating_add(Self::parse(&text)?.wait_ns);
        }
        let cpu = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let cpu_ns = u64::try_from(cpu.tv_sec).ok()?.saturating_mul(1_000_000_000).saturating_add(u64::try_from(cpu.tv_nsec).ok()?);
        Some(Self { cpu_ns, wait_ns })
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

    /// On Linux a busy loop shows up as CPU time of this process, up to the
    /// moment of reading: the count grows by a millisecond while this
    /// thread spins (given up to 60 s of wall time, which only a machine
    /// that never runs it would use).
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
