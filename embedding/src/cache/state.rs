//! The caches an embedding holds, as the table sees them: whether each is
//! enabled, forgetting and invalidating rows, freeing. Enabling, reading and
//! measuring them are methods of the embedding (the parent module).

use std::sync::Mutex;

use wholemem::CommonError;
use wm_gather::Ids;
use wm_gather::cache::{NodeCache, WriteMark};

use crate::{Error, Result};

/// The caches of one embedding.
#[derive(Debug, Default)]
pub(crate) struct Caches {
    /// The node cache; a mutex because gathers take `&self`.
    pub(super) node: Option<Mutex<NodeCache>>,
    /// This rank's device cache of its own rows and their state.
    #[cfg(feature = "cuda")]
    pub(super) device: Option<wm_gather::cache::DeviceCache>,
}

/// The error of a node cache whose lock a panicking thread left poisoned.
pub(super) fn poisoned() -> Error {
    Error::Common(CommonError::InvalidArgument("the node cache's lock was poisoned by a panic in another thread".into()))
}

impl Caches {
    /// Whether a node cache is enabled.
    pub(crate) fn node_enabled(&self) -> bool {
        self.node.is_some()
    }

    /// Whether a device cache is enabled.
    pub(crate) fn device_enabled(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.device.is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// This rank's device cache forgets every row (the host rows changed).
    pub(crate) fn forget_device(&mut self) {
        #[cfg(feature = "cuda")]
        if let Some(d) = &mut self.device {
            d.clear();
        }
    }

    /// Drops every rank's `rows` of `table` from every node's cache, the
    /// rows this rank wrote since `since` (collective; nothing without a
    /// cache).
    pub(crate) fn invalidate_node_written(&mut self, table: &wholemem::WholeMemory, rows: Ids<'_>, since: WriteMark) -> Result<()> {
        if let Some(c) = &mut self.node {
            c.get_mut().map_err(|_| poisoned())?.invalidate_written(table, rows, since)?;
        }
        Ok(())
    }

    /// Frees the caches (collective). A device cache has no dirty rows
    /// between calls (`apply_gradients` writes them back).
    pub(crate) fn free(self) -> Result<()> {
        if let Some(c) = self.node {
            c.into_inner().map_err(|_| poisoned())?.free()?;
        }
        Ok(())
    }
}
