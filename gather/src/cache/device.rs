//! The device cache of host rows: this rank's own rows of a host table
//! (and, alongside, its own rows of a second table partitioned alike — an
//! optimizer's state), kept in its GPU's memory, read-write.
//!
//! Owner-side, as WholeGraph's device-cached host embedding: a row is only
//! ever cached by the rank that owns it, so no two caches hold one row and
//! writes need no invalidation across ranks. The rule that keeps the table
//! right is write-back: a row written through the cache is dirty on the
//! GPU until [`DeviceCache::writeback`], until it is evicted (written back
//! first), or until the cache is dropped — and it must be written back
//! before any collective reads the table through another path (a gather:
//! peers read the host rows).
//!
//! Writes by other paths to the cached rows (a scatter by any rank, a load,
//! `write_local`, …) move the table's write generation of this rank's rows;
//! every call of the cache compares it with the one its slots reflect and
//! forgets its rows when it moved. The cache's own writes to the host rows
//! move it too, and are taken as its own.

use std::ops::Range;

use wholemem::CommonError;
use wholemem::device::DeviceBuffer;
use wholemem::{Location, WholeMemory};

use super::policy::{Placement, Tags};
use super::{CacheStats, check_ratio, ratio_slots};
use crate::device::{SlotRows, read_slots, write_slots};
use crate::kernel::{self, RowConv};
use crate::{DType, Error, Result, RowLayout, mapped};
use wholemem::agree::{Rule, agree};

/// One table the cache holds rows of: its layout and the slots' rows.
#[derive(Debug)]
struct CachedTable {
    layout: RowLayout,
    rows: DeviceBuffer,
    rows_of: usize,
    granularity: usize,
    /// The table's allocation number.
    table: u64,
    /// The table's write generation of this rank's rows that the slots
    /// reflect.
    seen: Seen,
}

/// The write generation a cache's slots reflect, and how it follows the
/// table's: the cache's own writes keep it current, any other write makes
/// the cache stale. Kept apart from the device buffers so that the rule is
/// tested without a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen(u64);

impl Seen {
    /// Whether the table's generation is now `now` because of a write that
    /// did not go through the cache.
    fn stale(self, now: u64) -> bool {
        now != self.0
    }

    /// After a write of the cache itself moved the table's generation from
    /// `before` to `after`: still current, unless another write came before
    /// or beside it.
    fn took_own_write(&mut self, before: u64, after: u64) {
        if self.0 == before && after.wrapping_sub(before) <= 1 {
            self.0 = after;
        }
    }
}

impl CachedTable {
    fn new(mem: &WholeMemory, layout: &RowLayout, slots: usize) -> Result<Self> {
        layout.check_fits(mem.granularity())?;
        if mem.location() != Location::Host {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "a device cache holds rows of host tables; this {} table is in device memory already",
                mem.memory_type()
            ))));
        }
        let bytes = slots
            .checked_mul(layout.bytes())
            .ok_or_else(|| Error::Common(CommonError::InvalidArgument(format!("{slots} cached rows overflow"))))?;
        Ok(Self {
            layout: *layout,
            rows: DeviceBuffer::new(mem, bytes.max(1))?,
            rows_of: mem.rows(),
            granularity: mem.granularity(),
            table: mem.serial(),
            seen: Seen(mem.write_generation()),
        })
    }

    /// Whether a path other than this cache wrote this rank's rows of
    /// `mem` since the slots were filled.
    fn written_elsewhere(&self, mem: &WholeMemory) -> bool {
        self.seen.stale(mem.write_generation())
    }

    /// After a write of this cache to this rank's host rows, which moved the
    /// generation from `before` to `after`: the slots still reflect the
    /// rows, unless another write came before or beside it.
    fn took_own_write(&mut self, before: u64, after: u64) {
        self.seen.took_own_write(before, after);
    }

    fn shape(&self, slots: usize) -> SlotRows {
        SlotRows { rows: slots, stride: self.layout.bytes() }
    }

    fn check(&self, mem: &WholeMemory, what: &str) -> Result<()> {
        if mem.serial() != self.table || mem.rows() != self.rows_of || mem.granularity() != self.granularity {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "this device cache holds rows of another {what}: table {} of {} rows of {} bytes, not table {} (a table allocated after one was freed is another table)",
                self.table,
                self.rows_of,
                self.granularity,
                mem.serial()
            ))));
        }
        Ok(())
    }
}

