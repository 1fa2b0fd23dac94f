//! The embedding: a table of weights, an optimizer, and the optimizer's
//! state in a second table partitioned exactly like the first.

use std::sync::Arc;
use std::time::Duration;

use wholemem::CommonError;
use wholemem::agree::{Rule, agree, agree_sharing};
use wholemem::{Location, MemoryType, WholeTensor};
use wm_comm::{Communicator, ExchangePlan};
use wm_gather::cache::WriteMark;
use wm_gather::profile::timed;
use wm_gather::{DType, Element, Ids, Index, RowLayout};

use crate::{Error, Init, Optimizer, Result, StateSlot};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type an embedding can be stored in: `f32`, `half::f16` or
/// `half::bf16`. Optimizer state and gradients are always f32.
pub trait EmbeddingElement: Element + sealed::Sealed {}
impl EmbeddingElement for f32 {}
impl EmbeddingElement for half::f16 {}
impl EmbeddingElement for half::bf16 {}

/// Rows written per round when a rank fills its own rows, so filling a
/// large table needs little extra memory.
const FILL_ROWS: usize = 16 * 1024;

/// Bytes of summed gradients (or of weights, or of state, whichever row is
/// widest) `apply_gradients` updates per run of rows: a run's three buffers
/// stay in a core's caches from the merge to the write.
const UPDATE_RUN_BYTES: usize = 256 * 1024;

/// A trainable table of `rows × dim` weights of `T`, partitioned by rows
/// across the ranks of a communicator, with an optional optimizer.
///
/// - [`gather`](Self::gather) reads rows by global id (the forward pass):
///   collective for Distributed and Hierarchy memory, local for Continuous
///   and Chunked, exactly as [`wm_gather::gather`].
/// - [`apply_gradients`](Self::apply_gradients) (the backward pass) is
///   **collective for every memory type**: gradients travel to the rank that
///   owns the row, which alone updates it. Two ranks never read, modify and
///   write one row at once, so Continuous and Chunked tables need no
///   atomics and the result does not depend on timing.
///
/// Weights go through `wm_gather`'s gather and scatter only (never a
/// pointer), so an embedding works at every location that `wm_gather`
/// supports.
#[derive(Debug)]
pub struct Embedding<T: EmbeddingElement> {
    pub(crate) table: WholeTensor<T>,
    pub(crate) layout: RowLayout,
    optimizer: Option<Optimizer>,
    /// One row of `optimizer.state_width(dim)` f32 per embedding row, same
    /// partition, memory type and location. `None` for SGD or no optimizer.
    pub(crate) state: Option<WholeTensor<f32>>,
    /// The node cache of remote rows, if enabled (`cache.rs`).
    pub(crate) cache: crate::cache::state::Caches,
}

/// The ids as row numbers (after the range check).
fn rows_of(ids: Ids<'_>) -> Vec<u64> {
    match ids {
        Ids::I32(v) => v.iter().map(|&x| x as u64).collect(),
        Ids::I64(v) => v.iter().map(|&x| x as u64).collect(),
    }
}

/// The first byte of a part of `apply_gradients`' exchange: the sender's
/// learning rate (4 bytes), its id count (8), the ids (8 bytes each, local
/// row numbers of the receiver) and their gradients (f32) follow.
const GRADS_IDS: u8 = 0;
/// The first byte of such a part when the sender failed its checks: its
/// outcome follows ([`wholemem::agree::outcome_bytes`]).
const GRADS_FAILED: u8 = 1;
/// Bytes before the ids in a [`GRADS_IDS`] part.
const GRADS_HEADER: usize = 13;

thread_local! {
    /// Large f32 buffers of earlier optimizer steps on this thread, reused:
    /// a fresh 4 MiB buffer costs a thousand page faults.
    static POOL: std::cell::RefCell<wm_comm::BufferPool<f32>> = const { std::cell::RefCell::new(wm_comm::BufferPool::new(1 << 16, 8)) };
}

/// An empty buffer with room for `cap` values, from the pool when one
/// fits.
fn pooled(cap: usize) -> Vec<f32> {
    let mut v = POOL.with(|p| p.borrow_mut().get(cap));
    v.clear();
    v
}

/// Keeps large buffers for [`pooled`] (a few, so the pool stays bounded).
fn recycle(bufs: impl IntoIterator<Item = Vec<f32>>) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        for b in bufs {
            p.keep(b);
        }
    });
}

/// A batch's ids grouped: the distinct ids ascending, and the positions
/// of each one's gradient rows in input order — those of distinct id `k`
/// are `order[starts[k]..starts[k + 1]]`. The gradients are summed where
/// they are wanted ([`Repeats::put_sum`], [`Grads::Own`]), read once from
/// the caller's buffer, with no copy of them in between.
#[derive(Debug, Default)]
pub(crate) struct Repeats {
    ids: Vec<u64>,
    order: Vec<usize>,
    starts: Vec<usize>,
}

impl Repeats {
    /// Groups `rows` (a row id per gradient row).
    pub(crate) fn of(rows: &[u64]) -> Self {
        let (mut ids, mut order, mut starts) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()), Vec::new());
        starts.reserve(rows.len() + 1);
        wm_gather::sort::for_each_by_id(rows.iter().copied(), |id, i| {
            if ids.last() != Some(&id) {
                ids.push(id);
                starts.push(order.len());
            }
            order.push(i);
        });
        starts.push(order.len());
        Self { ids, order, starts }
    }

    /// Asks for the first gradient row of distinct id `k` (if there is
    /// one) ahead of reading it: the rows are read in id order, which is
    /// random in `grads`.
    fn prefetch(&self, grads: &[f32], dim: usize, k: usize) {
        if let Some(&i) = self.starts.get(k).filter(|_| k < self.ids.len()).and_then(|&at| self.order.get(at)) {
            wm_gather::prefetch_slice(&grads[i * dim..][..dim]);
        }
    }

    /// The gradient rows (in `grads`, `dim` each) of distinct id `k`.
    fn rows<'g>(&self, grads: &'g [f32], dim: usize, k: usize) -> impl Iterator<Item = &'g [f32]> + use<'g, '_> {
        self.order[self.starts[k]..self.starts[k + 1]].iter().map(move |&i| &grads[i * dim..][..dim])
    }

    /// The sum of distinct id `k`'s rows, in input order, added into `acc`
    /// as one value per column (repeats summed first, as a sender does).
    fn add_sum(&self, grads: &[f32], k: usize, acc: &mut [f32]) {
        let add = |acc: &mut [f32], row: &[f32]| acc.iter_mut().zip(row).for_each(|(a, g)| *a += g);
        if self.starts[k + 1] - self.starts[k] == 1 {
            add(acc, &grads[self.order[self.starts[k]] * acc.len()..][..acc.len()]);
        } else {
            let mut sum = Vec::with_capacity(acc.len());
            self.push_sum(grads, acc.len(), k, &mut sum);
            add(acc, &sum);
        }
    }

    /// The sum of distinct id `k`'s rows, in input order, appended to
    /// `sums` (the first row copied, the others added to it).
    fn push_sum(&self, grads: &[f32], dim: usize, k: usize, sums: &mut Vec<f32>) {
        let mut rows = self.rows(grads, dim, k);
        let start = sums.len();
        sums.extend_from_slice(rows.next().unwrap_or_default());
        for row in rows {
            sums[start..].iter_mut().zip(row).for_each(|(a, g)| *a += g);
        }
    }

    /// The sum of distinct id `k`'s rows as little-endian bytes into
    /// `slot` (`4 · dim` bytes): the row itself when it is not repeated,
    /// else summed in `tmp` first.
    fn put_sum(&self, grads: &[f32], dim: usize, k: usize, tmp: &mut Vec<f32>, slot: &mut [u8]) {
        if self.starts[k + 1] - self.starts[k] == 1 {
            put_f32s(slot, &grads[self.order[self.starts[k]] * dim..][..dim]);
        } else {
            tmp.clear();
            self.push_sum(grads, dim, k, tmp);
            put_f32s(slot, tmp);
        }
    }
}

