//! The kernels on a real GPU, against the CPU kernels: every conversion
//! pair and both id types through gather and scatter over a table of three
//! owners (one of them empty), and the two bucket steps; the id check, the
//! status word that stops the row kernels, the resolution of repeated ids
//! against its host reference, and the bucket steps with the scan on the
//! device. The kernels load
//! as users load them (`Kernels::load`: prebuilt, else NVRTC). Prints a
//! skip line where there is no driver or GPU or the kernels do not load
//! (`WM_REQUIRE_GPU=1` makes that a failure).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use super::source::allowed_pairs;
use super::{BucketArgs, CheckArgs, GatherArgs, IdType, Kernels, RepeatArgs, STATUS_OK, ScatterArgs};
use crate::DType;
use crate::kernel::RowConv;

/// Rows per owner: the middle owner holds none.
const OWNER_ROWS: [usize; 3] = [5, 0, 7];

struct Gpu {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
}

fn gpu(test: &str) -> Option<Gpu> {
    let skip = |why: String| {
        assert!(!wm_topology::env::require_gpu(), "WM_REQUIRE_GPU is set but {why}");
        println!("SKIP {test}: {why}");
        None
    };
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return skip("no CUDA driver (libcuda.so.1)".into());
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => return skip(format!("no GPU: {e}")),
    };
    let stream = ctx.new_stream().expect("a stream");
    // As users load them: the prebuilt CUBIN when there is one (a GPU
    // machine without NVRTC), else NVRTC.
    let kernels = match Kernels::load(&ctx) {
        Ok(k) => k,
        Err(e) => return skip(format!("the kernels do not load: {e}")),
    };
    println!("{test}: {} {:?} image on a GPU with {} SMs", kernels.arch(), kernels.format(), kernels.sm_count());
    Some(Gpu { _ctx: ctx, stream, kernels })
}

impl Gpu {
    fn upload(&self, bytes: &[u8]) -> CudaSlice<u8> {
        // Never empty: an owner without rows still gets an address.
        let mut v = bytes.to_vec();
        v.resize(bytes.len().max(16), 0);
        self.stream.clone_htod(&v).expect("upload")
    }
    fn addr(&self, s: &CudaSlice<u8>) -> u64 {
        s.device_ptr(&self.stream).0
    }
    fn download(&self, s: &CudaSlice<u8>, len: usize) -> Vec<u8> {
        let mut v = self.stream.clone_dtoh(s).expect("download");
        self.stream.synchronize().expect("synchronize");
        v.truncate(len);
        v
    }
}

/// `values` as `n` elements of `d` (through the CPU conversion).
fn elements(d: DType, values: &[f64]) -> Vec<u8> {
    let (from, src): (DType, Vec<u8>) = if d.is_float() {
        (DType::F64, bytemuck::cast_slice(values).to_vec())
    } else {
        let ints: Vec<i64> = values.iter().map(|&v| v as i64).collect();
        (DType::I64, bytemuck::cast_slice(&ints).to_vec())
    };
    convert(from, d, &src)
}

fn convert(from: DType, to: DType, src: &[u8]) -> Vec<u8> {
    let n = src.len() / from.size();
    let c = RowConv::new(from, to, n).unwrap();
    let mut out = vec![0u8; c.dst_bytes()];
    // SAFETY: `src` holds n elements of `from`, `out` n of `to`.
    unsafe { c.row(src.as_ptr(), out.as_mut_ptr()) };
    out
}

/// A value that depends on row and column, not exact in the narrow types,
/// and wide enough to wrap the narrow integers.
fn value(row: usize, col: usize, float: bool) -> f64 {
    if float { (row * 100 + col) as f64 * 1.37 - 500.0 + 1e-3 } else { ((row * 1000 + col) * 37) as f64 - 20_000.0 }
}

fn ids_bytes(id: IdType, ids: &[usize]) -> Vec<u8> {
    match id {
        IdType::I32 => ids.iter().flat_map(|&i| (i as i32).to_le_bytes()).collect(),
        IdType::I64 => ids.iter().flat_map(|&i| (i as i64).to_le_bytes()).collect(),
    }
}

fn first_rows() -> Vec<i64> {
    let mut v = vec![0i64];
    for r in OWNER_ROWS {
        v.push(v.last().unwrap() + r as i64);
    }
    v
}

