//! Striped row locks in shared memory, so that ranks scattering into the
//! same row of mapped memory at once leave one whole row, never a torn one.
//!
//! Each stripe is a process-shared, robust pthread mutex in a memfd that
//! rank 0 creates, initialises and seals before handing it to the node's
//! ranks with the table. Robust means the kernel, not a guess, says when a
//! holder died: when a process exits (SIGKILL included) holding a stripe,
//! the next waiter gets `EOWNERDEAD`, marks the stripe consistent and takes
//! it. The row the dead process was writing may then be torn — part old,
//! part new — until a write repairs it; [`RowGuard::owner_died`] says so.
//! (A rule by process id, as `kill(pid, 0)` gives, is wrong across PID
//! namespaces and for reused ids; the kernel's is not.)
//!
//! Waiting is bounded by `WM_TIMEOUT_S`: a holder that lives but does not
//! let go (stopped, hung) makes [`RowLocks::lock`] fail with
//! [`Error::Timeout`] instead of spinning forever.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::map::{self, Region};
use crate::{Error, Result};

/// Stripes per table: rows map to stripes by `row % STRIPES`.
pub const STRIPES: usize = 4096;
/// Bytes per stripe: one mutex, packed (a 160 KiB table; a cache line
/// each would be 256 KiB, and a larger lock table measured slower on
/// random rows).
const MUTEX: usize = std::mem::size_of::<libc::pthread_mutex_t>();
/// Bytes of the lock table.
pub const BYTES: usize = STRIPES * MUTEX;

/// The lock table of one mapped allocation.
#[derive(Debug)]
pub struct RowLocks {
    region: Region,
    timeout: Duration,
}

/// Holds one stripe until dropped (on the thread that locked it).
#[derive(Debug)]
pub struct RowGuard<'a> {
    mutex: *mut libc::pthread_mutex_t,
    owner_died: bool,
    _locks: PhantomData<&'a RowLocks>,
}

/// Creates the lock table: a sealed memfd of [`BYTES`] bytes holding
/// [`STRIPES`] process-shared robust mutexes, for rank 0 to hand out.
pub(crate) fn create() -> io::Result<OwnedFd> {
    let fd = map::memfd("wholemem-locks", BYTES, false)?;
    let region = Region::shared(fd.as_fd(), BYTES)?;
    // SAFETY: an all-zero attribute object is storage for init to fill.
    let mut attr: libc::pthread_mutexattr_t = unsafe { std::mem::zeroed() };
    let check = |r: libc::c_int| if r == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(r)) };
    // SAFETY: `attr` is writable storage for a mutex attribute object.
    check(unsafe { libc::pthread_mutexattr_init(&mut attr) })?;
    let made = (|| {
        // SAFETY: `attr` was initialised above.
        check(unsafe { libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED) })?;
        // SAFETY: as above.
        check(unsafe { libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST) })?;
        for s in 0..STRIPES {
            // SAFETY: stripe `s` lies inside the fresh mapping (BYTES long,
            // page aligned, so every MUTEX-sized slot is aligned for a
            // mutex); nobody else has the memfd yet.
            check(unsafe { libc::pthread_mutex_init(region.ptr().add(s * MUTEX).cast(), &attr) })?;
        }
        Ok(())
    })();
    // SAFETY: `attr` was initialised and is not used after this.
    unsafe { libc::pthread_mutexattr_destroy(&mut attr) };
    made.map(|()| fd)
}

