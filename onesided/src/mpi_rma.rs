//! MPI RMA reads (feature `mpi`), through rsmpi's raw bindings (rsmpi has
//! no RMA API): the only unsafe code of the transport.
//!
//! A table created with the `mpi` method opens one window per table over
//! every rank's rows (`MPI_Win_create` on the read-only mapping its read
//! server uses), collectively, and opens a passive-target epoch on it at
//! once (`MPI_Win_lock_all` with `MPI_MODE_NOCHECK`), which stays open
//! until the table is freed. A read posts one `MPI_Get` per owner whose
//! indexed types (`MPI_Type_create_hindexed_block` on both sides) put
//! every row straight into its place in the output (or a staging buffer
//! when it converts), all before waiting, then one `MPI_Win_flush_all`:
//! the owners call nothing. `publish` adds `MPI_Win_sync` (the separate memory model's
//! barrier between the owner's writes and the window). Every call goes
//! through the table communicator's MPI lock (MPI is initialised with
//! serialised threading), so reads from several threads take turns, and
//! take turns with that communicator's collectives on this rank.

use std::ffi::c_int;
use std::sync::Arc;

use mpi::ffi;
use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wm_comm::Communicator;
use wm_comm::mpi_backend::{MpiComm, MpiExt};
use wm_gather::RowLayout;
use wm_gather::rows::{RowSource, gather_from};

use crate::profile::{Counters, Span, timed};
use crate::shm::OwnerRows;
use crate::transport::{ReadRequest, Transport};
use crate::{Error, Method, Result};

/// An MPI window handle, used only under the communicator's MPI lock.
struct RawWin(ffi::MPI_Win);

// SAFETY: the handle is used only inside `MpiComm::with_raw`, which holds
// the locks that keep MPI calls within the threading MPI granted.
unsafe impl Send for RawWin {}
// SAFETY: as above.
unsafe impl Sync for RawWin {}

/// MPI's words for an error code.
fn strerror(code: c_int) -> String {
    let mut buf = vec![0 as std::ffi::c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: `buf` holds MPI_MAX_ERROR_STRING (≤ 512 in Open MPI and
    // MPICH) characters; MPI_Error_string writes at most that and its length.
    let r = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr(), &mut len) };
    if r != 0 {
        return format!("MPI error {code}");
    }
    let bytes: Vec<u8> = buf[..usize::try_from(len).unwrap_or(0).min(buf.len())].iter().map(|&c| c as u8).collect();
    format!("{} ({code})", String::from_utf8_lossy(&bytes))
}

fn check(call: &'static str, r: c_int) -> Result<()> {
    if r == ffi::MPI_SUCCESS as c_int { Ok(()) } else { Err(Error::Mpi { call, detail: strerror(r) }) }
}

/// A table's window over every rank's rows.
pub(crate) struct Window {
    table: String,
    comm: Arc<dyn Communicator>,
    win: RawWin,
    /// Set (under the MPI lock) once the window is freed: a reader that
    /// gets the lock later must not touch it.
    freed: std::sync::atomic::AtomicBool,
    /// This rank's rows, kept mapped while the window exposes them.
    _rows: Arc<OwnerRows>,
    first: Vec<usize>,
    row_bytes: usize,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Window({:?})", self.table)
    }
}

fn mpi_of(comm: &Arc<dyn Communicator>) -> Result<&MpiComm> {
    comm.as_mpi().ok_or_else(|| Error::Unsupported {
        what: "MPI RMA reads".into(),
        reason: format!("the table's communicator is the {} backend's, not MPI's: start the job with mpirun", comm.backend()),
    })
}

