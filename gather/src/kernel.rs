//! The CPU row kernels: copy (and convert) rows between raw pointers, split
//! over threads. The only unsafe code of this crate lives here.

use half::{bf16, f16};

use crate::{DType, parallel};

/// A pointer that may cross threads: into table memory or an output buffer
/// that outlives the scoped threads using it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendPtr(pub *mut u8);
// SAFETY: SendPtr is only used inside `std::thread::scope` over memory that
// outlives the scope; each thread writes disjoint rows.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer (a method, so closures capture the whole `SendPtr`).
    #[inline(always)]
    pub(crate) fn get(self) -> *mut u8 {
        self.0
    }
}

trait Float: Copy {
    const WIDE: bool;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! float {
    ($t:ty, $wide:expr, $to32:expr, $from32:expr, $to64:expr, $from64:expr) => {
        impl Float for $t {
            const WIDE: bool = $wide;
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to32(self)
            }
            #[inline(always)]
            fn from_f32(v: f32) -> Self {
                $from32(v)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to64(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from64(v)
            }
        }
    };
}
float!(f16, false, f16::to_f32, f16::from_f32, f16::to_f64, f16::from_f64);
float!(bf16, false, bf16::to_f32, bf16::from_f32, bf16::to_f64, bf16::from_f64);
float!(f32, false, |v| v, |v| v, f64::from, |v| v as f32);
float!(f64, true, |v| v as f32, f64::from, |v| v, |v| v);

trait Int: Copy {
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}
macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
int!(i8, i16, i32, i64);

/// # Safety
/// `src` readable for `n` `S`, `dst` writable for `n` `D`, not overlapping.
unsafe fn floats<S: Float, D: Float>(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src.cast::<S>(), dst.cast::<D>());
    for i in 0..n {
        // SAFETY: i < n, within both buffers by the caller's contract;
        // unaligned access because output buffers may be byte buffers.
        unsafe {
            let v = s.add(i).read_unaligned();
            let out = if S::WIDE || D::WIDE { D::from_f64(v.to_f64()) } else { D::from_f32(v.to_f32()) };
            d.add(i).write_unaligned(out);
        }
    }
}

/// # Safety
/// As [`floats`].
unsafe fn ints<S: Int, D: Int>(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src.cast::<S>(), dst.cast::<D>());
    for i in 0..n {
        // SAFETY: as in `floats`.
        unsafe { d.add(i).write_unaligned(D::from_i64(s.add(i).read_unaligned().to_i64())) }
    }
}

/// How one row becomes another: `cols` elements from `from` to `to`.
/// Built only for allowed pairs (see [`DType::check_conversion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowConv {
    from: DType,
    to: DType,
    cols: usize,
}

impl RowConv {
    pub(crate) fn new(from: DType, to: DType, cols: usize) -> Result<Self, crate::ConversionError> {
        from.check_conversion(to)?;
        Ok(Self { from, to, cols })
    }

    /// The source element type.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn from(&self) -> DType {
        self.from
    }

    /// The destination element type.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn to(&self) -> DType {
        self.to
    }

    /// The conversion the other way (for scatter).
    pub(crate) fn reversed(self) -> Self {
        Self { from: self.to, to: self.from, cols: self.cols }
    }

    /// Bytes a source row occupies.
    pub(crate) fn src_bytes(&self) -> usize {
        self.cols * self.from.size()
    }

    /// Bytes a destination row occupies.
    pub(crate) fn dst_bytes(&self) -> usize {
        self.cols * self.to.size()
    }

    /// Converts one row.
    ///
    /// # Safety
    /// `src` is readable for [`src_bytes`](Self::src_bytes), `dst` writable
    /// for [`dst_bytes`](Self::dst_bytes), and the two do not overlap.
    #[inline]
    pub(crate) unsafe fn row(&self, src: *const u8, dst: *mut u8) {
        let n = self.cols;
        if self.from == self.to {
            // SAFETY: the caller's contract, with src_bytes == dst_bytes.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, self.src_bytes()) };
            return;
        }
        type Kernel = unsafe fn(*const u8, *mut u8, usize);
        macro_rules! to_float {
            ($s:ty) => {
                match self.to {
                    DType::F16 => floats::<$s, f16> as Kernel,
                    DType::Bf16 => floats::<$s, bf16>,
                    DType::F32 => floats::<$s, f32>,
                    DType::F64 => floats::<$s, f64>,
                    _ => unreachable!("checked at construction"),
                }
            };
        }
        macro_rules! to_int {
            ($s:ty) => {
                match self.to {
                    DType::I8 => ints::<$s, i8> as Kernel,
                    DType::I16 => ints::<$s, i16>,
                    DType::I32 => ints::<$s, i32>,
                    DType::I64 => ints::<$s, i64>,
                    _ => unreachable!("checked at construction"),
                }
            };
        }
        let kernel: Kernel = match self.from {
            DType::F16 => to_float!(f16),
            DType::Bf16 => to_float!(bf16),
            DType::F32 => to_float!(f32),
            DType::F64 => to_float!(f64),
            DType::I8 => to_int!(i8),
            DType::I16 => to_int!(i16),
            DType::I32 => to_int!(i32),
            DType::I64 => to_int!(i64),
        };
        // SAFETY: the caller's contract covers `n` elements of each type.
        unsafe { kernel(src, dst, n) }
    }
}