impl<T: EmbeddingElement> Embedding<T> {
    /// Allocates collectively a `rows × dim` embedding of `ty` memory at
    /// `loc`, rows per rank from `partition` (or the default split), and the
    /// optimizer's state beside it. The weights are zero until
    /// [`init`](Self::init) fills them; the state starts as
    /// [`Optimizer::initial_state`].
    ///
    /// # Errors
    /// As [`from_tensor`](Self::from_tensor), and as
    /// `WholeTensor::allocate` ([`Error::Memory`]).
    ///
    /// # Examples
    /// ```no_run
    /// use wholemem::{Location, MemoryType};
    /// use wm_embedding::{Embedding, Init, Optimizer};
    /// let world = wm_comm::init()?;
    /// let opt = Optimizer::adam().with_weight_decay(1e-4);
    /// let mut emb = Embedding::<f32>::allocate(&world, MemoryType::Distributed, Location::Host, 100_000, 64, None, Some(opt))?;
    /// emb.init(Init::Normal { mean: 0.0, std: 0.1 }, 42)?;
    /// let ids: Vec<i64> = vec![3, 99_999, 3]; // this rank's batch; repeats are fine
    /// let mut rows = vec![0f32; ids.len() * 64];
    /// emb.gather(&ids, &mut rows)?; // collective here: Distributed memory
    /// let grads = vec![0.01f32; ids.len() * 64]; // d loss / d rows
    /// emb.apply_gradients(&ids, &grads, 0.05)?; // collective on every type
    /// emb.free()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allocate(
        comm: &Arc<dyn Communicator>,
        ty: MemoryType,
        loc: Location,
        rows: usize,
        dim: usize,
        partition: Option<&[usize]>,
        optimizer: Option<Optimizer>,
    ) -> Result<Self> {
        if dim == 0 {
            // Every rank passes the same shape or the allocation below fails
            // on every rank; refusing here is the same decision everywhere.
            return Err(Error::Common(CommonError::InvalidArgument("an embedding dimension of 0".into())));
        }
        let table = WholeTensor::<T>::matrix(comm, ty, loc, rows, dim, partition)?;
        Self::from_tensor(table, optimizer)
    }

    /// Makes an embedding of an existing table (collectively): allocates
    /// the optimizer state with the table's partition, memory type and
    /// location. The table must be 1-D or 2-D with contiguous rows (a row
    /// stride wider than the row is fine).
    ///
    /// # Errors
    /// - [`Error::InvalidParameter`] for an optimizer parameter out of range;
    ///   [`wholemem::CommonError::InvalidArgument`] for a table shape gather cannot read, or
    ///   when ranks pass different optimizers (naming both) — on every rank.
    /// - [`Error::Memory`] when the state cannot be allocated.
    pub fn from_tensor(table: WholeTensor<T>, optimizer: Option<Optimizer>) -> Result<Self> {
        let comm = table.memory().comm().clone();
        let layout = RowLayout::of(&table).map_err(Error::from);
        let mine = layout.as_ref().map(|_| ()).map_err(|e| Error::Common(CommonError::InvalidArgument(e.to_string())));
        let mine = mine.and_then(|()| optimizer.as_ref().map_or(Ok(()), Optimizer::validate));
        let name = optimizer.map_or_else(|| "no optimizer".to_owned(), |o| o.to_string());
        let ((), all) = agree_sharing(comm.as_ref(), mine, Rule::Lowest, name.as_bytes())?;
        let ranks = comm.world_ranks();
        if let Some((r, other)) = all.iter().enumerate().find(|(_, o)| **o != all[0]) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different optimizers: rank {} {} and rank {} {}",
                ranks[0],
                String::from_utf8_lossy(&all[0]),
                ranks[r],
                String::from_utf8_lossy(other)
            ))));
        }
        let layout = layout?;
        let width = optimizer.map_or(0, |o| o.state_width(layout.cols()));
        let state = if width > 0 {
            let mem = table.memory();
            let counts = mem.partition().counts();
            Some(WholeTensor::<f32>::matrix(&comm, mem.memory_type(), mem.location(), mem.rows(), width, Some(&counts))?)
        } else {
            None
        };
        let mut emb = Self { table, layout, optimizer, state, cache: crate::cache::state::Caches::default() };
        emb.reset_state()?;
        Ok(emb)
    }

    /// Rows in the table.
    pub fn rows(&self) -> usize {
        self.table.rows()
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.layout.cols()
    }

    /// The element type of the weights.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// The communicator the table spans.
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        self.table.memory().comm()
    }

    /// The weights.
    pub fn table(&self) -> &WholeTensor<T> {
        &self.table
    }

    /// The weights, writable: to load them, for example with
    /// `wm_gather::scatter_from`. Such writes follow the table's rules
    /// (collective for Distributed and Hierarchy; separate them from reads
    /// on other ranks with a barrier). The caches need not be told: every
    /// write moves the table's write generation, which they check (see
    /// [`enable_node_cache`](Self::enable_node_cache)).
    pub fn table_mut(&mut self) -> &mut WholeTensor<T> {
        &mut self.table
    }

    /// The optimizer, if any.
    pub fn optimizer(&self) -> Option<&Optimizer> {
        self.optimizer.as_ref()
    }

    /// The optimizer's state table (one row of
    /// [`Optimizer::state_width`] f32 per embedding row), if it keeps any.
    pub fn state_table(&self) -> Option<&WholeTensor<f32>> {
        self.state.as_ref()
    }

    /// The names of the optimizer's per-row state, for
    /// [`gather_state`](Self::gather_state).
    pub fn state_names(&self) -> Vec<&'static str> {
        self.slots().iter().map(|s| s.name).collect()
    }

    fn slots(&self) -> Vec<StateSlot> {
        self.optimizer.map_or_else(Vec::new, |o| o.state_slots(self.dim()))
    }

    /// Gathers rows `ids` into `out` (`ids.len() × dim` values of `O`,
    /// converted from `T`; floating types only). Collective for Distributed
    /// and Hierarchy memory, local otherwise.
    ///
    /// # Errors
    /// [`Error::IndexOutOfRange`] naming the first bad id and its rank (on
    /// every rank of a collective call); [`Error::Gather`] for a wrongly
    /// sized buffer or an integer `O`; [`Error::Comm`].
    pub fn gather<O: Element, I: Index>(&self, ids: &[I], out: &mut [O]) -> Result<()> {
        if self.cache.node_enabled() {
            return self.gather_cached(I::ids(ids), bytemuck::cast_slice_mut(out), O::DTYPE);
        }
        wm_gather::gather(self.table.memory(), &self.layout, I::ids(ids), bytemuck::cast_slice_mut(out), O::DTYPE)?;
        Ok(())
    }

    /// Gathers the optimizer state `name` (one of
    /// [`state_names`](Self::state_names)) of rows `ids` into `out`. As
    /// collective as [`gather`](Self::gather).
    ///
    /// # Errors
    /// [`Error::UnknownState`] on the rank that passed the name (the
    /// others report that rank's failure); otherwise as
    /// [`gather`](Self::gather).
    pub fn gather_state<I: Index>(&self, name: &str, ids: &[I], out: &mut [f32]) -> Result<()> {
        let slot = self.slots().into_iter().find(|s| s.name == name);
        let found = match (slot, &self.state) {
            (Some(slot), Some(state)) => Ok((slot, state)),
            _ => Err(Error::UnknownState {
                optimizer: self.optimizer.map_or("no", |o| o.name()),
                name: name.to_owned(),
                known: self.state_names(),
            }),
        };
        // An unknown name on one rank fails the call on every rank before
        // the gather, which the others would otherwise enter alone.
        let (slot, state) = agree(self.comm().as_ref(), found, Rule::OwnFirst)?;
        let layout = RowLayout::new(DType::F32, slot.cols, slot.offset)?;
        wm_gather::gather(state.memory(), &layout, I::ids(ids), bytemuck::cast_slice_mut(out), DType::F32)?;
        Ok(())
    }

    /// Fills the weights (collectively) with `init`, a pure function of
    /// `(seed, row, column)`: the table holds the same values whatever the
    /// rank count, partition or memory type. Values are rounded to `T`.
    /// The optimizer state is left as it is (see
    /// [`reset_state`](Self::reset_state)).
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for bad parameters, or when ranks pass
    /// different ones (on every rank); [`Error::Gather`], [`Error::Comm`].
    pub fn init(&mut self, init: Init, seed: u64) -> Result<()> {
        let comm = self.comm().clone();
        let mine = init.check().map_err(|m| Error::Common(CommonError::InvalidArgument(m)));
        let ((), all) = agree_sharing(comm.as_ref(), mine, Rule::Lowest, format!("{init:?} seed {seed}").as_bytes())?;
        if let Some((r, other)) = all.iter().enumerate().find(|(_, o)| **o != all[0]) {
            let ranks = comm.world_ranks();
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different initialisations: rank {} {} and rank {} {}",
                ranks[0],
                String::from_utf8_lossy(&all[0]),
                ranks[r],
                String::from_utf8_lossy(other)
            ))));
        }
        let layout = self.layout;
        fill_own(&mut self.table, &layout, |row, out| {
            for (c, v) in out.iter_mut().enumerate() {
                *v = init.value(seed, row, c as u64);
            }
        })?;
        comm.barrier()?;
        // Every row changed: the node cache drops them at its next gather
        // (their generations moved), and this rank's device cache forgets
        // them now.
        self.cache.forget_device();
        Ok(())
    }

    /// Sets every row's optimizer state (collectively) back to
    /// [`Optimizer::initial_state`], as for a new embedding.
    ///
    /// # Errors
    /// [`Error::Gather`], [`Error::Comm`].
    pub fn reset_state(&mut self) -> Result<()> {
        self.cache.forget_device();
        let (Some(opt), Some(state)) = (self.optimizer, self.state.as_mut()) else { return Ok(()) };
        let initial = opt.initial_state(self.layout.cols());
        let layout = RowLayout::of(state)?;
        fill_own(state, &layout, |_, out| out.copy_from_slice(&initial))?;
        self.table.memory().comm().barrier()?;
        Ok(())
    }

    /// Applies one step of the optimizer: row `ids[i]` received gradient
    /// `grads[i·dim .. (i+1)·dim]` (f32), at learning rate `lr`.
    ///
    /// **Collective for every memory type**: every rank calls it, with its
    /// own (possibly empty) ids, and the same `lr`. The gradients of a
    /// repeated id are summed — on each rank in input order, then across
    /// ranks in rank order — and sent with the ids to the rank that owns the
    /// row (one exchange, ids and gradients together). Each owner then
    /// updates its own rows, once each, with the summed gradient, reading
    /// and writing weights and state in place (`wm_gather::gather_owned`,
    /// `scatter_owned`). Rows
    /// without a gradient do not change, state included. When it returns on
    /// a rank, that rank's updates are done; for Continuous and Chunked
    /// memory it also waits (a barrier) until every rank's are, so a
    /// gather through the mapping that follows sees them all.
    ///
    /// # Errors
    /// Checked before anything moves, and the same error on every rank (the
    /// next call works): [`Error::NoOptimizer`]; [`Error::IndexOutOfRange`]
    /// naming the first bad id, its position and rank;
    /// [`Error::GradientLength`] when `grads` is not `ids.len() × dim`
    /// values; [`wholemem::CommonError::InvalidArgument`] for a learning rate that is not
    /// finite and at least 0, or differs between ranks (naming both). Later:
    /// [`Error::Gather`], [`Error::Comm`].
    pub fn apply_gradients<I: Index>(&mut self, ids: &[I], grads: &[f32], lr: f32) -> Result<()> {
        // Its phases, when `wm_gather::profile` records.
        let mut clock = wm_gather::profile::Clock::start();
        let comm = self.comm().clone();
        let dim = self.dim();
        let ids = I::ids(ids);
        let checked = self.check_step(ids, grads, lr);
        clock.lap("checks");

        // 1. Group repeats here, then send each owner, in one exchange, its
        //    rows (as its local row numbers) and their summed gradients —
        //    with this rank's learning rate and the outcome of its checks,
        //    so every rank learns every rank's without a round of its own.
        //    Sorted ids group by owner; each sum is made as its part is
        //    written. This rank's own rows and gradients stay here (its part
        //    is only the head), and the peers' parts are kept as they
        //    arrived (or copied once out of a mailbox): the merge reads them.
        let p = self.table.memory().partition().clone();
        let repeats = if checked.is_ok() { Repeats::of(&rows_of(ids)) } else { Repeats::default() };
        let uids = &repeats.ids;
        clock.lap("group ids");
        let bounds: Vec<usize> = (0..=comm.size()).map(|r| uids.partition_point(|&id| (id as usize) < p.offset(r))).collect();
        let failure = checked.as_ref().err().map(|_| wholemem::agree::outcome_bytes(&checked));
        let step = Step { lr, dim, grads, repeats: &repeats, bounds: &bounds };
        let (arrived, packing) = send_gradients(comm.as_ref(), &p, &step, failure.as_deref(), clock.on())?;
        clock.lap_split("exchange", &[("pack", packing)]);
        let ExchangedGradients { outcomes, mut rates, received, problem } = arrived;

        // 2. Every rank holds every rank's outcome and rate: the same
        //    decision everywhere. Then what each rank sent is checked — rows
        //    this rank owns, one row of gradients per id — and every rank
        //    learns whether all was well before any row changes.
        let opt = agree_on_step(comm.as_ref(), checked, &outcomes, &mut rates, lr, problem)?;
        clock.lap("agree");
        let first = p.offset(comm.rank()) as i64;
        let (lo, hi) = (bounds[comm.rank()], bounds[comm.rank() + 1]);
        let own_rows: Vec<u64> = uids[lo..hi].iter().map(|&id| id - first as u64).collect();
        let parts: Vec<(&[u64], Grads<'_>)> = received
            .iter()
            .enumerate()
            .map(|(r, (ids, from_peer))| {
                if r == comm.rank() {
                    (&own_rows[..], Grads::Own { grads, repeats: &repeats, first: lo })
                } else {
                    (&ids[..], from_peer.grads())
                }
            })
            .collect();

        // 3. Merge, read, update and write back this rank's touched rows, a
        //    run of them at a time: its own rows, so no communication. On
        //    the host a run's sums, weights and state stay in the CPU's
        //    caches from the merge to the write; the device cache takes
        //    every row at once. Should any of it fail, the writes are left
        //    untold: the next cached gather drops every row of the ranks
        //    that made them.
        let since = WriteMark::of(self.table.memory());
        let ([reading, updating, writing], buffers) = self.update_own_rows(opt, lr, &parts, first, clock.on())?;
        drop(parts);
        let mut frames = Vec::new();
        for (_, from_peer) in received {
            match from_peer {
                Received::Frame(kept, _) => frames.push(kept.into_vec()),
                Received::Copied(v) => recycle([v]),
            }
        }
        comm.recycle(frames);
        clock.lap_split("merge", &[("read rows", reading), ("update", updating), ("write rows", writing)]);
        if self.table.memory().memory_type().is_mapped() {
            comm.barrier()?;
        }
        // Every node's cache drops every rank's updated rows: every row this
        // step wrote (the owners wrote the union of every rank's ids).
        let changed: Vec<i64> = uids.iter().map(|&id| id as i64).collect();
        self.cache.invalidate_node_written(self.table.memory(), Ids::I64(&changed), since)?;
        recycle(buffers);
        clock.lap("finish");
        Ok(())
    }

    /// `apply_gradients`' own checks on this rank, before anything moves:
    /// an optimizer, a usable learning rate, ids in range, one row of
    /// gradients per id.
    fn check_step(&self, ids: Ids<'_>, grads: &[f32], lr: f32) -> Result<Optimizer> {
        let (rows, dim) = (self.rows(), self.dim());
        let me = self.comm().world_rank();
        let opt = self.optimizer.ok_or(Error::NoOptimizer)?;
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "learning rate {lr} on rank {me}: it must be finite and at least 0"
            ))));
        }
        if let Some((position, index)) = ids.first_out_of_range(rows) {
            return Err(Error::IndexOutOfRange { index, position, rank: me, rows });
        }
        if ids.len().checked_mul(dim) != Some(grads.len()) {
            return Err(Error::GradientLength { rank: me, ids: ids.len(), dim, len: grads.len() });
        }
        Ok(opt)
    }

    /// `apply_gradients`' third phase: merges the senders' `parts` a run of
    /// rows at a time, reads those rows' weights and state (this rank's
    /// own, from row `first` on), updates them and writes them back. The
    /// time spent reading, updating and writing, when `on`, and the
    /// buffers it used, for [`recycle`] (after the peers' parts).
    fn update_own_rows(
        &mut self,
        opt: Optimizer,
        lr: f32,
        parts: &[(&[u64], Grads<'_>)],
        first: i64,
        on: bool,
    ) -> Result<([Duration; 3], [Vec<f32>; 3])> {
        let dim = self.dim();
        let width = opt.state_width(dim);
        let device = self.cache.device_enabled();
        let total: usize = parts.iter().map(|(ids, _)| ids.len()).sum();
        let run = if device { total } else { (UPDATE_RUN_BYTES / (4 * dim.max(width))).clamp(1, total.max(1)) };
        let (mut local, mut own) = (Vec::with_capacity(run), Vec::with_capacity(run));
        let (mut sums, mut w, mut s) = (pooled(run * dim), pooled(run * dim), pooled(run * width));
        let (mut reading, mut updating, mut writing) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        let mut merger = Merger::new(parts, dim);
        while merger.next(run, &mut local, &mut sums) {
            own.clear();
            own.extend(local.iter().map(|&r| first + r as i64));
            w.resize(own.len() * dim, 0.0);
            s.resize(own.len() * width, 0.0);
            timed(on, &mut reading, || -> Result<()> {
                if device {
                    // Through this rank's device cache (its own rows only).
                    return self.read_own_cached(&own, &mut w, &mut s);
                }
                wm_gather::gather_owned(self.table.memory(), &self.layout, Ids::I64(&own), bytemuck::cast_slice_mut(&mut w), DType::F32)?;
                if let Some(state) = &self.state {
                    let layout = RowLayout::of(state)?;
                    wm_gather::gather_owned(state.memory(), &layout, Ids::I64(&own), bytemuck::cast_slice_mut(&mut s), DType::F32)?;
                }
                Ok(())
            })?;
            timed(on, &mut updating, || {
                for (i, g) in sums.chunks_exact(dim).enumerate() {
                    opt.update_row(lr, &mut w[i * dim..(i + 1) * dim], &mut s[i * width..(i + 1) * width], g);
                }
            });
            timed(on, &mut writing, || -> Result<()> {
                if device {
                    // Dirty on the GPU, then home before any other path reads them.
                    return self.write_own_cached(&own, &w, &s);
                }
                wm_gather::scatter_owned(self.table.memory_mut(), &self.layout, Ids::I64(&own), bytemuck::cast_slice(&w), DType::F32)?;
                if let Some(state) = &mut self.state {
                    let layout = RowLayout::of(state)?;
                    wm_gather::scatter_owned(state.memory_mut(), &layout, Ids::I64(&own), bytemuck::cast_slice(&s), DType::F32)?;
                }
                Ok(())
            })?;
        }
        Ok(([reading, updating, writing], [sums, w, s]))
    }

    /// Frees the weights and the state, collectively.
    ///
    /// # Errors
    /// When a peer is lost or times out.
    pub fn free(self) -> Result<()> {
        self.cache.free()?;
        if let Some(state) = self.state {
            state.free()?;
        }
        self.table.free()?;
        Ok(())
    }
}

/// What one `apply_gradients` step sends: the learning rate, the
/// dimension, the caller's gradients, its ids grouped ([`Repeats`]) and
/// where each owner's start among them (`bounds[r]..bounds[r + 1]`).
struct Step<'a> {
    lr: f32,
    dim: usize,
    grads: &'a [f32],
    repeats: &'a Repeats,
    bounds: &'a [usize],
}

