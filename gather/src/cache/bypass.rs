//! Whether a node cache's gather goes through the cache at all: where rows
//! mostly miss, or the link is so fast that a miss costs little more than
//! a hit, a cached call pays for lookups, decisions, fills and a second
//! copy on top of an exchange nearly as large as the uncached one. The
//! [`Chooser`] measures both paths and takes the faster.
//!
//! Every rank of the table must take the same path (the paths' collectives
//! differ), so the chooser decides only from what every rank has: each
//! cached gather opens with an allgather (the write generations, see
//! `node.rs`), which also carries each rank's time of its previous call.
//! Every rank feeds the same samples to an identical chooser and so
//! chooses alike — no extra collective. Inside a stretch of uncached
//! calls the schedule alone decides ([`Chooser::quiet`]): those calls
//! skip the allgather too, each rank keeping its times, and the first
//! call after the stretch carries the median of them.
//!
//! The schedule: the first [`WARM_CALLS`] calls go through the cache (it
//! warms); then the other path is tried for [`PROBE_CALLS`] calls, and the
//! faster path by the median time (the slowest rank's time of each call)
//! of the probe's calls and of the winner's last [`SAMPLES`] runs for a stretch. A stretch begins at
//! [`FIRST_STRETCH`] calls and doubles, up to [`LAST_STRETCH`], each time a
//! probe confirms the winner (back to the first length when it does not),
//! so a settled choice costs a probe of the losing path once in hundreds of
//! calls. The cache takes over only when its median is more than
//! [`MARGIN`] below the uncached path's, and gives way as soon as the
//! uncached path's is more than [`CACHE_SLACK`] below its own: a near tie
//! goes to the uncached path, so that the cache, left on, costs at most a
//! little. A probe of a path much slower than the
//! winner costs more than the probe's own calls: each is that much
//! slower. So a stretch is also never shorter than makes the probe after
//! it add more than [`PROBE_SHARE`] to the stretch's time, by the two
//! medians just compared (at most [`LAST_STRETCH`] still): a cache 4×
//! faster than the link, probed after 64 calls, lost 13 % of its time to
//! probes; after 495, 2 %.
//!
//! A new workload starts the schedule afresh (warm, then probe): when two
//! calls in a row (of those that exchange) have more than [`RESIZE`] times
//! as many ids, or as few, as the call that began the schedule (all ranks'
//! ids together, which every rank learns in the same allgather), once the
//! cache has warmed — or when the program says so
//! (`NodeCache::rechoose`). Times of calls of other sizes say nothing of
//! this one's, and a cache that lost while its rows were of no use (a
//! phase of small batches, say) would otherwise be tried again only cold,
//! in probes too short to warm it, and never win.

/// Which path the gathers of a node cache take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bypass {
    /// Measure the cached and the uncached path and take the faster (the
    /// default: the cache is then safe to leave on).
    #[default]
    Auto,
    /// Every gather through the cache.
    Off,
    /// Every gather on the uncached path (the cache stays coherent, keeps
    /// its rows and counts nothing). For measurements and tests.
    Always,
}

/// One of the two paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Through the cache.
    Cached,
    /// The table's own gather.
    Plain,
}

impl Path {
    fn other(self) -> Self {
        match self {
            Self::Cached => Self::Plain,
            Self::Plain => Self::Cached,
        }
    }

    /// The word a rank sends for a call that took this path.
    pub(crate) fn word(self) -> u64 {
        match self {
            Self::Cached => 1,
            Self::Plain => 2,
        }
    }

    /// The path a word names (0: no call, or a failed one).
    pub(crate) fn of_word(w: u64) -> Option<Self> {
        match w {
            1 => Some(Self::Cached),
            2 => Some(Self::Plain),
            _ => None,
        }
    }
}