/// A device cache of this rank's own rows of a host table (and of a second
/// table alongside, such as an optimizer's state), read-write.
///
/// - [`read`](Self::read) serves rows from the GPU where they are cached,
///   from the host otherwise, and admits missed rows by the cache's
///   replacement rule (32-way sets with access counts, or a slot per row
///   when the ratio covers them all); a dirty row is written back before
///   its slot is reused.
/// - [`write`](Self::write) updates cached rows on the GPU only (they turn
///   dirty) and writes the others to the host table.
/// - [`writeback`](Self::writeback) writes every dirty row back. Call it
///   before any collective that reads the table another way (a gather:
///   other ranks read these rows from the host), and before dropping the
///   cache: a cache dropped with dirty rows cannot reach the table, says
///   how many rows were lost on stderr, and drops them.
///
/// Writes to this rank's rows by any other path (`wm_gather::scatter` by
/// any rank, `files::load`, `write_local`, …) need no call: each call of
/// the cache first compares the tables' write generations of this rank's
/// rows with those its slots reflect, and forgets every row when they
/// moved. Should the cache hold dirty rows then, two paths wrote the rows
/// and neither can be taken to be the last: `read` and `write` refuse,
/// naming both generations, until [`writeback`](Self::writeback) (which
/// writes them over the other path's, then forgets every row).
///
/// `wm_embedding::Embedding::enable_device_cache` uses it for its weights
/// and optimizer state and keeps to these rules itself.
#[derive(Debug)]
pub struct DeviceCache {
    own: Range<usize>,
    tags: Tags,
    main: CachedTable,
    side: Option<CachedTable>,
    dirty: Vec<bool>,
    stats: CacheStats,
}

impl DeviceCache {
    /// A device cache of `ratio` of this rank's rows of `mem` (a host table
    /// on a rank with a GPU; registered with CUDA or not: the cache copies
    /// rows between the host and its slots), read with `layout`, and of the same rows of `side` (a second host table
    /// with the same partition) read with its layout. Collective over the
    /// table's ranks, so a bad ratio or a rank without a GPU is every
    /// rank's error.
    ///
    /// # Errors
    /// On every rank: [`wholemem::CommonError::InvalidArgument`] naming the ratio when it
    /// is not greater than 0 and at most 1, for a device table, a layout
    /// that does not fit, or a side table partitioned otherwise;
    /// [`Error::Memory`] when a rank has no GPU or its memory runs out.
    pub fn new(mem: &WholeMemory, layout: &RowLayout, side: Option<(&WholeMemory, &RowLayout)>, ratio: f64) -> Result<Self> {
        let own = mem.local_rows();
        let slots_wanted = ratio_slots(ratio, own.len()).max(usize::from(!own.is_empty()));
        let placement = Placement::for_capacity(slots_wanted, own.len());
        let slots = placement.slots(own.len());
        let made = check_ratio(ratio).and_then(|()| {
            let main = CachedTable::new(mem, layout, slots)?;
            let side = match side {
                None => None,
                Some((s, l)) => {
                    if s.partition().counts() != mem.partition().counts() {
                        return Err(Error::Common(CommonError::InvalidArgument(
                            "the side table of a device cache must be partitioned as the table".into(),
                        )));
                    }
                    Some(CachedTable::new(s, l, slots)?)
                }
            };
            Ok((main, side))
        });
        let (main, side) = agree(mem.comm().as_ref(), made, Rule::Lowest)?;
        Ok(Self {
            own,
            tags: Tags::new(placement, mem.local_rows().len(), true),
            main,
            side,
            dirty: vec![false; slots],
            stats: CacheStats::default(),
        })
    }

    /// Rows this rank's cache can hold.
    pub fn capacity(&self) -> usize {
        self.tags.slots()
    }

    /// Rows it holds now.
    pub fn cached_rows(&self) -> usize {
        self.tags.occupied()
    }

