//! The one trait every transport implements: read these rows into that
//! buffer, every read posted before any is waited for.

use std::fmt;

use wm_gather::{DType, RowLayout};

use crate::profile::Counters;
use crate::{Method, Result};

/// One call's rows for one transport.
#[derive(Debug)]
pub(crate) struct ReadRequest<'a> {
    /// Global rows (checked against the table).
    pub rows: &'a [usize],
    /// The owner of each row (as the partition says).
    pub owners: &'a [usize],
    /// The output row of each (`None`: row `i` goes to output row `i`).
    pub slots: Option<&'a [usize]>,
    /// What a table row holds: its element type and count.
    pub layout: &'a RowLayout,
    /// The whole output of the call.
    pub out: &'a mut [u8],
    /// The output's element type.
    pub out_dtype: DType,
}

/// A way to read owners' rows without the owners taking part.
pub(crate) trait Transport: Send + Sync + fmt::Debug {
    /// Which method this is.
    fn method(&self) -> Method;

    /// Reads every row of `req` into its output row (converting), posting
    /// all reads before waiting for any.
    fn read(&self, req: &mut ReadRequest<'_>, profile: Option<&Counters>) -> Result<()>;

    /// Registers a destination buffer once (libfabric); `None` where the
    /// transport registers nothing.
    ///
    /// # Errors
    /// The transport's, when it cannot register the memory.
    ///
    /// # Safety
    /// `buf`'s memory must stay allocated, at the same address, until the
    /// returned registration is dropped: drop the registration before the
    /// buffer, and never grow, shrink or move the buffer's allocation while
    /// it lives. The transport keeps the address, and the network device
    /// may write there.
    // The lint counts this default body as unsafe code, though it does
    // nothing unsafe.
    #[allow(unsafe_code)]
    unsafe fn register(&self, buf: &mut [u8]) -> Result<Option<Box<dyn Registration>>> {
        let _ = buf;
        Ok(None)
    }
}

/// A destination buffer's registration with a transport, undone on drop.
pub(crate) trait Registration: Send + Sync + fmt::Debug {}
