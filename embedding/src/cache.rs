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
//!
//! And the device cache (feature `cuda`): this rank's own rows and their
//! optimizer state in its GPU's memory (`wm_gather::cache::DeviceCache`).
//! `apply_gradients` reads and updates them there and writes the updated
//! rows back before it returns — the next collective (a gather: peers read
//! the host rows) finds them home. `init` and `reset_state` overwrite the
//! rows, so the cache forgets them; a loan of the table on any rank (known
//! at the next `apply_gradients`, whose agreement carries it) does too.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use wm_comm::CommExt;
use wm_gather::cache::{CacheStats, NodeCache};
use wm_gather::{DType, Ids};

#[cfg(feature = "cuda")]
use wholemem::WholeTensor;

use crate::table::{Embedding, EmbeddingElement};
use crate::{Error, Result};

/// Whether the table was marked as lent, for each cache, before a step
/// (see [`Caches::begin_step`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Marks {
    node: bool,
    device: bool,
}

/// The caches of one embedding.
#[derive(Debug, Default)]
pub(crate) struct Caches {
    /// The node cache; a mutex because gathers take `&self`.
    node: Option<Mutex<NodeCache>>,
    /// Whether this rank wrote (or may have written) the table by another
    /// path since the last cached gather.
    lent: AtomicBool,
    /// The same, since the last step (for the device cache).
    device_lent: AtomicBool,
    /// This rank's device cache of its own rows and their state.
    #[cfg(feature = "cuda")]
    device: Option<wm_gather::cache::DeviceCache>,
}

fn poisoned() -> Error {
    Error::InvalidArgument("the node cache's lock was poisoned by a panic in another thread".into())
}

impl Caches {
    /// Whether a node cache is enabled.
    pub(crate) fn node_enabled(&self) -> bool {
        self.node.is_some()
    }

    /// Marks the table as written by another path (a loan of the table:
    /// both caches act on it).
    pub(crate) fn lend(&self) {
        self.device_lent.store(true, Ordering::Relaxed);
        self.lent.store(true, Ordering::Relaxed);
    }

    /// Marks the table as written by another path for the length of a step
    /// that writes its rows itself: should the step fail half-way, the next
    /// gather empties every node's cache and the next step forgets the
    /// device cache. Returns the marks as they were, for
    /// [`end_step`](Self::end_step).
    pub(crate) fn begin_step(&self) -> Marks {
        Marks { node: self.lent.swap(true, Ordering::Relaxed), device: self.device_lent.swap(true, Ordering::Relaxed) }
    }

    /// Takes back both marks of a step that succeeded (its own writes kept
    /// the caches coherent), leaving what a loan before it had set. The
    /// device cache's mark too: a step that left it set made the next step
    /// forget every cached row, so the device cache never hit.
    pub(crate) fn end_step(&self, before: Marks) {
        self.lent.store(before.node, Ordering::Relaxed);
        self.device_lent.store(before.device, Ordering::Relaxed);
    }