impl RowLocks {
    /// Maps a lock table made by [`create`] (and checked on receipt), with
    /// waits bounded by `timeout`.
    pub(crate) fn open(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<Self> {
        Ok(Self { region: Region::shared(fd, BYTES)?, timeout })
    }

    fn mutex(&self, row: usize) -> *mut libc::pthread_mutex_t {
        // The offset is below BYTES, inside the mapping.
        self.region.ptr().wrapping_add((row % STRIPES) * MUTEX).cast()
    }

    /// Waits for the stripe of `row`, at most `WM_TIMEOUT_S` (as read when
    /// the table was allocated). From a holder that died the stripe is
    /// taken over, and the guard says so ([`RowGuard::owner_died`]).
    ///
    /// # Errors
    /// [`Error::Timeout`] when another process held the stripe for the whole
    /// timeout; [`Error::Os`] when the lock is unusable.
    pub fn lock(&self, row: usize) -> Result<RowGuard<'_>> {
        let m = self.mutex(row);
        // SAFETY: `m` is an initialised process-shared mutex inside the
        // mapping, which lives as long as `self`.
        let mut r = unsafe { libc::pthread_mutex_trylock(m) };
        if r == libc::EBUSY {
            r = self.wait(m);
        }
        let owner_died = match r {
            0 => false,
            libc::EOWNERDEAD => {
                // SAFETY: this thread holds `m` (EOWNERDEAD hands it over).
                let c = unsafe { libc::pthread_mutex_consistent(m) };
                if c != 0 {
                    // SAFETY: as above; give it back unusable rather than keep it.
                    unsafe { libc::pthread_mutex_unlock(m) };
                    return Err(Error::os(format!("recovering the lock of row {row} from a dead holder"), io::Error::from_raw_os_error(c)));
                }
                true
            }
            libc::ETIMEDOUT => {
                return Err(Error::Timeout {
                    what: format!("waiting for the lock of row {row} (another process holds it)"),
                    secs: self.timeout.as_secs_f64(),
                });
            }
            e => return Err(Error::os(format!("locking row {row}"), io::Error::from_raw_os_error(e))),
        };
        Ok(RowGuard { mutex: m, owner_died, _locks: PhantomData })
    }

    /// `pthread_mutex_timedlock` until the timeout has passed by the
    /// monotonic clock (the call itself takes a wall-clock deadline: if the
    /// wall clock jumps ahead, the wait resumes for what is left; only a
    /// wall clock set back meanwhile can stretch it).
    fn wait(&self, m: *mut libc::pthread_mutex_t) -> libc::c_int {
        let start = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return libc::ETIMEDOUT;
            }
            let deadline = wall_clock_after(left);
            // SAFETY: as in `lock`; `deadline` is a valid timespec.
            let r = unsafe { libc::pthread_mutex_timedlock(m, &deadline) };
            if r != libc::ETIMEDOUT {
                return r;
            }
        }
    }
}

/// `CLOCK_REALTIME` now plus `d`, as `pthread_mutex_timedlock` wants it.
fn wall_clock_after(d: Duration) -> libc::timespec {
    // SAFETY: an all-zero timespec is valid storage for clock_gettime.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `now` is writable; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
    let secs = libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX / 2);
    let mut t = libc::timespec { tv_sec: now.tv_sec.saturating_add(secs), tv_nsec: now.tv_nsec + d.subsec_nanos() as libc::c_long };
    if t.tv_nsec >= 1_000_000_000 {
        t.tv_sec = t.tv_sec.saturating_add(1);
        t.tv_nsec -= 1_000_000_000;
    }
    t
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
        // SAFETY: this thread locked the mutex (a guard is not Send) and the
        // lock table outlives the guard.
        unsafe { libc::pthread_mutex_unlock(self.mutex) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(timeout: Duration) -> RowLocks {
        let fd = super::super::received(create().unwrap(), BYTES, 0, "row-lock table").unwrap();
        RowLocks::open(fd.as_fd(), timeout).unwrap()
    }

    #[test]
    fn a_held_stripe_times_out_and_is_free_again_after_the_guard() {
        let locks = table(Duration::from_millis(200));
        let held = locks.lock(7).unwrap();
        assert!(!held.owner_died());
        // Another thread waits for the same stripe (row 7 + STRIPES) and
        // gives up after the timeout; a different stripe is free.
        std::thread::scope(|s| {
            s.spawn(|| {
                let e = locks.lock(7 + STRIPES).unwrap_err();
                assert!(matches!(&e, Error::Timeout { what, .. } if what.contains(&format!("row {}", 7 + STRIPES))), "{e}");
                drop(locks.lock(8).unwrap());
            });
        });
        drop(held);
        std::thread::scope(|s| {
            s.spawn(|| drop(locks.lock(7).unwrap()));
        });
    }

    #[test]
    fn a_stripe_whose_holder_thread_ended_is_taken_over() {
        let locks = table(Duration::from_secs(60));
        // A thread that ends holding a robust mutex leaves it to the next
        // waiter, as a process that dies does.
        std::thread::scope(|s| {
            s.spawn(|| std::mem::forget(locks.lock(3).unwrap()));
        });
        let g = locks.lock(3).unwrap();
        assert!(g.owner_died());
        drop(g);
        assert!(!locks.lock(3).unwrap().owner_died());
    }
}