/// Where a row comes from or goes to, in table memory.
pub(crate) trait RowAddr: Sync {
    /// The first byte of the row with this (already validated) index.
    fn addr(&self, index: usize) -> *mut u8;
}

/// Rows ahead of the copy whose cache lines are requested early: random
/// rows are latency-bound, and a few misses in flight hide most of it.
pub const PREFETCH_DISTANCE: usize = 8;

/// Asks for the cache lines of `len` bytes at `p` (a hint; never faults).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }>(p, len);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Asks for the cache lines of `len` bytes at `p` (its first KiB) to be
/// written (a hint; never faults).
#[inline(always)]
pub(crate) fn prefetch_for_write(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p, len);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// The lines of the first KiB of `len` bytes at `p`, with prefetch hint
/// `HINT`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32>(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len.min(1024) {
        // SAFETY: prefetch is a hint that never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(off).cast::<i8>()) };
        off += 64;
    }
}

/// Asks for the cache lines of `v` (its first KiB) ahead of reading it: a
/// hint, which never faults. Random rows are latency-bound; asking for the
/// row [`PREFETCH_DISTANCE`] ahead of the one being read hides most of it.
#[inline(always)]
pub fn prefetch_slice<T>(v: &[T]) {
    prefetch(v.as_ptr().cast(), std::mem::size_of_val(v));
}

/// Rows a CPU row kernel gives each thread at least: a call over fewer
/// than twice this many rows runs on the calling thread alone, whatever
/// number of threads it is allowed. Below that, starting a thread costs
/// more than it saves. What only one thread makes safe — a repeated output
/// slot in `gather_rows`, see [`crate::rows::gather_from`] — is allowed
/// exactly when `threads_for` says one.
pub const MIN_ROWS_PER_THREAD: usize = 2048;

/// The threads a row kernel uses for `rows` rows when allowed `threads`:
/// one per whole [`MIN_ROWS_PER_THREAD`] rows, at most `threads`, at least
/// one ([`parallel::threads_for`]).
#[inline]
pub(crate) fn threads_for(rows: usize, threads: usize) -> usize {
    parallel::threads_for(rows, MIN_ROWS_PER_THREAD, threads)
}

/// Copies `rows[i]` of the source into output row `i` — or output row
/// `to[i]` when `to` is given — for every `i`, split over `threads`
/// ([`threads_for`] of them), which claim pieces of the rows as they come
/// free ([`parallel::for_each_piece`]).
///
/// # Safety
/// Every `src.addr(rows[i])` is readable for `conv.src_bytes()`; `out` holds
/// `rows.len()` rows of `conv.dst_bytes()` (with `to`: more than every
/// `to[i]`, all distinct) and does not overlap the source.
pub(crate) unsafe fn gather_rows(src: &dyn RowAddr, rows: &[usize], to: Option<&[usize]>, conv: RowConv, out: &mut [u8], threads: usize) {
    let db = conv.dst_bytes();
    debug_assert!(to.map_or(out.len() == rows.len() * db, |t| t.len() == rows.len() && t.iter().all(|&p| (p + 1) * db <= out.len())));
    let base = SendPtr(out.as_mut_ptr());
    let sb = conv.src_bytes();
    let run = |piece: std::ops::Range<usize>| {
        let first = piece.start;
        let rows = &rows[piece];
        for (i, &r) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(i + PREFETCH_DISTANCE) {
                prefetch(src.addr(ahead), sb);
            }
            let slot = to.map_or(first + i, |t| t[first + i]);
            // SAFETY: the caller's contract; output rows are disjoint.
            unsafe { conv.row(src.addr(r), base.get().add(slot * db)) };
        }
    };
    let threads = threads_for(rows.len(), threads);
    parallel::for_each_piece(rows.len(), parallel::grain(rows.len(), threads), threads, run);
}

