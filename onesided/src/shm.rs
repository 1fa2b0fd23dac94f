//! Rows of owners' portions mapped read-only into this process: the shm
//! transport reads through them, and each read server serves its own rows
//! from one. The one unsafe step — a row source over those mappings — is
//! here.

use std::sync::Arc;

use wholemem::CommonError;
use wholemem::MappedPortion;
use wm_gather::rows::RowSource;
use wm_gather::{DType, RowLayout};

use crate::profile::{Counters, Span, timed};
use crate::transport::{ReadRequest, Transport};
use crate::{Error, Method, Result};

/// One owner's rows inside a mapped portion.
#[derive(Debug)]
pub(crate) struct OwnerRows {
    map: MappedPortion,
    /// Where the first row starts in the mapping.
    offset: usize,
    /// Rows it holds.
    rows: usize,
    row_bytes: usize,
}

impl OwnerRows {
    /// `rows` rows of `row_bytes` from byte `offset` of `map`.
    ///
    /// # Errors
    /// [`Error::Malformed`] when they do not fit the mapping (a record
    /// that lies; checked already, checked again here where it matters).
    pub(crate) fn new(map: MappedPortion, offset: usize, rows: usize, row_bytes: usize, owner: usize) -> Result<Self> {
        if rows.checked_mul(row_bytes).and_then(|b| b.checked_add(offset)).is_none_or(|end| end > map.len()) {
            return Err(Error::Malformed {
                from: format!("rank {owner}"),
                detail: format!("{rows} rows of {row_bytes} bytes from byte {offset} do not fit its portion of {} bytes", map.len()),
            });
        }
        Ok(Self { map, offset, rows, row_bytes })
    }

    /// The first byte of the first row (for a registration covering the
    /// rows; read through raw pointers only).
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn first_row(&self) -> *const u8 {
        self.map.as_ptr().wrapping_add(self.offset)
    }

    /// Bytes of the rows.
    #[cfg_attr(not(feature = "fabric"), allow(dead_code))]
    pub(crate) fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }
}

/// Rows of several owners, numbered on from owner to owner.
#[derive(Debug)]
pub(crate) struct Mapped {
    parts: Vec<Arc<OwnerRows>>,
    row_bytes: usize,
}

impl Mapped {
    pub(crate) fn new(parts: Vec<Arc<OwnerRows>>, row_bytes: usize) -> Self {
        Self { parts, row_bytes }
    }

    /// The rows as a source for [`wm_gather::rows::gather_from`].
    pub(crate) fn source(&self) -> Result<RowSource<'_>> {
        let parts: Vec<(*const u8, usize)> = self.parts.iter().map(|p| (p.map.as_ptr().wrapping_add(p.offset), p.rows)).collect();
        // SAFETY: each part's rows lie inside its mapping (checked in
        // `OwnerRows::new`), which `self` keeps mapped (read-only) for the
        // source's lifetime, the borrow of `self`. The owner may write them
        // meanwhile; the source copies through raw pointers.
        unsafe { RowSource::from_parts(&parts, self.row_bytes) }.map_err(Error::from)
    }
}

/// The shm transport: the portions of the owners on this node.
#[derive(Debug)]
pub(crate) struct ShmTransport {
    mapped: Mapped,
    /// For each owner, the number of its first row in `mapped` (`None` when
    /// it is not mapped).
    first: Vec<Option<usize>>,
    /// Each owner's first global row.
    global: Vec<usize>,
    /// Whether every owner is mapped, in order (global rows are then the
    /// mapped rows' numbers).
    all: bool,
    threads: usize,
}

impl ShmTransport {
    /// `owners[r]`: owner `r`'s rows, if mapped; `global[r]` its first row.
    pub(crate) fn new(owners: Vec<Option<Arc<OwnerRows>>>, global: Vec<usize>, row_bytes: usize, threads: usize) -> Self {
        let all = owners.iter().all(Option::is_some);
        let mut first = Vec::with_capacity(owners.len());
        let mut parts = Vec::new();
        let mut at = 0;
        for o in owners {
            match o {
                Some(p) => {
                    first.push(Some(at));
                    at += p.rows;
                    parts.push(p);
                }
                None => first.push(None),
            }
        }
        Self { mapped: Mapped::new(parts, row_bytes), first, global, all, threads }
    }
}

impl Transport for ShmTransport {
    fn method(&self) -> Method {
        Method::Shm
    }

    fn read(&self, req: &mut ReadRequest<'_>, profile: Option<&Counters>) -> Result<()> {
        let src = self.mapped.source()?;
        let local: Vec<usize>;
        let rows = if self.all {
            req.rows
        } else {
            let mapped: Option<Vec<usize>> = req
                .rows
                .iter()
                .zip(req.owners)
                .map(|(&row, &o)| self.first.get(o).copied().flatten().map(|f| f + row - self.global[o]))
                .collect();
            local = mapped.ok_or_else(|| {
                Error::Common(CommonError::InvalidArgument("a row routed to shared memory whose owner is not mapped".into()))
            })?;
            &local
        };
        timed(profile, Span::Copy, || gather(&src, req.layout, rows, req.slots, req.out, req.out_dtype, self.threads))
    }
}

fn gather(
    src: &RowSource<'_>,
    layout: &RowLayout,
    rows: &[usize],
    slots: Option<&[usize]>,
    out: &mut [u8],
    dt: DType,
    threads: usize,
) -> Result<()> {
    wm_gather::rows::gather_from(src, layout, rows, slots, out, dt, threads).map_err(Error::from)
}