    /// Whether the table was lent since the last step, clearing the mark.
    pub(crate) fn take_device_loan(&self) -> bool {
        self.device_lent.swap(false, Ordering::Relaxed)
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

    /// Frees the caches (collective). A device cache has no dirty rows
    /// between calls (`apply_gradients` writes them back).
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

    /// Keeps up to `ratio` of this rank's own rows — and their optimizer
    /// state alongside — in its GPU's memory: [`apply_gradients`](Self::apply_gradients)
    /// reads and updates cached rows there, and writes what it updated back
    /// to the host table before it returns. Collective; for host tables
    /// whose ranks each have a GPU. A device cache already there is
    /// replaced.
    ///
    /// # Errors
    /// On every rank: [`Error::Gather`] naming the ratio when it is not
    /// greater than 0 and at most 1, for a device table, or when a rank has
    /// no GPU (the reason named).
    #[cfg(feature = "cuda")]
    pub fn enable_device_cache(&mut self, ratio: f64) -> Result<()> {
        self.cache.device = None;
        let state_layout = self.state.as_ref().map(wm_gather::RowLayout::of).transpose()?;
        let side = self.state.as_ref().zip(state_layout.as_ref()).map(|(s, l)| (s.memory(), l));
        let cache = wm_gather::cache::DeviceCache::new(self.table.memory(), &self.layout, side, ratio)?;
        self.cache.device = Some(cache);
        Ok(())
    }

    /// Drops the device cache, if any (it holds no dirty rows between
    /// calls). Not collective.
    #[cfg(feature = "cuda")]
    pub fn disable_device_cache(&mut self) {
        self.cache.device = None;
    }

    /// What the device cache did so far (`None` without one).
    #[cfg(feature = "cuda")]
    pub fn device_cache_stats(&self) -> Option<CacheStats> {
        self.cache.device.as_ref().map(wm_gather::cache::DeviceCache::stats)
    }

    /// Reads own rows `own` (global ids) and their state through the
    /// device cache, as f32.
    pub(crate) fn read_own_cached(&mut self, own: &[i64], w: &mut [f32], s: &mut [f32]) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(d) = &mut self.cache.device {
            let rows: Vec<usize> = own.iter().map(|&r| r as usize).collect();
            let side = self.state.as_mut().map(WholeTensor::memory_mut);
            d.read(self.table.memory_mut(), side, &rows, bytemuck::cast_slice_mut(w), bytemuck::cast_slice_mut(s), DType::F32)?;
            return Ok(());
        }
        let _ = (own, w, s);
        Err(Error::InvalidArgument("no device cache".into()))
    }

    /// Writes own rows `own` and their state through the device cache, then
    /// writes every dirty row back to the host tables.
    pub(crate) fn write_own_cached(&mut self, own: &[i64], w: &[f32], s: &[f32]) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(d) = &mut self.cache.device {
            let rows: Vec<usize> = own.iter().map(|&r| r as usize).collect();
            let side = self.state.as_mut().map(WholeTensor::memory_mut);
            d.write(self.table.memory_mut(), side, &rows, bytemuck::cast_slice(w), bytemuck::cast_slice(s), DType::F32)?;
            let side = self.state.as_mut().map(WholeTensor::memory_mut);
            d.writeback(self.table.memory_mut(), side)?;
            return Ok(());
        }
        let _ = (own, w, s);
        Err(Error::InvalidArgument("no device cache".into()))
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

#[cfg(test)]
mod tests {
    use wholemem::{Location, MemoryType};

    use crate::{Embedding, Init, Optimizer};

    /// The device cache never hit on the H200 (`CacheStats { lookups: 641,
    /// hits: 0, fills: 456, .. }`): each `apply_gradients` marked the table
    /// as lent to another path while it wrote its own rows, and only the
    /// node cache's mark was taken back, so the next step's agreement saw a
    /// loan and the device cache forgot every row. Host logic, so checked
    /// here on one rank without a GPU: the mark a step leaves is what the
    /// device cache acts on.
    #[test]
    fn a_step_counted_as_a_loan_so_the_device_cache_forgot_its_rows_and_never_hit() {
        let world = wm_comm::init().expect("a world of one rank");
        for ty in [MemoryType::Continuous, MemoryType::Chunked, MemoryType::Distributed] {
            let mut emb =
                Embedding::<f32>::allocate(&world, ty, Location::Host, 40, 4, None, Some(Optimizer::adam())).expect("an embedding");
            emb.init(Init::Constant(0.5), 1).expect("init");
            assert!(!emb.cache.take_device_loan(), "{ty}: init rewrote the rows and forgot them itself");
            for step in 0..3 {
                let ids = [3i64, 7, 3, 39];
                let grads: Vec<f32> = (0..ids.len() * 4).map(|k| k as f32 * 0.01).collect();
                emb.apply_gradients(&ids, &grads, 0.1).expect("a step");
                assert!(
                    !emb.cache.take_device_loan(),
                    "{ty}: step {step} left the table marked as lent: the next step forgets the device cache"
                );
            }
            // A real loan still counts, once.
            let _ = emb.table_mut();
            assert!(emb.cache.take_device_loan() && !emb.cache.take_device_loan(), "{ty}: a loan of the table is seen once");
            emb.free().expect("free");
        }
    }
}