    /// Rows written through it and not written back yet.
    pub fn dirty_rows(&self) -> usize {
        self.dirty.iter().filter(|&&d| d).count()
    }

    /// What the cache did since it was created.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Local row numbers of `rows` (global ids), each checked to be this
    /// rank's.
    fn local(&self, rows: &[usize]) -> Result<Vec<usize>> {
        rows.iter()
            .map(|&r| {
                if self.own.contains(&r) {
                    Ok(r - self.own.start)
                } else {
                    Err(Error::Common(CommonError::InvalidArgument(format!(
                        "row {r} is not one of this rank's rows {:?}: a device cache holds its owner's rows only",
                        self.own
                    ))))
                }
            })
            .collect()
    }

    /// Checks the tables passed: the cache's, and a side table exactly
    /// when it holds one's rows.
    fn check_tables(&self, mem: &WholeMemory, side: Option<&WholeMemory>) -> Result<()> {
        self.main.check(mem, "table")?;
        match (&self.side, side) {
            (Some(p), Some(s)) => p.check(s, "side table"),
            (None, None) => Ok(()),
            (Some(_), None) => {
                Err(Error::Common(CommonError::InvalidArgument("this device cache holds rows of a side table too: pass it".into())))
            }
            (None, Some(_)) => Err(Error::Common(CommonError::InvalidArgument("this device cache holds no side table's rows".into()))),
        }
    }

    /// Whether another path wrote this rank's rows of either table since
    /// the slots were filled.
    fn written_elsewhere(&self, mem: &WholeMemory, side: Option<&WholeMemory>) -> bool {
        self.main.written_elsewhere(mem) || matches!((&self.side, side), (Some(p), Some(s)) if p.written_elsewhere(s))
    }

    /// The slots now reflect the tables' rows as they are.
    fn seen_now(&mut self, mem: &WholeMemory, side: Option<&WholeMemory>) {
        self.main.seen = Seen(mem.write_generation());
        if let (Some(p), Some(s)) = (&mut self.side, side) {
            p.seen = Seen(s.write_generation());
        }
    }

