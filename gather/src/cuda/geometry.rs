//! Checking launch arguments and laying out the launch: which kernel, how
//! many threads per row, how many blocks, what goes in shared memory. Pure
//! host code, tested without a GPU.

use super::source::{COPY_WIDTHS, Direction, Entry};
use super::{BLOCK_THREADS, BucketArgs, CheckArgs, GatherArgs, KernelError, LaunchPlan, RepeatArgs, ScatterArgs};
use crate::DType;

/// The most dynamic shared memory a launch asks for (staged `first_rows`,
/// plus the bucket histogram); more owners than fit search global memory.
/// It stays below the 48 KiB that needs no opt-in.
pub const MAX_STAGED_BYTES: u32 = 32 * 1024;

/// Resident blocks per multiprocessor the grid is sized for; grid-stride
/// loops cover the rest.
const BLOCKS_PER_SM: u32 = 8;

/// The kernel parameters of gather and scatter: the mirror of `WmRowParams`
/// in `kernels.cu` (all fields 64-bit, same order).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RowParams {
    pub bases: u64,
    pub first_rows: u64,
    pub ranks: u64,
    pub staged: u64,
    pub table_stride: u64,
    pub ids: u64,
    pub n_ids: u64,
    pub buf: u64,
    pub buf_stride: u64,
    pub keep: u64,
    pub units: u64,
    pub row_bytes: u64,
    pub lanes_log2: u64,
    pub status: u64,
}

/// The kernel parameters of the id check: the mirror of `WmCheckParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct CheckParams {
    pub ids: u64,
    pub n_ids: u64,
    pub lo: u64,
    pub hi: u64,
    pub status: u64,
}

/// The kernel parameters of the repeat kernels: the mirror of `WmRepeatParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RepeatParams {
    pub ids: u64,
    pub n_ids: u64,
    pub lo: u64,
    pub hi: u64,
    pub keys: u64,
    pub vals: u64,
    pub mask: u64,
    pub keep: u64,
}

/// The kernel parameters of the scan: the mirror of `WmScanParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ScanParams {
    pub counts: u64,
    pub cursors: u64,
    pub n: u64,
}

/// The kernel parameters of the bucket kernels: the mirror of `WmBucketParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BucketParams {
    pub first_rows: u64,
    pub ranks: u64,
    pub staged: u64,
    pub ids: u64,
    pub n_ids: u64,
    pub owner: u64,
    pub counts: u64,
    pub cursors: u64,
    pub out_ids: u64,
    pub positions: u64,
}

fn invalid(msg: String) -> KernelError {
    KernelError::InvalidArgument(msg)
}

fn nonzero(what: &str, addr: u64) -> Result<(), KernelError> {
    if addr == 0 { Err(invalid(format!("{what} is a null device address"))) } else { Ok(()) }
}

fn blocks_for(units_of_work: u64, per_block: u64, sm_count: u32) -> u32 {
    let cap = u64::from(sm_count.max(1)) * u64::from(BLOCKS_PER_SM);
    units_of_work.div_ceil(per_block).clamp(1, cap) as u32
}

/// The shared side of gather and scatter: the table, and the dense buffer
/// (`out` or `src`) with its type.
struct Rows {
    dir: Direction,
    bases: u64,
    first_rows: u64,
    ranks: u32,
    table_stride: u64,
    table_dtype: DType,
    dim: u32,
    ids: u64,
    id_type: super::IdType,
    n_ids: u64,
    buf: u64,
    buf_stride: u64,
    buf_dtype: DType,
    keep: u64,
    status: u64,
}

