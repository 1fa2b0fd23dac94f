//! The node cache of remote rows: rows that other nodes own, kept in host
//! memory shared by the ranks of this node.
//!
//! One cached gather, on every rank of the table (it is collective, like
//! the gather it replaces):
//!
//! 0. **Writes.** Every rank learns every rank's write generation of the
//!    table (one allgather of five words each) and drops the rows of every rank
//!    whose generation moved since the cache last saw it (see
//!    [`NodeCache`], "Coherence").
//!    The same allgather carries each rank's path, time and ids of its previous
//!    gather, from which every rank alike chooses whether this call goes
//!    through the cache or straight to the table's own gather
//!    ([`Bypass`](super::Bypass)); steps 1 to 3 are the cached path.
//! 1. **Look up.** Each id of a row another node owns is looked up in this
//!    rank's copy of the tags (identical on every rank of the node).
//! 2. **Fetch.** Every other id (misses, and rows of the node's other
//!    ranks) goes through the table's own collective gather, each distinct
//!    row once, in the table's element type, and is converted into place;
//!    while the misses travel, the calling thread copies the hits (from the
//!    shared rows) and this rank's own rows into the output, a piece
//!    between the exchange's steps.
//! 3. **Update.** The node's leader (its lowest rank) counts every access
//!    of every rank of the node and decides which missed rows enter which
//!    slots ([`Tags::decide`](super::policy::Tags::decide)); a rank that
//!    fetched such a row copies it into the slot. On a node of one rank
//!    that is all local work. Where some node has several ranks, the ranks
//!    of a node send the leader their accesses (one exchange within the
//!    node), the leader sends every rank its decision (one broadcast), the
//!    fillers copy, and one agreement over the table's ranks ends the call
//!    — so no rank reads a slot before it is filled, and a failure anywhere
//!    is every rank's error.
//!
//! The shared rows change only in step 3, after every rank of the node has
//! passed step 1 of the same call (the leader decides only once every
//! rank's accesses arrived), and the next call's step 1 starts only after
//! every fill (the closing agreement). Tags change only by decisions every
//! rank of the node applies alike, and by invalidations and generations
//! every rank of the table learns alike.

use std::sync::Arc;

use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wholemem::{AllocRequest, Location, MemoryType, WholeMemory};
use wm_comm::{CommExt, Communicator};

use super::bypass::{Bypass, Chooser, Path};
use super::policy::{Fill, Placement, Tags};
use super::{CacheStats, RowSpace, check_ratio, ratio_slots};
use crate::kernel::{self, RowConv};
use crate::{DType, Error, Ids, Result, RowLayout, mapped};

/// A node cache of remote rows for one distributed or hierarchy table that
/// spans several nodes: up to `ratio` of the table's rows, of those other
/// nodes own, in host memory shared by the ranks of each node.
///
/// [`gather`](Self::gather) returns exactly what
/// [`wm_gather::gather`](crate::gather) returns for the same table, ids and
/// layout — served from the cache where it can, fetched otherwise.
///
/// # Coherence: write generations
/// The cache is read-only: rows enter it only as copies of what the table
/// held when a gather fetched them. Nobody needs to tell it of a write:
/// every write to a rank's rows moves that rank's
/// [`write_generation`](WholeMemory::write_generation) (scatters,
/// `apply_gradients`, `files::load`, `write_rows`, `write_local`, in-place
/// slices), and every cached gather opens with every rank's generation
/// (an allgather of five words per rank), dropping on every node the rows of
/// each rank whose generation moved since the cache last saw it.
///
/// **The rule.** A cached gather returns no row older than the writes that
/// happened before the call **on the writing rank** — before that rank
/// entered this collective call, in its own program order (or in another
/// thread's, joined before the call). Ranks need not wait for each other:
/// a rank already inside the gather waits for the writer's generation in
/// the opening allgather, so a write the writer made just before its call
/// is seen by every rank, whenever they entered. A write made after the
/// writer entered belongs to the next call. Outside the rule, as for an
/// uncached gather: rows written at the same time as the gather, and
/// writes through raw pointers that do not call
/// [`WholeMemory::note_written`].
///
/// Only the cache's own writes keep what they did not touch:
///
/// | write | what the cache drops |
/// |---|---|
/// | [`scatter`](Self::scatter) (collective) | every rank's ids, once (every rank learns them in one allgather, which also tells that those were the only rows written) |
/// | [`invalidate_written`](Self::invalidate_written) after writes (collective; `wm_embedding`'s `apply_gradients`) | the rows named, once, the writes counted as told |
/// | any other write (`wm_gather::scatter`, `write_rows`, `files::load`, …) | every row of each rank whose rows were written, at the next cached gather |
/// | a failed scatter or step (rows may be written) | the same as any other write |
/// | a call refused by its checks (a bad id, a wrong buffer, another table) | nothing: it wrote nothing |
///
/// [`invalidate`](Self::invalidate) and [`clear`](Self::clear) drop rows
/// on request; coherence never needs them.
///
/// # Which table
/// A cache knows its table by the table's allocation number
/// ([`WholeMemory::serial`]), never reused: a table allocated after the
/// cache's was freed is refused on every rank, naming both, wherever the
/// allocator placed it.
///
/// # Collectivity
/// Creation, [`gather`](Self::gather), [`scatter`](Self::scatter),
/// [`invalidate`](Self::invalidate),
/// [`invalidate_written`](Self::invalidate_written), [`clear`](Self::clear),
/// [`preload`](Self::preload) and [`free`](Self::free) are collective over the table's ranks, in the
/// same order on every rank, as the table's own gather and scatter are.
#[derive(Debug)]
pub struct NodeCache {
    comm: Arc<dyn Communicator>,
    local: Arc<dyn Communicator>,
    layout: RowLayout,
    table: TableId,
    /// Each rank's write generation of the table as the cached rows
    /// reflect it (the same on every rank of the table).
    seen: Vec<u64>,
    ratio: f64,
    space: RowSpace,
    tags: Tags,
    /// The slots' rows, one row of the layout's elements each (no slots:
    /// nothing to hold).
    data: Option<WholeMemory>,
    /// Whether some node has more than one rank (then updates talk).
    shared: bool,
    stats: CacheStats,
    /// The fetched rows' buffer, kept between calls.
    scratch: Vec<u8>,
    /// The lookup's lists, kept between calls (made afresh, they cost page
    /// faults each call where the allocator had given their memory back).
    lists: Lookup,
    /// Which path each gather takes (the same on every rank).
    chooser: Chooser,
    /// This rank's previous gather: its path and time in nanoseconds (for
    /// uncached calls, the median of those since the last exchange), if
    /// it succeeded.
    last: Option<(Path, u64)>,
    /// This rank's times of its uncached calls since the last exchange.
    plain_times: Vec<u64>,
    /// The ids of this rank's previous call.
    last_ids: u64,
}

/// The table a cache belongs to: its allocation number, which no other
/// table of the process ever gets (a table allocated where a freed one was
/// is another table), and what it is, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TableId {
    serial: u64,
    ty: MemoryType,
    loc: Location,
    rows: usize,
    granularity: usize,
}

impl TableId {
    fn of(mem: &WholeMemory) -> Self {
        Self { serial: mem.serial(), ty: mem.memory_type(), loc: mem.location(), rows: mem.rows(), granularity: mem.granularity() }
    }
}

impl std::fmt::Display for TableId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "table {} (a {} {} table of {} rows of {} bytes)", self.serial, self.loc, self.ty, self.rows, self.granularity)
    }
}