    /// Forgets every row when another path wrote this rank's rows since
    /// the slots were filled.
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] naming the generations when the cache
    /// holds dirty rows then (nothing changes).
    fn follow_writes(&mut self, mem: &WholeMemory, side: Option<&WholeMemory>) -> Result<()> {
        if !self.written_elsewhere(mem, side) {
            return Ok(());
        }
        let dirty = self.dirty_rows();
        if dirty > 0 {
            return Err(Error::Common(CommonError::InvalidArgument(format!(
                "rank {}'s rows of the table were written by another path (write generation {}, the device cache's rows reflect {}) while the cache held {dirty} rows written through it: write them back first (writeback), or forget them (clear)",
                mem.comm().world_rank(),
                mem.write_generation(),
                self.main.seen.0
            ))));
        }
        self.clear();
        self.seen_now(mem, side);
        Ok(())
    }

    /// Writes back the dirty slots among `victims` (slot, the row it holds
    /// or held) to the host tables.
    fn write_back(&mut self, mem: &mut WholeMemory, side: Option<&mut WholeMemory>, victims: &[(usize, usize)]) -> Result<()> {
        let (slots, rows): (Vec<usize>, Vec<usize>) = victims.iter().copied().filter(|&(s, _)| self.dirty[s]).unzip();
        if slots.is_empty() {
            return Ok(());
        }
        let n = self.tags.slots();
        let before = mem.write_generation();
        let done = write_back_cached(&self.main, mem, n, &slots, &rows);
        self.main.took_own_write(before, mem.write_generation());
        done?;
        if let (Some(p), Some(s)) = (&mut self.side, side) {
            let before = s.write_generation();
            let done = write_back_cached(p, s, n, &slots, &rows);
            p.took_own_write(before, s.write_generation());
            done?;
        }
        for &s in &slots {
            self.dirty[s] = false;
        }
        self.stats.writebacks += slots.len() as u64;
        Ok(())
    }

    /// Writes every dirty row back to the host tables (`side`: the side
    /// table, when the cache holds its rows too); returns how many.
    ///
    /// # Errors
    /// Tables other than the cache's; the driver's errors; a row lock that
    /// could not be had.
    pub fn writeback(&mut self, mem: &mut WholeMemory, mut side: Option<&mut WholeMemory>) -> Result<usize> {
        self.check_tables(mem, side.as_deref())?;
        // Another path's writes since: the dirty rows go over them, then
        // every row is forgotten.
        let elsewhere = self.written_elsewhere(mem, side.as_deref());
        let victims: Vec<(usize, usize)> =
            (0..self.dirty.len()).filter(|&s| self.dirty[s]).filter_map(|s| self.tags.row_at(s).map(|r| (s, r))).collect();
        self.write_back(mem, side.as_deref_mut(), &victims)?;
        if elsewhere {
            self.clear();
            self.seen_now(mem, side.as_deref());
        }
        Ok(victims.len())
    }

    /// Forgets every row without writing anything back: after the host
    /// rows were overwritten (an initialisation), when what the cache holds
    /// is stale and its dirty rows are moot.
    pub fn clear(&mut self) {
        self.tags.clear();
        self.dirty.fill(false);
    }

    /// Reads rows `rows` (this rank's, global ids) of the table into `out`
    /// and of the side table into `side_out` (empty without one), both as
    /// `buf_dtype`: from the GPU where cached, else from the host,
    /// admitting what the replacement rule takes (a dirty row leaving its
    /// slot is written back first).
    ///
    /// # Errors
    /// [`wholemem::CommonError::InvalidArgument`] for a row of another rank, buffers of the
    /// wrong size, or tables other than the cache's; [`Error::Conversion`];
    /// the driver's errors.
    pub fn read(
        &mut self,
        mem: &mut WholeMemory,
        mut side: Option<&mut WholeMemory>,
        rows: &[usize],
        out: &mut [u8],
        side_out: &mut [u8],
        buf_dtype: DType,
    ) -> Result<()> {
        self.check_tables(mem, side.as_deref())?;
        let local = self.local(rows)?;
        self.follow_writes(mem, side.as_deref())?;
        let mut plan = Plan::default();
        for (k, &r) in local.iter().enumerate() {
            match self.tags.lookup(r) {
                Some(s) => {
                    self.tags.count_held(s, 1);
                    plan.hit_slots.push(s);
                    plan.hit_at.push(k);
                }
                None => {
                    self.tags.count_missed(r, 1);
                    plan.miss.push(r);
                    plan.miss_at.push(k);
                }
            }
        }
        let mut distinct = plan.miss.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let (fills, evicted) = self.tags.decide(&distinct);
        // Rows leaving their slots go home first if dirty.
        let victims: Vec<(usize, usize)> = fills.iter().filter_map(|f| f.evicted.map(|e| (f.slot, e))).collect();
        self.write_back(mem, side.as_deref_mut(), &victims)?;
        // The first place each missed row was asked.
        let mut first: Vec<(usize, usize)> = plan.miss.iter().enumerate().map(|(k, &r)| (r, k)).collect();
        first.sort_unstable();
        first.dedup_by_key(|f| f.0);
        for f in &fills {
            if let Ok(i) = first.binary_search_by_key(&f.row, |x| x.0) {
                plan.fills.push((f.slot, first[i].1));
            }
        }
        let n = self.tags.slots();
        read_cached(&mut self.main, mem, n, &plan, out, buf_dtype)?;
        match (&mut self.side, side) {
            (Some(p), Some(s)) => read_cached(p, s, n, &plan, side_out, buf_dtype)?,
            (None, None) => {}
            _ => {
                return Err(Error::Common(CommonError::InvalidArgument(
                    "pass the side table exactly when the cache holds its rows".into(),
                )));
            }
        }
        self.stats.lookups += rows.len() as u64;
        self.stats.hits += plan.hit_slots.len() as u64;
        self.stats.fills += plan.fills.len() as u64;
        self.stats.evictions += evicted;
        Ok(())
    }

    /// Writes rows `rows` (this rank's, global ids; the last occurrence of a
    /// repeated row wins) from `src` and `side_src` (`buf_dtype`): cached
    /// rows on the GPU only, where they turn dirty; the others to the host.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn write(
        &mut self,
        mem: &mut WholeMemory,
        side: Option<&mut WholeMemory>,
        rows: &[usize],
        src: &[u8],
        side_src: &[u8],
        buf_dtype: DType,
    ) -> Result<()> {
        self.check_tables(mem, side.as_deref())?;
        let local = self.local(rows)?;
        self.follow_writes(mem, side.as_deref())?;
        // The last occurrence of each row.
        let mut last: Vec<(usize, usize)> = local.iter().enumerate().map(|(k, &r)| (r, k)).collect();
        last.sort_unstable();
        let mut keep: Vec<(usize, usize)> = Vec::with_capacity(last.len());
        for (r, k) in last {
            match keep.last_mut() {
                Some(l) if l.0 == r => l.1 = k,
                _ => keep.push((r, k)),
            }
        }
        let (mut cached, mut host) = (Vec::new(), Vec::new());
        for &(r, k) in &keep {
            match self.tags.lookup(r) {
                Some(s) => cached.push((s, k)),
                None => host.push((r, k)),
            }
        }
        let n = self.tags.slots();
        let before = mem.write_generation();
        let done = write_cached(&mut self.main, mem, n, &cached, &host, src, buf_dtype);
        self.main.took_own_write(before, mem.write_generation());
        done?;
        match (&mut self.side, side) {
            (Some(p), Some(s)) => {
                let before = s.write_generation();
                let done = write_cached(p, s, n, &cached, &host, side_src, buf_dtype);
                p.took_own_write(before, s.write_generation());
                done?;
            }
            (None, None) => {}
            _ => {
                return Err(Error::Common(CommonError::InvalidArgument(
                    "pass the side table exactly when the cache holds its rows".into(),
                )));
            }
        }
        for &(s, _) in &cached {
            self.dirty[s] = true;
        }
        Ok(())
    }
}