/// What `apply_gradients`' exchange brought this rank, per sender: the
/// outcome of a sender that failed its checks, its learning rate, its ids
/// and gradients; and the first malformed part, as an error naming its
/// sender.
struct ExchangedGradients {
    outcomes: Vec<Option<Vec<u8>>>,
    rates: Vec<Option<f32>>,
    received: Vec<(Vec<u64>, Received)>,
    problem: Option<Error>,
}

/// `apply_gradients`' first phase: one exchange that sends each owner its
/// rows of `step` (as its local row numbers) with their summed gradients
/// and this rank's learning rate — or, when this rank's checks failed, its
/// `failure` — and reads what every peer sent. With the time spent packing
/// gradients, when `on`.
fn send_gradients(
    comm: &dyn Communicator,
    p: &wholemem::Partition,
    step: &Step<'_>,
    failure: Option<&[u8]>,
    on: bool,
) -> Result<(ExchangedGradients, Duration)> {
    let Step { lr, dim, grads, repeats, bounds } = *step;
    let (uids, n, me) = (&repeats.ids, comm.size(), comm.world_rank());
    let sizes: Vec<usize> = (0..n)
        .map(|r| match failure {
            Some(f) => 1 + f.len(),
            None if r == comm.rank() => GRADS_HEADER,
            None => GRADS_HEADER + (bounds[r + 1] - bounds[r]) * (8 + 4 * dim),
        })
        .collect();
    let count = p.count(comm.rank());
    let mut outcomes: Vec<Option<Vec<u8>>> = vec![None; n];
    let mut rates: Vec<Option<f32>> = vec![None; n];
    // Per sender: its ids and its gradients.
    let mut received: Vec<(Vec<u64>, Received)> = (0..n).map(|_| (Vec::new(), Received::Copied(Vec::new()))).collect();
    let mut problem = None;
    let mut tmp = Vec::new();
    let mut packing = Duration::ZERO;
    comm.exchange(
        ExchangePlan::new(&sizes, &mut |r, buf| match failure {
            Some(f) => {
                buf[0] = GRADS_FAILED;
                buf[1..].copy_from_slice(f);
            }
            None => {
                let k = if r == comm.rank() { bounds[r] } else { bounds[r + 1] };
                let ids = &uids[bounds[r]..k];
                buf[0] = GRADS_IDS;
                buf[1..5].copy_from_slice(&lr.to_le_bytes());
                buf[5..13].copy_from_slice(&(ids.len() as u64).to_le_bytes());
                let (id_bytes, grad_bytes) = buf[GRADS_HEADER..].split_at_mut(ids.len() * 8);
                for (slot, &id) in id_bytes.chunks_exact_mut(8).zip(ids) {
                    slot.copy_from_slice(&(id - p.offset(r) as u64).to_le_bytes());
                }
                timed(on, &mut packing, || {
                    for (j, slot) in grad_bytes.chunks_exact_mut(4 * dim).enumerate() {
                        if j + wm_gather::PREFETCH_DISTANCE < ids.len() {
                            repeats.prefetch(grads, dim, bounds[r] + j + wm_gather::PREFETCH_DISTANCE);
                        }
                        repeats.put_sum(grads, dim, bounds[r] + j, &mut tmp, slot);
                    }
                });
            }
        })
        .receive_parts(&mut |r, part| match read_part(part.bytes(), count, dim) {
            PartRead::Failed(outcome) => outcomes[r] = Some(outcome),
            PartRead::Gradients { rate, ids, at } => {
                rates[r] = Some(rate);
                if !ids.is_empty() {
                    received[r] = (ids, Received::of(part, at));
                }
            }
            PartRead::Malformed { rate, detail } => {
                rates[r] = rate;
                problem.get_or_insert_with(|| {
                    Error::Common(CommonError::Malformed { rank: comm.world_ranks()[r], detail: format!("{detail} (to rank {me})") })
                });
            }
        }),
    )?;
    Ok((ExchangedGradients { outcomes, rates, received, problem }, packing))
}

