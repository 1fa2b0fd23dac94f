//! Reaching rows of a table from this rank: by pointer, by copy, and this
//! rank's own rows in place (`unsafe`, with the contract spelled out).

use super::WholeMemory;
use crate::CommonError;
use crate::types::Location;
use crate::{Error, Result};

impl WholeMemory {
    /// The first byte of `row`, if this rank maps it.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] for a row past the end.
    pub fn row_ptr(&self, row: usize) -> Result<Option<*mut u8>> {
        if row >= self.rows() {
            return Err(Error::IndexOutOfRange { index: i64::try_from(row).unwrap_or(i64::MAX), rows: self.rows() });
        }
        let owner = self.partition.owner(row);
        Ok(self.rank_ptr(owner).map(|p| p.wrapping_add((row - self.partition.offset(owner)) * self.granularity)))
    }

    /// This rank's rows, borrowed in place.
    ///
    /// Prefer [`read_local`](Self::read_local), which copies: a slice over
    /// memory other processes may write cannot be made safe by this process
    /// alone.
    ///
    /// # Safety
    /// While the slice lives, no process may write these rows: no other
    /// rank's gather, scatter or load that writes them (Continuous and
    /// Chunked memory map them on every rank of the node), no
    /// [`local_bytes_mut`](Self::local_bytes_mut) on another rank's handle
    /// of this table. Separate such writes from the borrow with a
    /// collective ([`Communicator::barrier`](wm_comm::Communicator::barrier)). Distributed and Hierarchy
    /// host rows are private to this process, so there only this
    /// process's own borrows count, which the borrow checker sees.
    ///
    /// # Panics
    /// For device memory, which has no host view: use
    /// [`read_rows`](Self::read_rows) and [`write_rows`](Self::write_rows).
    pub unsafe fn local_bytes(&self) -> &[u8] {
        let (p, len) = self.own_rows();
        // SAFETY: `p` starts this rank's rows, mapped read-write for `len`
        // bytes (dangling only when len == 0) and alive as long as `self`;
        // no other process writes them meanwhile (the caller's contract).
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// This rank's rows, writable in place. Making the slice counts as a
    /// write of every one of them ([`write_generation`](Self::write_generation)).
    ///
    /// Prefer [`write_local`](Self::write_local), which copies.
    ///
    /// # Safety
    /// While the slice lives, no other process may read or write these
    /// rows (as [`local_bytes`](Self::local_bytes), reads included: a
    /// reader would see half-written rows and a writer's bytes would
    /// change what this slice holds).
    ///
    /// # Panics
    /// For device memory, as [`local_bytes`](Self::local_bytes).
    pub unsafe fn local_bytes_mut(&mut self) -> &mut [u8] {
        let (p, len) = self.own_rows();
        // Before the writes, which the borrow keeps from every other user
        // of this handle until they are done.
        self.note_written(self.local_rows());
        // SAFETY: as for `local_bytes`; `&mut self` excludes other users in
        // this process, the caller's contract other processes.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// This rank's rows as a slice for a system call to fill (file
    /// loading), without the exclusion [`local_bytes_mut`](Self::local_bytes_mut)
    /// asks of other processes.
    ///
    /// # Safety
    /// The slice (and every part of it) may only be handed to system calls
    /// that store bytes into it (positioned reads); no Rust code may read
    /// or write its contents, and none may keep it past those calls. Then
    /// nothing in this process assumes what the memory holds while other
    /// processes may write it.
    pub(crate) unsafe fn local_bytes_for_io(&mut self) -> &mut [u8] {
        let (p, len) = self.own_rows();
        // A write of every row, counted as `local_bytes_mut` counts it.
        self.note_written(self.local_rows());
        // SAFETY: `p` starts this rank's rows, mapped read-write for `len`
        // bytes and alive as long as the borrow of `self`; only system
        // calls touch the contents (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// This rank's rows as a slice for a system call or the CUDA driver to
    /// read (file storing, uploads), without the exclusion
    /// [`local_bytes`](Self::local_bytes) asks of other processes. Rows
    /// other processes write meanwhile may be stored torn, as with
    /// [`read_rows`](Self::read_rows).
    ///
    /// # Safety
    /// The slice (and every part of it) may only be handed to system calls
    /// or driver copies that read it as plain bytes (positioned writes,
    /// host-to-device copies); no Rust code may read its contents, and
    /// none may keep it past those calls.
    pub(crate) unsafe fn local_bytes_for_output(&self) -> &[u8] {
        let (p, len) = self.own_rows();
        // SAFETY: as for `local_bytes_for_io`: only system calls and the
        // driver read the contents (the caller's contract).
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// The first byte of this rank's host rows and their length.
    fn own_rows(&self) -> (*mut u8, usize) {
        assert!(self.loc == Location::Host, "device memory has no host view: use read_rows/write_rows or the device gather");
        let len = self.local_rows().len() * self.granularity;
        let p = self.rank_ptr(self.comm.rank()).expect("a rank maps its own host rows");
        (p, len)
    }

    /// Copies this rank's rows into `out` (as many bytes as the rows hold),
    /// for every memory type and location: the safe counterpart of
    /// [`local_bytes`](Self::local_bytes). Rows another rank writes
    /// meanwhile may be copied half-written; separate writes from reads
    /// with a collective.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] when `out` is not the size of this rank's
    /// rows.
    pub fn read_local(&self, out: &mut [u8]) -> Result<()> {
        self.check_local_len(out.len())?;
        self.read_rows(self.local_rows().start, out)
    }

    /// Copies `src` over this rank's rows (as many bytes as the rows hold):
    /// the safe counterpart of [`local_bytes_mut`](Self::local_bytes_mut).
    /// Rows of mapped tables are written under their row locks.
    ///
    /// # Errors
    /// As [`read_local`](Self::read_local), and as [`write_rows`](Self::write_rows).
    pub fn write_local(&mut self, src: &[u8]) -> Result<()> {
        self.check_local_len(src.len())?;
        self.write_rows(self.local_rows().start, src)
    }

    /// Copies this rank's host rows, up to `dst.len()` bytes from the
    /// first, straight from the table into a device buffer — no staging
    /// copy, so a table registered with CUDA is read page-locked. Returns
    /// the bytes copied. Rows another rank writes meanwhile may arrive
    /// half-written.
    ///
    /// # Errors
    /// [`crate::CommonError::InvalidArgument`] for device memory (copy device rows with
    /// the device buffers' own copies); the driver's error.
    #[cfg(feature = "cuda")]
    pub fn upload_local(&self, dst: &mut crate::device::DeviceBuffer) -> Result<usize> {
        if self.loc != Location::Host {
            return Err(Error::Common(CommonError::InvalidArgument(
                "upload_local copies host rows; this table is in device memory".into(),
            )));
        }
        // SAFETY: the slice goes only to the driver's host-to-device copy,
        // which reads it as bytes; it is dropped when this call returns.
        let src = unsafe { self.local_bytes_for_output() };
        let n = src.len().min(dst.len());
        dst.upload(&src[..n])?;
        Ok(n)
    }

    fn check_local_len(&self, len: usize) -> Result<()> {
        let want = self.local_rows().len() * self.granularity;
        if len != want {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "rank {} owns {} rows of {} bytes ({want} bytes); the buffer has {len}",
                self.comm.world_rank(),
                self.local_rows().len(),
                self.granularity
            ))));
        }
        Ok(())
    }