impl Drop for DeviceCache {
    fn drop(&mut self) {
        let dirty = self.dirty_rows();
        if dirty > 0 {
            eprintln!("wm-gather: a device cache was dropped with {dirty} dirty rows it could not write back (call writeback first)");
        }
    }
}

/// Where one read's rows come from and go.
#[derive(Debug, Default)]
struct Plan {
    hit_slots: Vec<usize>,
    hit_at: Vec<usize>,
    miss: Vec<usize>,
    miss_at: Vec<usize>,
    /// (slot, index into `miss`) of each row admitted.
    fills: Vec<(usize, usize)>,
}

/// One table's share of a read.
fn read_cached(cached_table: &mut CachedTable, table: &WholeMemory, n: usize, plan: &Plan, buf: &mut [u8], buf_dtype: DType) -> Result<()> {
    let conv = RowConv::new(cached_table.layout.dtype(), buf_dtype, cached_table.layout.cols())?;
    let count = plan.hit_at.len() + plan.miss_at.len();
    if buf.len() != count * conv.dst_bytes() {
        return Err(Error::Common(CommonError::InvalidArgument(format!(
            "{} bytes for {count} rows of {} bytes",
            buf.len(),
            conv.dst_bytes()
        ))));
    }
    let rb = cached_table.layout.bytes();
    // Hits: rows of the table's type from the GPU, converted here.
    let mut dense = vec![0u8; plan.hit_slots.len() * rb];
    read_slots(table, &cached_table.rows, cached_table.shape(n), &cached_table.layout, &plan.hit_slots, &mut dense)?;
    let order: Vec<usize> = (0..plan.hit_slots.len()).collect();
    kernel::place_rows(&dense, conv, &order, &plan.hit_at, buf, 1).map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
    // Misses: from the host rows, then the admitted ones up to the GPU.
    let same = RowConv::new(cached_table.layout.dtype(), cached_table.layout.dtype(), cached_table.layout.cols())?;
    let packed: Vec<usize> = (0..plan.miss.len()).collect();
    let mut host = vec![0u8; plan.miss.len() * rb];
    mapped::PlacedCopy::new(table, mapped::RowsOf::Own, &cached_table.layout, same, &plan.miss, &packed, host.len())?.run_all(&mut host)?;
    kernel::place_rows(&host, conv, &packed, &plan.miss_at, buf, 1).map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
    let slots: Vec<usize> = plan.fills.iter().map(|f| f.0).collect();
    let mut up = Vec::with_capacity(slots.len() * rb);
    for &(_, k) in &plan.fills {
        up.extend_from_slice(&host[k * rb..][..rb]);
    }
    let (shape, layout) = (cached_table.shape(n), cached_table.layout);
    write_slots(table, &mut cached_table.rows, shape, &layout, &slots, &up)
}