/// Calls through the cache before the first probe of the uncached path.
pub(crate) const WARM_CALLS: u64 = 16;
/// Calls of the losing path in one probe.
pub(crate) const PROBE_CALLS: u32 = 3;
/// Calls of the winning path after a probe that changed the winner.
pub(crate) const FIRST_STRETCH: u32 = 64;
/// The longest stretch between probes.
pub(crate) const LAST_STRETCH: u32 = 1024;
/// Samples of the winning path the choice looks at (the newest); a probe
/// starts the probed path's samples afresh, so its median is of the
/// probe's own calls.
pub(crate) const SAMPLES: usize = 5;
/// The most a probe of the losing path may add to the time of the stretch
/// before it (by the medians of the last choice), unless that stretch
/// would be longer than [`LAST_STRETCH`].
pub(crate) const PROBE_SHARE: f64 = 0.02;
/// How much faster than the uncached path the cache must be to take over
/// from it (a near tie keeps the uncached path).
pub(crate) const MARGIN: f64 = 0.05;
/// How much faster than the cache the uncached path must be to take over
/// from it (the first winner is the cache). Smaller than [`MARGIN`]: with
/// 5 % each way, the cache stayed on at a tie of two loopback paths and
/// ran one timed phase in five 5–7 % slower than the uncached gather
/// (docs/perf-log/2026-12-07-distributed-distinct.md).
pub(crate) const CACHE_SLACK: f64 = 0.02;
/// How many times as many (or as few) ids a call may have as the call that
/// began the schedule before the schedule starts afresh.
pub(crate) const RESIZE: u64 = 2;

/// The newest call times of one path, in nanoseconds.
#[derive(Debug, Clone, Default)]
struct Window {
    times: [u64; SAMPLES],
    len: usize,
    next: usize,
}

impl Window {
    fn push(&mut self, ns: u64) {
        self.times[self.next] = ns;
        self.next = (self.next + 1) % SAMPLES;
        self.len = (self.len + 1).min(SAMPLES);
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    fn median(&self) -> Option<f64> {
        let mut t = self.times[..self.len].to_vec();
        t.sort_unstable();
        match t.len() {
            0 => None,
            n if n % 2 == 1 => Some(t[n / 2] as f64),
            n => Some((t[n / 2 - 1] as f64 + t[n / 2] as f64) / 2.0),
        }
    }
}

/// The choice of path, call by call; identical on every rank when fed the
/// same samples.
#[derive(Debug, Clone)]
pub(crate) struct Chooser {
    mode: Bypass,
    calls: u64,
    cached: Window,
    plain: Window,
    /// The path of the last decided stretch.
    winner: Path,
    /// The path of the calls now running (the winner, or the probed one).
    current: Path,
    /// Calls left in the current stretch or probe.
    left: u32,
    probing: bool,
    stretch: u32,
    /// Calls that took the uncached path.
    bypassed: u64,
    /// The ids of the first call measured since the schedule began (all
    /// ranks' together), once known.
    size: Option<u64>,
    /// Whether the previous call whose size was learned was more than
    /// [`RESIZE`] times larger (`Some(true)`) or smaller (`Some(false)`)
    /// than `size`.
    off: Option<bool>,
}

impl Default for Chooser {
    fn default() -> Self {
        Self {
            mode: Bypass::Auto,
            calls: 0,
            cached: Window::default(),
            plain: Window::default(),
            winner: Path::Cached,
            current: Path::Cached,
            left: 0,
            probing: false,
            stretch: FIRST_STRETCH / 2,
            bypassed: 0,
            size: None,
            off: None,
        }
    }
}

impl Chooser {
    pub(crate) fn set_mode(&mut self, mode: Bypass) {
        self.mode = mode;
    }

    pub(crate) fn mode(&self) -> Bypass {
        self.mode
    }

    /// Calls that took the uncached path.
    pub(crate) fn bypassed(&self) -> u64 {
        self.bypassed
    }

