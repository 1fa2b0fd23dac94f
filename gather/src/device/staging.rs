//! The buffers device calls reuse: device scratch and page-locked host
//! memory, kept between calls in a process-wide pool and grown when a call
//! needs more, never allocated per call. A call takes a [`Lease`] on one
//! set (concurrent calls take different sets, so they never share a
//! buffer), and gives it back when it ends.
//!
//! A buffer is only replaced (grown) once the stream has passed every copy
//! and kernel enqueued since the lease last waited for it: the old one may
//! be in use by the GPU until then (`cuMemFree` and `cuMemFreeHost` of
//! memory a pending copy uses are undefined).

use std::sync::{Arc, Mutex};

use wholemem::WholeMemory;
use wholemem::device::raw::cudarc::driver::CudaStream;
use wholemem::device::{DeviceBuffer, PinnedBuffer};

use crate::cuda::{Kernels, StreamCopy};
use crate::{Error, Result};

/// The device scratch a call may use, one buffer each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    /// Ids uploaded from the host.
    Ids,
    /// A dense input uploaded from the host, or converted rows.
    Src,
    /// Dense rows: a gather's output before it goes down, or rows in
    /// bucket order.
    Rows,
    /// The owner table of a kernel over the table (bases, first rows).
    Table,
    /// The owner table of a kernel over a dense buffer (an output).
    BufTable,
    /// The partition's first rows, for bucketing.
    Partition,
    /// Status words.
    Status,
    /// The repeat table's keys.
    Keys,
    /// The repeat table's positions.
    Vals,
    /// The keep mask of a scatter.
    Keep,
    /// Bucketing: each id's owner.
    Owner,
    /// Bucketing: ids per owner.
    Counts,
    /// Bucketing: cursors.
    Cursors,
    /// Bucketing: the ids grouped by owner.
    Bucketed,
    /// Bucketing: where each grouped id came from.
    Positions,
    /// NCCL: the ids other ranks ask of this one.
    Requests,
    /// NCCL: the rows this rank gathered for them.
    Replies,
    /// NCCL: the rows that came back, in bucket order.
    Staged,
}

/// The page-locked host memory a call may use, one buffer each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    /// Status words and counts coming down.
    Control,
    /// The owner tables of `Dev::Table` going up.
    Table,
    /// Those of `Dev::BufTable`.
    BufTable,
    /// Those of `Dev::Partition`.
    Partition,
    /// Ids going up (or down).
    Ids,
    /// Rows, first of two alternating buffers.
    Rows0,
    /// Rows, second.
    Rows1,
}

const DEV_SLOTS: usize = Dev::Staged as usize + 1;
const HOST_SLOTS: usize = Host::Rows1 as usize + 1;

/// The size a buffer is allocated with for `len` bytes when it held `had`:
/// half as much again at least (a batch that grows slowly does not
/// reallocate every call), in 64 KiB units.
pub(crate) fn grown_len(had: usize, len: usize) -> usize {
    const UNIT: usize = 64 << 10;
    let want = len.max(had.saturating_add(had / 2)).max(1);
    want.checked_next_multiple_of(UNIT).unwrap_or(want)
}

/// Named buffers that grow and are kept, generic over what a buffer is so
/// the rule is tested without a GPU.
#[derive(Debug)]
pub(crate) struct Slots<B> {
    bufs: Vec<Option<B>>,
}

impl<B> Slots<B> {
    pub(crate) fn new(n: usize) -> Self {
        Self { bufs: (0..n).map(|_| None).collect() }
    }

