//! Splitting a call's work over threads so that more threads are never
//! slower than one.
//!
//! Two rules, each against a way threads used to lose:
//!
//! - **Enough work per thread.** [`threads_for`] starts a thread only for a
//!   share of at least the caller's measured minimum of work (rows, bytes,
//!   edges): below that, starting and joining it costs more than it saves.
//! - **Nobody waits for a late thread.** The work is cut into pieces
//!   ([`PIECES_PER_THREAD`] per thread) that the calling thread and its
//!   helpers claim one at a time from a shared counter ([`map_pieces`],
//!   [`for_each_piece`]). The calling thread works too, so a helper that the
//!   scheduler starts late (cores shared with other ranks or programs) only
//!   gets fewer pieces; the call waits at most for the pieces in hand, never
//!   for a fixed half of the work that one descheduled thread holds.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pieces a thread's share of the work is cut into: enough that a late
/// thread's share is taken over by the others, few enough that claiming
/// (one atomic add) and collecting them costs nothing measurable.
pub const PIECES_PER_THREAD: usize = 8;

/// Threads to use for `work` units when each thread should get at least
/// `min_per_thread` units and at most `threads` are allowed: `work /
/// min_per_thread`, within `1..=threads`.
///
/// ```
/// use wm_gather::parallel::threads_for;
/// assert_eq!(threads_for(1_000, 4_096, 2), 1);
/// assert_eq!(threads_for(8_191, 4_096, 2), 1);
/// assert_eq!(threads_for(8_192, 4_096, 2), 2);
/// assert_eq!(threads_for(1 << 20, 4_096, 2), 2);
/// ```
#[inline]
pub fn threads_for(work: usize, min_per_thread: usize, threads: usize) -> usize {
    threads.clamp(1, (work / min_per_thread.max(1)).max(1))
}

/// The piece size that cuts `n` items into [`PIECES_PER_THREAD`] pieces per
/// thread (at least one item).
#[inline]
pub fn grain(n: usize, threads: usize) -> usize {
    n.div_ceil(threads.max(1) * PIECES_PER_THREAD).max(1)
}

/// `f` over `0..n` cut into pieces of `grain` items, on the calling thread
/// and `threads - 1` helpers that claim pieces as they come free; the
/// results in piece order. With one thread (or one piece) this is
/// `vec![f(0..n)]` on the calling thread, nothing started.
///
/// A panic in `f` is raised again on the calling thread.
pub fn map_pieces<R: Send>(n: usize, grain: usize, threads: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
    let grain = grain.max(1);
    let pieces = n.div_ceil(grain);
    let threads = threads.clamp(1, pieces.max(1));
    if threads == 1 {
        return vec![f(0..n)];
    }
    let next = AtomicUsize::new(0);
    let work = || {
        let mut mine = Vec::new();
        loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= pieces {
                return mine;
            }
            mine.push((p, f(p * grain..((p + 1) * grain).min(n))));
        }
    };
    let mut done = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut done = work();
        for h in helpers {
            done.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        done
    });
    done.sort_unstable_by_key(|&(p, _)| p);
    done.into_iter().map(|(_, r)| r).collect()
}

/// [`map_pieces`] for work without results.
pub fn for_each_piece(n: usize, grain: usize, threads: usize, f: impl Fn(Range<usize>) + Sync) {
    map_pieces(n, grain, threads, f);
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::*;

    #[test]
    fn threads_need_the_minimum_of_work_each() {
        assert_eq!(threads_for(0, 100, 4), 1);
        assert_eq!(threads_for(199, 100, 4), 1);
        assert_eq!(threads_for(200, 100, 4), 2);
        assert_eq!(threads_for(10_000, 100, 4), 4);
        assert_eq!(threads_for(10_000, 100, 0), 1, "no threads allowed is one");
        assert_eq!(threads_for(10_000, 0, 3), 3, "a minimum of 0 counts as 1");
    }

    #[test]
    fn pieces_cover_every_item_once_in_order() {
        for (n, grain, threads) in [(0, 1, 2), (1, 1, 2), (10, 3, 2), (1000, 7, 3), (1000, 1000, 4), (5, 1, 8)] {
            let got = map_pieces(n, grain, threads, |r| r.clone().collect::<Vec<usize>>());
            assert_eq!(got.concat(), (0..n).collect::<Vec<_>>(), "{n} items, grain {grain}, {threads} threads");
            if threads > 1 && n > grain {
                assert!(got.iter().all(|p| p.len() <= grain), "{n} items, grain {grain}: a piece too large");
            }
        }
    }

    /// The defect of issue 30 item 10: work split in fixed halves made
    /// two threads slower than one whenever the second thread ran late
    /// (two cores shared with other work), the call waiting for the half
    /// that only that thread could do. Here a helper stalls on its first
    /// piece until every other piece is done: the calling thread must be
    /// able to do all of them. (The wait is bounded only so that a broken
    /// split fails instead of hanging; nothing is timed.)
    #[test]
    fn threads_slowing_things_down_a_stalled_helper_holds_no_work() {
        let caller = std::thread::current().id();
        let pieces = 64;
        let done = Mutex::new(0usize);
        let cv = Condvar::new();
        let stalled_for_ever = Mutex::new(false);
        let got = map_pieces(pieces, 1, 2, |r| {
            if std::thread::current().id() != caller {
                let g = done.lock().unwrap();
                let (g, waited) = cv.wait_timeout_while(g, Duration::from_secs(60), |d| *d < pieces - 1).unwrap();
                drop(g);
                if waited.timed_out() {
                    *stalled_for_ever.lock().unwrap() = true;
                }
            }
            *done.lock().unwrap() += 1;
            cv.notify_all();
            r.start
        });
        assert_eq!(got, (0..pieces).collect::<Vec<_>>());
        assert!(!*stalled_for_ever.lock().unwrap(), "the calling thread left pieces to a stalled helper");
    }

    #[test]
    fn a_panicking_piece_panics_the_caller() {
        let r = std::panic::catch_unwind(|| map_pieces(100, 1, 2, |r| assert!(r.start != 57, "piece 57")));
        assert!(r.is_err());
    }
}