/// Where this rank's writes to a table stood at one moment: its write
/// generation then. Taken before writes that
/// [`NodeCache::invalidate_written`] then names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteMark {
    table: u64,
    generation: u64,
}

impl WriteMark {
    /// Where this rank's writes to `mem` stand now.
    pub fn of(mem: &WholeMemory) -> Self {
        Self { table: mem.serial(), generation: mem.write_generation() }
    }
}

/// The first word of a rank's part of an invalidation: its rows follow.
const PLAIN: u64 = 0;
/// The first word of a rank's part of an invalidation: its write generation
/// before and after the writes of the rows that follow, which are every row
/// those writes changed.
const ACCOUNTED: u64 = 1;

/// Encodes a ratio and a layout: what every rank must pass alike.
fn request_bytes(ratio: f64, layout: &RowLayout) -> Vec<u8> {
    let mut m = ratio.to_bits().to_le_bytes().to_vec();
    m.extend_from_slice(layout.dtype().name().as_bytes());
    for v in [layout.cols(), layout.offset()] {
        m.extend_from_slice(&(v as u64).to_le_bytes());
    }
    m
}

/// A request in words, for an error message.
fn show_request(m: &[u8]) -> String {
    match m.split_first_chunk::<8>() {
        Some((ratio, rest)) if rest.len() >= 16 => {
            let (name, words) = rest.split_at(rest.len() - 16);
            let word = |i: usize| words.get(i * 8..i * 8 + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
            format!(
                "ratio {} for {} {} elements from element {}",
                f64::from_bits(u64::from_le_bytes(*ratio)),
                word(0),
                String::from_utf8_lossy(name),
                word(1)
            )
        }
        _ => format!("{m:?}"),
    }
}

/// The first byte of the leader's decision: fills follow.
const DECIDED: u64 = 0;
/// The first byte of the leader's decision: a rank of the node sent a
/// malformed report; its world rank and the detail follow.
const REFUSED: u64 = 1;

/// The rows to fetch for `pending` ((row, place) pairs, sorted here):
/// each distinct row once, ascending; for each pair, the index of its row
/// among them; and its place.
fn distinct_rows(pending: &mut [(usize, usize)]) -> (Vec<i64>, Vec<usize>, Vec<usize>) {
    pending.sort_unstable();
    let mut fetch: Vec<i64> = Vec::with_capacity(pending.len());
    let mut from = Vec::with_capacity(pending.len());
    for &(row, _) in pending.iter() {
        if fetch.last() != Some(&(row as i64)) {
            fetch.push(row as i64);
        }
        from.push(fetch.len() - 1);
    }
    (fetch, from, pending.iter().map(|p| p.1).collect())
}

/// The count a preloaded row is credited with ([`NodeCache::preload`]):
/// the mean accesses per slot of an ageing period. In the GraphSAGE
/// example (R = 0.3) the hit rate over 4 epochs went 0.800, 0.790, 0.778,
/// 0.778 without it and 0.804, 0.805, 0.805, 0.802 with it (16 gave the
/// same); docs/cache.md, "Filled before the first batch".
const PRELOAD_CREDIT: u32 = super::policy::AGEING_PER_SLOT as u32;

/// Where each id of a cached gather is read from (step 1).
#[derive(Debug, Default)]
struct Lookup {
    /// Slots of the hits, and their positions in the output.
    hit_slots: Vec<usize>,
    hit_at: Vec<usize>,
    /// This rank's own host rows (numbered from its first), and their
    /// positions.
    own_rows: Vec<usize>,
    own_at: Vec<usize>,
    /// (row, position) of every id fetched.
    pending: Vec<(usize, usize)>,
    /// Each access as (cacheable row << 1) | missed.
    accesses: Vec<u64>,
}

impl Lookup {
    /// Empties every list (keeping their memory).
    fn clear(&mut self) {
        for v in [&mut self.hit_slots, &mut self.hit_at, &mut self.own_rows, &mut self.own_at] {
            v.clear();
        }
        self.pending.clear();
        self.accesses.clear();
    }
}

impl NodeCache {
    /// Creates a node cache of `ratio` of `mem`'s rows for rows read with
    /// `layout` (in the table's element type). Collective: every rank of
    /// the table passes the same ratio and layout.
    ///
    /// Each node gets `ceil(ratio × rows)` slots, or one per row other nodes
    /// own when that is fewer (then rows never compete for slots), shared
    /// by its ranks; its leader also keeps a 4-byte access count per row
    /// other nodes own.
    ///
    /// # Errors
    /// On every rank: [`wholemem::CommonError::InvalidArgument`] naming the value for a
    /// ratio that is not greater than 0 and at most 1 (NaN included), a
    /// table that is not distributed or hierarchy memory, a table whose
    /// ranks are all on one node, a layout that does not fit the rows, or
    /// ranks that pass different ratios or layouts (naming both);
    /// [`Error::Memory`] when the shared rows cannot be had.
    pub fn new(mem: &WholeMemory, layout: &RowLayout, ratio: f64) -> Result<Self> {
        let comm = mem.comm().clone();
        let mine = check_ratio(ratio).and_then(|()| {
            match mem.memory_type() {
                MemoryType::Distributed | MemoryType::Hierarchy => {}
                other => {
                    return Err(Error::Common(CommonError::InvalidArgument(format!(
                        "a node cache holds rows of distributed and hierarchy tables; {other} memory reaches every row through the mapping"
                    ))));
                }
            }
            layout.check_fits(mem.granularity())
        });
        let request = request_bytes(ratio, layout);
        let ((), all) = wholemem::agree::agree_sharing(comm.as_ref(), mine, Rule::Lowest, &request)?;
        if let Some((r, other)) = all.iter().enumerate().find(|(_, o)| **o != all[0]) {
            let ranks = comm.world_ranks();
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "ranks passed different node caches: rank {} {} and rank {} {}",
                ranks[0],
                show_request(&all[0]),
                ranks[r],
                show_request(other)
            ))));
        }
        let placement = wm_topology::NodeLayout::of(comm.nodes());
        if placement.nodes < 2 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "the table's {} ranks are all on one node: every row is on this node, so a node cache would hold nothing",
                comm.size()
            ))));
        }
        let me = comm.rank();
        let space = RowSpace::new(mem.partition(), |r| placement.node[r] != placement.node[me]);
        let slots_wanted = ratio_slots(ratio, mem.rows()).min(space.rows());
        let policy = Placement::for_capacity(slots_wanted, space.rows());
        let slots = if space.rows() == 0 { 0 } else { policy.slots(space.rows()) };
        let local = mem.local_comm().cloned().unwrap_or_else(|| comm.local());
        let leader = local.rank() == 0;
        let rb = layout.bytes();
        let data = if slots == 0 {
            Ok(None)
        } else {
            match slots.checked_mul(rb) {
                None => Err(Error::Common(CommonError::InvalidArgument(format!(
                    "{slots} cached rows of {rb} bytes are more than usize::MAX bytes"
                )))),
                Some(total) => {
                    let req = AllocRequest { ty: MemoryType::Continuous, loc: Location::Host, total, granularity: rb, partition: None };
                    WholeMemory::allocate(&local, &req).map(Some).map_err(Error::from)
                }
            }
        };
        // Each node allocated its own; every rank learns whether all did.
        let data = agree(comm.as_ref(), data, Rule::Lowest)?;
        let shared = placement.local.iter().any(|&l| l > 0);
        Ok(Self {
            layout: *layout,
            table: TableId::of(mem),
            // Nothing is cached yet: the first gather takes every rank's.
            seen: vec![0; comm.size()],
            ratio,
            tags: Tags::new(policy, space.rows(), leader),
            space,
            data,
            shared,
            stats: CacheStats::default(),
            scratch: Vec::new(),
            lists: Lookup::default(),
            chooser: Chooser::default(),
            last: None,
            plain_times: Vec::new(),
            last_ids: 0,
            comm,
            local,
        })
    }

    /// How fast the access counts fade: the node's leader halves every
    /// count once the node has counted `periods_per_slot` × [`capacity`]
    /// accesses since the last halving (the default is
    /// [`AGEING_PER_SLOT`](super::AGEING_PER_SLOT), 4); `None` keeps
    /// every count growing (pure LFU, which never
    /// lets a moved hot set displace the old one's rows). Only the leader
    /// decides, so pass the same on every rank. Not collective.
    ///
    /// # Errors
    /// `InvalidArgument` for a period that is not a positive finite number.
    ///
    /// [`capacity`]: Self::capacity
    pub fn set_ageing(&mut self, periods_per_slot: Option<f64>) -> Result<()> {
        let every = match periods_per_slot {
            None => None,
            Some(p) if p.is_finite() && p > 0.0 => Some(((p * self.tags.slots() as f64).ceil() as u64).max(1)),
            Some(p) => {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "cache ageing {p}: counts are halved after a positive number of accesses per slot"
                ))));
            }
        };
        self.tags.set_ageing(every);
        Ok(())
    }

    /// The fraction of the table's rows asked for.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Rows the cache of this node can hold.
    pub fn capacity(&self) -> usize {
        self.tags.slots()
    }

    /// Rows that ranks of other nodes own: what this node's cache may hold.
    pub fn remote_rows(&self) -> usize {
        self.space.rows()
    }

    /// Rows this node's cache holds now.
    pub fn cached_rows(&self) -> usize {
        self.tags.occupied()
    }

    /// The layout the cache holds rows of.
    pub fn layout(&self) -> &RowLayout {
        &self.layout
    }

    /// What the cache did since it was created (see [`CacheStats`]).
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn check_table(&self, mem: &WholeMemory) -> Result<()> {
        let other = TableId::of(mem);
        if other != self.table {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "this node cache belongs to another table: it was made for {}, not {other} (a table allocated after one was freed is another table, even where the freed one was; make a cache for it)",
                self.table
            ))));
        }
        Ok(())
    }

    /// Step 0 of a gather: every rank's write generation of `mem` (when
    /// every rank passed the cache's table), and the rows of each rank whose
    /// generation moved dropped; with them every rank's path and time of
    /// its previous gather, from which every rank chooses this call's path
    /// alike; and the world rank of the first rank that said it failed the
    /// cache's table check, if any (then no generation is followed, and the
    /// call must fail). Collective.
    fn follow_writes(&mut self, mem: &WholeMemory) -> Result<(Path, Option<usize>)> {
        let (path, ns) = self.last.map_or((0, 0), |(p, ns)| (p.word(), ns));
        let ids = self.last_ids;
        let mine = match self.check_table(mem) {
            Ok(()) => [1, mem.write_generation(), path, ns, ids],
            // The call fails (every rank learns why in its checks): leave
            // the rows as they are.
            Err(_) => [0, 0, path, ns, ids],
        };
        let all = self.comm.allgather_pod(&mine)?;
        // The previous call's sample: its slowest rank, when every rank
        // took the same path and succeeded — unless its size (every rank's
        // ids) starts the schedule afresh.
        let paths: Vec<Option<Path>> = all.chunks_exact(5).map(|w| Path::of_word(w[2])).collect();
        let sample = match paths.first().copied().flatten() {
            Some(p) if paths.iter().all(|&q| q == Some(p)) => Some((p, all.chunks_exact(5).map(|w| w[3]).max().unwrap_or(0))),
            _ => None,
        };
        let size = all.chunks_exact(5).fold(0u64, |t, w| t.saturating_add(w[4]));
        let resized = sample.is_some() && self.chooser.resized(size);
        let chosen = self.chooser.next(if resized { None } else { sample });
        if let Some(r) = all.chunks_exact(5).position(|w| w[0] != 1) {
            return Ok((chosen, Some(self.comm.world_ranks()[r])));
        }
        for (r, w) in all.chunks_exact(5).enumerate() {
            self.follow_generation(r, w[1]);
        }
        Ok((chosen, None))
    }

    /// Rank `r`'s write generation of the table is `generation`: when it
    /// moved since the cache last saw it, every row of `r` leaves.
    fn follow_generation(&mut self, r: usize, generation: u64) {
        if self.seen[r] != generation {
            if let Some(rows) = self.space.rank_rows(r) {
                self.tags.invalidate_range(rows);
            }
            self.seen[r] = generation;
        }
    }

    /// Which path gathers take: [`Bypass::Auto`] (the default) measures
    /// the cached and the uncached path and takes the faster, trying the
    /// other now and then (docs/cache.md, "Safe to leave on"). Every rank
    /// must pass the same. Not collective.
    pub fn set_bypass(&mut self, mode: Bypass) {
        self.chooser.set_mode(mode);
    }

    /// The path gathers take (see [`set_bypass`](Self::set_bypass)).
    pub fn bypass(&self) -> Bypass {
        self.chooser.mode()
    }

    /// Measures the two paths afresh, as for a new cache: the next
    /// gathers go through the cache (it warms), then both paths are timed
    /// and the faster taken. For a program whose gathers change (a new
    /// phase of training, other batches): the cache's own check starts
    /// afresh only when the number of ids changes more than twofold. Every
    /// rank must call it before the same gather. Not collective.
    pub fn rechoose(&mut self) {
        self.chooser.restart();
        self.last = None;
        self.plain_times.clear();
    }

    /// Fills each node's cache with rows of `hot`, hottest first, before
    /// any gather asks for them: for a program that knows which rows its
    /// gathers will ask most — a graph's highest-degree nodes, as
    /// WholeGraph fills its feature cache — so that its first batches do
    /// not pay for first sights. `hot` lists rows in the order they should
    /// be kept; the rows this node owns and repeats are passed over, and
    /// the first [`capacity`](Self::capacity) of the others are read
    /// through the table's gather (the node's ranks share the reading)
    /// and enter the slots (in a set-associative cache each set takes the
    /// hottest of the rows hashed to it). Every row the cache then holds
    /// is credited with a period's mean accesses per slot on top of its
    /// one access, so rows the batches ask more often take their slots once
    /// ageing has halved that away, and rows asked a few times do not
    /// displace them at once. Returns the rows this
    /// node's cache holds after it. The lookups and hits of the reading
    /// are not counted in [`stats`](Self::stats) (its fills are); the
    /// choice of path is left as it was.
    ///
    /// Collective: every rank passes a list (the same on the ranks of a
    /// node for the order to hold; it may differ between nodes).
    ///
    /// # Errors
    /// On every rank: [`Error::IndexOutOfRange`] naming the first bad id
    /// of any rank (nothing is read or filled);
    /// [`wholemem::CommonError::InvalidArgument`] for another table than
    /// the cache's; as [`gather`](Self::gather) for a failure while
    /// reading (a lost peer), after which the cache may hold fewer rows.
    pub fn preload(&mut self, mem: &WholeMemory, hot: Ids<'_>) -> Result<usize> {
        /// Rows read per gather: the size of a large batch.
        const CHUNK: usize = 8192;
        let rows = mem.rows();
        let (lr, ls) = (self.local.rank(), self.local.size());
        let mine: Result<Vec<i64>> = self.check_table(mem).and_then(|()| match hot.first_out_of_range(rows) {
            Some((position, index)) => Err(Error::IndexOutOfRange { index, position, rank: self.comm.world_rank(), rows }),
            None => {
                // The node's candidates, hottest first, at most one per
                // slot and as many per set as it has ways (within one read
                // a full set would keep the lowest rows, not the hottest);
                // this rank reads every `ls`-th.
                let mut taken = std::collections::HashSet::new();
                let mut per_set: Vec<usize> = Vec::new();
                let mut room = |r: usize| match self.tags.set_of_row(r) {
                    None => true,
                    Some((set, sets)) => {
                        per_set.resize(sets, 0);
                        per_set[set] += 1;
                        per_set[set] <= super::WAYS
                    }
                };
                Ok(hot
                    .to_rows()
                    .into_iter()
                    .filter(|&row| self.space.index(row).is_some_and(|r| !taken.contains(&row) && room(r)) && taken.insert(row))
                    .take(self.tags.slots())
                    .skip(lr)
                    .step_by(ls.max(1))
                    .map(|row| row as i64)
                    .collect())
            }
        });
        // Every rank's write generation and number of reads: rows written
        // since the last gather leave first, as at a gather's step 0.
        let words: Vec<u64> = match &mine {
            Ok(list) => vec![mem.write_generation(), list.len().div_ceil(CHUNK) as u64],
            Err(_) => Vec::new(),
        };
        let (list, all) = wholemem::agree::agree_sharing(self.comm.as_ref(), mine, Rule::Lowest, bytemuck::cast_slice(&words))?;
        let mut calls = 0u64;
        // No rank has more candidates than the table has rows.
        let most = rows.div_ceil(CHUNK) as u64;
        for (r, bytes) in all.iter().enumerate() {
            let w: Vec<u64> = match bytes.len() {
                16 => bytemuck::pod_collect_to_vec(bytes),
                n => vec![0, u64::MAX, n as u64],
            };
            if w.len() != 2 || w[1] > most {
                // Every rank received the same parts, so every rank stops
                // here.
                self.tags.clear();
                let detail = match w.len() {
                    2 => format!("a cache preload of {} reads of {CHUNK} rows, for a table of {rows} rows", w[1]),
                    _ => format!("a cache preload announcement of {} bytes instead of 16", w[2]),
                };
                return Err(Error::Common(CommonError::Malformed { rank: self.comm.world_ranks()[r], detail }));
            }
            self.follow_generation(r, w[0]);
            calls = calls.max(w[1]);
        }
        let (lookups, hits) = (self.stats.lookups, self.stats.hits);
        let conv = RowConv::new(self.layout.dtype(), self.layout.dtype(), self.layout.cols())?;
        let mut out = vec![0u8; CHUNK.min(list.len()) * self.layout.bytes()];
        // Every rank makes the same number of reads, whatever fails on one
        // of them (an error after the exchange is this rank's alone): after
        // a failure, reads of nothing; then one agreement.
        let mut result = Ok(());
        for k in 0..calls as usize {
            let part = match (&result, list.get(k * CHUNK..)) {
                (Ok(()), Some(rest)) => &rest[..rest.len().min(CHUNK)],
                _ => &[][..],
            };
            let read = self.gather_cached(mem, Ids::I64(part), &mut out[..part.len() * self.layout.bytes()], conv);
            if result.is_ok() {
                result = read;
            }
        }
        (self.stats.lookups, self.stats.hits) = (lookups, hits);
        // The rows enter with the weight of a period's accesses per slot on
        // top of the access of their reading: a row the batches ask a few
        // times no longer displaces one the program ranked hot at once,
        // and ageing halves the weight away within a few periods.
        self.tags.credit_held(PRELOAD_CREDIT);
        agree(self.comm.as_ref(), result, Rule::Lowest).map(|()| self.cached_rows())
    }

    /// The gathers of this cache that took the uncached path.
    pub fn bypassed_calls(&self) -> u64 {
        self.chooser.bypassed()
    }

    /// Gathers rows `ids` of `mem` (the table the cache was made for) into
    /// `out` (`ids.len()` rows of the cache's layout, as `out_dtype`), as
    /// [`wm_gather::gather`](crate::gather) does — collective, with the same
    /// checks and errors on every rank — serving rows other nodes own from
    /// the cache where it holds them, and updating the cache.
    ///
    /// # Errors
    /// As [`wm_gather::gather`](crate::gather); [`wholemem::CommonError::InvalidArgument`]
    /// for another table than the cache's.
    pub fn gather(&mut self, mem: &WholeMemory, ids: Ids<'_>, out: &mut [u8], out_dtype: DType) -> Result<()> {
        // 0. What was written since the last call, on any rank, and which
        //    path this call takes (every rank alike, from the previous
        //    call's times).
        //    Inside a stretch of uncached calls there is nothing to
        //    exchange: the schedule decides, and the write generations
        //    are followed at the next call that exchanges, before any
        //    lookup (so no row written meanwhile is served).
        let mut clock = crate::profile::Clock::around();
        // Timed from here, the opening allgather included: a cached call
        // pays for it and an uncached call inside a stretch does not. Its
        // wait for the other ranks' work between calls would otherwise fall
        // in the uncached call's exchange, so both paths carry it alike.
        // (Timed from after it, a cached call 5-7 % slower on loopback
        // measured as a tie; docs/perf-log/2026-12-07-distributed-distinct.md.)
        let start = std::time::Instant::now();
        let followed = if self.chooser.quiet() {
            Ok((self.chooser.next(None), None))
        } else {
            let followed = self.follow_writes(mem);
            self.last = None;
            self.plain_times.clear();
            followed
        };
        let (path, refused) = followed?;
        clock.lap("cache follow");
        let checked = crate::check_call(mem, &self.layout, ids, out.len(), out_dtype, "output").and_then(|conv| {
            self.check_table(mem)?;
            Ok(conv)
        });
        let done = match (checked, path) {
            // Every rank learns it in the table's own exchange.
            (Err(e), _) => crate::exchange::gather_collective(mem, &self.layout, Err(e), ids, out, &mut || false),
            // The table's own gather.
            (Ok(conv), Path::Plain) => crate::exchange::gather_collective(mem, &self.layout, Ok(conv), ids, out, &mut || false),
            (Ok(conv), Path::Cached) => self.gather_cached(mem, ids, out, conv),
        }
        .and_then(|()| match refused {
            // A rank that failed the table check fails the call on every
            // rank; one that said so and then took part as if it passed
            // kept every rank from following the writes: rows written since
            // may have been served.
            Some(rank) => Err(Error::Common(CommonError::Malformed {
                rank,
                detail: "it announced a failed cache table check in the opening allgather, then took part in the gather as if it passed"
                    .into(),
            })),
            None => Ok(()),
        });
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ids = ids.len() as u64;
        self.last = match (&done, path) {
            (Err(_), _) => {
                self.plain_times.clear();
                None
            }
            (Ok(()), Path::Cached) => Some((path, ns)),
            // The median of this rank's uncached calls since the last
            // exchange.
            (Ok(()), Path::Plain) => {
                self.plain_times.push(ns);
                self.plain_times.sort_unstable();
                Some((path, self.plain_times[self.plain_times.len() / 2]))
            }
        };
        done
    }

    /// Step 1 of [`gather_cached`](Self::gather_cached): looks up every id
    /// of a row another node owns (a few ids ahead, the tags they will read
    /// are asked for); this rank's own host rows are read in place, every
    /// other id is fetched.
    fn look_up(&self, mem: &WholeMemory, rows: &[usize], lists: &mut Lookup) {
        let own = mem.local_rows();
        let own_host = mem.location() == Location::Host;
        // The row's number among the cacheable rows, if the cache may hold
        // it (computed again for the id ahead: cheaper than a list of them).
        let space = &self.space;
        let cacheable = |row: usize| if own_host && own.contains(&row) { None } else { space.index(row) };
        lists.clear();
        let Lookup { hit_slots, hit_at, own_rows, own_at, pending, accesses } = lists;
        // 24 ids ahead: the lookups of a Zipf 1.1 batch took 0.23-0.25 ms
        // against 0.26-0.27 at 8, and the same at 48
        // (docs/perf-log/2026-12-07-distributed-distinct.md).
        const AHEAD: usize = 24;
        for (i, &row) in rows.iter().enumerate() {
            if let Some(ahead) = rows.get(i + AHEAD).and_then(|&a| cacheable(a)) {
                self.tags.prefetch(ahead);
            }
            let Some(r) = cacheable(row) else {
                if own_host && own.contains(&row) {
                    own_rows.push(row - own.start);
                    own_at.push(i);
                } else {
                    pending.push((row, i));
                }
                continue;
            };
            match self.tags.lookup(r) {
                Some(slot) => {
                    hit_slots.push(slot);
                    hit_at.push(i);
                    accesses.push((r as u64) << 1);
                }
                None => {
                    pending.push((row, i));
                    accesses.push(((r as u64) << 1) | 1);
                }
            }
        }
    }

    /// Steps 1 to 3 of a gather through the cache (the call's checks
    /// passed on this rank).
    fn gather_cached(&mut self, mem: &WholeMemory, ids: Ids<'_>, out: &mut [u8], conv: RowConv) -> Result<()> {
        let mut clock = crate::profile::Clock::around();
        // 1. Look up every id of a row another node owns (a few ids ahead,
        //    the tags they will read are asked for); this rank's own host
        //    rows are read in place, every other id is fetched.
        let rows = ids.to_rows();
        let mut lists = std::mem::take(&mut self.lists);
        self.look_up(mem, &rows, &mut lists);
        let Lookup { hit_slots, hit_at, own_rows, own_at, pending, accesses } = &mut lists;

        clock.lap("cache lookup");
        // 2. Everything else through the table's gather, in its own type,
        //    each row once however often it was asked. Between the
        //    exchange's steps, this thread copies the hits and this rank's
        //    own rows into place and, on a node of one rank, counts and
        //    decides what enters.
        let (fetch, from, places) = distinct_rows(pending);
        let (layout, cached_layout) = (self.layout, self.cached_layout()?);
        let rb = layout.bytes();
        let same = RowConv::new(layout.dtype(), layout.dtype(), layout.cols())?;
        let mut fetched = std::mem::take(&mut self.scratch);
        fetched.resize(fetch.len() * rb, 0);
        let (data, tags, alone) = (self.data.as_ref(), &mut self.tags, !self.shared);
        // The hits, own rows and (alone) the decision, run while the
        // misses travel, a piece per step so that the exchange moves
        // between pieces; what is left runs here after the exchange (which
        // ends before running any when it has nothing to move).
        let piece = crate::exchange::step_rows(mem, conv.dst_bytes(), hit_slots.len() + own_rows.len());
        // Both copies checked once here, run a piece per step.
        let (mut hits, mut own) = (None, None);
        let mut copied: Result<()> = (|| {
            if !hit_slots.is_empty() {
                let data = data.ok_or_else(|| Error::Common(CommonError::InvalidArgument("a hit in a cache without rows".into())))?;
                hits = Some(mapped::PlacedCopy::new(data, mapped::RowsOf::Table, &cached_layout, conv, hit_slots, hit_at, out.len())?);
            }
            if !own_rows.is_empty() {
                own = Some(mapped::PlacedCopy::new(mem, mapped::RowsOf::Own, &layout, conv, own_rows, own_at, out.len())?);
            }
            Ok(())
        })();
        let (n_hits, n_own) = (hits.as_ref().map_or(0, mapped::PlacedCopy::len), own.as_ref().map_or(0, mapped::PlacedCopy::len));
        let (mut next_hit, mut next_own) = (0, 0);
        let mut decided: Option<(Vec<Fill>, u64)> = None;
        let (mut ran, mut finished, mut busy) = (false, false, std::time::Duration::ZERO);
        let mut step = || -> bool {
            if finished {
                return false;
            }
            ran = true;
            let t = std::time::Instant::now();
            if let (Ok(()), Some(copy), true) = (&copied, &hits, next_hit < n_hits) {
                let end = (next_hit + piece).min(n_hits);
                copied = copy.run(next_hit..end, out);
                next_hit = end;
            } else if let (Ok(()), Some(copy), true) = (&copied, &own, next_own < n_own) {
                let end = (next_own + piece).min(n_own);
                copied = copy.run(next_own..end, out);
                next_own = end;
            } else {
                // The decision may evict a row just hit: its slot is
                // refilled only after the hits are copied.
                decided = alone.then(|| decide_alone(tags, hit_slots, accesses));
                finished = true;
            }
            busy += t.elapsed();
            !finished
        };
        let result = crate::exchange::gather_collective(mem, &layout, Ok(same), Ids::I64(&fetch), &mut fetched, &mut step);
        clock.lap("cache misses");
        if result.is_ok() {
            while step() {}
        }
        if let Err(e) = &result
            && (!ran || matches!(e, Error::Comm(_)))
        {
            // The exchange failed before any row travelled (some rank's
            // checks: a bad id, a wrong buffer), or the communicator failed
            // (a lost peer): every rank fails alike. Nothing was counted or
            // decided, and nothing changes.
            return self.finish(result, false, fetched, lists);
        }
        // Whether the tags may hold a decision whose fills did not happen.
        let mut decided_here = decided.is_some();
        clock.lap("cache rest");
        clock.add("cache hits", busy);
        let result = match result {
            // A failure found after the rows travelled may be this rank's
            // alone (a malformed part it received): where the call ends in
            // the node's step 3 and an agreement, this rank takes part, with
            // nothing to count or fill, so that every rank fails naming the
            // culprit instead of waiting for this one.
            Err(e) if self.shared => {
                let result = self.update_shared_and_agree(Err(e), Vec::new(), &[], &[]);
                return self.finish(result, true, fetched, lists);
            }
            r => r,
        };
        let result = result.and_then(|()| {
            self.stats.lookups += accesses.len() as u64;
            self.stats.hits += hit_slots.len() as u64;
            let placed = copied.and_then(|()| {
                kernel::place_rows(&fetched, conv, &from, &places, out, crate::threads(mem))
                    .map_err(|m| Error::Common(CommonError::InvalidArgument(m)))
            });
            clock.lap("cache place");
            // 3. Fill (and, where nodes have several ranks, count and
            //    decide first). The rows fetched are in table order, so
            //    their numbers among the cacheable rows ascend too.
            let missed_at: Vec<(usize, usize)> =
                fetch.iter().enumerate().filter_map(|(k, &row)| self.space.index(row as usize).map(|r| (r, k))).collect();
            match decided {
                Some((fills, evicted)) => placed.map(|()| self.fill_alone(&fills, evicted, &missed_at, &fetched)),
                None => {
                    decided_here = true;
                    self.update_shared_and_agree(placed, std::mem::take(accesses), &missed_at, &fetched)
                }
            }
        });
        clock.lap("cache update");
        self.finish(result, decided_here, fetched, lists)
    }

    /// The end of [`gather_cached`](Self::gather_cached): after a failure
    /// where a decision may be in the tags without its fills
    /// (`decided_here`), the cache holds nothing; the scratch memory is
    /// kept for the next call.
    fn finish(&mut self, result: Result<()>, decided_here: bool, fetched: Vec<u8>, lists: Lookup) -> Result<()> {
        if result.is_err() && decided_here {
            self.tags.clear();
        }
        self.scratch = fetched;
        self.lists = lists;
        result
    }

    /// Step 3 on a node of one rank: copies the decided rows into their
    /// slots. A fill that fails leaves its slot empty (a later miss, never
    /// a wrong row: the gather itself is complete).
    fn fill_alone(&mut self, fills: &[Fill], evicted: u64, missed_at: &[(usize, usize)], fetched: &[u8]) {
        self.stats.evictions += evicted;
        if self.fill_rows(fills, missed_at, fetched).is_ok() {
            self.stats.fills += fills.len() as u64;
        } else {
            // Some slots may hold their row, some not: none is trusted.
            for f in fills {
                self.tags.invalidate(f.row);
            }
        }
    }

    /// Step 3 where some node has several ranks: the leader hears every
    /// rank's accesses and decides, fillers fill, and one agreement over
    /// the table's ranks ends the call.
    fn update_shared_and_agree(
        &mut self,
        placed: Result<()>,
        accesses: Vec<u64>,
        missed_at: &[(usize, usize)],
        fetched: &[u8],
    ) -> Result<()> {
        // A rank that failed still takes part in the node's exchange and
        // broadcast (reporting nothing, so it fills nothing): its node's
        // ranks wait for it there, and its error reaches every rank in the
        // agreement.
        let report = if placed.is_ok() { tally(accesses) } else { Vec::new() };
        let updated = self.update_shared(&report, if placed.is_ok() { missed_at } else { &[] }, fetched);
        agree(self.comm.as_ref(), placed.and(updated), Rule::Lowest)
    }

    /// The layout of the cache's own rows: the cached elements, from 0.
    fn cached_layout(&self) -> Result<RowLayout> {
        RowLayout::new(self.layout.dtype(), self.layout.cols(), 0)
    }

    /// Copies each fill's row (fetched into `fetched` at the place
    /// `missed_at` names) into its slot: one scatter into the slots for
    /// them all, straight from the fetched rows. (Row by row through
    /// `WholeMemory::write_rows`, whose checks, lock and write count are
    /// per call, a fill cost 3 µs: 12 ms of a uniform batch of 8 192 ids,
    /// more than its exchange.)
    fn fill_rows(&mut self, fills: &[Fill], missed_at: &[(usize, usize)], fetched: &[u8]) -> Result<()> {
        if fills.is_empty() {
            return Ok(());
        }
        let mut slots = Vec::with_capacity(fills.len());
        let mut from = Vec::with_capacity(fills.len());
        for f in fills {
            let k = missed_at.binary_search_by_key(&f.row, |m| m.0).map_err(|_| {
                Error::Common(CommonError::InvalidArgument(format!(
                    "a fill of row {} of the node's remote rows, which this rank did not fetch",
                    f.row
                )))
            })?;
            slots.push(f.slot);
            from.push(missed_at[k].1);
        }
        let layout = self.cached_layout()?;
        let data =
            self.data.as_mut().ok_or_else(|| Error::Common(CommonError::InvalidArgument("a fill of a cache without rows".into())))?;
        mapped::scatter_packed(data, &layout, &slots, &from, fetched)
    }

    /// Step 3 where some node has several ranks: accesses to the leader,
    /// its decision to every rank, fills by the ranks that fetched the rows.
    fn update_shared(&mut self, report: &[(usize, u32, bool)], missed_at: &[(usize, usize)], fetched: &[u8]) -> Result<()> {
        let local = self.local.clone();
        let (lr, ls) = (local.rank(), local.size());
        // Never empty, so the leader hears from every rank.
        let mut words: Vec<u64> = Vec::with_capacity(1 + 2 * report.len());
        words.push(report.len() as u64);
        for &(r, n, missed) in report {
            words.push(r as u64);
            words.push((u64::from(n) << 1) | u64::from(missed));
        }
        let mine: &[u8] = bytemuck::cast_slice(&words);
        let parts: Vec<&[u8]> = (0..ls).map(|q| if q == 0 { mine } else { &[][..] }).collect();
        let got = local.alltoallv(&parts)?;
        let mut decision: Vec<u64> = Vec::new();
        if lr == 0 {
            decision = self.decide_for_node(&got);
        }
        local.recycle(got);
        let mut bytes: Vec<u8> = bytemuck::cast_slice(&decision).to_vec();
        local.broadcast(0, &mut bytes)?;
        let leader = local.world_ranks()[0];
        let bad = |detail: String| {
            Error::Common(CommonError::Malformed { rank: leader, detail: format!("{detail} (to rank {})", local.world_rank()) })
        };
        if bytes.len() % 8 != 0 || bytes.len() < 16 {
            return Err(bad(format!("a cache decision of {} bytes", bytes.len())));
        }
        let words: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes);
        match words[0] {
            DECIDED => {}
            REFUSED => {
                let culprit = usize::try_from(words[1]).unwrap_or(usize::MAX);
                let detail: Vec<u8> = bytemuck::cast_slice(&words[2..]).to_vec();
                let detail = String::from_utf8_lossy(&detail).trim_end_matches('\0').to_owned();
                return Err(Error::Common(CommonError::Malformed { rank: culprit, detail }));
            }
            other => return Err(bad(format!("a cache decision of unknown kind {other}"))),
        }
        let n = usize::try_from(words[1]).unwrap_or(usize::MAX);
        if words.len() != 2 + n.saturating_mul(3) {
            return Err(bad(format!("a cache decision of {} words announcing {} fills", words.len(), words[1])));
        }
        let mut fills = Vec::with_capacity(n);
        for w in words[2..].chunks_exact(3) {
            let (slot, row, filler) = (usize::try_from(w[0]), usize::try_from(w[1]), usize::try_from(w[2]));
            let (Ok(slot), Ok(row), Ok(filler)) = (slot, row, filler) else {
                return Err(bad(format!("a cache fill {w:?} past usize")));
            };
            let f = Fill { slot, row, evicted: None };
            if !self.tags.fits(f) || filler >= ls {
                return Err(bad(format!("a fill of slot {slot} with row {row} by local rank {filler}, which this cache cannot hold")));
            }
            fills.push((f, filler));
        }
        let mut mine = Vec::new();
        for (f, filler) in fills {
            // The leader applied its decision (and counted its evictions)
            // when it made it.
            if lr != 0 {
                self.stats.evictions += u64::from(self.tags.apply(f));
            }
            if filler == lr {
                mine.push(f);
            }
        }
        // The node's fills, the same count on every rank of the node.
        self.stats.fills += n as u64;
        self.fill_rows(&mine, missed_at, fetched)
    }

    /// The leader's decision from every local rank's report (`got[q]` from
    /// local rank `q`), applied to its own tags, as words: `DECIDED`, the
    /// number of fills, then (slot, row, filler) for each; or `REFUSED`,
    /// the culprit's world rank and the detail.
    fn decide_for_node(&mut self, got: &[Vec<u8>]) -> Vec<u64> {
        let rows = self.space.rows();
        let mut candidates: Vec<(usize, usize)> = Vec::new();
        let mut counted: Vec<(usize, u32)> = Vec::new();
        for (q, bytes) in got.iter().enumerate() {
            match parse_report(bytes, rows) {
                Ok(entries) => {
                    for (r, n, missed) in entries {
                        counted.push((r, n));
                        if missed {
                            candidates.push((r, q));
                        }
                    }
                }
                Err(detail) => {
                    let rank = self.local.world_ranks()[q];
                    let detail = format!("its cache report: {detail} (to rank {})", self.local.world_rank());
                    let mut words = vec![REFUSED, rank as u64];
                    let mut text = detail.into_bytes();
                    text.resize(text.len().div_ceil(8) * 8, 0);
                    words.extend(text.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))));
                    return words;
                }
            }
        }
        for (r, n) in counted {
            self.tags.count(r, n);
        }
        // The lowest local rank that fetched a row fills it.
        candidates.sort_unstable();
        candidates.dedup_by_key(|c| c.0);
        let missed: Vec<usize> = candidates.iter().map(|c| c.0).collect();
        let (fills, evicted) = self.tags.decide(&missed);
        self.stats.evictions += evicted;
        let mut words = Vec::with_capacity(2 + 3 * fills.len());
        words.push(DECIDED);
        words.push(fills.len() as u64);
        for f in fills {
            let filler = candidates.binary_search_by_key(&f.row, |c| c.0).map_or(0, |k| candidates[k].1);
            words.extend([f.slot as u64, f.row as u64, filler as u64]);
        }
        words
    }

    /// Scatters `src` into rows `ids` of `mem` as
    /// [`wm_gather::scatter`](crate::scatter) does (collective), then drops
    /// every rank's rows `ids` from every node's cache — and only those:
    /// the rest stays cached. A call its checks refuse (a bad id on any
    /// rank, another table) changes nothing; one that fails later may have
    /// written rows, and the next cached gather drops every row of the
    /// ranks whose rows it wrote.
    ///
    /// # Errors
    /// As [`wm_gather::scatter`](crate::scatter); [`wholemem::CommonError::InvalidArgument`]
    /// for another table than the cache's (on every rank).
    pub fn scatter(&mut self, mem: &mut WholeMemory, ids: Ids<'_>, src: &[u8], src_dtype: DType) -> Result<()> {
        agree(self.comm.as_ref(), self.check_table(mem), Rule::Lowest)?;
        let since = WriteMark::of(mem);
        crate::scatter(mem, &self.layout, ids, src, src_dtype)?;
        self.drop_rows(ids, Ok(Some((since, mem.write_generation()))))
    }

    /// Drops every rank's rows `ids` from every node's cache, now. Not
    /// needed for coherence (a written row leaves the cache at the next
    /// gather anyway, see "Coherence"); it frees slots early. Collective:
    /// each rank passes its rows (possibly none). A bad id on any rank
    /// drops nothing.
    ///
    /// # Errors
    /// On every rank: [`Error::IndexOutOfRange`] naming the first bad id;
    /// [`wholemem::CommonError::Malformed`] for a peer's garbled list; [`Error::Comm`].
    pub fn invalidate(&mut self, ids: Ids<'_>) -> Result<()> {
        self.drop_rows(ids, Ok(None))
    }

    /// Drops every rank's rows `ids` from every node's cache, as
    /// [`invalidate`](Self::invalidate), and takes them as **every** row
    /// this rank's writes to `mem` since `since` changed: those writes then
    /// cost the cache these rows only, instead of every row of this rank
    /// at the next gather. For write paths that know every row they wrote
    /// (`wm_embedding`'s `apply_gradients`); a row written and not named
    /// here would be served stale. Collective: each rank passes the rows it
    /// wrote (possibly none) and its own mark. A bad id on any rank drops
    /// nothing and takes nothing as told (the writes then cost every row of
    /// the ranks that made them).
    ///
    /// # Errors
    /// As [`invalidate`](Self::invalidate); [`wholemem::CommonError::InvalidArgument`] on
    /// every rank for another table than the cache's, or a mark of another
    /// table.
    pub fn invalidate_written(&mut self, mem: &WholeMemory, ids: Ids<'_>, since: WriteMark) -> Result<()> {
        let told = self.check_table(mem).and_then(|()| {
            if since.table != self.table.serial {
                return Err(Error::Common(CommonError::InvalidArgument(format!(
                    "a write mark of table {}, for a node cache of {}",
                    since.table, self.table
                ))));
            }
            Ok(Some((since, mem.write_generation())))
        });
        self.drop_rows(ids, told)
    }

    /// Every rank's rows `ids` out of every node's cache, with, where a
    /// rank's `told` names its generation before and after its writes, those
    /// writes counted as told: every rank learns every rank's part (one
    /// allgather) and does the same. Nothing changes unless every rank's
    /// part is good.
    fn drop_rows(&mut self, ids: Ids<'_>, told: Result<Option<(WriteMark, u64)>>) -> Result<()> {
        let rows = self.table.rows;
        let mine = told.and_then(|told| match ids.first_out_of_range(rows) {
            Some((position, index)) => Err(Error::IndexOutOfRange { index, position, rank: self.comm.world_rank(), rows }),
            None => Ok(told),
        });
        let mut words: Vec<u64> = Vec::new();
        if let Ok(told) = &mine {
            words.extend(match told {
                Some((since, now)) => [ACCOUNTED, since.generation, *now],
                None => [PLAIN, 0, 0],
            });
            words.extend(ids.to_rows().into_iter().map(|r| r as u64));
        }
        let (_, all) = wholemem::agree::agree_sharing(self.comm.as_ref(), mine, Rule::Lowest, bytemuck::cast_slice(&words))?;
        // Every rank's part, checked in full before anything is dropped.
        let mut parts: Vec<Invalidation> = Vec::with_capacity(all.len());
        for (r, bytes) in all.iter().enumerate() {
            match parse_invalidation(bytes, rows) {
                Ok(part) => parts.push(part),
                Err(detail) => {
                    // Every rank received the same parts, so every rank
                    // finds it; the writes stay untold, and the cache holds
                    // nothing a garbled list may have meant.
                    self.tags.clear();
                    return Err(Error::Common(CommonError::Malformed { rank: self.comm.world_ranks()[r], detail }));
                }
            }
        }
        for (r, Invalidation { told, rows: part }) in parts.into_iter().enumerate() {
            for row in part {
                if let Some(i) = self.space.index(row) {
                    self.tags.invalidate(i);
                }
            }
            if let Some((since, now)) = told
                && self.seen[r] == since
            {
                self.seen[r] = now;
            }
        }
        Ok(())
    }

    /// Empties every node's cache. Not needed after writes (see
    /// "Coherence"). Collective. The access counts stay, so rows hot before
    /// are admitted again first.
    ///
    /// # Errors
    /// [`Error::Comm`] when a peer is lost.
    pub fn clear(&mut self) -> Result<()> {
        self.tags.clear();
        agree(self.comm.as_ref(), Ok(()), Rule::Lowest)
    }

    /// Frees the shared rows, collectively.
    ///
    /// # Errors
    /// When a peer is lost or times out.
    pub fn free(self) -> Result<()> {
        if let Some(data) = self.data {
            data.free()?;
        }
        Ok(())
    }
}