fn owner_of(row: usize) -> (usize, usize) {
    let f = first_rows();
    let r = (0..OWNER_ROWS.len()).rev().find(|&r| f[r] as usize <= row && row < f[r + 1] as usize).unwrap();
    (r, row - f[r] as usize)
}

#[test]
fn kernels_run_like_the_cpu_kernels() {
    let Some(g) = gpu("kernels_run_like_the_cpu_kernels") else { return };
    let rows: usize = OWNER_ROWS.iter().sum();
    let ids: Vec<usize> = (0..40).map(|i| (i * 7 + 3) % rows).collect();
    let fr = g.upload(bytemuck::cast_slice(&first_rows()));
    for id_type in [IdType::I32, IdType::I64] {
        let dev_ids = g.upload(&ids_bytes(id_type, &ids));
        let case = Case { g: &g, fr: &fr, dev_ids: &dev_ids, id_type, ids: &ids, rows };
        for (from, to) in allowed_pairs() {
            for dim in [1usize, 7, 64] {
                gather_matches(&case, from, to, dim);
                scatter_matches(&case, from, to, dim);
            }
        }
        bucket_matches(&case);
    }
}

/// One id type's ids on the device, for [`kernels_run_like_the_cpu_kernels`].
struct Case<'a> {
    g: &'a Gpu,
    /// The owners' first rows, on the device.
    fr: &'a CudaSlice<u8>,
    dev_ids: &'a CudaSlice<u8>,
    id_type: IdType,
    ids: &'a [usize],
    /// Rows of the table.
    rows: usize,
}

/// The gather of `c`'s ids from a table of `from` into rows of `to`.
fn gather_matches(c: &Case<'_>, from: DType, to: DType, dim: usize) {
    let Case { g, fr, dev_ids, id_type, ids, rows } = *c;
    // ---- gather: a table of `from`, rows padded to a 16-byte multiple plus 16.
    let stride = (dim * from.size()).div_ceil(16) * 16 + 16;
    let mut owners: Vec<Vec<u8>> = OWNER_ROWS.iter().map(|&n| vec![0u8; n * stride]).collect();
    for row in 0..rows {
        let (r, k) = owner_of(row);
        let vals: Vec<f64> = (0..dim).map(|c| value(row, c, from.is_float())).collect();
        owners[r][k * stride..][..dim * from.size()].copy_from_slice(&elements(from, &vals));
    }
    let dev_owners: Vec<CudaSlice<u8>> = owners.iter().map(|o| g.upload(o)).collect();
    let bases: Vec<u64> = dev_owners.iter().map(|o| g.addr(o)).collect();
    let dev_bases = g.upload(bytemuck::cast_slice(&bases));
    let out_row = dim * to.size();
    let out = g.upload(&vec![0u8; ids.len() * out_row]);
    let args = GatherArgs {
        bases: g.addr(&dev_bases),
        first_rows: g.addr(fr),
        ranks: OWNER_ROWS.len() as u32,
        row_stride_bytes: stride as u64,
        table_dtype: from,
        dim: dim as u32,
        ids: g.addr(dev_ids),
        id_type,
        n_ids: ids.len() as u64,
        out: g.addr(&out),
        out_stride_bytes: out_row as u64,
        out_dtype: to,
        status: 0,
    };
    // SAFETY: every address is a live allocation of the sizes in `args`; ids are in range.
    unsafe { g.kernels.gather(&g.stream, &args) }.unwrap();
    let got = g.download(&out, ids.len() * out_row);
    for (i, &id) in ids.iter().enumerate() {
        let (r, k) = owner_of(id);
        let want = convert(from, to, &owners[r][k * stride..][..dim * from.size()]);
        assert_eq!(&got[i * out_row..][..out_row], &want[..], "gather {id_type:?} {from} -> {to} dim {dim}, output row {i} (id {id})");
    }
}

