//! Agreement steps of the collective calls: every rank learns every rank's
//! outcome, so a problem anywhere is one error everywhere and the ranks stay
//! in step.

use wholemem::CommonError;
use wholemem::agree::{Rule, agree_sharing};
use wm_comm::Communicator;

use crate::{Error, Result};

/// Fails on every rank if any rank failed, or if the ranks' `header`s (what
/// must be the same on every rank) differ: the lowest failing rank's error
/// (bad node ids and edges keep their kind), or one naming the ranks whose
/// headers differ and how (`describe` renders a header).
pub(crate) fn agree_same_header<T>(
    comm: &dyn Communicator,
    mine: Result<T>,
    header: &[u64],
    describe: impl Fn(&[u64]) -> String,
) -> Result<T> {
    let bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
    let (value, all) = agree_sharing(comm, mine, Rule::Lowest, &bytes)?;
    let ranks = comm.world_ranks();
    let words = |m: &[u8]| m.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).collect::<Vec<u64>>();
    let first = words(&all[0]);
    for (r, m) in all.iter().enumerate().skip(1) {
        let other = words(m);
        if other != first {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different arguments to a collective call: rank {} {} but rank {} {}",
                ranks[0],
                describe(&first),
                ranks[r],
                describe(&other)
            ))));
        }
    }
    Ok(value)
}

/// The counting sort of ids by owner, shared with the gather.
pub(crate) use wm_gather::sort::bucket;

/// `f(range)` for contiguous pieces of `0..n`, in parallel on the calling
/// thread and `threads - 1` helpers that claim pieces as they come free
/// ([`wm_gather::parallel::map_pieces`]: a late helper does less, and the
/// call never waits for a fixed share it holds), the results in piece
/// order. One thread: `vec![f(0..n)]`.
pub(crate) fn split_work<R: Send>(n: usize, threads: usize, f: impl Fn(std::ops::Range<usize>) -> R + Sync) -> Vec<R> {
    let t = threads.clamp(1, n.max(1));
    wm_gather::parallel::map_pieces(n, wm_gather::parallel::grain(n, t), t, f)
}

#[cfg(test)]
mod tests {
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::*;

    #[test]
    fn split_work_covers_every_item_once_in_order() {
        for (n, threads) in [(0, 1), (0, 3), (1, 2), (17, 2), (1000, 3), (5, 8)] {
            let got = split_work(n, threads, |r| r.collect::<Vec<usize>>());
            assert_eq!(got.concat(), (0..n).collect::<Vec<_>>(), "{n} items on {threads} threads");
        }
    }

    /// Issue 30 item 10, "threads that slow things down": the sampler split
    /// its centers into one fixed share per thread, so on two cores shared
    /// with other work a second thread that ran late held half of the call
    /// (2 threads: 61 M edges/s, 1 thread: 79 M). Here the helper stalls on
    /// the first piece it takes until the calling thread has done more than
    /// half of the items, which only a split that lets the caller take the
    /// helper's share over allows. (The stall is bounded only so that the
    /// old split fails instead of hanging; nothing is timed.)
    #[test]
    fn threads_slowing_things_down_a_late_thread_holds_no_fixed_share() {
        let caller = std::thread::current().id();
        let n = 1024;
        let by_caller = Mutex::new(0usize);
        let cv = Condvar::new();
        let gave_up = Mutex::new(false);
        let got = split_work(n, 2, |r| {
            if std::thread::current().id() == caller {
                *by_caller.lock().unwrap() += r.len();
                cv.notify_all();
            } else {
                let g = by_caller.lock().unwrap();
                let (_g, waited) = cv.wait_timeout_while(g, Duration::from_secs(60), |d| *d <= n / 2).unwrap();
                if waited.timed_out() {
                    *gave_up.lock().unwrap() = true;
                }
            }
            r.len()
        });
        assert_eq!(got.iter().sum::<usize>(), n);
        assert!(!*gave_up.lock().unwrap(), "the calling thread could not take over a stalled helper's share");
    }
}