/// Whether `positions` are distinct rows of an output of `out_rows` rows:
/// what [`gather_rows`] needs of them to write each output row once.
pub(crate) fn distinct_below(positions: &[usize], out_rows: usize) -> bool {
    // Positions in ascending order (as callers that place rows usually
    // have them) are distinct: no table of the output rows needed.
    if positions.windows(2).all(|w| w[0] < w[1]) {
        return positions.last().is_none_or(|&p| p < out_rows);
    }
    let mut seen = vec![false; out_rows];
    positions.iter().all(|&p| p < out_rows && !std::mem::replace(&mut seen[p], true))
}

/// Copies (converting) row `from[k]` of the dense rows `src` into output
/// row `positions[k]` for every `k`, split over `threads`: the safe form of
/// [`gather_rows`] over a buffer, for placing rows that arrived packed (a
/// row of `src` may go to several places).
///
/// # Errors
/// A message naming the sizes when `src` is not whole rows of `conv`'s
/// source type, an index is past them, or the positions are not distinct
/// rows of `out`.
pub(crate) fn place_rows(
    src: &[u8],
    conv: RowConv,
    from: &[usize],
    positions: &[usize],
    out: &mut [u8],
    threads: usize,
) -> Result<(), String> {
    let (sb, db) = (conv.src_bytes(), conv.dst_bytes());
    if sb == 0 || src.len() % sb != 0 || from.len() != positions.len() {
        return Err(format!("{} bytes of rows of {sb} bytes for {} rows to {} places", src.len(), from.len(), positions.len()));
    }
    if let Some(bad) = from.iter().find(|&&k| k >= src.len() / sb) {
        return Err(format!("row {bad} of {} packed rows", src.len() / sb));
    }
    if db == 0 || out.len() % db != 0 || !distinct_below(positions, out.len() / db) {
        return Err(format!("{} positions are not distinct rows of an output of {} bytes in rows of {db}", positions.len(), out.len()));
    }
    struct Packed(SendPtr, usize);
    impl RowAddr for Packed {
        #[inline]
        fn addr(&self, k: usize) -> *mut u8 {
            self.0.0.wrapping_add(k * self.1)
        }
    }
    // SAFETY: every row `from[k]` lies inside `src` (checked above) and is
    // only read; the positions are distinct rows of `out` (checked above),
    // which is a separate, exclusively borrowed buffer.
    unsafe { gather_rows(&Packed(SendPtr(src.as_ptr().cast_mut()), sb), from, Some(positions), conv, out, threads) };
    Ok(())
}

