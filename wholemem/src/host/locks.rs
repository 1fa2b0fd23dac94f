//! Striped row locks in shared memory, so that ranks scattering into the
//! same row of mapped memory at once leave one whole row, never a torn one.
//!
//! A lock word holds the pid of its holder (0 when free). A waiter that has
//! spun for a while checks whether the holder is still alive and takes the
//! lock over from a dead one, so a rank killed mid-write cannot wedge the
//! others.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::map::Region;

/// Lock words per table: rows map to words by `row % STRIPES`.
pub const STRIPES: usize = 4096;
/// Bytes per lock word: packed. A 16 KiB table stays in the caches and the
/// TLB; a cache line per word (256 KiB) measured slower on random rows.
const LINE: usize = std::mem::size_of::<AtomicU32>();
/// Bytes of the lock table.
pub const BYTES: usize = STRIPES * LINE;

/// The lock table of one mapped allocation.
#[derive(Debug)]
pub struct RowLocks {
    region: Region,
    pid: u32,
}

/// Holds one stripe until dropped.
#[derive(Debug)]
pub struct RowGuard<'a> {
    word: &'a AtomicU32,
    pid: u32,
}

impl RowLocks {
    /// Locks over a shared mapping of [`BYTES`] bytes (zero-filled when new).
    pub(crate) fn new(region: Region) -> Self {
        Self { region, pid: std::process::id() }
    }

    fn word(&self, row: usize) -> &AtomicU32 {
        let at = (row % STRIPES) * LINE;
        // SAFETY: the region is BYTES long and page aligned, so every offset
        // below BYTES that is a multiple of LINE holds an aligned AtomicU32
        // inside it; it lives as long as `self`. Other processes touch it only
        // through atomics.
        unsafe { &*self.region.ptr().add(at).cast::<AtomicU32>() }
    }

    /// Waits for the stripe of `row`, taking it over from a holder that died.
    pub fn lock(&self, row: usize) -> RowGuard<'_> {
        let word = self.word(row);
        let mut spins = 0u32;
        // Read the clock only once contended: it is not free in a VM.
        let mut last_check: Option<Instant> = None;
        loop {
            match word.compare_exchange_weak(0, self.pid, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return RowGuard { word, pid: self.pid },
                Err(holder) => {
                    spins += 1;
                    if spins < 256 {
                        std::hint::spin_loop();
                        continue;
                    }
                    std::thread::yield_now();
                    let since = *last_check.get_or_insert_with(Instant::now);
                    if holder != 0 && since.elapsed() > Duration::from_millis(10) {
                        last_check = Some(Instant::now());
                        if !alive(holder) {
                            // Take over from a dead holder (another waiter
                            // may win the race; then keep waiting).
                            let _ = word.compare_exchange(holder, 0, Ordering::AcqRel, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        let _ = self.word.compare_exchange(self.pid, 0, Ordering::Release, Ordering::Relaxed);
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