impl Rows {
    fn plan(&self, sm_count: u32) -> Result<(LaunchPlan, RowParams), KernelError> {
        let (from, to) = match self.dir {
            Direction::Gather => (self.table_dtype, self.buf_dtype),
            Direction::Scatter => (self.buf_dtype, self.table_dtype),
        };
        if from.check_conversion(to).is_err() {
            return Err(KernelError::UnsupportedPair { from, to });
        }
        let buf_name = match self.dir {
            Direction::Gather => "out",
            Direction::Scatter => "src",
        };
        if self.ranks == 0 {
            return Err(invalid("ranks is 0; a table has at least one owner".into()));
        }
        if self.dim == 0 {
            return Err(invalid("dim is 0; a row moves at least one element".into()));
        }
        let table_row = u64::from(self.dim) * self.table_dtype.size() as u64;
        let buf_row = u64::from(self.dim) * self.buf_dtype.size() as u64;
        if self.table_stride < table_row || self.table_stride % self.table_dtype.size() as u64 != 0 {
            return Err(invalid(format!(
                "row_stride_bytes {} must be a multiple of {} and hold {} {} elements ({table_row} bytes)",
                self.table_stride,
                self.table_dtype.size(),
                self.dim,
                self.table_dtype
            )));
        }
        if self.buf_stride < buf_row || self.buf_stride % self.buf_dtype.size() as u64 != 0 {
            return Err(invalid(format!(
                "{buf_name}_stride_bytes {} must be a multiple of {} and hold {} {} elements ({buf_row} bytes)",
                self.buf_stride,
                self.buf_dtype.size(),
                self.dim,
                self.buf_dtype
            )));
        }
        if self.buf % self.buf_dtype.size() as u64 != 0 {
            return Err(invalid(format!("{buf_name} {:#x} is not aligned to its {} elements", self.buf, self.buf_dtype)));
        }
        if self.n_ids > 0 {
            nonzero("bases", self.bases)?;
            nonzero("first_rows", self.first_rows)?;
            nonzero("ids", self.ids)?;
            nonzero(buf_name, self.buf)?;
        }
        let (entry, width, units, row_bytes) = if from == to {
            let g = [table_row, self.table_stride, self.buf, self.buf_stride].into_iter().fold(0, gcd);
            let width = COPY_WIDTHS.into_iter().find(|&w| g % u64::from(w) == 0).unwrap_or(1);
            (Entry::Copy { dir: self.dir, id: self.id_type, width }, width, table_row / u64::from(width), table_row)
        } else {
            (Entry::Convert { dir: self.dir, id: self.id_type, from, to }, 0, u64::from(self.dim), 0)
        };
        let lanes = units.next_power_of_two().clamp(1, 32) as u32;
        let lanes_log2 = lanes.trailing_zeros();
        let staged_bytes = (u64::from(self.ranks) + 1) * 8;
        let staged = self.ranks > 1 && staged_bytes <= u64::from(MAX_STAGED_BYTES);
        let plan = LaunchPlan {
            kernel: entry.name(),
            blocks: blocks_for(self.n_ids, u64::from(BLOCK_THREADS / lanes), sm_count),
            lanes,
            copy_width: width,
            shared_bytes: if staged { staged_bytes as u32 } else { 0 },
        };
        let params = RowParams {
            bases: self.bases,
            first_rows: self.first_rows,
            ranks: u64::from(self.ranks),
            staged: u64::from(staged),
            table_stride: self.table_stride,
            ids: self.ids,
            n_ids: self.n_ids,
            buf: self.buf,
            buf_stride: self.buf_stride,
            keep: self.keep,
            units,
            row_bytes,
            lanes_log2: u64::from(lanes_log2),
            status: self.status,
        };
        Ok((plan, params))
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl GatherArgs {
    /// Checks the arguments and lays out the launch for a GPU with
    /// `sm_count` multiprocessors.
    ///
    /// # Errors
    /// [`KernelError::UnsupportedPair`] for floating ↔ integer;
    /// [`KernelError::InvalidArgument`] for no owners, no elements, a
    /// stride too small or misaligned for its type, or a null address.
    pub fn plan(&self, sm_count: u32) -> Result<LaunchPlan, KernelError> {
        self.plan_params(sm_count).map(|(p, _)| p)
    }

    pub(crate) fn plan_params(&self, sm_count: u32) -> Result<(LaunchPlan, RowParams), KernelError> {
        Rows {
            dir: Direction::Gather,
            bases: self.bases,
            first_rows: self.first_rows,
            ranks: self.ranks,
            table_stride: self.row_stride_bytes,
            table_dtype: self.table_dtype,
            dim: self.dim,
            ids: self.ids,
            id_type: self.id_type,
            n_ids: self.n_ids,
            buf: self.out,
            buf_stride: self.out_stride_bytes,
            buf_dtype: self.out_dtype,
            keep: 0,
            status: self.status,
        }
        .plan(sm_count)
    }
}

impl ScatterArgs {
    /// As [`GatherArgs::plan`].
    ///
    /// # Errors
    /// As [`GatherArgs::plan`].
    pub fn plan(&self, sm_count: u32) -> Result<LaunchPlan, KernelError> {
        self.plan_params(sm_count).map(|(p, _)| p)
    }

    pub(crate) fn plan_params(&self, sm_count: u32) -> Result<(LaunchPlan, RowParams), KernelError> {
        Rows {
            dir: Direction::Scatter,
            bases: self.bases,
            first_rows: self.first_rows,
            ranks: self.ranks,
            table_stride: self.row_stride_bytes,
            table_dtype: self.table_dtype,
            dim: self.dim,
            ids: self.ids,
            id_type: self.id_type,
            n_ids: self.n_ids,
            buf: self.src,
            buf_stride: self.src_stride_bytes,
            buf_dtype: self.src_dtype,
            keep: self.keep,
            status: self.status,
        }
        .plan(sm_count)
    }
}

/// The two bucket launches: (count, place).
#[derive(Debug)]
pub(crate) struct BucketPlan {
    pub count: LaunchPlan,
    pub place: LaunchPlan,
    pub params: BucketParams,
}

impl BucketArgs {
    pub(crate) fn plan_params(&self, sm_count: u32) -> Result<BucketPlan, KernelError> {
        if self.ranks == 0 {
            return Err(invalid("ranks is 0; a table has at least one owner".into()));
        }
        if self.n_ids > u64::from(u32::MAX) {
            return Err(invalid(format!("{} ids do not fit the u32 positions of a bucket launch", self.n_ids)));
        }
        if self.n_ids > 0 {
            for (what, addr) in [
                ("first_rows", self.first_rows),
                ("ids", self.ids),
                ("owner", self.owner),
                ("counts", self.counts),
                ("cursors", self.cursors),
                ("out_ids", self.out_ids),
                ("positions", self.positions),
            ] {
                nonzero(what, addr)?;
            }
        }
        let staged_bytes = (u64::from(self.ranks) + 1) * 8 + u64::from(self.ranks) * 4;
        let staged = staged_bytes <= u64::from(MAX_STAGED_BYTES);
        let blocks = blocks_for(self.n_ids, u64::from(BLOCK_THREADS), sm_count);
        let plan = |entry: Entry, shared: u32| LaunchPlan { kernel: entry.name(), blocks, lanes: 1, copy_width: 0, shared_bytes: shared };
        Ok(BucketPlan {
            count: plan(Entry::BucketCount { id: self.id_type }, if staged { staged_bytes as u32 } else { 0 }),
            place: plan(Entry::BucketPlace { id: self.id_type }, 0),
            params: BucketParams {
                first_rows: self.first_rows,
                ranks: u64::from(self.ranks),
                staged: u64::from(staged),
                ids: self.ids,
                n_ids: self.n_ids,
                owner: self.owner,
                counts: self.counts,
                cursors: self.cursors,
                out_ids: self.out_ids,
                positions: self.positions,
            },
        })
    }
}

impl BucketArgs {
    /// The scan between the two bucket steps, on the device: `counts` into
    /// `cursors`, by one thread.
    pub(crate) fn scan_plan(&self) -> (LaunchPlan, ScanParams) {
        let plan = LaunchPlan { kernel: Entry::Scan.name(), blocks: 1, lanes: 1, copy_width: 0, shared_bytes: 0 };
        (plan, ScanParams { counts: self.counts, cursors: self.cursors, n: u64::from(self.ranks) })
    }
}

impl CheckArgs {
    /// Checks the arguments and lays out the launch.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] for an empty range or a null
    /// address (with ids).
    pub(crate) fn plan_params(&self, sm_count: u32) -> Result<(LaunchPlan, CheckParams), KernelError> {
        if self.lo > self.hi {
            return Err(invalid(format!("the id range {}..{} is reversed", self.lo, self.hi)));
        }
        if self.n_ids > 0 {
            nonzero("ids", self.ids)?;
            nonzero("status", self.status)?;
        }
        let plan = LaunchPlan {
            kernel: Entry::CheckIds { id: self.id_type }.name(),
            blocks: blocks_for(self.n_ids, u64::from(BLOCK_THREADS), sm_count),
            lanes: 1,
            copy_width: 0,
            shared_bytes: 0,
        };
        let params = CheckParams { ids: self.ids, n_ids: self.n_ids, lo: self.lo as u64, hi: self.hi as u64, status: self.status };
        Ok((plan, params))
    }
}

/// The two repeat launches: (mark, keep).
#[derive(Debug)]
pub(crate) struct RepeatPlan {
    pub mark: LaunchPlan,
    pub keep: LaunchPlan,
    pub params: RepeatParams,
}

impl RepeatArgs {
    /// Checks the arguments and lays out the two launches.
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] for more ids than `u32` positions
    /// hold, a capacity that is not a power of two above the ids, a
    /// reversed range or a null address (with ids).
    pub(crate) fn plan_params(&self, sm_count: u32) -> Result<RepeatPlan, KernelError> {
        if self.n_ids > u64::from(u32::MAX) {
            return Err(invalid(format!("{} ids do not fit the u32 positions of the repeat table", self.n_ids)));
        }
        if !self.capacity.is_power_of_two() || self.capacity <= self.n_ids {
            return Err(invalid(format!(
                "a repeat table of {} slots for {} ids; it needs a power of two above them",
                self.capacity, self.n_ids
            )));
        }
        if self.lo > self.hi {
            return Err(invalid(format!("the id range {}..{} is reversed", self.lo, self.hi)));
        }
        if self.n_ids > 0 {
            for (what, addr) in [("ids", self.ids), ("keys", self.keys), ("vals", self.vals), ("keep", self.keep)] {
                nonzero(what, addr)?;
            }
        }
        let blocks = blocks_for(self.n_ids, u64::from(BLOCK_THREADS), sm_count);
        let plan = |entry: Entry| LaunchPlan { kernel: entry.name(), blocks, lanes: 1, copy_width: 0, shared_bytes: 0 };
        Ok(RepeatPlan {
            mark: plan(Entry::RepeatMark { id: self.id_type }),
            keep: plan(Entry::RepeatKeep { id: self.id_type }),
            params: RepeatParams {
                ids: self.ids,
                n_ids: self.n_ids,
                lo: self.lo as u64,
                hi: self.hi as u64,
                keys: self.keys,
                vals: self.vals,
                mask: self.capacity - 1,
                keep: self.keep,
            },
        })
    }
}

/// Exclusive prefix sum of bucket counts: the cursors of `bucket_place`.
pub(crate) fn exclusive_prefix_sum(counts: &[u32]) -> Vec<u32> {
    counts
        .iter()
        .scan(0u32, |acc, &c| {
            let start = *acc;
            *acc += c;
            Some(start)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::IdType;
    use super::*;

    fn gather(dim: u32, table: DType, out: DType) -> GatherArgs {
        GatherArgs {
            bases: 0x7000_0000_0000,
            first_rows: 0x7100_0000_0000,
            ranks: 4,
            row_stride_bytes: u64::from(dim) * table.size() as u64,
            table_dtype: table,
            dim,
            ids: 0x7200_0000_0000,
            id_type: IdType::I64,
            n_ids: 100_000,
            out: 0x7300_0000_0000,
            out_stride_bytes: u64::from(dim) * out.size() as u64,
            out_dtype: out,
            status: 0,
        }
    }

    #[test]
    fn same_type_rows_copy_in_the_widest_aligned_units() {
        // 128 f32 = 512 bytes: 16-byte units, 32 of them, a full warp per row.
        let p = gather(128, DType::F32, DType::F32).plan(132).unwrap();
        assert_eq!((p.kernel.as_str(), p.copy_width, p.lanes), ("wm_gather_copy16_i64", 16, 32));
        assert_eq!(p.blocks, 132 * 8, "capped; grid-stride loops do the rest");
        assert_eq!(p.shared_bytes, 5 * 8);
        // 3 f32 = 12 bytes: 4-byte units, 3 of them, 4 lanes per row.
        let p = gather(3, DType::F32, DType::F32).plan(132).unwrap();
        assert_eq!((p.copy_width, p.lanes), (4, 4));
        // An output stride of 8 bytes per 16-byte-multiple row limits to 8.
        let mut a = gather(4, DType::F32, DType::F32);
        a.out_stride_bytes = 24;
        assert_eq!(a.plan(1).unwrap().copy_width, 8);
        // An odd i8 row is copied byte by byte, one thread per row.
        let p = gather(1, DType::I8, DType::I8).plan(1).unwrap();
        assert_eq!((p.copy_width, p.lanes, p.kernel.as_str()), (1, 1, "wm_gather_copy1_i64"));
        // A 2-byte-aligned output of f16 rows.
        let mut a = gather(8, DType::F16, DType::F16);
        a.out = 0x7300_0000_0002;
        assert_eq!(a.plan(1).unwrap().copy_width, 2);
    }

    #[test]
    fn converting_rows_take_one_element_per_lane() {
        let a = gather(100, DType::F64, DType::Bf16);
        let (p, params) = a.plan_params(10).unwrap();
        assert_eq!((p.kernel.as_str(), p.copy_width, p.lanes), ("wm_gather_i64_f64_bf16", 0, 32));
        assert_eq!((params.units, params.lanes_log2, params.staged), (100, 5, 1));
        let mut s = ScatterArgs {
            bases: 1 << 40,
            first_rows: 2 << 40,
            ranks: 1,
            row_stride_bytes: 64,
            table_dtype: DType::I64,
            dim: 5,
            ids: 3 << 40,
            id_type: IdType::I32,
            n_ids: 10,
            src: 4 << 40,
            src_stride_bytes: 5,
            src_dtype: DType::I8,
            keep: 5 << 40,
            status: 6 << 40,
        };
        let (p, params) = s.plan_params(10).unwrap();
        // Scatter names read-side type first: i8 input into an i64 table.
        assert_eq!((p.kernel.as_str(), p.lanes, p.blocks), ("wm_scatter_i32_i8_i64", 8, 1));
        assert_eq!((params.keep, params.staged, p.shared_bytes), (5 << 40, 0, 0), "one owner needs no staging");
        assert_eq!(params.status, 6 << 40, "the status word reaches the kernel");
        s.src_dtype = DType::F32;
        assert_eq!(s.plan(10).unwrap_err(), KernelError::UnsupportedPair { from: DType::F32, to: DType::I64 });
    }

    #[test]
    fn bad_arguments_are_refused_with_the_values() {
        let ok = gather(16, DType::F32, DType::F16);
        let cases: Vec<(GatherArgs, &str)> = vec![
            (GatherArgs { ranks: 0, ..ok }, "ranks is 0"),
            (GatherArgs { dim: 0, ..ok }, "dim is 0"),
            (GatherArgs { row_stride_bytes: 60, ..ok }, "row_stride_bytes 60"),
            (GatherArgs { row_stride_bytes: 66, ..ok }, "row_stride_bytes 66"),
            (GatherArgs { out_stride_bytes: 30, ..ok }, "out_stride_bytes 30"),
            (GatherArgs { out: 0x7300_0000_0001, ..ok }, "not aligned"),
            (GatherArgs { ids: 0, ..ok }, "ids is a null"),
            (GatherArgs { out_dtype: DType::I16, ..ok }, "do not convert f32 to i16"),
        ];
        for (a, want) in cases {
            let e = a.plan(1).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        // No ids: null addresses are fine (nothing is launched).
        assert!(GatherArgs { n_ids: 0, ids: 0, out: 0, ..ok }.plan(1).is_ok());
    }

    #[test]
    fn many_owners_search_global_memory() {
        let a = GatherArgs { ranks: 4095, ..gather(8, DType::F32, DType::F32) };
        assert_eq!(a.plan(1).unwrap().shared_bytes, 4096 * 8);
        let a = GatherArgs { ranks: 4096, ..a };
        assert_eq!(a.plan(1).unwrap().shared_bytes, 0);
    }

    #[test]
    fn kernels_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<super::super::Kernels>();
    }

    #[test]
    fn bucket_layout_and_cursors() {
        let b = BucketArgs {
            first_rows: 1,
            ranks: 8,
            ids: 2,
            id_type: IdType::I32,
            n_ids: 1000,
            owner: 3,
            counts: 4,
            cursors: 5,
            out_ids: 6,
            positions: 7,
        };
        let p = b.plan_params(4).unwrap();
        assert_eq!((p.count.kernel.as_str(), p.place.kernel.as_str()), ("wm_bucket_count_i32", "wm_bucket_place_i32"));
        assert_eq!((p.count.blocks, p.count.shared_bytes, p.place.shared_bytes), (4, 9 * 8 + 8 * 4, 0));
        assert!(BucketArgs { n_ids: 1 << 32, ..b }.plan_params(4).is_err());
        assert!(BucketArgs { counts: 0, ..b }.plan_params(4).unwrap_err().to_string().contains("counts"));
        assert_eq!(exclusive_prefix_sum(&[3, 0, 5, 1]), vec![0, 3, 3, 8]);
    }

    #[test]
    fn id_checks_and_repeat_tables_refuse_what_the_kernels_cannot_do() {
        let c = CheckArgs { ids: 1, id_type: IdType::I64, n_ids: 1000, lo: 0, hi: 10, status: 2 };
        let (p, params) = c.plan_params(4).unwrap();
        assert_eq!((p.kernel.as_str(), p.blocks, params.lo, params.hi), ("wm_check_ids_i64", 4, 0, 10));
        // A negative bound travels as its bits.
        let (_, params) = CheckArgs { lo: -5, ..c }.plan_params(4).unwrap();
        assert_eq!(params.lo as i64, -5);
        assert!(CheckArgs { lo: 11, ..c }.plan_params(4).unwrap_err().to_string().contains("11..10"));
        assert!(CheckArgs { status: 0, ..c }.plan_params(4).unwrap_err().to_string().contains("status"));
        assert!(CheckArgs { n_ids: 0, ids: 0, status: 0, ..c }.plan_params(4).is_ok(), "no ids: nothing launched");

        let r = RepeatArgs { ids: 1, id_type: IdType::I32, n_ids: 100, lo: 0, hi: 50, keys: 2, vals: 3, capacity: 256, keep: 4 };
        let p = r.plan_params(2).unwrap();
        assert_eq!((p.mark.kernel.as_str(), p.keep.kernel.as_str(), p.params.mask), ("wm_repeat_mark_i32", "wm_repeat_keep_i32", 255));
        for (bad, want) in [
            (RepeatArgs { capacity: 100, ..r }, "100 slots"),
            (RepeatArgs { capacity: 64, ..r }, "64 slots for 100 ids"),
            (RepeatArgs { n_ids: 1 << 32, capacity: 1 << 33, ..r }, "u32 positions"),
            (RepeatArgs { keep: 0, ..r }, "keep"),
            (RepeatArgs { lo: 60, ..r }, "60..50"),
        ] {
            let e = bad.plan_params(2).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
        }
        let b = BucketArgs {
            first_rows: 1,
            ranks: 3,
            ids: 2,
            id_type: IdType::I64,
            n_ids: 9,
            owner: 3,
            counts: 4,
            cursors: 5,
            out_ids: 6,
            positions: 7,
        };
        let (p, params) = b.scan_plan();
        assert_eq!((p.kernel.as_str(), p.blocks, params.counts, params.cursors, params.n), ("wm_exclusive_scan", 1, 4, 5, 3));
    }
}