    /// Buffer `slot`, at least `len` bytes long: the one it holds when that
    /// is long enough; else `settle` is called (wait for pending work on
    /// the old one), the old one dropped and a new one of
    /// [`grown_len`] bytes made by `alloc`.
    pub(crate) fn get<E>(
        &mut self,
        slot: usize,
        len: usize,
        size: impl Fn(&B) -> usize,
        alloc: impl FnOnce(usize) -> std::result::Result<B, E>,
        settle: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<&mut B, E> {
        let had = self.bufs[slot].as_ref().map_or(0, &size);
        if self.bufs[slot].is_none() || had < len {
            if self.bufs[slot].is_some() {
                settle()?;
            }
            self.bufs[slot] = None;
            self.bufs[slot] = Some(alloc(grown_len(had, len))?);
        }
        Ok(self.bufs[slot].as_mut().expect("just filled"))
    }

    /// Buffer `slot` if one was made.
    pub(crate) fn peek(&self, slot: usize) -> Option<&B> {
        self.bufs[slot].as_ref()
    }
}

/// One set of buffers.
#[derive(Debug)]
struct Staging {
    dev: Slots<DeviceBuffer>,
    host: Slots<PinnedBuffer>,
    /// What the owner table buffers hold now (`Dev::Table`, `Dev::BufTable`,
    /// `Dev::Partition`): their contents as last uploaded, to skip an upload
    /// of the same.
    uploaded: [Vec<u8>; 3],
}

impl Staging {
    fn new() -> Self {
        Self { dev: Slots::new(DEV_SLOTS), host: Slots::new(HOST_SLOTS), uploaded: Default::default() }
    }
}

/// The sets not in use. A process uses one GPU (its context is bound once),
/// so every set belongs to it.
static POOL: Mutex<Vec<Staging>> = Mutex::new(Vec::new());

/// The kernels, loaded once into this process's context.
pub(crate) fn kernels(mem: &WholeMemory) -> Result<Arc<Kernels>> {
    static KERNELS: std::sync::OnceLock<std::result::Result<Arc<Kernels>, String>> = std::sync::OnceLock::new();
    let ctx = wholemem::device::raw::context(mem)
        .ok_or_else(|| Error::Cuda(format!("rank {} has no GPU for this table", mem.comm().world_rank())))?;
    KERNELS.get_or_init(|| Kernels::load(&ctx).map(Arc::new).map_err(|e| e.to_string())).clone().map_err(Error::Cuda)
}

pub(crate) fn cuda(e: impl std::fmt::Display) -> Error {
    Error::Cuda(e.to_string())
}

/// A call's hold on one set of buffers, with the stream and kernels it
/// uses. Given back on drop, after waiting for the stream if work is still
/// pending there (an error path that returned early).
pub(crate) struct Lease<'m> {
    set: Option<Staging>,
    mem: &'m WholeMemory,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) k: Arc<Kernels>,
    /// Work enqueued since the last wait.
    pending: bool,
    /// Table uploads (by table) enqueued since the last wait: their
    /// page-locked source must not be rewritten until then.
    uploading: [bool; 3],
}

impl<'m> Lease<'m> {
    /// A set of buffers for a call on `mem`'s GPU.
    ///
    /// # Errors
    /// [`Error::Cuda`] when the rank has no GPU or the kernels do not load.
    pub(crate) fn take(mem: &'m WholeMemory) -> Result<Self> {
        let stream = wholemem::device::raw::stream(mem)
            .ok_or_else(|| Error::Cuda(format!("rank {} has no GPU for this table", mem.comm().world_rank())))?;
        let k = kernels(mem)?;
        let set = POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop().unwrap_or_else(Staging::new);
        Ok(Self { set: Some(set), mem, stream, k, pending: false, uploading: [false; 3] })
    }

    fn set(&mut self) -> &mut Staging {
        self.set.as_mut().expect("held until drop")
    }

    /// Waits for the stream.
    ///
    /// # Errors
    /// [`Error::Cuda`]: a kernel or copy failed.
    pub(crate) fn wait(&mut self) -> Result<()> {
        self.pending = false;
        self.uploading = [false; 3];
        self.stream.synchronize().map_err(|e| Error::Cuda(format!("waiting for the GPU: {e:?}")))
    }

    /// Marks work as enqueued on the stream (the lease waits for it before
    /// replacing a buffer, or when dropped).
    pub(crate) fn enqueued(&mut self) {
        self.pending = true;
    }

    /// The device address of scratch buffer `d`, at least `len` bytes.
    ///
    /// # Errors
    /// The driver's, when a buffer must grow and cannot.
    pub(crate) fn dev(&mut self, d: Dev, len: usize) -> Result<u64> {
        let (mem, pending, stream) = (self.mem, self.pending, self.stream.clone());
        let set = self.set.as_mut().expect("held until drop");
        let grew = set.dev.peek(d as usize).is_none_or(|b| b.len() < len);
        let replaced = set.dev.peek(d as usize).is_some_and(|b| b.len() < len);
        let addr = set
            .dev
            .get(
                d as usize,
                len,
                DeviceBuffer::len,
                |n| DeviceBuffer::new(mem, n).map_err(Error::from),
                || if pending { stream.synchronize().map_err(|e| Error::Cuda(format!("waiting for the GPU: {e:?}"))) } else { Ok(()) },
            )?
            .addr();
        if grew {
            // Whatever a table buffer held is gone.
            if let Some(i) = table_index(d) {
                set.uploaded[i].clear();
            }
        }
        if replaced && pending {
            // Waited for before the old buffer went.
            self.pending = false;
            self.uploading = [false; 3];
        }
        Ok(addr)
    }

    /// Page-locked buffer `h`, at least `len` bytes.
    ///
    /// # Errors
    /// The driver's, when a buffer must grow and cannot.
    pub(crate) fn host(&mut self, h: Host, len: usize) -> Result<&mut PinnedBuffer> {
        let (mem, pending, stream) = (self.mem, self.pending, self.stream.clone());
        let set = self.set.as_mut().expect("held until drop");
        if set.host.peek(h as usize).is_some_and(|b| b.len() < len) && pending {
            // Waited for below before the old buffer goes (or the call fails).
            self.pending = false;
            self.uploading = [false; 3];
        }
        let set = self.set.as_mut().expect("held until drop");
        set.host.get(
            h as usize,
            len,
            PinnedBuffer::len,
            |n| PinnedBuffer::new(mem, n).map_err(Error::from),
            || if pending { stream.synchronize().map_err(|e| Error::Cuda(format!("waiting for the GPU: {e:?}"))) } else { Ok(()) },
        )
    }

