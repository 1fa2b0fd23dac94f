//! A rank's rows as files another process can map: what one-sided readers
//! (`wm-onesided`) receive and map read-only.

use std::os::fd::{AsFd, BorrowedFd};

use super::WholeMemory;
use crate::CommonError;
use crate::host::{self, map::Region};
use crate::types::MemoryType;
use crate::{Error, Result};

impl WholeMemory {
    /// This rank's rows as sealed memfds another process can map (host
    /// memory of every type; `None` for device memory). One-sided readers
    /// map them read-only with [`MappedPortion::open`].
    pub fn portion(&self) -> Option<Portion<'_>> {
        if self.loc != crate::types::Location::Host {
            return None;
        }
        let (p, g, me) = (&self.partition, self.granularity, self.comm.rank());
        let (indices, offset) = host::portion_pieces(self.ty, p, g, self.total, me);
        let own_only = self.ty != MemoryType::Continuous;
        let mut pieces = Vec::with_capacity(indices.len());
        for k in indices {
            let fd = if own_only { self.portion_fds.first() } else { self.portion_fds.get(k) };
            pieces.push((fd?.as_fd(), host::portion_bytes(self.ty, p, g, self.total, k).0));
        }
        Some(Portion { pieces, offset, bytes: p.count(me) * g })
    }
}

/// A rank's rows as shareable files: see [`WholeMemory::portion`].
///
/// Every memfd is sealed against shrinking and growing, so a process that
/// maps it never faults on a missing page; a receiver checks that with
/// [`MappedPortion::open`].
#[derive(Debug, Clone)]
pub struct Portion<'a> {
    pieces: Vec<(BorrowedFd<'a>, usize)>,
    offset: usize,
    bytes: usize,
}

impl<'a> Portion<'a> {
    /// The memfds and their sizes, in order: mapped side by side they hold
    /// the rank's rows contiguously (one memfd except for continuous
    /// memory, where a rank's rows may end in a neighbour's; none for a
    /// rank without rows).
    pub fn pieces(&self) -> &[(BorrowedFd<'a>, usize)] {
        &self.pieces
    }

    /// Where the rank's first row starts in them.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of the rank's rows.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A read-only mapping of a rank's portion received from another process
/// (a one-sided reader's view of an owner's rows).
#[derive(Debug)]
pub struct MappedPortion {
    region: Option<Region>,
    len: usize,
}

impl MappedPortion {
    /// Checks every memfd — a sealed shared-memory file of exactly the
    /// size given with it, so it can never shrink under the mapping — then
    /// maps them read-only side by side (every size but the last a
    /// multiple of the page size). `from` is the world rank that sent them,
    /// for the error.
    ///
    /// # Errors
    /// [`crate::CommonError::Malformed`] naming `from` when a file is not what it must
    /// be; [`Error::Os`] when they cannot be mapped.
    pub fn open(pieces: &[(BorrowedFd<'_>, usize)], from: usize) -> Result<Self> {
        let page = host::map::page_size();
        let mut len = 0usize;
        for (i, &(fd, bytes)) in pieces.iter().enumerate() {
            host::map::check_received(fd, bytes)
                .map_err(|d| Error::Common(CommonError::Malformed { rank: from, detail: format!("as its table portion, {d}") }))?;
            if i + 1 < pieces.len() && bytes % page != 0 {
                return Err(Error::Common(CommonError::Malformed {
                    rank: from,
                    detail: format!("a portion piece of {bytes} bytes, not whole pages, before another"),
                }));
            }
            len = len.checked_add(bytes).filter(|&l| l <= isize::MAX as usize).ok_or_else(|| {
                Error::Common(CommonError::Malformed { rank: from, detail: "portion pieces larger than any address space".into() })
            })?;
        }
        let region = if len == 0 {
            None
        } else {
            let r =
                Region::read_only_pieces(pieces, len).map_err(|e| Error::os(format!("mapping rank {from}'s portion of {len} bytes"), e))?;
            Some(r)
        };
        Ok(Self { region, len })
    }

    /// The first byte (dangling but non-null for an empty portion). Other
    /// processes may write the bytes at any time: read through raw
    /// pointers (copies), never through a reference.
    pub fn as_ptr(&self) -> *const u8 {
        self.region.as_ref().map_or(std::ptr::NonNull::dangling().as_ptr(), |r| r.ptr().cast_const())
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}