/// `apply_gradients`' second phase: every rank decides the same from every
/// rank's outcome (`outcomes[r]`, `None` for a rank whose checks passed)
/// and learning rate, then learns whether any part was malformed
/// (`problem`) — all before any row changes. The optimizer, when all was
/// well.
fn agree_on_step(
    comm: &dyn Communicator,
    checked: Result<Optimizer>,
    outcomes: &[Option<Vec<u8>>],
    rates: &mut [Option<f32>],
    lr: f32,
    problem: Option<Error>,
) -> Result<Optimizer> {
    let ok = wholemem::agree::outcome_bytes::<(), Error>(&Ok(()));
    let parts: Vec<&[u8]> = outcomes.iter().map(|o| o.as_deref().unwrap_or(&ok)).collect();
    let opt = wholemem::agree::decide(comm, checked, Rule::Lowest, &parts)?;
    rates[comm.rank()] = Some(lr);
    let show = |r: Option<f32>| r.map_or_else(|| "(none)".to_owned(), |r| r.to_string());
    // Each rank compares the rates it received; a peer that sent different
    // ranks different rates would split them here, so the verdict goes
    // through the agreement like a malformed part (which comes first).
    let same = match rates.iter().enumerate().find(|(_, x)| x.map(f32::to_bits) != rates[0].map(f32::to_bits)) {
        Some((r, &rate)) => {
            let ranks = comm.world_ranks();
            Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different learning rates: rank {} {} and rank {} {}",
                ranks[0],
                show(rates[0]),
                ranks[r],
                show(rate)
            ))))
        }
        None => Ok(()),
    };
    agree(comm, problem.map_or(same, Err), Rule::OwnFirst)?;
    Ok(opt)
}

