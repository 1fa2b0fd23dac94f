//! An embedding's node cache: rows other nodes own, kept in memory shared
//! by the ranks of each node ([`wm_gather::cache::NodeCache`]), and its
//! device cache.
//!
//! Both keep themselves coherent with the weights: every write to a rank's
//! rows moves that rank's write generation of the table
//! (`WholeMemory::write_generation`), whatever wrote them —
//! `apply_gradients`, `init`, or any write through
//! [`Embedding::table_mut`] (scatter, `write_rows`, `write_local`,
//! `wholemem::files::load`) — and the caches check it:
//!
//! - every cached [`Embedding::gather`] (collective) opens with every
//!   rank's generation and drops, on every node, the rows of each rank
//!   whose generation moved;
//! - [`Embedding::apply_gradients`] tells the node cache which rows it
//!   wrote (every rank's updated rows, dropped from every node's cache),
//!   so a step costs the cache those rows only; a step that fails part way
//!   tells nothing, and its writes cost every row of the ranks that made
//!   them.
//!
//! The device cache (feature `cuda`): this rank's own rows and their
//! optimizer state in its GPU's memory (`wm_gather::cache::DeviceCache`).
//! `apply_gradients` reads and updates them there and writes the updated
//! rows back before it returns — the next collective (a gather: peers read
//! the host rows) finds them home. A write to this rank's rows by any other
//! path (on any rank) moves the generation the cache checks at the next
//! step, and it forgets its rows.

use std::sync::Mutex;

use wm_gather::cache::{Bypass, CacheStats, NodeCache};
use wm_gather::{DType, Ids};

#[cfg(feature = "cuda")]
use wholemem::CommonError;
use wholemem::WholeTensor;

use self::state::poisoned;
use crate::table::{Embedding, EmbeddingElement};
use crate::{Error, Result};

pub(crate) mod state;

impl<T: EmbeddingElement> Embedding<T> {
    /// Keeps up to `ratio` of the rows — of those ranks of other nodes own —
    /// in a cache shared by the ranks of each node, so that
    /// [`gather`](Self::gather) fetches hot rows across nodes once instead
    /// of in every batch. Collective; every rank passes the same ratio. A
    /// cache already there is replaced (and freed).
    ///
    /// For distributed and hierarchy tables spanning several nodes. The
    /// cache never changes what a gather returns, whatever writes the
    /// table: each gather first drops the rows of every rank whose rows
    /// were written (see `docs/cache.md`). Rows a step updates leave the
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
        Ok(())
    }

    /// Which path the node cache's gathers take (see
    /// [`NodeCache::set_bypass`]; by default the faster of the cached and
    /// the uncached one, measured). Every rank passes the same; does
    /// nothing without a node cache. Not collective.
    pub fn set_node_cache_bypass(&mut self, mode: Bypass) {
        if let Some(c) = self.cache.node.as_mut() {
            match c.get_mut() {
                Ok(c) => c.set_bypass(mode),
                Err(p) => p.into_inner().set_bypass(mode),
            }
        }
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
        Err(Error::Common(CommonError::InvalidArgument("no device cache".into())))
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
        Err(Error::Common(CommonError::InvalidArgument("no device cache".into())))
    }

    /// The gather through the node cache (which first drops what was
    /// written since the last one).
    pub(crate) fn gather_cached(&self, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
        let Some(cache) = &self.cache.node else {
            wm_gather::gather(self.table.memory(), &self.layout, ids, out, out_dtype)?;
            return Ok(());
        };
        let mut cache = cache.lock().map_err(|_| poisoned())?;
        cache.gather(self.table.memory(), ids, out, out_dtype)?;
        Ok(())
    }
}
