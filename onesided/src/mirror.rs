//! Device tables served through the host: a host table of the same type,
//! partition and row size (the *mirror*) into which each rank copies its
//! own rows, and which the transports then serve as any host table.
//!
//! The transports reach host memory only (mappings of memfds, libfabric
//! registrations and MPI windows of those mappings), so a device table's
//! rows are read from its mirror: a snapshot, taken when the table is made
//! and again at every [`Table::publish_from`](crate::Table::publish_from).

use std::ops::Range;

use wholemem::CommonError;
use wholemem::{AllocRequest, Location, WholeMemory};

use crate::{Error, Result};

/// The most bytes one step of a copy stages in private memory.
const STAGE_BYTES: usize = 32 << 20;

/// Allocates the mirror of `src`: host memory of its type, row size and
/// partition, on its communicator. Collective (every rank, the same
/// outcome).
///
/// # Errors
/// As [`WholeMemory::allocate`] (host memory of that type refused here,
/// memory that cannot be had).
pub(crate) fn allocate(src: &WholeMemory) -> Result<WholeMemory> {
    let req = AllocRequest {
        ty: src.memory_type(),
        loc: Location::Host,
        total: src.total_bytes(),
        granularity: src.granularity(),
        partition: Some(src.partition().counts()),
    };
    WholeMemory::allocate(src.comm(), &req).map_err(|e| match e {
        wholemem::Error::Unsupported { what, reason } => Error::Unsupported {
            what: format!("a host mirror ({what}) for one-sided reads of {} {} memory", src.location(), src.memory_type()),
            reason,
        },
        e => Error::Memory(e),
    })
}

/// Checks that `src` has the table's shape: `rows` rows of `row_bytes`,
/// split over the ranks as `counts`, on a communicator of `ranks` ranks.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] naming the field that differs.
pub(crate) fn check_shape(src: &WholeMemory, table: &str, rows: usize, row_bytes: usize, counts: &[usize]) -> Result<()> {
    let bad = |what: String| Err(Error::Common(CommonError::InvalidArgument(format!("publish_from on table {table:?}: {what}"))));
    if src.rows() != rows || src.granularity() != row_bytes {
        return bad(format!(
            "the memory has {} rows of {} bytes; the table {rows} rows of {row_bytes} bytes",
            src.rows(),
            src.granularity()
        ));
    }
    let theirs = src.partition().counts();
    if theirs != counts {
        return bad(format!("the memory's rows per rank are {theirs:?}; the table's {counts:?}"));
    }
    Ok(())
}

/// Copies this rank's rows of `src` into the same rows of `mirror`, through
/// a private buffer of at most [`STAGE_BYTES`] (or one row). Not
/// collective: each rank copies its own rows.
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] when the two own different rows; the memory
/// layer's error for a failed copy (a device copy, a row lock).
pub(crate) fn copy_local(src: &WholeMemory, mirror: &mut WholeMemory) -> Result<()> {
    let own: Range<usize> = src.local_rows();
    if mirror.local_rows() != own || mirror.granularity() != src.granularity() {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "the mirror holds rows {:?} of {} bytes on this rank; the memory rows {own:?} of {} bytes",
            mirror.local_rows(),
            mirror.granularity(),
            src.granularity()
        ))));
    }
    let g = src.granularity();
    let step = (STAGE_BYTES / g).max(1).min(own.len());
    let mut stage = vec![0u8; step * g];
    let mut row = own.start;
    while row < own.end {
        let n = step.min(own.end - row);
        let buf = &mut stage[..n * g];
        src.read_rows(row, buf)?;
        mirror.write_rows(row, buf)?;
        row += n;
    }
    Ok(())
}
