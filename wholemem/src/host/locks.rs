//! Striped row locks in shared memory, so that ranks scattering into the
//! same row of mapped memory at once leave one whole row, never a torn one.
//!
//! A lock word (one per stripe of rows, in a memfd rank 0 creates and seals)
//! holds 0 when free, else the holder's rank in the table's communicator
//! plus one. Taking a free stripe is one compare-and-swap, letting it go
//! another: a scatter takes one per row, so this is the whole cost.
//!
//! **A dead holder.** Each rank hands the node's ranks a pidfd of its own
//! process with the table. A waiter that has waited a while polls the
//! holder's pidfd: readable means the process has exited (SIGKILL
//! included), and the waiter takes the stripe over; the row the dead
//! process was writing may then be torn — part old, part new — until a
//! write repairs it, and [`RowGuard::owner_died`] says so. A pidfd names one
//! process, in whatever PID namespace, and is never reused for another, so
//! the rule is right where `kill(pid, 0)` is not (other namespaces, reused
//! pids). Where the kernel has no pidfds (before Linux 5.3) a rank sends a
//! stand-in, and its death cannot be seen: waiters then wait for the
//! timeout.
//!
//! **A live holder that does not let go** (stopped, hung): waiting is
//! bounded by `WM_TIMEOUT_S`, after which [`RowLocks::lock`] fails with
//! [`crate::CommonError::Timeout`] instead of spinning forever.
//!
//! **Write generations.** After the lock words the same memfd holds one
//! 64-bit counter per rank: how often rows of that rank were written, by
//! any rank of the table (`WholeMemory::write_generation`). A writer
//! through the mapping adds one to the counter of every rank whose rows it
//! wrote, after writing them; a cache of a rank's rows compares the
//! counter with the one it last saw.
//!
//! (Process-shared robust pthread mutexes give the same dead-holder rule
//! from the kernel, but cost a quarter of a mapped scatter's speed on the
//! development machine — `docs/memory.md`, "Row locks".)

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::map::{self, Region};
use crate::CommonError;
use crate::{Error, Result};

/// Lock words per table: rows map to words by `row % STRIPES`.
pub const STRIPES: usize = 4096;
/// Bytes per lock word: packed. A 16 KiB table stays in the caches and the
/// TLB; a cache line per word (256 KiB) measured slower on random rows.
const LINE: usize = std::mem::size_of::<AtomicU32>();
/// Bytes of the lock words.
pub const BYTES: usize = STRIPES * LINE;
/// Bytes of one rank's write generation, after the lock words.
const GENERATION: usize = std::mem::size_of::<AtomicU64>();

/// Bytes of the shared table of `world` ranks: the lock words, then a
/// write generation per rank.
pub(crate) fn table_bytes(world: usize) -> usize {
    BYTES + world * GENERATION
}

/// Spins before a waiter starts yielding (and reading the clock).
const SPINS: u32 = 256;
/// How often a waiter asks whether the holder is still alive.
const LIFE_CHECK: Duration = Duration::from_millis(10);

/// The lock table of one mapped allocation.
#[derive(Debug)]
pub struct RowLocks {
    region: Region,
    /// This rank's lock word value: its rank in the table's communicator + 1.
    me: u32,
    /// Each rank's pidfd, by rank; `None` for this rank and for a rank whose
    /// death cannot be seen.
    pidfds: Vec<Option<OwnedFd>>,
    timeout: Duration,
    /// Ranks of the table: write generations in the region.
    world: usize,
}

/// Holds one stripe until dropped.
#[derive(Debug)]
pub struct RowGuard<'a> {
    word: &'a AtomicU32,
    me: u32,
    owner_died: bool,
}

/// Creates the lock table of a table of `world` ranks (all stripes free,
/// every write generation 0), sealed, for rank 0 to hand out.
pub(crate) fn create(world: usize) -> io::Result<OwnedFd> {
    map::memfd("wholemem-locks", table_bytes(world), false)
}

/// A pidfd of this process (Linux 5.3 and later).
pub(crate) fn own_pidfd() -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; getpid has no preconditions.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd_open returned no descriptor"))?;
    // SAFETY: a fresh descriptor this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` is a pidfd (what `/proc/self/fd` says it is), so that
/// polling it says whether that process lives.
pub(crate) fn is_pidfd(fd: BorrowedFd<'_>) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).is_ok_and(|p| {
        let p = p.to_string_lossy();
        p == "anon_inode:[pidfd]" || p.starts_with("pidfd:")
    })
}