/// The scatter of rows of `from` to `c`'s ids in a table of `to`.
fn scatter_matches(c: &Case<'_>, from: DType, to: DType, dim: usize) {
    let Case { g, fr, dev_ids, id_type, ids, rows } = *c;
    // ---- scatter: dense rows of `from` into a zeroed table of `to`; the last occurrence wins.
    let t_stride = (dim * to.size()).div_ceil(16) * 16 + 16;
    let table: Vec<CudaSlice<u8>> = OWNER_ROWS.iter().map(|&n| g.upload(&vec![0u8; n * t_stride])).collect();
    let bases: Vec<u64> = table.iter().map(|o| g.addr(o)).collect();
    let dev_bases = g.upload(bytemuck::cast_slice(&bases));
    let src_row = dim * from.size();
    let src: Vec<u8> =
        (0..ids.len()).flat_map(|i| elements(from, &(0..dim).map(|c| value(i + 50, c, from.is_float())).collect::<Vec<_>>())).collect();
    let mut last = vec![None; rows];
    for (i, &id) in ids.iter().enumerate() {
        last[id] = Some(i);
    }
    let keep: Vec<u8> = ids.iter().enumerate().map(|(i, &id)| u8::from(last[id] == Some(i))).collect();
    let dev_src = g.upload(&src);
    let dev_keep = g.upload(&keep);
    let args = ScatterArgs {
        bases: g.addr(&dev_bases),
        first_rows: g.addr(fr),
        ranks: OWNER_ROWS.len() as u32,
        row_stride_bytes: t_stride as u64,
        table_dtype: to,
        dim: dim as u32,
        ids: g.addr(dev_ids),
        id_type,
        n_ids: ids.len() as u64,
        src: g.addr(&dev_src),
        src_stride_bytes: src_row as u64,
        src_dtype: from,
        keep: g.addr(&dev_keep),
        status: 0,
    };
    // SAFETY: as for the gather; kept ids are distinct.
    unsafe { g.kernels.scatter(&g.stream, &args) }.unwrap();
    let got: Vec<Vec<u8>> = table.iter().zip(OWNER_ROWS).map(|(t, n)| g.download(t, n * t_stride)).collect();
    for (row, l) in last.iter().enumerate() {
        let (r, k) = owner_of(row);
        let mut want = vec![0u8; t_stride];
        if let Some(i) = *l {
            want[..dim * to.size()].copy_from_slice(&convert(from, to, &src[i * src_row..][..src_row]));
        }
        assert_eq!(&got[r][k * t_stride..][..t_stride], &want[..], "scatter {id_type:?} {from} -> {to} dim {dim}, row {row}");
    }
}

/// The bucket steps over `c`'s ids.
fn bucket_matches(c: &Case<'_>) {
    let Case { g, fr, dev_ids, id_type, ids, .. } = *c;
    // ---- bucket: counts per owner, ids grouped by owner with their positions.
    let n = ids.len();
    let owner = g.upload(&vec![0u8; n * 4]);
    let counts = g.upload(&[0xffu8; 12]);
    let cursors = g.upload(&[0u8; 12]);
    let out_ids = g.upload(&vec![0u8; n * 8]);
    let positions = g.upload(&vec![0u8; n * 4]);
    let args = BucketArgs {
        first_rows: g.addr(fr),
        ranks: OWNER_ROWS.len() as u32,
        ids: g.addr(dev_ids),
        id_type,
        n_ids: n as u64,
        owner: g.addr(&owner),
        counts: g.addr(&counts),
        cursors: g.addr(&cursors),
        out_ids: g.addr(&out_ids),
        positions: g.addr(&positions),
    };
    // SAFETY: every address is a live allocation of the sizes in `args`; ids are in range.
    let got_counts = unsafe { g.kernels.bucket(&g.stream, &args) }.unwrap();
    let mut want_counts = vec![0u32; OWNER_ROWS.len()];
    ids.iter().for_each(|&id| want_counts[owner_of(id).0] += 1);
    assert_eq!(got_counts, want_counts, "bucket counts {id_type:?}");
    let owners: Vec<u32> = bytemuck::pod_collect_to_vec(&g.download(&owner, n * 4));
    assert_eq!(owners, ids.iter().map(|&id| owner_of(id).0 as u32).collect::<Vec<_>>());
    let out: Vec<i64> = bytemuck::pod_collect_to_vec(&g.download(&out_ids, n * 8));
    let pos: Vec<u32> = bytemuck::pod_collect_to_vec(&g.download(&positions, n * 4));
    let mut seen = vec![false; n];
    let mut slot = 0;
    for (r, &c) in want_counts.iter().enumerate() {
        for s in slot..slot + c as usize {
            let p = pos[s] as usize;
            assert!(!seen[p], "position {p} placed twice");
            seen[p] = true;
            assert_eq!(out[s], ids[p] as i64, "slot {s}");
            assert_eq!(owner_of(ids[p]).0, r, "slot {s} is in owner {r}'s bucket");
        }
        slot += c as usize;
    }
}