/// Copies input row `i` — or input row `from[i]` when `from` is given —
/// into table row `rows[i]` for every `i`, converting; when a row appears
/// more than once the last occurrence wins. Split over
/// `threads` by row: the rows fall into buckets by `row % buckets`, which
/// the threads claim as they come free ([`parallel::for_each_piece`]), and
/// a bucket's rows are written by one thread, in input order. With `locks`,
/// each row is written under its row lock.
///
/// # Errors
/// A row lock that could not be had (a holder that kept it for the whole
/// timeout): that bucket stops there, the others finish.
///
/// # Safety
/// Every `dst.addr(rows[i])` is writable for `conv.dst_bytes()`; `src` holds
/// `rows.len() * conv.src_bytes()` bytes (with `from`: as many entries as
/// `rows`, each below `src.len() / conv.src_bytes()`) and does not overlap
/// the table; no one else in this process accesses those rows meanwhile.
pub(crate) unsafe fn scatter_rows(
    dst: &dyn RowAddr,
    rows: &[usize],
    from: Option<&[usize]>,
    conv: RowConv,
    src: &[u8],
    threads: usize,
    locks: Option<&wholemem::RowLocks>,
) -> Result<(), wholemem::Error> {
    let sb = conv.src_bytes();
    debug_assert!(from.map_or(src.len() == rows.len() * sb, |f| f.len() == rows.len() && f.iter().all(|&k| (k + 1) * sb <= src.len())));
    let input = SendPtr(src.as_ptr().cast_mut());
    let write = move |i: usize, r: usize| -> Result<(), wholemem::Error> {
        // Other ranks may write the same row now: one at a time (tried
        // first without waiting: the cheap path).
        let _row = match locks {
            Some(l) => Some(match l.try_lock(r) {
                Some(g) => g,
                None => l.lock(r)?,
            }),
            None => None,
        };
        // SAFETY: the caller's contract; each row is written by one
        // thread, in input order (see below).
        unsafe { conv.row(input.get().add(from.map_or(i, |f| f[i]) * sb), dst.addr(r)) };
        Ok(())
    };
    let threads = threads_for(rows.len(), threads);
    if threads == 1 {
        // Random rows: their lines and their stripes asked for a few rows
        // ahead, to be written (taking a stripe waits for the stores
        // before it; missing, each waited on memory).
        let db = conv.dst_bytes();
        return rows.iter().enumerate().try_for_each(|(i, &r)| {
            if let Some(&ahead) = rows.get(i + PREFETCH_DISTANCE) {
                prefetch_for_write(dst.addr(ahead), db);
                if let Some(l) = locks {
                    l.prefetch(ahead);
                }
            }
            write(i, r)
        });
    }
    // The input positions grouped by bucket (a counting sort, stable): a
    // row is in exactly one bucket, so one thread writes all of its
    // occurrences, in input order, and the last one wins.
    let buckets = threads * parallel::PIECES_PER_THREAD;
    let mut starts = vec![0usize; buckets + 1];
    for &r in rows {
        starts[r % buckets + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut fill = starts.clone();
    let mut order = vec![0usize; rows.len()];
    for (i, &r) in rows.iter().enumerate() {
        order[fill[r % buckets]] = i;
        fill[r % buckets] += 1;
    }
    let outcomes = parallel::map_pieces(buckets, 1, threads, |bucket| {
        bucket.into_iter().try_for_each(|b| order[starts[b]..starts[b + 1]].iter().try_for_each(|&i| write(i, rows[i])))
    });
    // Every bucket ran; the first error wins.
    outcomes.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convert(from: DType, to: DType, src: &[u8]) -> Vec<u8> {
        let n = src.len() / from.size();
        let c = RowConv::new(from, to, n).unwrap();
        let mut out = vec![0u8; c.dst_bytes()];
        // SAFETY: buffers sized for the conversion.
        unsafe { c.row(src.as_ptr(), out.as_mut_ptr()) };
        out
    }

    #[test]
    fn distinct_positions_are_told_apart_sorted_or_not() {
        // Ascending (the quick path), in any order, repeated, past the end.
        assert!(distinct_below(&[], 0));
        assert!(distinct_below(&[0, 3, 7], 8));
        assert!(!distinct_below(&[0, 3, 8], 8), "8 is past an output of 8 rows");
        assert!(distinct_below(&[7, 0, 3], 8));
        assert!(!distinct_below(&[3, 0, 3], 8), "3 twice");
        assert!(!distinct_below(&[0, 3, 3], 8), "3 twice, ascending");
        assert!(!distinct_below(&[9, 0], 8));
    }

    #[test]
    fn floats_round_like_the_half_crate() {
        let v = [1.0f32, -2.5, 65504.0, 1e-8, 1234.567, f32::INFINITY];
        let h: Vec<f16> = bytemuck::pod_collect_to_vec(&convert(DType::F32, DType::F16, bytemuck::cast_slice(&v)));
        assert_eq!(h, v.map(f16::from_f32).to_vec());
        let b: Vec<bf16> = bytemuck::pod_collect_to_vec(&convert(DType::F32, DType::Bf16, bytemuck::cast_slice(&v)));
        assert_eq!(b, v.map(bf16::from_f32).to_vec());
        let d: Vec<f64> = bytemuck::pod_collect_to_vec(&convert(DType::F16, DType::F64, bytemuck::cast_slice(&h)));
        assert_eq!(d, h.iter().map(|x| x.to_f64()).collect::<Vec<_>>());
        let back: Vec<f32> = bytemuck::pod_collect_to_vec(&convert(DType::F64, DType::F32, bytemuck::cast_slice(&[0.1f64, 1e300])));
        assert_eq!(back, vec![0.1f32, f32::INFINITY]);
    }

    #[test]
    fn ints_convert_like_as_casts() {
        let v = [1i64, -1, 300, i64::MAX];
        let n: Vec<i8> = bytemuck::pod_collect_to_vec(&convert(DType::I64, DType::I8, bytemuck::cast_slice(&v)));
        assert_eq!(n, vec![1i8, -1, 300i64 as i8, -1]);
        let w: Vec<i32> = bytemuck::pod_collect_to_vec(&convert(DType::I8, DType::I32, bytemuck::cast_slice(&[-5i8, 7])));
        assert_eq!(w, vec![-5, 7]);
    }

    struct Slab(SendPtr, usize);
    impl RowAddr for Slab {
        fn addr(&self, index: usize) -> *mut u8 {
            self.0.0.wrapping_add(index * self.1)
        }
    }

    /// A slab that notes every thread that asks it for a row.
    struct Watched {
        slab: Slab,
        seen: std::sync::Mutex<std::collections::HashSet<std::thread::ThreadId>>,
    }
    impl RowAddr for Watched {
        fn addr(&self, index: usize) -> *mut u8 {
            self.seen.lock().unwrap().insert(std::thread::current().id());
            self.slab.addr(index)
        }
    }

    /// Whether the threads in `seen` are what a split over `want` threads
    /// allows: the calling thread alone for one, else at most `want` (a
    /// helper may take every piece before the caller claims one).
    fn ran_as_said(seen: &std::collections::HashSet<std::thread::ThreadId>, want: usize, me: std::thread::ThreadId) -> bool {
        if want == 1 { seen.len() == 1 && seen.contains(&me) } else { (1..=want).contains(&seen.len()) }
    }

    /// What `rows::gather_from` relies on to accept repeated slots: the
    /// kernels run on the calling thread alone below twice
    /// `MIN_ROWS_PER_THREAD` rows and split from there, as `threads_for`
    /// says. (A helper may find every piece taken: at most that many
    /// threads, then.)
    #[test]
    fn kernels_split_rows_over_threads_from_twice_min_rows_per_thread() {
        let m = MIN_ROWS_PER_THREAD;
        let (rows, cols) = (3 * m + 1, 2usize);
        let mut table: Vec<u32> = (0..rows * cols).map(|i| i as u32).collect();
        let conv = RowConv::new(DType::I32, DType::I32, cols).unwrap();
        let me = std::thread::current().id();
        for (n, want) in [(1, 1), (m - 1, 1), (m, 1), (m + 1, 1), (2 * m - 1, 1), (2 * m, 2), (3 * m, 3), (3 * m + 1, 3)] {
            assert_eq!(threads_for(n, 4), want, "{n} rows");
            assert_eq!(threads_for(n, 1), 1, "{n} rows, one thread allowed");
            let ids: Vec<usize> = (0..n).map(|i| (i * 7919) % rows).collect();
            let watched = Watched { slab: Slab(SendPtr(table.as_mut_ptr().cast()), cols * 4), seen: Default::default() };
            let mut out = vec![0u8; n * cols * 4];
            // SAFETY: every id is below `rows`; `out` is sized for the ids.
            unsafe { gather_rows(&watched, &ids, None, conv, &mut out, 4) };
            let seen = std::mem::take(&mut *watched.seen.lock().unwrap());
            assert!(ran_as_said(&seen, want, me), "gather of {n} rows ran on {} threads (at most {want}; alone: the caller)", seen.len());
            let src = vec![0u8; n * cols * 4];
            // SAFETY: as above; the table is only reached through `watched`.
            unsafe { scatter_rows(&watched, &ids, None, conv, &src, 4, None) }.unwrap();
            let seen = watched.seen.lock().unwrap();
            assert!(ran_as_said(&seen, want, me), "scatter of {n} rows ran on {} threads (at most {want}; alone: the caller)", seen.len());
        }
    }

    /// Issue 30 item 10: a copy split into a thread per started 2048 rows
    /// gave a second thread as little as one row (2049 rows: two threads),
    /// whose start and join cost more than its share. Below two full
    /// shares the calling thread copies every row itself.
    #[test]
    fn threads_slowing_things_down_small_copies_stay_on_the_calling_thread() {
        let m = MIN_ROWS_PER_THREAD;
        let (rows, cols) = (2 * m, 1usize);
        let mut table: Vec<u32> = (0..rows as u32).collect();
        let conv = RowConv::new(DType::I32, DType::I32, cols).unwrap();
        for n in [m + 1, 2 * m - 1] {
            let ids: Vec<usize> = (0..n).map(|i| (i * 7919) % rows).collect();
            let watched = Watched { slab: Slab(SendPtr(table.as_mut_ptr().cast()), cols * 4), seen: Default::default() };
            let mut out = vec![0u8; n * cols * 4];
            // SAFETY: every id is below `rows`; `out` is sized for the ids.
            unsafe { gather_rows(&watched, &ids, None, conv, &mut out, 2) };
            let seen = std::mem::take(&mut *watched.seen.lock().unwrap());
            assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![std::thread::current().id()], "gather of {n} rows on 2 threads");
            let got: Vec<u32> = bytemuck::pod_collect_to_vec(&out);
            assert_eq!(got, ids.iter().map(|&i| i as u32).collect::<Vec<_>>());
        }
    }

    /// A scatter that reads packed rows through `from` (the node cache's
    /// fills) writes what a dense copy in that order would: packed row
    /// `from[i]` to table row `ids[i]`, the last occurrence winning, on
    /// one thread and on several.
    #[test]
    fn a_scatter_from_packed_rows_reads_the_rows_from_names() {
        let (rows, cols) = (3000usize, 2usize);
        let conv = RowConv::new(DType::I32, DType::I32, cols).unwrap();
        let packed: Vec<u32> = (0..700 * cols).map(|i| 5_000_000 + i as u32).collect();
        for n in [10, 3 * MIN_ROWS_PER_THREAD] {
            let ids: Vec<usize> = (0..n).map(|i| (i * 613) % rows).collect();
            let from: Vec<usize> = (0..n).map(|i| (i * 37 + 11) % 700).collect();
            let mut table = vec![0u32; rows * cols];
            let slab = Slab(SendPtr(table.as_mut_ptr().cast()), cols * 4);
            // SAFETY: every id is below `rows`, every `from` below the 700
            // packed rows; the table is only reached through `slab`.
            unsafe { scatter_rows(&slab, &ids, Some(&from), conv, bytemuck::cast_slice(&packed), 4, None) }.unwrap();
            let mut want = vec![0u32; rows * cols];
            for (&id, &k) in ids.iter().zip(&from) {
                want[id * cols..][..cols].copy_from_slice(&packed[k * cols..][..cols]);
            }
            assert_eq!(table, want, "{n} rows");
        }
    }

    #[test]
    fn threaded_gather_and_scatter_match_a_plain_loop() {
        let (rows, cols) = (5000usize, 3usize);
        let mut table: Vec<u32> = (0..rows * cols).map(|i| i as u32).collect();
        let ids: Vec<usize> = (0..20_000).map(|i| (i * 7919) % rows).collect();
        let conv = RowConv::new(DType::I32, DType::I32, cols).unwrap();
        let slab = Slab(SendPtr(table.as_mut_ptr().cast()), cols * 4);
        let mut out = vec![0u8; ids.len() * cols * 4];
        // SAFETY: every id is below `rows`; `out` is sized for the ids.
        unsafe { gather_rows(&slab, &ids, None, conv, &mut out, 4) };
        let out: Vec<u32> = bytemuck::pod_collect_to_vec(&out);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(out[i * cols..][..cols], table[id * cols..][..cols]);
        }
        // Scatter: repeated ids, the last occurrence wins.
        let src: Vec<u32> = (0..ids.len() * cols).map(|i| 1_000_000 + i as u32).collect();
        // SAFETY: as above, the table is only reached through `slab` meanwhile.
        unsafe { scatter_rows(&slab, &ids, None, conv, bytemuck::cast_slice(&src), 4, None) }.unwrap();
        let mut last = vec![usize::MAX; rows];
        for (i, &id) in ids.iter().enumerate() {
            last[id] = i;
        }
        for (id, &i) in last.iter().enumerate() {
            if i != usize::MAX {
                assert_eq!(table[id * cols..][..cols], src[i * cols..][..cols], "row {id}");
            }
        }
    }
}