    /// Starts the schedule afresh: the cache warms, then both paths are
    /// measured again (the mode and the count of bypassed calls stay).
    pub(crate) fn restart(&mut self) {
        *self = Self { mode: self.mode, bypassed: self.bypassed, ..Self::default() };
    }

    /// The ids of the previous call, all ranks' together: the second such
    /// call in a row more than [`RESIZE`] times off the schedule's size, on
    /// the same side, once the cache has warmed, starts the schedule
    /// afresh, and then says so (the previous call's time is then no sample
    /// of the new schedule). One call off the size (a short last batch)
    /// does not, nor do sizes that alternate call by call, which would
    /// otherwise restart the schedule at every call and never let it
    /// measure.
    pub(crate) fn resized(&mut self, ids: u64) -> bool {
        let Some(s) = self.size else {
            self.size = Some(ids);
            return false;
        };
        let off = if ids > s.saturating_mul(RESIZE) {
            Some(true)
        } else if ids.saturating_mul(RESIZE) < s {
            Some(false)
        } else {
            None
        };
        let again = off.is_some() && off == self.off;
        self.off = off;
        if again && self.calls > WARM_CALLS {
            self.restart();
            self.size = Some(ids);
            return true;
        }
        false
    }

    /// Whether the next call takes the uncached path whatever the samples
    /// say (`Always`, or inside a stretch of it): it then needs no
    /// exchange, and [`next`](Self::next) is called without a sample.
    pub(crate) fn quiet(&self) -> bool {
        match self.mode {
            Bypass::Always => true,
            Bypass::Off => false,
            Bypass::Auto => self.calls >= WARM_CALLS && self.left > 0 && self.current == Path::Plain,
        }
    }

    /// The path of the next call, given the previous call's path and time
    /// (the slowest rank's), when it succeeded on every rank.
    pub(crate) fn next(&mut self, last: Option<(Path, u64)>) -> Path {
        match last {
            Some((Path::Cached, ns)) => self.cached.push(ns),
            Some((Path::Plain, ns)) => self.plain.push(ns),
            None => {}
        }
        self.calls += 1;
        let path = match self.mode {
            Bypass::Off => Path::Cached,
            Bypass::Always => Path::Plain,
            Bypass::Auto => self.auto(),
        };
        self.bypassed += u64::from(path == Path::Plain);
        path
    }

    fn auto(&mut self) -> Path {
        if self.calls <= WARM_CALLS {
            return Path::Cached;
        }
        if self.left > 0 {
            self.left -= 1;
            return self.current;
        }
        if self.probing {
            // The probe's samples are in: choose again.
            self.probing = false;
            let faster = self.faster();
            let doubled = if faster == self.winner { (self.stretch * 2).min(LAST_STRETCH) } else { FIRST_STRETCH };
            self.stretch = doubled.max(self.paying_stretch());
            self.winner = faster;
            self.current = faster;
            self.left = self.stretch - 1;
        } else {
            self.probing = true;
            self.current = self.winner.other();
            match self.current {
                Path::Cached => self.cached.clear(),
                Path::Plain => self.plain.clear(),
            }
            self.left = PROBE_CALLS - 1;
        }
        self.current
    }

    /// The shortest stretch after which a probe of the slower path adds
    /// at most [`PROBE_SHARE`] of the stretch's time, by the medians of
    /// both paths (0 while either is unmeasured), at most [`LAST_STRETCH`].
    fn paying_stretch(&self) -> u32 {
        let (Some(c), Some(p)) = (self.cached.median(), self.plain.median()) else {
            return 0;
        };
        let (fast, slow) = (c.min(p), c.max(p));
        if fast <= 0.0 {
            return LAST_STRETCH;
        }
        let calls = f64::from(PROBE_CALLS) * (slow / fast - 1.0) / PROBE_SHARE;
        // `as` saturates; NaN (never, from finite medians) gives 0.
        (calls.ceil() as u32).min(LAST_STRETCH)
    }