#[test]
fn checks_repeats_and_device_buckets_run_like_their_references() {
    let Some(g) = gpu("checks_repeats_and_device_buckets_run_like_their_references") else { return };
    let rows: usize = OWNER_ROWS.iter().sum();
    let fr = g.upload(bytemuck::cast_slice(&first_rows()));
    for id_type in [IdType::I32, IdType::I64] {
        check_and_status_match(&g, id_type, rows);
        repeats_match(&g, id_type);
        device_buckets_match(&g, &fr, id_type, rows);
    }
}

/// Ids, any of them out of range, as `id_type`'s bytes.
fn signed_ids_bytes(id_type: IdType, ids: &[i64]) -> Vec<u8> {
    match id_type {
        IdType::I32 => ids.iter().flat_map(|&i| (i as i32).to_le_bytes()).collect(),
        IdType::I64 => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
    }
}

/// The id check over a table of `rows` rows, and a row kernel after it.
fn check_and_status_match(g: &Gpu, id_type: IdType, rows: usize) {
    // ---- the check: the first position of an id outside 0..rows.
    let ids: Vec<i64> = (0..5000).map(|i| (i * 7 + 3) as i64 % rows as i64).collect();
    for bad in [None, Some((4000usize, -3i64)), Some((17, rows as i64))] {
        let mut with = ids.clone();
        if let Some((at, v)) = bad {
            with[at] = v;
            with[4999] = -1; // a later bad one: the first is reported
        }
        let dev_ids = g.upload(&signed_ids_bytes(id_type, &with));
        let status = g.upload(&[0u8; 8]);
        // SAFETY: `status` holds one u64; `dev_ids` the ids.
        unsafe {
            g.kernels.reset_status(&g.stream, g.addr(&status), 1).unwrap();
            g.kernels
                .check_ids(
                    &g.stream,
                    &CheckArgs {
                        ids: g.addr(&dev_ids),
                        id_type,
                        n_ids: with.len() as u64,
                        lo: 0,
                        hi: rows as i64,
                        status: g.addr(&status),
                    },
                )
                .unwrap();
        }
        let word = u64::from_le_bytes(g.download(&status, 8).try_into().unwrap());
        assert_eq!(word, bad.map_or(STATUS_OK, |(at, _)| at as u64), "{id_type:?} {bad:?}");
        // ---- a row kernel given a set status word moves nothing.
        let out = g.upload(&vec![0u8; with.len() * 4]);
        let table = g.upload(&vec![0xabu8; rows * 4]);
        let bases = g.upload(&g.addr(&table).to_le_bytes());
        let one_owner = g.upload(bytemuck::cast_slice(&[0i64, rows as i64]));
        if bad.is_none() {
            let args = GatherArgs {
                bases: g.addr(&bases),
                first_rows: g.addr(&one_owner),
                ranks: 1,
                row_stride_bytes: 4,
                table_dtype: DType::F32,
                dim: 1,
                ids: g.addr(&dev_ids),
                id_type,
                n_ids: with.len() as u64,
                out: g.addr(&out),
                out_stride_bytes: 4,
                out_dtype: DType::F32,
                status: g.addr(&status),
            };
            // SAFETY: every address is a live allocation of the sizes in `args`; ids are in range.
            unsafe { g.kernels.gather(&g.stream, &args) }.unwrap();
            assert!(g.download(&out, with.len() * 4).iter().all(|&b| b == 0xab), "a clean status lets the gather run");
        } else {
            // Bad ids, but the status word stops the launch before any row is read.
            let args = ScatterArgs {
                bases: g.addr(&bases),
                first_rows: g.addr(&one_owner),
                ranks: 1,
                row_stride_bytes: 4,
                table_dtype: DType::F32,
                dim: 1,
                ids: g.addr(&dev_ids),
                id_type,
                n_ids: with.len() as u64,
                src: g.addr(&out),
                src_stride_bytes: 4,
                src_dtype: DType::F32,
                keep: 0,
                status: g.addr(&status),
            };
            // SAFETY: as above; the bad ids are never used (the status word is set).
            unsafe { g.kernels.scatter(&g.stream, &args) }.unwrap();
            assert!(g.download(&table, rows * 4).iter().all(|&b| b == 0xab), "a set status word stops the scatter");
        }
    }
}