impl Window {
    /// Opens the table's window when the method is `mpi` (collective;
    /// every rank asks for the same method, checked before); `None`
    /// otherwise.
    pub(crate) fn for_table(
        method: Option<Method>,
        comm: &Arc<dyn Communicator>,
        rows: &Arc<OwnerRows>,
        table: &str,
        counts: &[usize],
        row_bytes: usize,
    ) -> Result<Option<Arc<Self>>> {
        if method != Some(Method::Mpi) {
            return Ok(None);
        }
        let mpi = agree(comm.as_ref(), mpi_of(comm).map(|_| ()), Rule::Lowest);
        mpi?;
        let m = mpi_of(comm)?;
        let size = ffi::MPI_Aint::try_from(rows.bytes())
            .map_err(|_| Error::Common(CommonError::InvalidArgument(format!("{} bytes of rows for one window", rows.bytes()))))?;
        let opened = m
            .with_raw(|raw| -> Result<RawWin> {
                let mut win = ffi::MPI_Win(std::ptr::null_mut());
                // SAFETY: every rank calls this together (the method is agreed);
                // the base is this rank's rows, mapped (read-only: the window is
                // only read from) for as long as the window lives, which holds
                // `rows`; the out pointer is a local.
                unsafe {
                    check(
                        "MPI_Win_create",
                        ffi::MPI_Win_create(rows.first_row().cast_mut().cast(), size, 1, ffi::RSMPI_INFO_NULL, raw, &mut win),
                    )?;
                    check("MPI_Win_set_errhandler", ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN))?;
                    check("MPI_Win_lock_all", ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as c_int, win))?;
                }
                Ok(RawWin(win))
            })
            .map_err(Error::from)
            .and_then(|opened| opened);
        let win = agree(comm.as_ref(), opened, Rule::Lowest)?;
        let mut first = Vec::with_capacity(counts.len());
        let mut at = 0;
        for &c in counts {
            first.push(at);
            at += c;
        }
        Ok(Some(Arc::new(Self {
            table: table.to_owned(),
            comm: comm.clone(),
            win,
            freed: std::sync::atomic::AtomicBool::new(false),
            _rows: rows.clone(),
            first,
            row_bytes,
        })))
    }

    /// Orders this rank's earlier writes before later reads of the window
    /// (part of publish, before its barrier).
    pub(crate) fn sync(&self) -> Result<()> {
        let m = mpi_of(&self.comm)?;
        // SAFETY: the window is open; under the communicator's MPI lock.
        m.with_raw(|_| check("MPI_Win_sync", unsafe { ffi::MPI_Win_sync(self.win.0) }))?
    }

    /// Ends the epoch and frees the window (collective).
    pub(crate) fn free(self: Arc<Self>, comm: &dyn Communicator) -> Result<()> {
        let m = mpi_of(&self.comm)?;
        let mut win = self.win.0;
        let r = m
            .with_raw(|_| {
                self.freed.store(true, std::sync::atomic::Ordering::Release);
                // SAFETY: the window is open and locked by this rank's
                // lock_all; every rank frees it together (free is collective);
                // no reader touches it after `freed` (checked under this lock).
                unsafe {
                    check("MPI_Win_unlock_all", ffi::MPI_Win_unlock_all(win))?;
                    check("MPI_Win_free", ffi::MPI_Win_free(&mut win))
                }
            })
            .map_err(Error::from)
            .and_then(|freed| freed);
        agree(comm, r, Rule::Lowest)
    }
}

/// Rows per indexed get.
const CHUNK: usize = 1 << 16;

/// One `MPI_Get` of `count` bytes at each of `there` (window
/// displacements of `target`) to `dest` plus each of `here`.
fn get_indexed(
    dest: *mut u8,
    here: &[ffi::MPI_Aint],
    there: &[ffi::MPI_Aint],
    count: c_int,
    target: c_int,
    win: ffi::MPI_Win,
) -> Result<()> {
    let n = c_int::try_from(here.len()).map_err(|_| Error::Common(CommonError::InvalidArgument("too many rows for one MPI get".into())))?;
    // SAFETY: the displacement arrays hold `n` entries each and outlive the
    // calls (MPI copies them into the types); every `dest + here[i]` is
    // `count` writable bytes the caller keeps alive until the flush, every
    // `there[i]` a range inside the target's window; the types are freed
    // after the get, which keeps what it needs (MPI's rule); under the
    // communicator's MPI lock.
    unsafe {
        let (mut origin, mut remote) = (std::mem::zeroed::<ffi::MPI_Datatype>(), std::mem::zeroed::<ffi::MPI_Datatype>());
        check(
            "MPI_Type_create_hindexed_block",
            ffi::MPI_Type_create_hindexed_block(n, count, here.as_ptr(), ffi::RSMPI_UINT8_T, &mut origin),
        )?;
        check(
            "MPI_Type_create_hindexed_block",
            ffi::MPI_Type_create_hindexed_block(n, count, there.as_ptr(), ffi::RSMPI_UINT8_T, &mut remote),
        )?;
        let committed = check("MPI_Type_commit", ffi::MPI_Type_commit(&mut origin))
            .and_then(|_| check("MPI_Type_commit", ffi::MPI_Type_commit(&mut remote)));
        let got = committed.and_then(|_| check("MPI_Get", ffi::MPI_Get(dest.cast(), 1, origin, target, 0, 1, remote, win)));
        ffi::MPI_Type_free(&mut origin);
        ffi::MPI_Type_free(&mut remote);
        got
    }
}

