//! What a cache of a table's rows checks before trusting what it holds:
//! which allocation a handle is ([`WholeMemory::serial`]), and how often
//! a rank's rows were written ([`WholeMemory::write_generation`]).

use std::ops::Range;
use std::sync::atomic::Ordering;

use super::WholeMemory;

/// The number of the next allocation of this process: from 1, never
/// reused.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A number for a new allocation.
pub(super) fn next_serial() -> u64 {
    NEXT_SERIAL.fetch_add(1, Ordering::Relaxed)
}

impl WholeMemory {
    /// This allocation's number: no other table this process allocates,
    /// before or after, has it — not even one allocated where this one was
    /// once it is freed. It names a table within a process (ranks may
    /// number one table differently), which is what a cache needs to tell
    /// its own table from another.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The write generation of this rank's rows: a count that every write
    /// to them moves. A cache of this rank's rows that remembers the value
    /// it saw when it copied them knows they are unchanged while the value
    /// is. Which writes it counts:
    ///
    /// - **Continuous and Chunked host memory**: every rank's writes to
    ///   this rank's rows; the counts live beside the row locks, in memory
    ///   the table's ranks share, and a writer moves them after it wrote
    ///   the rows (so a value read after a write's call returned on the
    ///   writer — and a collective since — includes it).
    /// - **Distributed and Hierarchy memory**: only this process writes its
    ///   rows (its own writes, and its part of collective writes such as
    ///   `wm_gather::scatter`), so its own count is every write. Ranks
    ///   learn each other's through their collectives.
    /// - **Continuous and Chunked device memory**: this process's writes to
    ///   its own rows only; another rank writing them through its mapping
    ///   is not counted.
    ///
    /// Every write path of wholemem and `wm-gather` moves it:
    /// [`write_rows`](Self::write_rows), [`write_local`](Self::write_local)
    /// (and `WholeTensor`'s row writes), [`local_bytes_mut`](Self::local_bytes_mut)
    /// (when the slice is made), [`files::load`](crate::files::load), and
    /// gather's scatters. Checks that fail first (a bad id, a bad range,
    /// files of the wrong shape) write nothing and move nothing. Code that
    /// writes rows through a pointer ([`rank_ptr`](Self::rank_ptr),
    /// [`row_ptr`](Self::row_ptr), [`continuous_base`](Self::continuous_base),
    /// [`device_ptr`](Self::device_ptr)) calls
    /// [`note_written`](Self::note_written) itself.
    pub fn write_generation(&self) -> u64 {
        match self.row_locks.as_ref().and_then(|l| l.generation(self.comm.rank())) {
            Some(shared) => shared.load(Ordering::Acquire),
            None => self.own_writes.load(Ordering::Acquire),
        }
    }

    /// Records that rows `rows` were written (through a pointer, or by a
    /// write path of another crate): moves the
    /// [`write_generation`](Self::write_generation) of every rank whose
    /// rows they include, as that generation counts (for mapped host
    /// memory every such rank's; elsewhere this rank's, when they include
    /// its rows). Call it after writing mapped host rows, so that a rank
    /// seeing the new generation finds the rows written; for rows only
    /// this process reaches, before or after alike. Rows past the end are
    /// ignored.
    pub fn note_written(&self, rows: Range<usize>) {
        let end = rows.end.min(self.rows());
        if rows.start >= end {
            return;
        }
        let p = &self.partition;
        if let Some(locks) = &self.row_locks {
            for r in p.owner(rows.start)..=p.owner(end - 1) {
                if let Some(g) = locks.generation(r) {
                    g.fetch_add(1, Ordering::Release);
                }
            }
            return;
        }
        let own = self.local_rows();
        if rows.start < own.end && own.start < end {
            self.own_writes.fetch_add(1, Ordering::Release);
        }
    }
}
