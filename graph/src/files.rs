//! Storing a graph in sharded `.npy` files and loading it back.

use std::path::Path;
use std::sync::Arc;

use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wholemem::files::{RowFormat, ShardSet, StoreTarget};
use wholemem::{DType, Location, MemoryType, Partition};
use wm_comm::{CommExt, Communicator};

use crate::collective::agree_same_header;
use crate::csr::{ColIndex, CsrGraph, IdType, vector};
use crate::{Error, Result};

const ROW_PTR: &str = "row_ptr";
const COL_IND: &str = "col_ind";
const WEIGHTS: &str = "weights";

/// Rows read at a time when checking loaded values.
const CHECK_ROWS: usize = 1 << 20;

/// Writes `graph` under `dir` collectively: `dir/row_ptr/`, `dir/col_ind/`
/// and, for a weighted graph, `dir/weights/`, each a directory of one
/// `shard_NNNN.npy` per rank holding that rank's rows (see
/// `wholemem::files::store`). `row_ptr` holds global edge offsets, so the
/// shards stack into one CSR whatever the rank count that loads them.
///
/// # Errors
/// As `wholemem::files::store`, on every rank.
pub fn store(graph: &CsrGraph, dir: &Path) -> Result<()> {
    graph.row_ptr.store(&StoreTarget::NpyDir(dir.join(ROW_PTR)))?;
    match &graph.col_ind {
        ColIndex::I32(t) => t.store(&StoreTarget::NpyDir(dir.join(COL_IND)))?,
        ColIndex::I64(t) => t.store(&StoreTarget::NpyDir(dir.join(COL_IND)))?,
    }
    if let Some(w) = &graph.weights {
        w.store(&StoreTarget::NpyDir(dir.join(WEIGHTS)))?;
    }
    Ok(())
}

/// What the files under a graph directory hold, from their headers.
fn discover(dir: &Path) -> Result<[u64; 4]> {
    let scalar = |elem| RowFormat { elem, shape: Vec::new() };
    let rp = ShardSet::npy_dir(dir.join(ROW_PTR)).discover(&scalar(DType::I64))?;
    let ci = ShardSet::npy_dir(dir.join(COL_IND)).discover(&scalar(DType::I64))?;
    let name = |p: &str| dir.join(p).display().to_string();
    if rp.element_type() != DType::I64 || !rp.row_shape().is_empty() {
        return Err(Error::BadGraph(format!(
            "{}: row offsets must be one-dimensional i64, not {} {:?}",
            name(ROW_PTR),
            rp.element_type(),
            rp.row_shape()
        )));
    }
    let ids = match ci.element_type() {
        DType::I32 => 32,
        DType::I64 => 64,
        other => return Err(Error::BadGraph(format!("{}: neighbour ids must be i32 or i64, not {other}", name(COL_IND)))),
    };
    if !ci.row_shape().is_empty() {
        return Err(Error::BadGraph(format!("{}: neighbour ids must be one-dimensional, not rows of {:?}", name(COL_IND), ci.row_shape())));
    }
    if rp.rows() < 2 || ci.rows() == 0 {
        return Err(Error::BadGraph(format!(
            "{}: {} row offsets and {} edges; a graph needs a node and an edge",
            dir.display(),
            rp.rows(),
            ci.rows()
        )));
    }
    let weighted = dir.join(WEIGHTS).exists();
    if weighted {
        let w = ShardSet::npy_dir(dir.join(WEIGHTS)).discover(&scalar(DType::F32))?;
        if w.element_type() != DType::F32 || !w.row_shape().is_empty() || w.rows() != ci.rows() {
            return Err(Error::BadGraph(format!(
                "{}: {} {} weights of shape {:?} for {} edges; one f32 per edge",
                name(WEIGHTS),
                w.rows(),
                w.element_type(),
                w.row_shape(),
                ci.rows()
            )));
        }
    }
    Ok([rp.rows() - 1, ci.rows(), ids, u64::from(weighted)])
}