    /// The path with the lower median time, where the other path than
    /// the last winner must be more than [`MARGIN`] faster to take over
    /// from the uncached path, [`CACHE_SLACK`] from the cache (samples
    /// this noisy would otherwise flip a near tie back and forth); the
    /// cache while the uncached path was never measured.
    fn faster(&self) -> Path {
        let (Some(c), Some(p)) = (self.cached.median(), self.plain.median()) else {
            return if self.plain.len > 0 { Path::Plain } else { Path::Cached };
        };
        match self.winner {
            Path::Cached if c > p * (1.0 + CACHE_SLACK) => Path::Plain,
            Path::Plain if p > c * (1.0 + MARGIN) => Path::Cached,
            w => w,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `calls` calls of a chooser whose paths take `cached` and
    /// `plain` ns; the path of each call.
    fn run(c: &mut Chooser, calls: usize, cached: u64, plain: u64) -> Vec<Path> {
        let mut last = None;
        (0..calls)
            .map(|_| {
                let p = c.next(last);
                last = Some((p, if p == Path::Cached { cached } else { plain }));
                p
            })
            .collect()
    }

    fn plain_share(paths: &[Path]) -> f64 {
        paths.iter().filter(|&&p| p == Path::Plain).count() as f64 / paths.len() as f64
    }

    #[test]
    fn a_cache_slower_than_the_uncached_gather_is_bypassed_but_probed_now_and_then() {
        let mut c = Chooser::default();
        let paths = run(&mut c, 3000, 2_000, 1_000);
        assert!(paths[..WARM_CALLS as usize].iter().all(|&p| p == Path::Cached), "the cache warms first");
        let first = WARM_CALLS as usize;
        assert_eq!(&paths[first..first + PROBE_CALLS as usize], &[Path::Plain; PROBE_CALLS as usize], "then the other path is tried");
        // Settled: the cache is tried less and less often.
        let tail = &paths[1000..];
        let probes = tail.iter().filter(|&&p| p == Path::Cached).count();
        assert!(probes > 0 && probes <= 2 * PROBE_CALLS as usize, "{probes} cached calls in the last 2000");
        assert_eq!(c.bypassed() as usize, paths.iter().filter(|&&p| p == Path::Plain).count());
    }

    #[test]
    fn a_cache_that_pays_stays_on_and_a_tie_keeps_it() {
        for (cached, plain) in [(500, 1_000), (1_010, 1_000)] {
            let mut c = Chooser::default();
            let paths = run(&mut c, 3000, cached, plain);
            let tail = &paths[1000..];
            assert!(plain_share(tail) <= 0.01, "cached {cached} plain {plain}: {:.3} bypassed", plain_share(tail));
            assert!(tail.contains(&Path::Plain), "the other path is still probed");
        }
    }

    /// The shaped link of docs/cache.md: the cache 4.3× faster than the
    /// uncached gather. After the first probe, a probe of the uncached path
    /// comes only once it adds at most PROBE_SHARE to the stretch before
    /// it, and over a long run the probes cost about that much.
    #[test]
    fn probes_of_a_much_slower_path_are_rare_enough_to_cost_little() {
        let (cached, plain) = (1_000u64, 4_300u64);
        let mut c = Chooser::default();
        let paths = run(&mut c, 20_000, cached, plain);
        let first = WARM_CALLS as usize + PROBE_CALLS as usize;
        assert!(paths[..WARM_CALLS as usize].iter().all(|&p| p == Path::Cached));
        assert!(paths[WARM_CALLS as usize..first].iter().all(|&p| p == Path::Plain), "the first probe");
        let gap = paths[first..].iter().position(|&p| p == Path::Plain).unwrap_or(usize::MAX);
        let want = (f64::from(PROBE_CALLS) * (plain as f64 / cached as f64 - 1.0) / PROBE_SHARE).ceil() as usize;
        assert!(want > 2 * FIRST_STRETCH as usize, "the case is one the doubling alone would probe sooner");
        assert_eq!(gap, want, "the stretch after the first probe");
        // Time lost to probes over the rest, against every call cached.
        let rest = &paths[first..];
        let probed = rest.iter().filter(|&&p| p == Path::Plain).count() as f64;
        let lost = probed * (plain - cached) as f64 / (rest.len() as f64 * cached as f64);
        assert!(lost > 0.0 && lost <= PROBE_SHARE, "probes cost {lost:.4} of the time");
        // A near tie is probed as before: the doubling rule sets the stretch.
        let mut d = Chooser::default();
        let paths = run(&mut d, 200, 1_000, 1_010);
        let gap = paths[first..].iter().position(|&p| p == Path::Plain).unwrap_or(usize::MAX);
        assert_eq!(gap, FIRST_STRETCH as usize);
    }

    #[test]
    fn the_choice_follows_a_change_of_which_path_is_faster() {
        let mut c = Chooser::default();
        run(&mut c, 1000, 2_000, 1_000);
        // The cache starts to pay (the stream became skewed): within the
        // longest stretch and a probe the cache is back.
        let paths = run(&mut c, 2 * LAST_STRETCH as usize + 8, 400, 1_000);
        assert_eq!(*paths.last().unwrap_or(&Path::Plain), Path::Cached);
        let back = paths.iter().position(|&p| p == Path::Cached).unwrap_or(usize::MAX);
        assert!(back <= LAST_STRETCH as usize + 1, "back after {back} calls");
        // And the other way.
        let paths = run(&mut c, 2 * LAST_STRETCH as usize + 8, 3_000, 1_000);
        assert_eq!(*paths.last().unwrap_or(&Path::Cached), Path::Plain);
    }

    #[test]
    fn quiet_calls_are_exactly_the_uncached_calls_inside_a_stretch() {
        let mut c = Chooser::default();
        let mut last = None;
        let mut quiet = 0;
        for _ in 0..3000 {
            let q = c.quiet();
            let p = c.next(if q { None } else { last });
            assert!(!q || p == Path::Plain, "a quiet call is uncached");
            quiet += usize::from(q);
            last = Some((p, if p == Path::Cached { 2_000 } else { 1_000 }));
        }
        // Every uncached call but the first of each stretch or probe.
        assert!(quiet > 2900 && (quiet as u64) < c.bypassed(), "{quiet} quiet of {} bypassed", c.bypassed());
        c.set_mode(Bypass::Always);
        assert!(c.quiet());
        c.set_mode(Bypass::Off);
        assert!(!c.quiet());
    }

    #[test]
    fn a_near_tie_goes_to_the_uncached_path() {
        let mut c = Chooser::default();
        run(&mut c, 1000, 2_000, 1_000);
        // The cache now 2 % faster: within the margin, the uncached path stays.
        let paths = run(&mut c, 3 * LAST_STRETCH as usize, 980, 1_000);
        assert!(plain_share(&paths) > 0.99, "{:.3}", plain_share(&paths));
        // 20 % faster: the cache takes over.
        let paths = run(&mut c, 3 * LAST_STRETCH as usize, 800, 1_000);
        assert_eq!(paths.last(), Some(&Path::Cached));
        // The cache now 4 % slower: past its slack, the uncached path
        // takes over again, and keeps it.
        let paths = run(&mut c, 3 * LAST_STRETCH as usize, 1_040, 1_000);
        assert_eq!(paths.last(), Some(&Path::Plain));
        assert!(plain_share(&paths[LAST_STRETCH as usize..]) > 0.99, "{:.3}", plain_share(&paths));
    }

    #[test]
    fn one_slow_sample_does_not_flip_the_choice() {
        let mut c = Chooser::default();
        let mut last = None;
        let mut paths = Vec::new();
        for i in 0..1000 {
            let p = c.next(last);
            // Every 7th call of either path is ten times slower (a loaded
            // machine); the cache is twice as fast otherwise.
            let base = if p == Path::Cached { 500 } else { 1_000 };
            last = Some((p, if i % 7 == 0 { base * 10 } else { base }));
            paths.push(p);
        }
        assert!(plain_share(&paths[200..]) < 0.02, "{:.3}", plain_share(&paths[200..]));
    }

    /// A phase in which the cache lost (small batches, no use for it), then
    /// batches 50 times larger in which it pays: the schedule starts afresh
    /// at the first call of the new size, and the cache wins at once.
    #[test]
    fn a_new_size_of_calls_starts_the_schedule_afresh() {
        let mut c = Chooser::default();
        let mut last = None;
        for _ in 0..300 {
            if !c.quiet() && c.resized(512) {
                last = None;
            }
            let sample = if c.quiet() { None } else { last };
            let p = c.next(sample);
            last = Some((p, if p == Path::Cached { 2_000 } else { 1_000 }));
        }
        assert_eq!(c.current, Path::Plain, "the cache lost the small calls");
        // Only calls that exchange learn the size, and the second of them
        // off the size restarts: the stretch runs out first.
        let mut paths = Vec::new();
        for _ in 0..3000 {
            if !c.quiet() && c.resized(25_600) {
                last = None;
            }
            let sample = if c.quiet() { None } else { last };
            let p = c.next(sample);
            last = Some((p, if p == Path::Cached { 50_000 } else { 100_000 }));
            paths.push(p);
        }
        let back = paths.iter().position(|&p| p == Path::Cached).unwrap_or(usize::MAX);
        assert!(back <= 2 * LAST_STRETCH as usize + 8, "the cache is tried again after {back} calls");
        assert!(paths[back..back + WARM_CALLS as usize].iter().all(|&p| p == Path::Cached), "and warms before the probe");
        assert!(plain_share(&paths[back + 100..]) < 0.01, "{:.3}", plain_share(&paths[back + 100..]));
        // A size within the bound keeps the schedule, and so do one call
        // off it and sizes that alternate.
        assert!(!c.resized(25_600 * 3 / 2) && !c.resized(25_600 * 2 / 3));
        assert!(!c.resized(512) && !c.resized(25_600));
        for _ in 0..10 {
            assert!(!c.resized(512) && !c.resized(100_000), "alternating sizes restart nothing");
        }
        // Two calls in a row off the same side, after the warm-up, do.
        assert!(!c.resized(512) && c.resized(512));
        // The mode and the count of bypassed calls outlive a restart.
        let bypassed = c.bypassed();
        c.set_mode(Bypass::Off);
        c.restart();
        assert_eq!((c.mode(), c.bypassed(), c.calls), (Bypass::Off, bypassed, 0));
    }

    #[test]
    fn fixed_modes_and_failed_calls() {
        let mut c = Chooser::default();
        c.set_mode(Bypass::Always);
        assert!(run(&mut c, 50, 1, 1_000).iter().all(|&p| p == Path::Plain));
        c.set_mode(Bypass::Off);
        assert!(run(&mut c, 50, 1_000, 1).iter().all(|&p| p == Path::Cached));
        assert_eq!((c.bypassed(), c.mode()), (50, Bypass::Off));
        // Calls without a sample (failed ones) leave the windows alone.
        let mut d = Chooser::default();
        for _ in 0..100 {
            d.next(None);
        }
        assert_eq!((d.cached.len, d.plain.len), (0, 0));
        assert_eq!(d.faster(), Path::Cached, "with nothing measured, the cache");
        for w in 0..4 {
            assert_eq!(Path::of_word(w), [None, Some(Path::Cached), Some(Path::Plain), None][w as usize]);
        }
        assert_eq!(Path::of_word(Path::Plain.word()), Some(Path::Plain));
    }
}