/// On a node of one rank, this rank is the leader: counts its accesses in
/// place and decides which missed rows enter which slots.
fn decide_alone(tags: &mut Tags, hit_slots: &[usize], accesses: &[u64]) -> (Vec<Fill>, u64) {
    const AHEAD: usize = 8;
    for (k, &slot) in hit_slots.iter().enumerate() {
        if let Some(&ahead) = hit_slots.get(k + AHEAD) {
            tags.prefetch_held(ahead);
        }
        tags.count_held(slot, 1);
    }
    let mut missed: Vec<usize> = accesses.iter().filter(|&&a| a & 1 == 1).map(|&a| (a >> 1) as usize).collect();
    for (k, &r) in missed.iter().enumerate() {
        if let Some(&ahead) = missed.get(k + AHEAD) {
            tags.prefetch_count(ahead);
        }
        tags.count_missed(r, 1);
    }
    missed.sort_unstable();
    missed.dedup();
    tags.decide(&missed)
}

/// Distinct accesses with their number and whether they missed, in row
/// order, from `(row << 1) | missed` words.
fn tally(mut accesses: Vec<u64>) -> Vec<(usize, u32, bool)> {
    accesses.sort_unstable();
    let mut out: Vec<(usize, u32, bool)> = Vec::new();
    for a in accesses {
        let (r, missed) = ((a >> 1) as usize, a & 1 == 1);
        match out.last_mut() {
            Some(last) if last.0 == r => {
                last.1 = last.1.saturating_add(1);
                last.2 |= missed;
            }
            _ => out.push((r, 1, missed)),
        }
    }
    out
}