/// Loads a graph that [`store`] wrote (with any rank count) collectively,
/// into tables of type `ty` at `loc`, with `partition` nodes per rank (the
/// default split for `None`). Each rank reads only its own rows, and checks
/// them: offsets that start at 0, never fall, and end at the edge count;
/// neighbour ids in range; weights finite and not negative.
///
/// # Errors
/// On every rank: [`Error::BadGraph`] naming the directory and the first
/// problem; [`Error::Memory`] for files `wholemem::files::load` refuses
/// (missing, malformed, of other element types); [`wholemem::CommonError::InvalidArgument`]
/// for a partition that does not fit or arguments that differ between
/// ranks.
pub fn load(comm: &Arc<dyn Communicator>, dir: &Path, ty: MemoryType, loc: Location, partition: Option<&[usize]>) -> Result<CsrGraph> {
    let world = comm.size();
    let found = discover(dir);
    let header = found.as_ref().map_or_else(|_| vec![0; 4], |h| h.to_vec());
    let [n, e, ids, weighted] =
        agree_same_header(comm.as_ref(), found, &header, |h| format!("found {h:?} (nodes, edges, id bits, weighted)"))?;
    let (n, e) = (n as usize, e as usize);
    let ids = if ids == 32 { IdType::I32 } else { IdType::I64 };
    let nodes = match partition {
        None => Ok(Partition::even(n, world)),
        Some(p) if p.len() == world && p.iter().try_fold(0usize, |a, &c| a.checked_add(c)) == Some(n) => Ok(Partition::from_counts(p)),
        Some(p) => {
            Err(Error::Common(CommonError::InvalidArgument(format!("the node partition {p:?} is not {world} counts summing to {n} nodes"))))
        }
    };
    let nodes = agree(comm.as_ref(), nodes, Rule::Lowest)?;
    let me = comm.rank();
    let mut ptr_counts = nodes.counts();
    ptr_counts[world - 1] += 1;
    let bad = |what: String| Error::BadGraph(format!("{}: {what}", dir.join(ROW_PTR).display()));

    // 1. Offsets: each rank's own, checked; the edge partition from them.
    let mut row_ptr = vector::<i64>(comm, ty, loc, n + 1, &ptr_counts)?;
    row_ptr.load(&ShardSet::npy_dir(dir.join(ROW_PTR)))?;
    let first = nodes.offset(me);
    let mut own = vec![0i64; ptr_counts[me]];
    row_ptr.memory().read_rows(first, bytemuck::cast_slice_mut(&mut own))?;
    // Rising from a first offset of 0 or more: every offset is then below
    // 2^63, clear of the `u64::MAX` that marks a rank without offsets below
    // (an offset of -1 read as that would pass for none).
    let rising = match (own.first(), own.windows(2).position(|w| w[1] < w[0])) {
        (Some(&v), _) if v < 0 => Err(bad(format!("offset {v} of node {first} is negative"))),
        (_, Some(i)) => {
            Err(bad(format!("offset {} of node {} is below offset {} of node {}", own[i + 1], first + i + 1, own[i], first + i)))
        }
        _ => Ok(()),
    };
    agree(comm.as_ref(), rising, Rule::Lowest)?;
    let firsts = comm.allgather_value(own.first().map_or(u64::MAX, |&v| v as u64))?;
    let lasts = comm.allgather_value(own.last().map_or(u64::MAX, |&v| v as u64))?;
    let mut starts = vec![e as u64; world + 1];
    for r in (0..world).rev() {
        starts[r] = if firsts[r] == u64::MAX { starts[r + 1] } else { firsts[r] };
    }
    // The same checks on every rank, from the same allgathered values.
    if starts[0] != 0 {
        return Err(bad(format!("the first offset is {}, not 0", starts[0])));
    }
    if lasts[world - 1] != e as u64 {
        return Err(bad(format!("the last offset is {}, not the edge count {e}", lasts[world - 1] as i64)));
    }
    for r in 0..world {
        let top = if r + 1 == world { e as u64 } else { starts[r + 1] };
        if starts[r] > top || (lasts[r] != u64::MAX && lasts[r] > top) {
            return Err(bad(format!(
                "offsets of rank {r}'s nodes run past those that follow ({} > {top})",
                lasts[r].max(starts[r]) as i64
            )));
        }
    }
    let edge_counts: Vec<usize> = starts.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
    let edges = Partition::from_counts(&edge_counts);

    // 2. Neighbour ids and weights, each rank checking its own.
    let mut col_ind = ColIndex::allocate(comm, ty, loc, ids, &edge_counts)?;
    match &mut col_ind {
        ColIndex::I32(t) => t.load(&ShardSet::npy_dir(dir.join(COL_IND)))?,
        ColIndex::I64(t) => t.load(&ShardSet::npy_dir(dir.join(COL_IND)))?,
    };
    let range = edges.range(me);
    let checked = check_chunks(range.clone(), |at, len| {
        let mut v = vec![0i64; len];
        col_ind.read(at, &mut v)?;
        Ok(v.iter()
            .position(|&x| x < 0 || x as u64 >= n as u64)
            .map(|i| format!("neighbour id {} of edge {} is out of range for {n} nodes", v[i], at + i)))
    });
    agree(comm.as_ref(), checked.map_err(|e| with_dir(e, dir, COL_IND)), Rule::Lowest)?;
    let weights = if weighted == 1 {
        let mut w = vector::<f32>(comm, ty, loc, e, &edge_counts)?;
        w.load(&ShardSet::npy_dir(dir.join(WEIGHTS)))?;
        let checked = check_chunks(range, |at, len| {
            let mut v = vec![0f32; len];
            w.memory().read_rows(at, bytemuck::cast_slice_mut(&mut v))?;
            Ok(v.iter()
                .position(|&x| !(x.is_finite() && x >= 0.0))
                .map(|i| format!("weight {} of edge {} is not a finite, non-negative number", v[i], at + i)))
        });
        agree(comm.as_ref(), checked.map_err(|e| with_dir(e, dir, WEIGHTS)), Rule::Lowest)?;
        Some(w)
    } else {
        None
    };
    Ok(CsrGraph { comm: comm.clone(), nodes, edges, row_ptr, col_ind, weights })
}

fn with_dir(e: Error, dir: &Path, part: &str) -> Error {
    match e {
        Error::BadGraph(m) => Error::BadGraph(format!("{}: {m}", dir.join(part).display())),
        other => other,
    }
}

/// Runs `check(first, len)` over `range` in chunks; the first problem it
/// names becomes [`Error::BadGraph`].
fn check_chunks(range: std::ops::Range<usize>, mut check: impl FnMut(usize, usize) -> Result<Option<String>>) -> Result<()> {
    let mut at = range.start;
    while at < range.end {
        let len = CHECK_ROWS.min(range.end - at);
        if let Some(problem) = check(at, len)? {
            return Err(Error::BadGraph(problem));
        }
        at += len;
    }
    Ok(())
}
