//! The collective paths: distributed and hierarchy memory, where a rank maps
//! only its own rows and other rows travel through the communicator.
//!
//! What a peer sends is input: every part is checked before it is used — a
//! length that is not what the exchange implies, a row id the receiver does
//! not own (or, in the hierarchy, was not routed to it) — and a bad part is
//! dropped and recorded as [`wholemem::CommonError::Malformed`] naming its sender. The
//! exchange still runs to its end on every rank, so the ranks stay in step
//! and the next call works. What an owner finds wrong with the requests it
//! got travels with the rows it sends back, so every rank fails with it; a
//! part found malformed by the last rank to receive it fails that rank (it
//! alone would otherwise return wrong rows). Where a copy can fail on one
//! rank alone (device tables), one agreement at the end makes the first
//! error every rank's.
//!
//! Each path reads as its phases: check and route the ids ([`ids`]), lay
//! out the exchange and carry it out (`wm_comm::ExchangePlan`), land the
//! rows ([`wire`], [`local`]), convert them on the way ([`crate::kernel`]).

mod dedup;
mod distributed;
mod hierarchy;
mod ids;
mod local;
mod scatter;
mod wire;

pub(crate) use distributed::gather_distributed;
pub(crate) use hierarchy::gather_hierarchy;
pub(crate) use local::{gather_owned, scatter_owned, step_rows};
pub(crate) use scatter::scatter_distributed;

use crate::kernel::RowConv;
use crate::profile::Clock;
use crate::{Error, Ids, Result, RowLayout};
use wholemem::{CommonError, MemoryType, WholeMemory};

/// The collective gather of distributed and hierarchy memory, with this
/// rank's checks already made (`checked`: their outcome, which every rank
/// learns in the first exchange), running `while_rows_travel` a piece at a
/// time while the rows travel, until it returns `false` (the caller runs
/// what is left when the call ends first): the caller's own work overlaps
/// the exchange on the calling thread.
pub(crate) fn gather_collective(
    mem: &WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    out: &mut [u8],
    while_rows_travel: &mut dyn FnMut() -> bool,
) -> Result<()> {
    match mem.memory_type() {
        MemoryType::Distributed => gather_distributed(mem, layout, checked, ids, out, Clock::start(), while_rows_travel),
        MemoryType::Hierarchy => gather_hierarchy(mem, layout, checked, ids, out, Clock::start(), while_rows_travel),
        // Not collective: nothing to tell the other ranks.
        other => checked.and(Err(Error::Common(CommonError::InvalidArgument(format!("{other} memory has no collective gather"))))),
    }
}

/// The collective scatter of distributed and hierarchy memory, with this
/// rank's checks already made (`checked`, which every rank learns in the
/// first exchange, as in [`gather_collective`]).
pub(crate) fn scatter_collective(
    mem: &mut WholeMemory,
    layout: &RowLayout,
    checked: Result<RowConv>,
    ids: Ids<'_>,
    src: &[u8],
) -> Result<()> {
    scatter_distributed(mem, layout, checked, ids, src, Clock::start())
}