/// A rank's part of an invalidation.
#[derive(Debug, PartialEq, Eq)]
struct Invalidation {
    /// Its write generation before and after the writes of `rows`, when
    /// they are every row those writes changed.
    told: Option<(u64, u64)>,
    /// The rows to drop.
    rows: Vec<usize>,
}

/// A rank's part of an invalidation, as sent: a kind ([`PLAIN`] or
/// [`ACCOUNTED`]), its generations before and after its writes (for
/// [`ACCOUNTED`]), then its rows, each below `rows`.
fn parse_invalidation(bytes: &[u8], rows: usize) -> std::result::Result<Invalidation, String> {
    if bytes.len() % 8 != 0 || bytes.len() < 24 {
        return Err(format!("{} bytes of rows to invalidate, not a head and whole 8-byte rows", bytes.len()));
    }
    let words: Vec<u64> = bytemuck::pod_collect_to_vec(bytes);
    let told = match words[0] {
        PLAIN => None,
        ACCOUNTED => Some((words[1], words[2])),
        other => return Err(format!("an invalidation of unknown kind {other}")),
    };
    let part = words[3..]
        .iter()
        .map(|&w| {
            usize::try_from(w).ok().filter(|&x| x < rows).ok_or_else(|| format!("row {w} to invalidate, past the {rows} rows of the table"))
        })
        .collect::<std::result::Result<Vec<usize>, String>>()?;
    Ok(Invalidation { told, rows: part })
}