/// Whether the process of pidfd `fd` has exited.
fn exited(fd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

impl RowLocks {
    /// Maps a lock table made by [`create`] (and checked on receipt) for
    /// rank `me` of a table whose ranks' pidfds are `pidfds` (one entry per
    /// rank), with waits bounded by `timeout`.
    pub(crate) fn open(fd: BorrowedFd<'_>, me: usize, pidfds: Vec<Option<OwnedFd>>, timeout: Duration) -> io::Result<Self> {
        let me = u32::try_from(me + 1).map_err(|_| io::Error::other(format!("rank {me} does not fit a lock word")))?;
        let world = pidfds.len();
        Ok(Self { region: Region::shared(fd, table_bytes(world))?, me, pidfds, timeout, world })
    }

    /// Rank `r`'s write generation, shared by the table's ranks (`None`
    /// past the last rank).
    #[inline]
    pub(crate) fn generation(&self, r: usize) -> Option<&AtomicU64> {
        if r >= self.world {
            return None;
        }
        let at = BYTES + r * GENERATION;
        // SAFETY: the region is `table_bytes(world)` long and page aligned;
        // `at` is below that, past the lock words, and a multiple of 8 (so
        // is BYTES), so it holds an aligned AtomicU64 inside the region,
        // which lives as long as `self`. Other processes touch it only
        // through atomics.
        Some(unsafe { &*self.region.ptr().add(at).cast::<AtomicU64>() })
    }

    /// Asks for the cache line of `row`'s stripe, to be written (a hint:
    /// a writer of random rows asks a few rows ahead, so taking a stripe
    /// does not wait on memory).
    #[inline]
    pub fn prefetch(&self, row: usize) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch(std::ptr::from_ref(self.word(row)).cast::<i8>(), std::arch::x86_64::_MM_HINT_ET0);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = row;
    }

    #[inline]
    fn word(&self, row: usize) -> &AtomicU32 {
        let at = (row % STRIPES) * LINE;
        // SAFETY: the region is BYTES long and page aligned, so every offset
        // below BYTES that is a multiple of LINE holds an aligned AtomicU32
        // inside it; it lives as long as `self`. Other processes touch it only
        // through atomics.
        unsafe { &*self.region.ptr().add(at).cast::<AtomicU32>() }
    }

    /// Waits for the stripe of `row`, at most `WM_TIMEOUT_S` (as read when
    /// the table was allocated). From a holder that died the stripe is
    /// taken over, and the guard says so ([`RowGuard::owner_died`]).
    ///
    /// # Errors
    /// [`crate::CommonError::Timeout`] when another process held the stripe for the whole
    /// timeout.
    pub fn lock(&self, row: usize) -> Result<RowGuard<'_>> {
        match self.try_lock(row) {
            Some(g) => Ok(g),
            None => self.wait(row, self.word(row)),
        }
    }

    /// Takes the stripe of `row` if it is free now, without waiting. A
    /// writer of many rows tries this first and calls [`lock`](Self::lock)
    /// only when it fails: the uncontended path then moves no error value
    /// around (measured: a quarter of a mapped scatter's speed).
    #[inline]
    pub fn try_lock(&self, row: usize) -> Option<RowGuard<'_>> {
        let word = self.word(row);
        word.compare_exchange(0, self.me, Ordering::Acquire, Ordering::Relaxed).ok()?;
        Some(RowGuard { word, me: self.me, owner_died: false })
    }

    #[cold]
    fn wait<'a>(&'a self, row: usize, word: &'a AtomicU32) -> Result<RowGuard<'a>> {
        let mut spins = 0u32;
        // Read the clock only once contended for a while: it is not free in
        // a VM.
        let mut start: Option<Instant> = None;
        let mut last_check = None;
        loop {
            match word.compare_exchange_weak(0, self.me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(RowGuard { word, me: self.me, owner_died: false }),
                Err(holder) => {
                    spins = spins.saturating_add(1);
                    if spins < SPINS {
                        std::hint::spin_loop();
                        continue;
                    }
                    std::thread::yield_now();
                    let now = Instant::now();
                    let since = *start.get_or_insert(now);
                    if holder != 0 && now.duration_since(*last_check.get_or_insert(now)) >= LIFE_CHECK {
                        last_check = Some(now);
                        if self.holder_exited(holder)
                            && word.compare_exchange(holder, self.me, Ordering::Acquire, Ordering::Relaxed).is_ok()
                        {
                            return Ok(RowGuard { word, me: self.me, owner_died: true });
                        }
                    }
                    if now.duration_since(since) >= self.timeout {
                        return Err(Error::Common(CommonError::Timeout {
                            what: format!("waiting for the lock of row {row} (rank {} of the table holds it)", holder.wrapping_sub(1)),
                            secs: self.timeout.as_secs_f64(),
                        }));
                    }
                }
            }
        }
    }

    /// Whether the rank whose lock word value is `holder` has exited. This
    /// rank (another thread of it) lives; a rank without a pidfd may.
    fn holder_exited(&self, holder: u32) -> bool {
        holder != self.me && self.pidfds.get(holder as usize - 1).and_then(Option::as_ref).is_some_and(|fd| exited(fd.as_fd()))
    }
}

