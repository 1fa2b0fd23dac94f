//! An embedding's node cache: rows other nodes own, kept in memory shared
//! by the ranks of each node ([`wm_gather::cache::NodeCache`]), and the
//! rules that keep it coherent with the weights.
//!
//! Every write path of an embedding reaches the cache of every node:
//!
//! - [`Embedding::apply_gradients`] (collective): every rank's updated rows
//!   are dropped from every node's cache after the owners wrote them.
//! - [`Embedding::init`] (collective): every node's cache is emptied.
//! - [`Embedding::table_mut`] (any write: scatter, `write_rows`,
//!   `write_local`, `wholemem::files::load`): the rank that borrowed the
//!   table marks it; the next cached [`Embedding::gather`] (collective)
//!   first asks every rank whether it did, and if any did, every node's
//!   cache is emptied before anything is read. That question is one small
//!   allgather per cached gather.
//! - A failed `apply_gradients` counts as such a loan.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use wm_comm::CommExt;
use wm_gather::cache::{CacheStats, NodeCache};
use wm_gather::{DType, Ids};

use crate::table::{Embedding, EmbeddingElement};
use crate::{Error, Result};

/// The caches of one embedding.
#[derive(Debug, Default)]
pub(crate) struct Caches {
    /// The node cache; a mutex because gathers take `&self`.
    node: Option<Mutex<NodeCache>>,
    /// Whether this rank wrote (or may have written) the table by another
    /// path since the last cached gather.
    lent: AtomicBool,
}

fn poisoned() -> Error {
    Error::InvalidArgument("the node cache's lock was poisoned by a panic in another thread".into())
}

impl Caches {
    /// Whether a node cache is enabled.
    pub(crate) fn node_enabled(&self) -> bool {
        self.node.is_some()
    }

    /// Marks the table as written by another path; whether it already was.
    pub(crate) fn lend(&self) -> bool {
        self.lent.swap(true, Ordering::Relaxed)
    }

    /// Takes back a mark this rank set itself.
    pub(crate) fn unlend(&self) {
        self.lent.store(false, Ordering::Relaxed);
    }

    /// Empties every node's cache (collective; nothing without a cache).
    pub(crate) fn clear_node(&mut self) -> Result<()> {
        if let Some(c) = &mut self.node {
            c.get_mut().map_err(|_| poisoned())?.clear()?;
        }
        Ok(())
    }

    /// Drops every rank's `rows` from every node's cache (collective;
    /// nothing without a cache).
    pub(crate) fn invalidate_node(&mut self, rows: Ids<'_>) -> Result<()> {
        if let Some(c) = &mut self.node {
            c.get_mut().map_err(|_| poisoned())?.invalidate(rows)?;
        }
        Ok(())
    }

    /// Frees the caches (collective).
    pub(crate) fn free(self) -> Result<()> {
        if let Some(c) = self.node {
            c.into_inner().map_err(|_| poisoned())?.free()?;
        }
        Ok(())
    }
}

impl<T: EmbeddingElement> Embedding<T> {
    /// Keeps up to `ratio` of the rows — of those ranks of other nodes own —
    /// in a cache shared by the ranks of each node, so that
    /// [`gather`](Self::gather) fetches hot rows across nodes once instead
    /// of in every batch. Collective; every rank passes the same ratio. A
    /// cache already there is replaced (and freed).
    ///
    /// For distributed and hierarchy tables spanning several nodes. The
    /// cache never changes what a gather returns: every write path keeps
    /// it coherent (see `docs/cache.md`). Rows a step updates leave the
    /// cache, so it pays most for rows read more often than trained.
    ///
    /// # Errors
    /// On every rank: [`Error::Gather`] naming the value for a ratio that
    /// is not greater than 0 and at most 1, a table of another type, a table
    /// on one node, or ratios that differ between ranks.
    pub fn enable_node_cache(&mut self, ratio: f64) -> Result<()> {
        self.disable_node_cache()?;
        let cache = NodeCache::new(self.table.memory(), &self.layout, ratio)?;
        self.cache.node = Some(Mutex::new(cache));
        self.cache.unlend();
        Ok(())
    }

    /// Frees the node cache, if any. Collective.
    ///
    /// # Errors
    /// When a peer is lost.
    pub fn disable_node_cache(&mut self) -> Result<()> {
        if let Some(c) = self.cache.node.take() {
            c.into_inner().map_err(|_| poisoned())?.free()?;
        }
        Ok(())
    }

    /// What the node cache did so far (`None` without one): lookups and
    /// hits of this rank, fills and evictions of its node's cache.
    pub fn node_cache_stats(&self) -> Option<CacheStats> {
        let c = self.cache.node.as_ref()?;
        Some(c.lock().map_or_else(|p| p.into_inner().stats(), |c| c.stats()))
    }

    /// The node cache's rows (`None` without one): how many this rank's
    /// node holds now, how many it can hold, and how many rows ranks of
    /// other nodes own (what it may hold).
    pub fn node_cache_rows(&self) -> Option<(usize, usize, usize)> {
        let c = self.cache.node.as_ref()?;
        let c = c.lock().ok()?;
        Some((c.cached_rows(), c.capacity(), c.remote_rows()))
    }

    /// The cached gather: first, whether any rank wrote the table by
    /// another path (then every node's cache empties), then the gather.
    pub(crate) fn gather_cached(&self, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
        let Some(cache) = &self.cache.node else {
            wm_gather::gather(self.table.memory(), &self.layout, ids, out, out_dtype)?;
            return Ok(());
        };
        let mut cache = cache.lock().map_err(|_| poisoned())?;
        let lent = self.cache.lent.swap(false, Ordering::Relaxed);
        let all = self.comm().allgather_value(u8::from(lent)).inspect_err(|_| {
            self.cache.lent.fetch_or(lent, Ordering::Relaxed);
        })?;
        if all.iter().any(|&l| l != 0) {
            cache.clear()?;
        }
        cache.gather(self.table.memory(), ids, out, out_dtype)?;
        Ok(())
    }
}
