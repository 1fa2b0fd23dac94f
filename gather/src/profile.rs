//! Where the time of gathers and scatters goes, phase by phase.
//!
//! Off by default and free when off (one thread-local flag read per call).
//! [`record`] starts recording on the calling thread; every gather and
//! scatter it makes then adds the time of each phase to a running total,
//! which [`take`] returns (and stops recording). `wm-bench gather --profile`
//! prints it per rank.
//!
//! The phases of a distributed call, in order: `checks` (ids and buffers),
//! `ids` (the row-id exchange, which also carries every rank's check
//! outcome), `owner copy` (owners copying — and converting — the rows asked
//! of them into the exchange), `rows` (moving the rows: the exchange minus
//! the owner copy and placing), `place` (rows into their places in the
//! output, own rows included) and `agree` (every rank learning whether any
//! part was malformed). A hierarchy call across nodes has `checks`, `node
//! ids`, `dedup`, `cross ids`, `owner copy`, `own rows`, `place`, `cross
//! rows`, `fan out` (with `fan copy`, rows written into the parts for node
//! peers, and `fan place`, theirs copied into the output, split out) and
//! `agree`. Mapped tables have `checks` and `copy`. A gather through a node
//! cache adds, around the table's gather of its misses (whose phases are
//! listed as its own, and counted inside `cache misses`): `cache follow`
//! (the opening allgather of write generations and path times, on calls
//! that make it), `cache lookup`,
//! `cache misses` (that gather, from start to end), `cache hits` (the hits
//! and own rows copied while the misses travel, a piece per step of the
//! exchange: inside `cache misses`), `cache rest` (the pieces left when
//! the exchange ended before running them all),
//! `cache place` and `cache update`. `wm_embedding`'s `apply_gradients`
//! records its own, with a [`Clock`] of its own: `checks`, `group ids`,
//! `exchange` (with `pack`, the senders' sums written into their parts,
//! split out), `agree`, `merge`, `read rows`, `update`, `write rows` and
//! `finish`.
//!
//! Device calls (`wm_gather::device`, and `gather`/`scatter` on device
//! tables) add device phases, timed with CUDA events and named `gpu …`,
//! which lie inside their host phases (so [`Profile::total`] counts them
//! twice): a mapped table has `checks`, `enqueue and wait` (with `gpu ids
//! up`, `gpu check`, `gpu repeats` and `gpu rows` inside) and `rows down`
//! for a host output; the peer exchange of distributed and hierarchy
//! device memory has `checks`, `bucket`, `agree counts`, `reserve`, `push`,
//! `owner rows`, `agree` and `rows` (with `gpu ids`, `gpu push`, `gpu owner
//! rows`, `gpu rows`); a host table gathered into device memory has
//! `checks`, `ids down`, `cpu rows` (the CPU copying rows into page-locked
//! buffers), `wait for a buffer` and `rows up`.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// Time per phase, summed over the calls made while recording.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    /// Calls recorded.
    pub calls: u64,
    /// Each phase's name and total time, in the order phases first ran.
    pub phases: Vec<(&'static str, Duration)>,
}

impl Profile {
    fn add(&mut self, phase: &'static str, d: Duration) {
        match self.phases.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, t)) => *t += d,
            None => self.phases.push((phase, d)),
        }
    }

    /// The total of one phase (zero when it never ran).
    pub fn get(&self, phase: &str) -> Duration {
        self.phases.iter().find(|(p, _)| *p == phase).map_or(Duration::ZERO, |(_, d)| *d)
    }

    /// Adds `other`'s calls and phases to these (a profile of some calls
    /// among others: record each, take it, merge).
    pub fn merge(&mut self, other: &Profile) {
        self.calls += other.calls;
        for (p, d) in &other.phases {
            self.add(p, *d);
        }
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|(_, d)| *d).sum()
    }
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static CURRENT: RefCell<Profile> = RefCell::new(Profile::default());
}

/// Starts recording this thread's gathers and scatters (from zero).
pub fn record() {
    CURRENT.with(|c| *c.borrow_mut() = Profile::default());
    ON.with(|o| o.set(true));
}

/// Stops recording and returns what was recorded since [`record`].
pub fn take() -> Profile {
    ON.with(|o| o.set(false));
    CURRENT.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

/// Times the phases of one call: each [`Clock::lap`] ends a phase.
pub struct Clock {
    last: Option<Instant>,
}

impl Clock {
    /// A clock for one call; it records nothing unless [`record`] is on.
    pub fn start() -> Self {
        let on = ON.with(Cell::get);
        if on {
            CURRENT.with(|c| c.borrow_mut().calls += 1);
        }
        Self { last: on.then(Instant::now) }
    }

    /// A clock for the phases around a call that starts a clock of its own
    /// (a cached gather around the table's gather): it adds phases, not a
    /// call.
    pub fn around() -> Self {
        Self { last: ON.with(Cell::get).then(Instant::now) }
    }

    /// Whether this call is being recorded.
    pub fn on(&self) -> bool {
        self.last.is_some()
    }

    /// Ends the current phase, naming it.
    pub fn lap(&mut self, phase: &'static str) {
        if let Some(last) = self.last {
            let now = Instant::now();
            CURRENT.with(|c| c.borrow_mut().add(phase, now - last));
            self.last = Some(now);
        }
    }

    /// Adds `d` to `phase` without ending the current one: time measured
    /// elsewhere (on another thread), beside the call's own phases.
    pub fn add(&mut self, phase: &'static str, d: Duration) {
        if self.last.is_some() {
            CURRENT.with(|c| c.borrow_mut().add(phase, d));
        }
    }

    /// Ends the current phase, splitting out of it the time `parts` already
    /// measured inside it (e.g. the owner copy inside an exchange); the rest
    /// goes to `phase`.
    pub fn lap_split(&mut self, phase: &'static str, parts: &[(&'static str, Duration)]) {
        if let Some(last) = self.last {
            let now = Instant::now();
            let inner: Duration = parts.iter().map(|(_, d)| *d).sum();
            CURRENT.with(|c| {
                let mut c = c.borrow_mut();
                c.add(phase, (now - last).saturating_sub(inner));
                for (p, d) in parts {
                    c.add(p, *d);
                }
            });
            self.last = Some(now);
        }
    }
}

/// Times a closure's body when `on`, adding to `total`.
#[inline]
pub fn timed<T>(on: bool, total: &mut Duration, f: impl FnOnce() -> T) -> T {
    if !on {
        return f();
    }
    let t = Instant::now();
    let r = f();
    *total += t.elapsed();
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_in_order_and_only_while_recording() {
        let mut off = Clock::start();
        off.lap("checks");
        assert!(!off.on());
        record();
        for _ in 0..2 {
            let mut c = Clock::start();
            std::thread::sleep(Duration::from_millis(2));
            c.lap("checks");
            let mut inner = Duration::ZERO;
            timed(c.on(), &mut inner, || std::thread::sleep(Duration::from_millis(3)));
            c.lap_split("rows", &[("owner copy", inner)]);
        }
        let p = take();
        assert_eq!(p.calls, 2);
        let names: Vec<&str> = p.phases.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["checks", "rows", "owner copy"]);
        assert!(p.get("checks") >= Duration::from_millis(4));
        assert!(p.get("owner copy") >= Duration::from_millis(6));
        assert_eq!(take().calls, 0, "take stops and clears");
    }
}