/// What a part of `apply_gradients`' exchange says.
#[derive(Debug, PartialEq)]
enum PartRead {
    /// The sender failed its checks: its outcome.
    Failed(Vec<u8>),
    /// The sender's learning rate, its ids (local row numbers here), and
    /// where their gradients start in the part.
    Gradients { rate: f32, ids: Vec<u64>, at: usize },
    /// What is wrong with the part, and the sender's learning rate when
    /// its head was whole (so that a bad part is reported as such, not as
    /// a rank without a rate).
    Malformed { rate: Option<f32>, detail: String },
}

/// Reads a part of `apply_gradients`' exchange (its layout at
/// [`GRADS_IDS`]) for a rank owning `count` rows of `dim` values.
fn read_part(bytes: &[u8], count: usize, dim: usize) -> PartRead {
    let (rate, k) = match bytes.split_first() {
        Some((&GRADS_FAILED, outcome)) => return PartRead::Failed(outcome.to_vec()),
        Some((&GRADS_IDS, _)) if bytes.len() >= GRADS_HEADER => {
            let word = |at: usize| u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7].map(|i| bytes[at + i]));
            (f32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]), usize::try_from(word(5)).unwrap_or(usize::MAX))
        }
        _ => {
            let detail = format!("a gradient part of {} bytes that is neither ids nor an outcome", bytes.len());
            return PartRead::Malformed { rate: None, detail };
        }
    };
    let rest = &bytes[GRADS_HEADER..];
    let Some(split) = k.checked_mul(8).filter(|&b| b <= rest.len()) else {
        return PartRead::Malformed { rate: Some(rate), detail: format!("a part announcing {k} ids in {} bytes", bytes.len()) };
    };
    match received_gradients(&rest[..split], rest.len() - split, count, dim) {
        Ok(ids) => PartRead::Gradients { rate, ids, at: GRADS_HEADER + split },
        Err(detail) => PartRead::Malformed { rate: Some(rate), detail },
    }
}

/// The ids of one peer's part of a gradient exchange: row ids (8 bytes
/// each) below `count`, ascending and distinct, followed by `grad_bytes`
/// bytes that must be `dim` f32 gradients (4 bytes each) per id; what is
/// wrong with them otherwise.
fn received_gradients(ids: &[u8], grad_bytes: usize, count: usize, dim: usize) -> std::result::Result<Vec<u64>, String> {
    if ids.len() % 8 != 0 {
        return Err(format!("{} bytes of row ids, not a whole number of 8-byte ids", ids.len()));
    }
    let rows: Vec<u64> = ids
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    if let Some((i, &r)) = rows.iter().enumerate().find(|(_, r)| **r >= count as u64) {
        return Err(format!("row id {r} at position {i}, past the {count} rows there"));
    }
    // A sender sums its repeats and sends its ids ascending.
    if let Some(i) = rows.windows(2).position(|w| w[0] >= w[1]) {
        return Err(format!(
            "row id {} at position {} after row id {}: the ids are not ascending and distinct",
            rows[i + 1],
            i + 1,
            rows[i]
        ));
    }
    if rows.len().checked_mul(dim).and_then(|v| v.checked_mul(4)) != Some(grad_bytes) {
        return Err(format!("{grad_bytes} bytes of gradients for {} ids of dimension {dim}", rows.len()));
    }
    Ok(rows)
}