    /// Copies whole rows starting at `first` into `out` (a multiple of the
    /// row size), through the mapping (for device memory, by a copy from
    /// the GPU).
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] past the end; [`Error::Unsupported`] when a
    /// row is not mapped on this rank.
    pub fn read_rows(&self, first: usize, out: &mut [u8]) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self.loc == Location::Device {
            return self.device_rows(first, out.len(), |gpu, dev, i, len| {
                let g = self.granularity;
                // SAFETY: `dev` addresses `len` bytes of rows this rank maps.
                unsafe { crate::device::memory::copy::to_host(gpu, &mut out[i * g..i * g + len], dev) }
            });
        }
        self.each_row(first, out.len(), |src, i, g| {
            // SAFETY: `src` points at a mapped row of `g` bytes; `out` is a
            // distinct private buffer.
            unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(i * g), g) };
            Ok(())
        })
    }

    /// Copies `src` (whole rows) into the table starting at row `first`,
    /// and counts the write ([`write_generation`](Self::write_generation)).
    /// Every row is checked first: a run past the end or through rows this
    /// rank does not map writes nothing.
    ///
    /// # Errors
    /// As [`read_rows`](Self::read_rows).
    pub fn write_rows(&mut self, first: usize, src: &[u8]) -> Result<()> {
        let n = self.row_run(first, src.len())?;
        self.check_reachable(first, n)?;
        let written = self.copy_in(first, src);
        // After the rows, even when a copy failed part way.
        self.note_written(first..first + n);
        written
    }

    /// [`write_rows`](Self::write_rows)'s copy, the rows checked.
    fn copy_in(&self, first: usize, src: &[u8]) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self.loc == Location::Device {
            return self.device_rows(first, src.len(), |gpu, dev, i, len| {
                let g = self.granularity;
                // SAFETY: `dev` addresses `len` bytes of rows this rank maps.
                unsafe { crate::device::memory::copy::to_device(gpu, dev, &src[i * g..i * g + len]) }
            });
        }
        let locks = self.row_locks.as_ref();
        self.each_row(first, src.len(), |dst, i, g| {
            let _row = match locks {
                Some(l) => Some(l.try_lock(first + i).map_or_else(|| l.lock(first + i), Ok)?),
                None => None,
            };
            // SAFETY: `dst` points at a mapped row of `g` bytes; `src` is a
            // distinct private buffer.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(i * g), dst, g) };
            Ok(())
        })
    }

    /// Checks a run of whole rows and returns how many.
    fn row_run(&self, first: usize, bytes: usize) -> Result<usize> {
        let g = self.granularity;
        if bytes % g != 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!("{bytes} bytes is not a whole number of {g}-byte rows"))));
        }
        let n = bytes / g;
        if first.checked_add(n).is_none_or(|end| end > self.rows()) {
            let last = first.saturating_add(n).saturating_sub(1);
            return Err(Error::IndexOutOfRange { index: i64::try_from(last).unwrap_or(i64::MAX), rows: self.rows() });
        }
        Ok(n)
    }

    /// Checks that this rank reaches every row of `first..first + n` (rows
    /// in range): a rank's rows at a time, so a write never stops half way
    /// at a row it cannot reach.
    fn check_reachable(&self, first: usize, n: usize) -> Result<()> {
        let mut row = first;
        while row < first + n {
            let owner = self.partition.owner(row);
            let reached = match self.loc {
                Location::Host => self.rank_ptr(owner).is_some(),
                Location::Device => self.device_ptr(owner).is_some(),
            };
            if !reached {
                return Err(self.unmapped(row));
            }
            row = self.partition.offset(owner) + self.partition.count(owner);
        }
        Ok(())
    }

    fn unmapped(&self, row: usize) -> Error {
        Error::Unsupported {
            what: format!("reaching row {row} from rank {}", self.comm.world_rank()),
            reason: format!(
                "it belongs to rank {} and {} memory maps only a rank's own rows",
                self.comm.world_ranks()[self.partition.owner(row)],
                self.ty
            ),
        }
    }

    fn each_row(&self, first: usize, bytes: usize, mut f: impl FnMut(*mut u8, usize, usize) -> Result<()>) -> Result<()> {
        let n = self.row_run(first, bytes)?;
        for i in 0..n {
            let Some(p) = self.row_ptr(first + i)? else { return Err(self.unmapped(first + i)) };
            f(p, i, self.granularity)?;
        }
        Ok(())
    }

    /// Calls `f(gpu, device address, first row index in the run, bytes)` for
    /// each stretch of the rows that one rank owns.
    #[cfg(feature = "cuda")]
    fn device_rows(
        &self,
        first: usize,
        bytes: usize,
        mut f: impl FnMut(&crate::device::driver::Gpu, u64, usize, usize) -> std::result::Result<(), crate::device::driver::CuError>,
    ) -> Result<()> {
        let n = self.row_run(first, bytes)?;
        let gpu = self.gpu().expect("device memory has a GPU");
        let mut i = 0;
        while i < n {
            let row = first + i;
            let owner = self.partition.owner(row);
            let Some(base) = self.device_ptr(owner) else { return Err(self.unmapped(row)) };
            let run = (self.partition.offset(owner) + self.partition.count(owner)).min(first + n) - row;
            let at = base + ((row - self.partition.offset(owner)) * self.granularity) as u64;
            f(gpu, at, i, run * self.granularity)?;
            i += run;
        }
        Ok(())
    }
}