/// One table's share of a write: `cached` (slot, source row) to the GPU,
/// `host` (local row, source row) to the host table.
fn write_cached(
    cached_table: &mut CachedTable,
    table: &mut WholeMemory,
    n: usize,
    cached: &[(usize, usize)],
    host: &[(usize, usize)],
    src: &[u8],
    buf_dtype: DType,
) -> Result<()> {
    // The source rows in the table's type, in the order they are written.
    let conv = RowConv::new(buf_dtype, cached_table.layout.dtype(), cached_table.layout.cols())?;
    let sb = conv.src_bytes();
    if sb == 0 || src.len() % sb != 0 {
        return Err(Error::Common(CommonError::InvalidArgument(format!("{} bytes are not whole rows of {sb} bytes", src.len()))));
    }
    let pack = |pairs: &[(usize, usize)]| -> Result<Vec<u8>> {
        let from: Vec<usize> = pairs.iter().map(|p| p.1).collect();
        let to: Vec<usize> = (0..pairs.len()).collect();
        let mut out = vec![0u8; pairs.len() * conv.dst_bytes()];
        kernel::place_rows(src, conv, &from, &to, &mut out, 1).map_err(|m| Error::Common(CommonError::InvalidArgument(m)))?;
        Ok(out)
    };
    let up = pack(cached)?;
    let slots: Vec<usize> = cached.iter().map(|p| p.0).collect();
    let (shape, layout) = (cached_table.shape(n), cached_table.layout);
    write_slots(table, &mut cached_table.rows, shape, &layout, &slots, &up)?;
    let down = pack(host)?;
    let rows: Vec<usize> = host.iter().map(|p| p.0).collect();
    mapped::scatter_own(table, &cached_table.layout, &rows, &down)
}

/// Writes slot rows `slots` of `cached_table` to host rows `rows` (local numbers).
fn write_back_cached(cached_table: &CachedTable, table: &mut WholeMemory, n: usize, slots: &[usize], rows: &[usize]) -> Result<()> {
    let mut dense = vec![0u8; slots.len() * cached_table.layout.bytes()];
    read_slots(table, &cached_table.rows, cached_table.shape(n), &cached_table.layout, slots, &mut dense)?;
    mapped::scatter_own(table, &cached_table.layout, rows, &dense)
}

#[cfg(test)]
mod tests {
    use super::Seen;

    /// Issue 31, item 1: on the H200 the device cache never hit (641
    /// lookups, 0 hits), because every training step left the table looking
    /// written by another path, so the next read forgot every cached row.
    /// The rule now: the cache's own writes, one generation each, keep its
    /// rows; only a write it did not make (or one beside its own) drops them.
    #[test]
    fn steps_written_through_the_device_cache_keep_its_rows() {
        let mut seen = Seen(7);
        for step in 7..1007 {
            // Each step writes through the cache: one write, one generation.
            seen.took_own_write(step, step + 1);
            assert!(!seen.stale(step + 1), "step {step} made the cache forget its own rows");
        }
        // A write the cache did not make: stale.
        assert!(seen.stale(1008));
        // A write beside its own (two generations for one write of its own):
        // stale too, and staying so.
        let mut seen = Seen(3);
        seen.took_own_write(3, 5);
        assert!(seen.stale(5));
        // A write before its own: its own write does not hide it.
        let mut seen = Seen(3);
        seen.took_own_write(4, 5);
        assert!(seen.stale(5));
        // A write that moved nothing (no rows of this rank) keeps it current;
        // generations wrap without a false alarm.
        let mut seen = Seen(u64::MAX);
        seen.took_own_write(u64::MAX, u64::MAX);
        assert!(!seen.stale(u64::MAX));
        seen.took_own_write(u64::MAX, 0);
        assert!(!seen.stale(0));
    }
}