/// A peer's gradients, as its part of the exchange brought them.
#[derive(Debug)]
enum Received {
    /// The part itself, where the backend hands it over without a copy (a
    /// frame from another node), with where the gradients start in it.
    Frame(wm_comm::KeptPart, usize),
    /// The gradients copied out of a part the backend keeps (a node
    /// peer's shared mailbox), into a buffer of [`pooled`]'s.
    Copied(Vec<f32>),
}

impl Received {
    /// Keeps `part`'s gradients, which start at byte `at`.
    fn of(part: wm_comm::ReceivedPart<'_>, at: usize) -> Self {
        if part.keeps_without_copy() {
            return Received::Frame(part.keep(), at);
        }
        let bytes = part.bytes().get(at..).unwrap_or_default();
        let mut v = pooled(bytes.len() / 4);
        v.extend(le_f32s(bytes));
        Received::Copied(v)
    }

    /// The gradients, to merge.
    fn grads(&self) -> Grads<'_> {
        match self {
            Received::Frame(kept, at) => Grads::Wire(kept.get(*at..).unwrap_or_default()),
            Received::Copied(v) => Grads::Copied(v),
        }
    }
}

/// One sender's summed gradients, `dim` values per id, read where they
/// lie: this rank's own (its row `k` is the sum of distinct id `first + k`
/// of `repeats`, from the caller's `grads`), or a peer's as its part
/// carries them (little-endian, any alignment).
#[derive(Debug, Clone, Copy)]
enum Grads<'a> {
    Own {
        grads: &'a [f32],
        repeats: &'a Repeats,
        first: usize,
    },
    Wire(&'a [u8]),
    /// A peer's, copied out of its part.
    Copied(&'a [f32]),
}

impl Grads<'_> {
    /// Row `k` added into `acc` (`dim` values).
    fn add_row(self, k: usize, acc: &mut [f32]) {
        let dim = acc.len();
        match self {
            Grads::Own { grads, repeats, first } => repeats.add_sum(grads, first + k, acc),
            Grads::Copied(g) => acc.iter_mut().zip(&g[k * dim..][..dim]).for_each(|(a, b)| *a += b),
            Grads::Wire(g) => acc.iter_mut().zip(le_f32s(&g[k * dim * 4..][..dim * 4])).for_each(|(a, b)| *a += b),
        }
    }

    /// Asks for row `k` ahead of reading it, where that helps (this rank's
    /// own rows, read in id order from the caller's batch order).
    fn prefetch(self, k: usize, dim: usize) {
        if let Grads::Own { grads, repeats, first } = self {
            repeats.prefetch(grads, dim, first + k);
        }
    }

    /// Row `k` appended to `sums`.
    fn push_row(self, k: usize, dim: usize, sums: &mut Vec<f32>) {
        match self {
            Grads::Own { grads, repeats, first } => repeats.push_sum(grads, dim, first + k, sums),
            Grads::Copied(g) => sums.extend_from_slice(&g[k * dim..][..dim]),
            Grads::Wire(g) => sums.extend(le_f32s(&g[k * dim * 4..][..dim * 4])),
        }
    }
}

/// Senders up to which [`Merger`] finds the next id by looking at every
/// sender's (a few compares, no branches to mispredict); past it, by a
/// heap.
const MERGE_SCAN_MAX: usize = 16;

/// The senders' parts (`parts[r]`: ascending distinct ids, and their
/// summed gradients, `dim` each) merged a run of ids at a time: each id
/// once, ascending, its gradients summed in rank order.
struct Merger<'p, 'a> {
    parts: &'p [(&'a [u64], Grads<'a>)],
    dim: usize,
    /// Per sender, the index in its part of its next id.
    at: Vec<usize>,
    /// With many senders: the next id of every sender not yet merged,
    /// smallest first, ties in rank order (id, sender).
    heap: Option<std::collections::BinaryHeap<std::cmp::Reverse<(u64, usize)>>>,
}

impl<'p, 'a> Merger<'p, 'a> {
    fn new(parts: &'p [(&'a [u64], Grads<'a>)], dim: usize) -> Self {
        let heap = (parts.len() > MERGE_SCAN_MAX)
            .then(|| parts.iter().enumerate().filter_map(|(r, (i, _))| i.first().map(|&id| std::cmp::Reverse((id, r)))).collect());
        Self { parts, dim, at: vec![0; parts.len()], heap }
    }

    /// The smallest next id of any sender, and the lowest sender with it.
    fn peek(&self) -> Option<(u64, usize)> {
        if let Some(h) = &self.heap {
            return h.peek().map(|&std::cmp::Reverse(top)| top);
        }
        let mut best: Option<(u64, usize)> = None;
        for (r, (ids, _)) in self.parts.iter().enumerate() {
            if let Some(&id) = ids.get(self.at[r])
                && best.is_none_or(|(b, _)| id < b)
            {
                best = Some((id, r));
            }
        }
        best
    }

    /// Moves sender `r` on to its next id.
    fn advance(&mut self, r: usize) {
        self.at[r] += 1;
        if let Some(h) = &mut self.heap {
            h.pop();
            if let Some(&id) = self.parts[r].0.get(self.at[r]) {
                h.push(std::cmp::Reverse((id, r)));
            }
        }
    }

    /// The next at most `max` ids (after those of earlier runs) into `ids`,
    /// and their sums into `sums` (both emptied first); `false` when every
    /// id has been merged.
    fn next(&mut self, max: usize, ids: &mut Vec<u64>, sums: &mut Vec<f32>) -> bool {
        let dim = self.dim;
        ids.clear();
        sums.clear();
        while let Some((id, r)) = self.peek() {
            let (g, k) = (self.parts[r].1, self.at[r]);
            if k + wm_gather::PREFETCH_DISTANCE < self.parts[r].0.len() {
                g.prefetch(k + wm_gather::PREFETCH_DISTANCE, dim);
            }
            if ids.last() == Some(&id) {
                let start = sums.len() - dim;
                g.add_row(k, &mut sums[start..]);
            } else if ids.len() == max {
                // A new id past the run: it starts the next one.
                break;
            } else {
                ids.push(id);
                g.push_row(k, dim, sums);
            }
            self.advance(r);
        }
        !ids.is_empty()
    }
}