    /// Puts `content` in table buffer `d` (`Dev::Table`, `Dev::BufTable` or
    /// `Dev::Partition`) through page-locked memory, unless it holds it
    /// already; its device address.
    ///
    /// # Errors
    /// The driver's.
    pub(crate) fn table(&mut self, d: Dev, content: &[u8]) -> Result<u64> {
        let i = table_index(d).expect("a table buffer");
        let addr = self.dev(d, content.len())?;
        if self.set().uploaded[i] == content {
            return Ok(addr);
        }
        // The page-locked copy must not be rewritten while an earlier
        // upload from it may still be pending (not within one call, as
        // the paths use the tables).
        if self.uploading[i] {
            self.wait()?;
        }
        let pinned = self.host([Host::Table, Host::BufTable, Host::Partition][i], content.len())?;
        pinned.as_mut_slice()[..content.len()].copy_from_slice(content);
        let src = pinned.as_ptr();
        // SAFETY: `addr` holds at least `content.len()` bytes (just sized);
        // `src` is page-locked and not touched again until the stream has
        // passed the copy (the lease waits before rewriting it or handing
        // it on).
        unsafe { self.k.copy(&self.stream, StreamCopy::ToDevice { dst: addr, src, len: content.len() }) }.map_err(cuda)?;
        self.pending = true;
        self.uploading[i] = true;
        let set = self.set();
        set.uploaded[i].clear();
        set.uploaded[i].extend_from_slice(content);
        Ok(addr)
    }

    /// Enqueues one copy.
    ///
    /// # Safety
    /// As [`Kernels::copy`].
    ///
    /// # Errors
    /// The driver's.
    pub(crate) unsafe fn copy(&mut self, op: StreamCopy) -> Result<()> {
        self.pending = true;
        // SAFETY: forwarded.
        unsafe { self.k.copy(&self.stream, op) }.map_err(cuda)
    }
}

fn table_index(d: Dev) -> Option<usize> {
    match d {
        Dev::Table => Some(0),
        Dev::BufTable => Some(1),
        Dev::Partition => Some(2),
        _ => None,
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.pending {
            // An early return left work on the stream that may still use
            // these buffers: they go back only once it is done.
            let _ = self.stream.synchronize();
        }
        if let Some(set) = self.set.take() {
            POOL.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(set);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A buffer of the fake allocator: its length and a serial number.
    #[derive(Debug)]
    struct Fake(usize, usize);

    #[test]
    fn staging_buffers_are_reused_between_calls_and_grow_only_after_pending_work() {
        let made = Cell::new(0usize);
        let settled = Cell::new(0usize);
        let mut slots: Slots<Fake> = Slots::new(3);
        let alloc = |n: usize| -> std::result::Result<Fake, ()> {
            made.set(made.get() + 1);
            Ok(Fake(n, made.get()))
        };
        let settle = || -> std::result::Result<(), ()> {
            settled.set(settled.get() + 1);
            Ok(())
        };
        // A first call allocates once; a thousand calls of the same size or less, never again.
        let first = slots.get(0, 1000, |b| b.0, alloc, settle).unwrap().1;
        for len in (1..=1000).rev() {
            let b = slots.get(0, len, |b| b.0, alloc, settle).unwrap();
            assert_eq!(b.1, first, "call of {len} bytes");
        }
        assert_eq!((made.get(), settled.get()), (1, 0));
        // Another slot is another buffer.
        slots.get(1, 10, |b| b.0, alloc, settle).unwrap();
        assert_eq!(made.get(), 2);
        // A larger call grows it once, waiting first for work on the old one.
        let b = slots.get(0, 64 << 10 | 1, |b| b.0, alloc, settle).unwrap();
        assert!(b.0 > 64 << 10);
        assert_eq!((made.get(), settled.get()), (3, 1));
        // A slowly growing batch does not reallocate on every call.
        let before = made.get();
        for len in (64 << 10) + 2..(64 << 10) + 2000 {
            slots.get(0, len, |b| b.0, alloc, settle).unwrap();
        }
        assert_eq!(made.get(), before);
        // A failed wait leaves the old buffer in place.
        let had = slots.peek(0).unwrap().1;
        assert!(slots.get(0, 10 << 20, |b| b.0, alloc, || Err(())).is_err());
        assert_eq!(slots.peek(0).unwrap().1, had);
    }

    #[test]
    fn buffers_grow_by_half_at_least_in_64_kib_units() {
        assert_eq!(grown_len(0, 1), 64 << 10);
        assert_eq!(grown_len(0, 0), 64 << 10);
        assert_eq!(grown_len(64 << 10, (64 << 10) + 1), 128 << 10);
        assert_eq!(grown_len(10 << 20, (10 << 20) + 1), 15 << 20);
        assert_eq!(grown_len(1 << 20, 100 << 20), 100 << 20);
        assert!(grown_len(usize::MAX / 2, usize::MAX / 2 + 1) > usize::MAX / 2);
    }
}