impl RowGuard<'_> {
    /// Whether the previous holder died holding this stripe: a row of the
    /// stripe it was writing may be torn until it is written again.
    pub fn owner_died(&self) -> bool {
        self.owner_died
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        let _ = self.word.compare_exchange(self.me, 0, Ordering::Release, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(me: usize, pidfds: Vec<Option<OwnedFd>>, timeout: Duration) -> RowLocks {
        let fd = super::super::received(create(pidfds.len()).unwrap(), table_bytes(pidfds.len()), 0, "row-lock table").unwrap();
        RowLocks::open(fd.as_fd(), me, pidfds, timeout).unwrap()
    }

    #[test]
    fn a_held_stripe_times_out_and_is_free_again_after_the_guard() {
        let locks = table(0, vec![None], Duration::from_millis(200));
        let held = locks.lock(7).unwrap();
        assert!(!held.owner_died());
        // Another thread of this rank waits for the same stripe (row 7 +
        // STRIPES) and gives up after the timeout; a different stripe is free.
        std::thread::scope(|s| {
            s.spawn(|| {
                let e = locks.lock(7 + STRIPES).unwrap_err();
                assert!(
                    matches!(&e, Error::Common(CommonError::Timeout { what, .. }) if what.contains(&format!("row {}", 7 + STRIPES))),
                    "{e}"
                );
                drop(locks.lock(8).unwrap());
            });
        });
        drop(held);
        std::thread::scope(|s| {
            s.spawn(|| drop(locks.lock(7).unwrap()));
        });
    }

    #[test]
    fn a_stripe_whose_holder_exited_is_taken_over_and_a_live_one_is_waited_for() {
        // A child process stands for rank 1: its pidfd says when it is gone.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        // SAFETY: pidfd_open of our own child; the descriptor is owned at once.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
        assert!(fd >= 0, "pidfd_open: {}", io::Error::last_os_error());
        // SAFETY: as above.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        assert!(is_pidfd(pidfd.as_fd()));
        assert!(!is_pidfd(std::fs::File::open("/dev/null").unwrap().as_fd()));
        let locks = table(0, vec![None, Some(pidfd)], Duration::from_millis(300));
        // Rank 1 holds stripe 3 (as its process would, through the table).
        locks.word(3).store(2, Ordering::Release);
        let e = locks.lock(3).unwrap_err();
        assert!(e.to_string().contains("rank 1 of the table holds it"), "{e}");
        child.kill().unwrap();
        child.wait().unwrap();
        let g = locks.lock(3).unwrap();
        assert!(g.owner_died());
        drop(g);
        assert!(!locks.lock(3).unwrap().owner_died());
        // A holder whose death cannot be seen (no pidfd) is only waited for.
        let blind = table(0, vec![None, None], Duration::from_millis(100));
        blind.word(5).store(2, Ordering::Release);
        assert!(matches!(blind.lock(5), Err(Error::Common(CommonError::Timeout { .. }))));
    }

    #[test]
    fn this_process_has_a_pidfd() {
        let fd = own_pidfd().unwrap();
        assert!(is_pidfd(fd.as_fd()));
        assert!(!exited(fd.as_fd()));
    }

    #[test]
    fn write_generations_sit_after_the_lock_words_one_per_rank_shared_by_every_mapping() {
        let fd = super::super::received(create(3).unwrap(), table_bytes(3), 0, "row-lock table").unwrap();
        // Two ranks' mappings of one table, as two processes of a node map it.
        let a = RowLocks::open(fd.as_fd(), 0, vec![None, None, None], Duration::from_millis(100)).unwrap();
        let b = RowLocks::open(fd.as_fd(), 2, vec![None, None, None], Duration::from_millis(100)).unwrap();
        assert!((0..3).all(|r| a.generation(r).unwrap().load(Ordering::Acquire) == 0));
        assert!(a.generation(3).is_none(), "no generation past the last rank");
        b.generation(1).unwrap().fetch_add(1, Ordering::Release);
        assert_eq!([0, 1, 0], [0, 1, 2].map(|r| a.generation(r).unwrap().load(Ordering::Acquire)));
        // The lock words are untouched by the counts, and the counts by the locks.
        let held = a.lock(STRIPES - 1).unwrap();
        assert!(b.try_lock(STRIPES - 1).is_none());
        drop(held);
        assert_eq!(b.generation(0).unwrap().load(Ordering::Acquire), 0);
        // A table of another size is refused on receipt.
        assert!(super::super::received(create(2).unwrap(), table_bytes(3), 1, "row-lock table").is_err());
    }
}