/// Little-endian `bytes` (4 per value, any alignment) as f32 values.
fn le_f32s(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// `values` as little-endian bytes into `bytes` (4 per value): one copy on
/// a little-endian machine.
fn put_f32s(bytes: &mut [u8], values: &[f32]) {
    if cfg!(target_endian = "little") {
        bytes.copy_from_slice(bytemuck::cast_slice(values));
    } else {
        for (slot, v) in bytes.chunks_exact_mut(4).zip(values) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Writes every row this rank owns, from `f(global row, out)` filling one
/// row of f32 (converted to the table's type), in rounds of at most
/// [`FILL_ROWS`] rows. Every rank does the same number of rounds (from the
/// partition, which every rank knows), since a scatter may be collective.
fn fill_own<U: Element>(t: &mut WholeTensor<U>, layout: &RowLayout, mut f: impl FnMut(u64, &mut [f32])) -> Result<()> {
    let mem = t.memory();
    let p = mem.partition().clone();
    let me = mem.comm().rank();
    let rounds = p.counts().iter().map(|c| c.div_ceil(FILL_ROWS)).max().unwrap_or(0);
    let cols = layout.cols();
    let mine = p.range(me);
    for k in 0..rounds {
        let start = (mine.start + k * FILL_ROWS).min(mine.end);
        let end = (start + FILL_ROWS).min(mine.end);
        let ids: Vec<i64> = (start as i64..end as i64).collect();
        let mut vals = vec![0f32; ids.len() * cols];
        for (row, out) in (start as u64..end as u64).zip(vals.chunks_exact_mut(cols)) {
            f(row, out);
        }
        wm_gather::scatter(t.memory_mut(), layout, Ids::I64(&ids), bytemuck::cast_slice(&vals), DType::F32)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Every sender's part merged in one run, and the same in runs of every
    /// length from 1 to 4: the same ids and sums.
    fn merge_sums(parts: &[(&[u64], Grads<'_>)], dim: usize) -> (Vec<u64>, Vec<f32>) {
        let (mut all_ids, mut all_sums) = (Vec::new(), Vec::new());
        Merger::new(parts, dim).next(usize::MAX, &mut all_ids, &mut all_sums);
        for run in 1..=4 {
            let (mut ids, mut sums, mut m) = (Vec::new(), Vec::new(), Merger::new(parts, dim));
            let (mut got_ids, mut got_sums) = (Vec::new(), Vec::new());
            while m.next(run, &mut ids, &mut sums) {
                assert!(ids.len() <= run && sums.len() == ids.len() * dim, "a run of {run}: {ids:?}");
                got_ids.extend_from_slice(&ids);
                got_sums.extend_from_slice(&sums);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!((&got_ids, bits(&got_sums)), (&all_ids, bits(&all_sums)), "runs of {run}");
        }
        (all_ids, all_sums)
    }

    /// Gradients as a part carries them: little-endian, behind `skew`
    /// bytes so that they are not aligned for f32.
    fn wire(values: &[f32], skew: usize) -> Vec<u8> {
        let mut b = vec![0xA5u8; skew];
        b.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        b
    }

    /// Every distinct id's summed gradient, in the order of `repeats`' ids.
    fn sums(repeats: &Repeats, grads: &[f32], dim: usize) -> Vec<f32> {
        let mut s = Vec::new();
        (0..repeats.ids.len()).for_each(|k| repeats.push_sum(grads, dim, k, &mut s));
        s
    }

    #[test]
    fn merged_parts_sum_each_id_once_in_rank_order() {
        let parts: Vec<(Vec<u64>, Vec<f32>)> = vec![
            (vec![1, 4], vec![1.0, 2.0, 3.0, 4.0]),
            (vec![], vec![]),
            (vec![0, 4, 9], vec![5.0, 6.0, 7.0, 8.0, 9.0, 10.0]),
            (vec![4], vec![0.5, 0.25]),
        ];
        let want_ids = [0u64, 1, 4, 9];
        let want_sums = [5.0, 6.0, 1.0, 2.0, 3.0 + 7.0 + 0.5, 4.0 + 8.0 + 0.25, 9.0, 10.0];
        // Every sender's gradients as this rank's own, then as parts off the
        // wire (unaligned), then mixed: the same sums.
        let wires: Vec<Vec<u8>> = parts.iter().enumerate().map(|(r, (_, g))| wire(g, r % 3 + 1)).collect();
        let repeats: Vec<Repeats> = parts.iter().map(|(i, _)| Repeats::of(i)).collect();
        for own in [usize::MAX, 0, 2] {
            let views: Vec<(&[u64], Grads<'_>)> = parts
                .iter()
                .zip(&wires)
                .zip(&repeats)
                .enumerate()
                .map(|(r, (((i, g), w), rep))| {
                    let grads = if own == usize::MAX || r == own {
                        Grads::Own { grads: g, repeats: rep, first: 0 }
                    } else {
                        Grads::Wire(&w[r % 3 + 1..])
                    };
                    (&i[..], grads)
                })
                .collect();
            let (ids, sums) = merge_sums(&views, 2);
            assert_eq!((&ids[..], &sums[..]), (&want_ids[..], &want_sums[..]), "own part {own}");
        }
        // The same as summing the concatenation.
        let all_ids: Vec<u64> = parts.iter().flat_map(|p| p.0.clone()).collect();
        let all_grads: Vec<f32> = parts.iter().flat_map(|p| p.1.clone()).collect();
        let all = Repeats::of(&all_ids);
        assert_eq!((&all.ids[..], &sums(&all, &all_grads, 2)[..]), (&want_ids[..], &want_sums[..]));
        // A sender's own part from the middle of its distinct ids, repeats
        // included: its rows are those ids' sums.
        let own = Grads::Own { grads: &all_grads, repeats: &all, first: 2 };
        assert_eq!(merge_sums(&[(&[4, 9], own)], 2), (vec![4, 9], want_sums[4..].to_vec()));
        assert_eq!(merge_sums(&[], 3), (vec![], vec![]));
    }

    #[test]
    fn a_ranks_repeats_are_summed_before_the_ranks_before_it_are_added() {
        // Rank 0 sent 1 for row 3; this rank (1) has row 3 twice, 1e8 and
        // -1e8. Its own sum is 0, so the total is 1; adding its rows one by
        // one to rank 0's would give (1 + 1e8) - 1e8 = 0 in f32.
        let repeats = Repeats::of(&[3, 3]);
        let grads = [1e8f32, -1e8];
        let peer = wire(&[1.0], 0);
        let parts: [(&[u64], Grads<'_>); 2] =
            [(&[3], Grads::Wire(&peer)), (&[3], Grads::Own { grads: &grads, repeats: &repeats, first: 0 })];
        assert_eq!(merge_sums(&parts, 1), (vec![3], vec![1.0]));
    }

    #[test]
    fn merging_equals_summing_each_rank_then_the_ranks_in_order() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut below = |m: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % m
        };
        for _ in 0..300 {
            // Few senders (scanned) and many (a heap).
            let n = if below(4) == 0 { MERGE_SCAN_MAX + 1 + below(8) as usize } else { 1 + below(4) as usize };
            let (dim, rows) = (1 + below(5) as usize, 1 + below(40));
            let batches: Vec<(Vec<u64>, Vec<f32>)> = (0..n)
                .map(|_| {
                    let c = below(30) as usize;
                    ((0..c).map(|_| below(rows)).collect(), (0..c * dim).map(|_| below(100) as f32 * 0.05 - 2.4).collect())
                })
                .collect();
            // Each rank's sums (input order), then the ranks' in rank order.
            let mut want = std::collections::BTreeMap::<u64, Vec<f32>>::new();
            for (ids, g) in &batches {
                let mut mine = std::collections::BTreeMap::<u64, Vec<f32>>::new();
                for (j, &id) in ids.iter().enumerate() {
                    let row = &g[j * dim..][..dim];
                    match mine.get_mut(&id) {
                        Some(s) => s.iter_mut().zip(row).for_each(|(a, b)| *a += b),
                        None => drop(mine.insert(id, row.to_vec())),
                    }
                }
                for (id, s) in mine {
                    match want.get_mut(&id) {
                        Some(t) => t.iter_mut().zip(&s).for_each(|(a, b)| *a += b),
                        None => drop(want.insert(id, s)),
                    }
                }
            }
            // As the exchange has them: one rank's own, the others' parts
            // as their senders wrote them.
            let repeats: Vec<Repeats> = batches.iter().map(|(i, _)| Repeats::of(i)).collect();
            let mut tmp = Vec::new();
            let wires: Vec<Vec<u8>> = repeats
                .iter()
                .zip(&batches)
                .map(|(r, (_, g))| {
                    let mut b = vec![0u8; r.ids.len() * dim * 4];
                    b.chunks_exact_mut(4 * dim).enumerate().for_each(|(k, slot)| r.put_sum(g, dim, k, &mut tmp, slot));
                    b
                })
                .collect();
            let me = below(n as u64) as usize;
            // Kept frames for some peers, copies out of a mailbox for others.
            let copies: Vec<Vec<f32>> = wires.iter().map(|w| le_f32s(w).collect()).collect();
            let views: Vec<(&[u64], Grads<'_>)> = (0..n)
                .map(|r| {
                    let grads = match r {
                        _ if r == me => Grads::Own { grads: &batches[r].1, repeats: &repeats[r], first: 0 },
                        _ if r % 2 == 0 => Grads::Wire(&wires[r]),
                        _ => Grads::Copied(&copies[r]),
                    };
                    (&repeats[r].ids[..], grads)
                })
                .collect();
            let (ids, sums) = merge_sums(&views, dim);
            assert_eq!(ids, want.keys().copied().collect::<Vec<_>>());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sums), bits(&want.values().flatten().copied().collect::<Vec<_>>()), "{n} ranks, own rank {me}");
        }
    }

    #[test]
    fn received_gradients_must_be_ascending_and_distinct() {
        let ids = |v: &[u64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(received_gradients(&ids(&[1, 3]), 2 * 4, 10, 1), Ok(vec![1, 3]));
        let e = received_gradients(&ids(&[3, 3]), 2 * 4, 10, 1).unwrap_err();
        assert!(e.contains("row id 3 at position 1 after row id 3"), "{e}");
        let e = received_gradients(&ids(&[5, 2]), 2 * 4, 10, 1).unwrap_err();
        assert!(e.contains("not ascending"), "{e}");
    }

    #[test]
    fn a_part_is_read_with_its_rate_ids_and_where_its_gradients_start() {
        let part = |kind: u8, rate: f32, k: u64, ids: &[u64], grads: &[f32]| {
            let mut b = vec![kind];
            b.extend(rate.to_le_bytes());
            b.extend(k.to_le_bytes());
            b.extend(ids.iter().flat_map(|x| x.to_le_bytes()));
            b.extend(wire(grads, 0));
            b
        };
        let good = part(GRADS_IDS, 0.5, 2, &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(read_part(&good, 5, 2), PartRead::Gradients { rate: 0.5, ids: vec![1, 4], at: GRADS_HEADER + 16 });
        assert_eq!(read_part(&part(GRADS_IDS, 1.0, 0, &[], &[]), 5, 2), PartRead::Gradients { rate: 1.0, ids: vec![], at: GRADS_HEADER });
        assert_eq!(read_part(&[GRADS_FAILED, 7, 8], 5, 2), PartRead::Failed(vec![7, 8]));
        let bad = |bytes: &[u8]| match read_part(bytes, 5, 2) {
            PartRead::Malformed { detail, .. } => detail,
            other => panic!("{other:?} for a malformed part"),
        };
        assert!(bad(&good[..GRADS_HEADER - 1]).contains("neither ids nor an outcome"));
        assert!(bad(&[9, 0, 0]).contains("neither ids nor an outcome"));
        assert!(bad(&[]).contains("a gradient part of 0 bytes"));
        // More ids announced than the part holds, even past usize.
        assert!(bad(&part(GRADS_IDS, 1.0, 3, &[1, 4], &[])).contains("a part announcing 3 ids in 29 bytes"));
        assert!(bad(&part(GRADS_IDS, 1.0, u64::MAX, &[], &[])).contains("announcing"));
        assert!(bad(&good[..good.len() - 1]).contains("15 bytes of gradients for 2 ids"));
        assert!(bad(&part(GRADS_IDS, 1.0, 2, &[4, 1], &[1.0, 2.0, 3.0, 4.0])).contains("not ascending"));
        // A whole head keeps its rate, even when the rest is bad.
        let rate = |bytes: &[u8]| match read_part(bytes, 5, 2) {
            PartRead::Malformed { rate, .. } => rate,
            other => panic!("{other:?} for a malformed part"),
        };
        assert_eq!(rate(&part(GRADS_IDS, 0.25, 2, &[1, 9], &[1.0, 2.0, 3.0, 4.0])), Some(0.25));
        assert_eq!(rate(&good[..GRADS_HEADER - 1]), None);
        // Kept as they came where that costs no copy, else copied out; the
        // same gradients either way.
        let at = GRADS_HEADER + 16;
        let mut frame = [vec![0u8; 8], good.clone()].concat();
        let kept = Received::of(wm_comm::ReceivedPart::owned(&mut frame, 8), at);
        let copied = Received::of(wm_comm::ReceivedPart::borrowed(&good), at);
        assert!(matches!(kept, Received::Frame(..)) && matches!(copied, Received::Copied(..)), "{kept:?} {copied:?}");
        for got in [&kept, &copied] {
            assert_eq!(merge_sums(&[(&[1, 4], got.grads())], 2), (vec![1, 4], vec![1.0, 2.0, 3.0, 4.0]));
        }
    }

    use super::*;

    #[test]
    fn a_peers_gradient_part_is_checked() {
        let ids: Vec<u8> = [1u64, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let grads: Vec<u8> = [0.5f32, 1.0, 2.0, -1.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(received_gradients(&ids, grads.len(), 5, 2), Ok(vec![1, 4]));
        assert!(received_gradients(&ids[..12], grads.len(), 5, 2).unwrap_err().contains("12 bytes of row ids"));
        assert!(received_gradients(&ids, grads.len(), 4, 2).unwrap_err().contains("row id 4 at position 1, past the 4 rows"));
        assert!(received_gradients(&ids, 12, 5, 2).unwrap_err().contains("12 bytes of gradients for 2 ids"));
        assert!(received_gradients(&[], 0, 0, 3).is_ok());
    }

    #[test]
    fn repeats_are_summed_in_input_order_and_ids_come_out_sorted() {
        let rows = [5u64, 2, 5, 9, 2, 5];
        let grads: Vec<f32> = (0..12).map(|k| k as f32).collect(); // dim 2
        let repeats = Repeats::of(&rows);
        assert_eq!(repeats.ids, [2, 5, 9]);
        let want = [2.0 + 8.0, 3.0 + 9.0, 0.0 + 4.0 + 10.0, 1.0 + 5.0 + 11.0, 6.0, 7.0];
        assert_eq!(sums(&repeats, &grads, 2), want);
        // Added to what is there; and as a part's bytes, repeated or not.
        let mut acc = [1.0f32, -1.0];
        repeats.add_sum(&grads, 1, &mut acc);
        assert_eq!(acc, [15.0, 16.0]);
        let mut tmp = Vec::new();
        for k in 0..3 {
            let mut slot = [0u8; 8];
            repeats.put_sum(&grads, 2, k, &mut tmp, &mut slot);
            assert_eq!(slot[..], wire(&want[2 * k..2 * k + 2], 0)[..], "distinct id {k}");
        }
        let none = Repeats::of(&[]);
        assert!(none.ids.is_empty() && sums(&none, &[], 3).is_empty());
    }
}