/// The resolution of repeated ids against its host reference.
fn repeats_match(g: &Gpu, id_type: IdType) {
    // ---- repeats: the keep mask is the host reference's (many repeats, a few out of range).
    let ids: Vec<i64> = (0..20_000).map(|i| ((i * 2_654_435_761u64 as usize) >> 7) as i64 % 9 - 1).collect();
    let (lo, hi) = (0i64, 7i64);
    let cap = super::repeats::capacity(ids.len());
    let dev_ids = g.upload(&signed_ids_bytes(id_type, &ids));
    let keys = g.upload(&vec![0u8; cap * 8]);
    let vals = g.upload(&vec![0u8; cap * 4]);
    let keep = g.upload(&vec![0x55u8; ids.len()]);
    let args = RepeatArgs {
        ids: g.addr(&dev_ids),
        id_type,
        n_ids: ids.len() as u64,
        lo,
        hi,
        keys: g.addr(&keys),
        vals: g.addr(&vals),
        capacity: cap as u64,
        keep: g.addr(&keep),
    };
    // SAFETY: every buffer is sized as RepeatArgs documents.
    unsafe { g.kernels.resolve_repeats(&g.stream, &args) }.unwrap();
    assert_eq!(g.download(&keep, ids.len()), super::repeats::keep_mask(&ids, lo, hi), "{id_type:?} keep mask");
}

/// The bucket steps with the scan on the device, over a table of `rows`.
fn device_buckets_match(g: &Gpu, fr: &CudaSlice<u8>, id_type: IdType, rows: usize) {
    // ---- buckets with the scan on the device: the same as the host-scan steps.
    let ids: Vec<usize> = (0..3000).map(|i| (i * 11 + 5) % rows).collect();
    let dev_ids = g.upload(&ids_bytes(id_type, &ids));
    let n = ids.len();
    let owner = g.upload(&vec![0u8; n * 4]);
    let counts = g.upload(&[0xffu8; 12]);
    let cursors = g.upload(&[0u8; 12]);
    let out_ids = g.upload(&vec![0u8; n * 8]);
    let positions = g.upload(&vec![0u8; n * 4]);
    let args = BucketArgs {
        first_rows: g.addr(fr),
        ranks: OWNER_ROWS.len() as u32,
        ids: g.addr(&dev_ids),
        id_type,
        n_ids: n as u64,
        owner: g.addr(&owner),
        counts: g.addr(&counts),
        cursors: g.addr(&cursors),
        out_ids: g.addr(&out_ids),
        positions: g.addr(&positions),
    };
    // SAFETY: every address is a live allocation of the sizes in `args`; ids are in range.
    unsafe { g.kernels.bucket_on_device(&g.stream, &args) }.unwrap();
    let got: Vec<u32> = bytemuck::pod_collect_to_vec(&g.download(&counts, 12));
    let mut want = vec![0u32; OWNER_ROWS.len()];
    ids.iter().for_each(|&id| want[owner_of(id).0] += 1);
    assert_eq!(got, want, "device bucket counts {id_type:?}");
    let ends: Vec<u32> = bytemuck::pod_collect_to_vec(&g.download(&cursors, 12));
    let mut acc = 0;
    let want_ends: Vec<u32> = want
        .iter()
        .map(|&c| {
            acc += c;
            acc
        })
        .collect();
    assert_eq!(ends, want_ends, "after place, each cursor is its bucket's end");
    let out: Vec<i64> = bytemuck::pod_collect_to_vec(&g.download(&out_ids, n * 8));
    let pos: Vec<u32> = bytemuck::pod_collect_to_vec(&g.download(&positions, n * 4));
    let mut start = 0usize;
    for (r, &c) in want.iter().enumerate() {
        for s in start..start + c as usize {
            assert_eq!(out[s], ids[pos[s] as usize] as i64);
            assert_eq!(owner_of(ids[pos[s] as usize]).0, r);
        }
        start += c as usize;
    }
}