/// A local rank's report to the leader: the number of entries, then
/// (row, count << 1 | missed) for each; each row below `rows`.
fn parse_report(bytes: &[u8], rows: usize) -> std::result::Result<Vec<(usize, u32, bool)>, String> {
    if bytes.len() % 8 != 0 || bytes.is_empty() {
        return Err(format!("{} bytes, not a count and whole 8-byte words", bytes.len()));
    }
    let words: Vec<u64> = bytemuck::pod_collect_to_vec(bytes);
    let n = usize::try_from(words[0]).unwrap_or(usize::MAX);
    if words.len() != 1 + n.saturating_mul(2) {
        return Err(format!("{} words announcing {} entries", words.len(), words[0]));
    }
    let mut out = Vec::with_capacity(n);
    for w in words[1..].chunks_exact(2) {
        let r = usize::try_from(w[0]).ok().filter(|&r| r < rows).ok_or_else(|| format!("row {} past the {rows} rows it may name", w[0]))?;
        let n = u32::try_from(w[1] >> 1).unwrap_or(u32::MAX);
        if n == 0 {
            return Err(format!("row {r} accessed 0 times"));
        }
        out.push((r, n, w[1] & 1 == 1));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_tallied_by_row() {
        let t = tally(vec![5 << 1 | 1, 2 << 1, 5 << 1 | 1, 9 << 1, 2 << 1]);
        assert_eq!(t, vec![(2, 2, false), (5, 2, true), (9, 1, false)]);
        assert!(tally(Vec::new()).is_empty());
    }

    #[test]
    fn a_local_peers_report_is_checked() {
        let words: Vec<u64> = vec![2, 3, (4 << 1) | 1, 7, 2];
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        assert_eq!(parse_report(bytes, 8).unwrap(), vec![(3, 4, true), (7, 1, false)]);
        assert!(parse_report(bytes, 7).unwrap_err().contains("row 7 past the 7 rows"));
        assert!(parse_report(&bytes[..24], 8).unwrap_err().contains("3 words announcing 2 entries"));
        assert!(parse_report(&bytes[..5], 8).unwrap_err().contains("5 bytes"));
        let zero: Vec<u64> = vec![1, 3, 1];
        assert!(parse_report(bytemuck::cast_slice(&zero), 8).unwrap_err().contains("0 times"));
        assert_eq!(parse_report(bytemuck::cast_slice(&[0u64]), 8).unwrap(), vec![]);
    }

    #[test]
    fn an_invalidation_part_is_checked_whole() {
        let part = |w: &[u64]| -> Vec<u8> { bytemuck::cast_slice(w).to_vec() };
        assert_eq!(parse_invalidation(&part(&[PLAIN, 0, 0, 4, 1]), 5).unwrap(), Invalidation { told: None, rows: vec![4, 1] });
        assert_eq!(parse_invalidation(&part(&[ACCOUNTED, 7, 9]), 5).unwrap(), Invalidation { told: Some((7, 9)), rows: vec![] });
        assert!(parse_invalidation(&part(&[PLAIN, 0, 0, 4, 5]), 5).unwrap_err().contains("row 5 to invalidate, past the 5 rows"));
        assert!(parse_invalidation(&part(&[2, 0, 0]), 5).unwrap_err().contains("unknown kind 2"));
        assert!(parse_invalidation(&part(&[PLAIN, 0]), 5).unwrap_err().contains("16 bytes"));
        assert!(parse_invalidation(&part(&[PLAIN, 0, 0, 1])[..30], 5).unwrap_err().contains("30 bytes"));
    }

    #[test]
    fn tables_are_told_apart_by_allocation_number_and_named_in_words() {
        let t = TableId { serial: 7, ty: MemoryType::Distributed, loc: Location::Host, rows: 100, granularity: 16 };
        assert_eq!(t.to_string(), "table 7 (a host distributed table of 100 rows of 16 bytes)");
        assert_ne!(t, TableId { serial: 8, ..t.clone() }, "the same shape, another allocation");
    }

    #[test]
    fn requests_read_back_in_words() {
        let l = RowLayout::new(DType::Bf16, 12, 4).unwrap();
        assert_eq!(show_request(&request_bytes(0.25, &l)), "ratio 0.25 for 12 bf16 elements from element 4");
    }
}