impl Transport for Window {
    fn method(&self) -> Method {
        Method::Mpi
    }

    fn read(&self, req: &mut ReadRequest<'_>, profile: Option<&Counters>) -> Result<()> {
        let n = req.rows.len();
        let (skip, len) = (req.layout.skip_bytes(), req.layout.bytes());
        let count =
            c_int::try_from(len).map_err(|_| Error::Common(CommonError::InvalidArgument(format!("rows of {len} bytes for MPI"))))?;
        let direct = req.out_dtype == req.layout.dtype();
        let mut staging = if direct { Vec::new() } else { vec![0u8; n * len] };
        let dest: *mut u8 = if direct { req.out.as_mut_ptr() } else { staging.as_mut_ptr() };
        let place = |k: usize| if direct { dest.wrapping_add(req.slots.map_or(k, |s| s[k]) * len) } else { dest.wrapping_add(k * len) };
        let m = mpi_of(&self.comm)?;
        let t = std::time::Instant::now();
        let posted = m.with_raw(|_| -> Result<()> {
            if self.freed.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::Gone { table: self.table.clone(), detail: "this process's job freed it".into() });
            }
            // One get per owner (and per `CHUNK` rows): an indexed type on
            // each side places every row, so the library moves them in one
            // operation rather than one per row.
            let mut by_owner: Vec<Vec<usize>> = vec![Vec::new(); self.first.len()];
            for (k, &o) in req.owners.iter().enumerate() {
                by_owner[o].push(k);
            }
            let mut first_err = Ok(());
            'owners: for (o, ks) in by_owner.iter().enumerate() {
                for chunk in ks.chunks(CHUNK) {
                    let here: Vec<ffi::MPI_Aint> = chunk.iter().map(|&k| (place(k) as usize - dest as usize) as ffi::MPI_Aint).collect();
                    let there: Vec<ffi::MPI_Aint> =
                        chunk.iter().map(|&k| ((req.rows[k] - self.first[o]) * self.row_bytes + skip) as ffi::MPI_Aint).collect();
                    let r = get_indexed(dest, &here, &there, count, o as c_int, self.win.0);
                    if r.is_err() {
                        first_err = r;
                        break 'owners;
                    }
                }
            }
            if let Some(p) = profile {
                p.add(Span::Post, t);
            }
            let t = std::time::Instant::now();
            // Completes every get posted above, failed or not, before the
            // buffers can go.
            // SAFETY: the window is open and locked (lock_all).
            let flushed = check("MPI_Win_flush_all", unsafe { ffi::MPI_Win_flush_all(self.win.0) });
            if let Some(p) = profile {
                p.add(Span::Wait, t);
            }
            first_err.and(flushed)
        })?;
        posted?;
        if !direct {
            let src = RowSource::from_slice(&staging, len)?;
            let order: Vec<usize> = (0..n).collect();
            let layout = RowLayout::new(req.layout.dtype(), req.layout.cols(), 0)?;
            let slots: Vec<usize> = (0..n).map(|k| req.slots.map_or(k, |s| s[k])).collect();
            timed(profile, Span::Copy, || gather_from(&src, &layout, &order, Some(&slots), req.out, req.out_dtype, 1))?;
        }
        Ok(())
    }
}
