//! The candle bridge (feature `candle`): gathered wholemem rows as candle
//! tensors (through a node cache where one is given), sampled blocks as index tensors, GraphSAGE's mean aggregation,
//! and `wm-embedding` tables trained through candle.
//!
//! Learnable node embeddings: [`EmbeddingVar::lookup`] gathers the rows of
//! a batch's nodes into a candle [`Var`]; the model uses
//! [`EmbeddingVar::as_tensor`]; after `loss.backward()`,
//! [`EmbeddingVar::apply`] hands the gradient rows to
//! [`Embedding::apply_gradients`], so the table's own sparse optimizer
//! (SGD, lazy Adam, AdamW, AdaGrad, RMSProp) updates only the rows the step
//! touched, on the ranks that own them: the rows of the batches the loss
//! depended on. A batch without a gradient sends no rows, so weight decay
//! and momentum leave its rows as they were.
//!
//! ```no_run
//! use candle_core::{Device, Tensor};
//! use wholemem::{Location, MemoryType};
//! use wm_embedding::{Embedding, Optimizer};
//! use wm_graph::candle_bridge::EmbeddingVar;
//! let world = wm_comm::init()?;
//! let mut emb = Embedding::<f32>::allocate(&world, MemoryType::Chunked, Location::Host, 1000, 16, None, Some(Optimizer::adam()))?;
//! let batch = EmbeddingVar::lookup(&emb, &[3, 17, 3], &Device::Cpu)?;
//! let loss = batch.as_tensor().sqr()?.sum_all()?;
//! let grads = loss.backward()?;
//! batch.apply(&mut emb, &grads, 0.01)?; // row 3 gets the sum of both rows' gradients
//! emb.free()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use wholemem::CommonError;
use wholemem::{Element, WholeTensor};
use wm_embedding::{Embedding, EmbeddingElement};
use wm_gather::cache::NodeCache;

use crate::multihop::Block;
use crate::{Error, Result};

/// Rows `ids` of a 1-D or 2-D float table as an `ids.len() × cols` f32
/// tensor on `device`, through `wm_gather::gather_into` (collective for
/// distributed and hierarchy tables).
///
/// # Errors
/// As `wm_gather::gather` (bad ids on every rank of a collective call);
/// [`Error::Memory`] naming both for `ids.len() × cols` past `usize::MAX`,
/// [`wholemem::CommonError::InvalidArgument`] for an output that cannot be allocated;
/// [`Error::Candle`].
pub fn gather_tensor<T: Element>(table: &WholeTensor<T>, ids: &[i64], device: &Device) -> Result<Tensor> {
    let (mut rows, cols) = output_rows(table, ids)?;
    wm_gather::gather_into(table, ids, &mut rows)?;
    Ok(Tensor::from_vec(rows, (ids.len(), cols), device)?)
}

/// [`gather_tensor`] through a node cache made for `table`
/// ([`NodeCache::new`] over `table.memory()` with the table's whole row,
/// `RowLayout::of(table)`): the rows other nodes own come from the cache
/// where it holds them. Collective, as the cache's gather is; the same
/// values as [`gather_tensor`].
///
/// # Errors
/// As [`gather_tensor`] and [`NodeCache::gather`] (a cache of another
/// table or layout among them).
pub fn gather_tensor_cached<T: Element>(cache: &mut NodeCache, table: &WholeTensor<T>, ids: &[i64], device: &Device) -> Result<Tensor> {
    let (mut rows, cols) = output_rows(table, ids)?;
    cache.gather(table.memory(), wm_gather::Ids::I64(ids), bytemuck::cast_slice_mut(&mut rows), wm_gather::DType::F32)?;
    Ok(Tensor::from_vec(rows, (ids.len(), cols), device)?)
}

/// A zeroed f32 output of `ids.len()` rows of `table`'s columns, and the
/// columns.
fn output_rows<T: Element>(table: &WholeTensor<T>, ids: &[i64]) -> Result<(Vec<f32>, usize)> {
    let cols = match table.desc().dims() {
        1 => 1,
        _ => table.desc().sizes()[1],
    };
    // Checked: a stride-0 dimension may have any number of columns.
    let len = wholemem::checked_size("gather_tensor's output of ids × columns", &[ids.len(), cols])?;
    let mut rows = Vec::new();
    rows.try_reserve_exact(len).map_err(|e| {
        Error::Common(CommonError::InvalidArgument(format!("gather_tensor's output of {} ids × {cols} f32 columns: {e}", ids.len())))
    })?;
    rows.resize(len, 0f32);
    Ok((rows, cols))
}

/// Indices as a `u32` tensor (candle's index type).
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] for an index past `u32::MAX`; [`Error::Candle`].
pub fn index_tensor(indices: &[usize], device: &Device) -> Result<Tensor> {
    let v: Vec<u32> = indices
        .iter()
        .map(|&i| {
            u32::try_from(i)
                .map_err(|_| Error::Common(CommonError::InvalidArgument(format!("index {i} does not fit candle's u32 indices"))))
        })
        .collect::<Result<_>>()?;
    Ok(Tensor::from_vec(v, indices.len(), device)?)
}

/// GraphSAGE's mean aggregation over one block: row `i` of the result is
/// the mean of `x`'s rows at output `i`'s sampled neighbours (zeros for an
/// output without any). `x` holds the block's inputs, one row each.
/// Differentiable. Contiguous f32 tensors on the CPU are summed in place,
/// each output row from its neighbours' rows of `x`, with no edges × cols
/// tensor in between (with 512-wide features and 28 000 sampled edges that
/// tensor was 57 MB a batch, written and read again); other tensors go
/// through candle's `index_select` and `index_add`. Both give the same
/// bits forward (the sums add in edge order from zero and divide by the
/// degree), and the same gradient terms backward; candle adds the fused
/// op's gradient to what `x` already has as one term, where its
/// `index_select` adds edge by edge, so when another use of `x` passes its
/// gradient back first the last bit may differ. In a GraphSAGE layer
/// written `self(dst) + neigh(agg)` the aggregate's gradient comes first
/// and the bits are the same (tested).
///
/// # Errors
/// [`wholemem::CommonError::InvalidArgument`] when `x` does not have one
/// row per input, or for a block whose offsets or neighbours do not fit
/// it (naming the first bad one); [`Error::Candle`].
pub fn mean_aggregate(x: &Tensor, block: &Block) -> Result<Tensor> {
    let (rows, cols) = x.dims2()?;
    if rows != block.inputs {
        return Err(Error::Common(CommonError::InvalidArgument(format!("{rows} input rows for a block of {} inputs", block.inputs))));
    }
    check_block(block)?;
    let device = x.device();
    if block.neighbors.is_empty() {
        return Ok(Tensor::zeros((block.targets, cols), x.dtype(), device)?);
    }
    if device.is_cpu() && x.dtype() == candle_core::DType::F32 && x.is_contiguous() {
        let op = MeanOp { offsets: block.offsets.clone(), neighbors: block.neighbors.clone(), targets: block.targets };
        return Ok(x.apply_op1(op)?);
    }
    unfused_mean(x, block)
}

/// [`mean_aggregate`] through candle's own operations.
fn unfused_mean(x: &Tensor, block: &Block) -> Result<Tensor> {
    let device = x.device();
    let zeros = Tensor::zeros((block.targets, x.dims2()?.1), x.dtype(), device)?;
    let gathered = x.index_select(&index_tensor(&block.neighbors, device)?, 0)?;
    let sums = zeros.index_add(&index_tensor(&block.target_index(), device)?, &gathered, 0)?;
    Ok(sums.broadcast_div(&degrees(block, x.dtype(), device)?)?)
}

/// A block's offsets and neighbours, checked against its shape: one
/// offset per target and one more, from 0, never falling, ending at the
/// neighbours' count; every neighbour an input.
fn check_block(block: &Block) -> Result<()> {
    let bad = |m: String| Err(Error::Common(CommonError::InvalidArgument(m)));
    if block.offsets.len() != block.targets + 1 {
        return bad(format!("a block of {} targets with {} offsets", block.targets, block.offsets.len()));
    }
    if block.offsets.first() != Some(&0) || block.offsets.last() != Some(&block.neighbors.len()) {
        return bad(format!(
            "a block whose offsets run from {:?} to {:?} for {} neighbours",
            block.offsets.first(),
            block.offsets.last(),
            block.neighbors.len()
        ));
    }
    if let Some(t) = block.offsets.windows(2).position(|w| w[1] < w[0]) {
        return bad(format!("a block whose offsets fall at target {t}: {} then {}", block.offsets[t], block.offsets[t + 1]));
    }
    if let Some(e) = block.neighbors.iter().position(|&v| v >= block.inputs) {
        return bad(format!("a block whose neighbour {e} is input {}, of {} inputs", block.neighbors[e], block.inputs));
    }
    Ok(())
}

/// Each target's number of neighbours (1 for none), as a `targets × 1`
/// tensor.
fn degrees(block: &Block, dtype: candle_core::DType, device: &Device) -> Result<Tensor> {
    let d: Vec<f32> = block.offsets.windows(2).map(|w| (w[1] - w[0]).max(1) as f32).collect();
    Ok(Tensor::from_vec(d, (block.targets, 1), device)?.to_dtype(dtype)?)
}

/// The fused mean aggregation of a checked block (f32, CPU).
struct MeanOp {
    offsets: Vec<usize>,
    neighbors: Vec<usize>,
    targets: usize,
}

impl candle_core::CustomOp1 for MeanOp {
    fn name(&self) -> &'static str {
        "wm-mean-aggregate"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (rows, cols) = layout.shape().dims2()?;
        let (candle_core::CpuStorage::F32(all), Some((start, end))) = (storage, layout.contiguous_offsets()) else {
            candle_core::bail!("wm-mean-aggregate: a contiguous f32 tensor is needed");
        };
        let x = &all[start..end];
        let Some(len) = self.targets.checked_mul(cols) else {
            candle_core::bail!("wm-mean-aggregate: {} targets × {cols} columns overflow", self.targets);
        };
        let mut out = Vec::new();
        if out.try_reserve_exact(len).is_err() {
            candle_core::bail!("wm-mean-aggregate: {} targets × {cols} f32 columns cannot be allocated", self.targets);
        }
        out.resize(len, 0f32);
        if cols > 0 {
            for (t, acc) in out.chunks_exact_mut(cols).enumerate() {
                let edges = &self.neighbors[self.offsets[t]..self.offsets[t + 1]];
                for &v in edges {
                    if v >= rows {
                        candle_core::bail!("wm-mean-aggregate: neighbour {v} of {rows} inputs");
                    }
                    for (a, b) in acc.iter_mut().zip(&x[v * cols..(v + 1) * cols]) {
                        *a += b;
                    }
                }
                let d = edges.len().max(1) as f32;
                for a in acc.iter_mut() {
                    *a /= d;
                }
            }
        }
        Ok((candle_core::CpuStorage::F32(out), (self.targets, cols).into()))
    }

    /// The gradient of `x`: each target's gradient over its degree, added
    /// into the row of every neighbour it summed (as the unfused path's
    /// backward computes it, in the same order).
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let device = arg.device();
        let block =
            Block { targets: self.targets, inputs: arg.dims2()?.0, offsets: self.offsets.clone(), neighbors: self.neighbors.clone() };
        let deg = degrees(&block, grad_res.dtype(), device).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let per_target = grad_res.broadcast_div(&deg)?;
        let target_index = index_tensor(&block.target_index(), device).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let per_edge = per_target.index_select(&target_index, 0)?;
        let neighbors = index_tensor(&self.neighbors, device).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(Some(arg.zeros_like()?.index_add(&neighbors, &per_edge, 0)?))
    }
}

/// A batch's rows of an embedding table as a trainable candle variable.
#[derive(Debug)]
pub struct EmbeddingVar {
    ids: Vec<i64>,
    var: Var,
}

impl EmbeddingVar {
    /// Gathers rows `ids` (repeats allowed) of `emb` as an `ids.len() ×
    /// dim` f32 variable. As collective as [`Embedding::gather`].
    ///
    /// # Errors
    /// As [`Embedding::gather`]; [`Error::Candle`].
    pub fn lookup<T: EmbeddingElement>(emb: &Embedding<T>, ids: &[i64], device: &Device) -> Result<Self> {
        let mut rows = vec![0f32; ids.len() * emb.dim()];
        emb.gather(ids, &mut rows)?;
        let var = Var::from_tensor(&Tensor::from_vec(rows, (ids.len(), emb.dim()), device)?)?;
        Ok(Self { ids: ids.to_vec(), var })
    }

    /// The rows, for use in a model.
    pub fn as_tensor(&self) -> &Tensor {
        self.var.as_tensor()
    }

    /// The candle variable.
    pub fn var(&self) -> &Var {
        &self.var
    }

    /// The ids the rows came from.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// Sends the rows' gradients in `grads` to [`Embedding::apply_gradients`]
    /// with learning rate `lr`. Collective for every memory type: every
    /// rank calls it for the same variables in the same order.
    ///
    /// Sparse as WholeGraph's optimizers: only rows whose ids are in the
    /// step's gradient move. When `grads` holds a gradient for this
    /// variable (the loss depended on it), every one of its ids is sent
    /// with its row, repeats summed, as a WholeGraph lookup's are (a row
    /// whose gradient came out zero still takes its step, so look up only
    /// the ids the loss reads). When it holds none, no id is sent, and the
    /// call only takes part in the exchange: no row of this batch moves,
    /// not even under weight decay or momentum, and no optimizer state
    /// changes.
    ///
    /// # Errors
    /// As [`Embedding::apply_gradients`]; [`Error::Candle`].
    pub fn apply<T: EmbeddingElement>(&self, emb: &mut Embedding<T>, grads: &GradStore, lr: f32) -> Result<()> {
        match grads.get(self.var.as_tensor()) {
            Some(g) => {
                let g: Vec<f32> = g.flatten_all()?.to_dtype(candle_core::DType::F32)?.to_vec1()?;
                emb.apply_gradients(&self.ids, &g, lr)?;
            }
            None => emb.apply_gradients::<i64>(&[], &[], lr)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `targets` outputs over `inputs` inputs, with degrees 0,
    /// 1, 2, … (cycling at 7) and repeated neighbours.
    fn some_block(targets: usize, inputs: usize) -> Block {
        let mut offsets = vec![0];
        let mut neighbors = Vec::new();
        for t in 0..targets {
            for k in 0..t % 7 {
                neighbors.push((t * 31 + k * 17 + k * k) % inputs);
            }
            offsets.push(neighbors.len());
        }
        Block { targets, inputs, offsets, neighbors }
    }

    /// The fused mean aggregation gives the unfused one's bits, forward
    /// and backward (a loss that weighs every output differently).
    #[test]
    fn the_fused_mean_aggregation_equals_candles_own_ops_bit_for_bit() {
        let (targets, inputs, cols) = (300, 500, 37);
        let block = some_block(targets, inputs);
        let vals: Vec<f32> = (0..inputs * cols).map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.013).collect();
        let weights: Vec<f32> = (0..targets * cols).map(|i| ((i * 131 % 97) as f32 - 48.0) * 0.1).collect();
        let weights = Tensor::from_vec(weights, (targets, cols), &Device::Cpu).unwrap();
        // `with_self`: the targets' own rows added too (`dst + agg`, as a
        // GraphSAGE layer uses `x` twice).
        let run = |fused: bool, with_self: bool| {
            let x = Var::from_tensor(&Tensor::from_vec(vals.clone(), (inputs, cols), &Device::Cpu).unwrap()).unwrap();
            let agg = if fused { mean_aggregate(x.as_tensor(), &block).unwrap() } else { unfused_mean(x.as_tensor(), &block).unwrap() };
            let y = if with_self { (x.as_tensor().narrow(0, 0, targets).unwrap() + &agg).unwrap() } else { agg };
            let loss = (&y * &weights).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let g = grads.get(x.as_tensor()).expect("a gradient for x").flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), g)
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for with_self in [true, false] {
            let (fused_y, fused_g) = run(true, with_self);
            let (plain_y, plain_g) = run(false, with_self);
            assert_eq!(bits(&fused_y), bits(&plain_y), "forward, with_self {with_self}");
            assert_eq!(bits(&fused_g), bits(&plain_g), "backward, with_self {with_self}");
        }
        let (fused_y, fused_g) = run(true, false);
        // Targets without neighbours read zeros; the gradient reached
        // inputs that were summed.
        assert!(fused_y[..cols].iter().all(|&v| v == 0.0));
        assert!(fused_g.iter().any(|&v| v != 0.0));
    }

    #[test]
    fn blocks_that_do_not_fit_their_inputs_are_refused_naming_the_value() {
        let x = Tensor::zeros((10, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let mut b = some_block(4, 10);
        b.neighbors[2] = 10;
        let e = mean_aggregate(&x, &b).unwrap_err().to_string();
        assert!(e.contains("neighbour 2 is input 10, of 10 inputs"), "{e}");
        let mut b = some_block(4, 10);
        b.offsets[2] = 5;
        let e = mean_aggregate(&x, &b).unwrap_err().to_string();
        assert!(e.contains("offsets fall at target 2: 5 then 3"), "{e}");
        let mut b = some_block(4, 10);
        b.offsets.pop();
        let e = mean_aggregate(&x, &b).unwrap_err().to_string();
        assert!(e.contains("4 targets with 4 offsets"), "{e}");
    }

    #[test]
    fn embedding_rows_train_through_candle_and_apply_gradients() {
        use wholemem::{Location, MemoryType};
        use wm_embedding::{Init, Optimizer};
        // One rank (no launcher): a chunked table, plain SGD.
        let world = wm_comm::init().unwrap();
        let mut emb = Embedding::<f32>::allocate(&world, MemoryType::Chunked, Location::Host, 10, 4, None, Some(Optimizer::sgd())).unwrap();
        emb.init(Init::Constant(1.0), 0).unwrap();
        let batch = EmbeddingVar::lookup(&emb, &[3, 3, 5], &Device::Cpu).unwrap();
        // d(sum of 2·x)/dx = 2 for every element.
        let loss = (batch.as_tensor() * 2.0).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        batch.apply(&mut emb, &grads, 0.1).unwrap();
        let mut rows = vec![0f32; 3 * 4];
        emb.gather(&[3i64, 5, 0], &mut rows).unwrap();
        // Row 3 twice: 1 − 0.1·(2 + 2); row 5 once: 1 − 0.1·2; row 0 untouched.
        for (i, want) in [0.6f32, 0.8, 1.0].into_iter().enumerate() {
            assert!(rows[i * 4..i * 4 + 4].iter().all(|&x| (x - want).abs() < 1e-6), "row {i}: {:?}", &rows[i * 4..i * 4 + 4]);
        }
        emb.free().unwrap();
    }

    /// Issue 30, item 4: `apply` sent zero gradients for every row of a
    /// batch the loss did not depend on, so AdamW's weight decay moved rows
    /// the step never touched (and a row's step count advanced, which
    /// changes its next bias correction). Two AdamW steps on one rank:
    /// untouched rows keep their bits, touched rows equal a plain f64
    /// AdamW step written here.
    #[test]
    fn apply_sends_no_zero_gradients_for_rows_the_step_did_not_touch() {
        use wholemem::{Location, MemoryType};
        use wm_embedding::Optimizer;
        let (rows, dim) = (10usize, 4usize);
        let (lr, wd, b1, b2, eps) = (0.05f32, 0.1f32, 0.9f32, 0.99f32, 1e-8f32);
        let world = wm_comm::init().unwrap();
        let opt = Optimizer::Adam { weight_decay: wd, beta1: b1, beta2: b2, epsilon: eps, decoupled_weight_decay: true };
        let mut emb = Embedding::<f32>::allocate(&world, MemoryType::Chunked, Location::Host, rows, dim, None, Some(opt)).unwrap();
        // Never zero (weight decay must have something to move).
        let start = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f32 * 0.25 - 1.3;
        let all: Vec<i64> = (0..rows as i64).collect();
        let w0: Vec<f32> = (0..rows * dim).map(|k| start(k / dim, k % dim)).collect();
        wm_gather::scatter_from(emb.table_mut(), &all, &w0).unwrap();
        // d(sum(x ⊙ C))/dx = C: distinct and non-zero per row and column.
        let coeffs = |step: usize, n: usize| -> Vec<f32> {
            (0..n * dim).map(|k| 0.1 * (k / dim + 1) as f32 - 0.03 * (k % dim) as f32 + 0.07 * step as f32).collect()
        };
        let step = |emb: &mut Embedding<f32>, step: usize, used: &[i64], idle: &[i64]| {
            let used_var = EmbeddingVar::lookup(emb, used, &Device::Cpu).unwrap();
            let idle_var = EmbeddingVar::lookup(emb, idle, &Device::Cpu).unwrap();
            let c = Tensor::from_vec(coeffs(step, used.len()), (used.len(), dim), &Device::Cpu).unwrap();
            let grads = used_var.as_tensor().mul(&c).unwrap().sum_all().unwrap().backward().unwrap();
            used_var.apply(emb, &grads, lr).unwrap();
            idle_var.apply(emb, &grads, lr).unwrap();
        };
        // Step 0 touches rows 3 (twice) and 7; 5 and 8 are looked up, unused.
        step(&mut emb, 0, &[3, 7, 3], &[5, 8]);
        // Step 1 touches 8 and 1; 3 and 7, with Adam moments now, sit idle.
        step(&mut emb, 1, &[8, 1], &[3, 7]);

        // Each touched row took one AdamW step (t = 1) with its summed gradient.
        let (c0, c1) = (coeffs(0, 3), coeffs(1, 2));
        let row_of = |c: &[f32], i: usize| c[i * dim..(i + 1) * dim].to_vec();
        let sum = |a: Vec<f32>, b: Vec<f32>| a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<f32>>();
        let touched = [(3usize, sum(row_of(&c0, 0), row_of(&c0, 2))), (7, row_of(&c0, 1)), (8, row_of(&c1, 0)), (1, row_of(&c1, 1))];
        let adamw_once = |w: f32, g: f32| -> f64 {
            let (w, g, lr, wd, b1, b2, eps) = (w as f64, g as f64, lr as f64, wd as f64, b1 as f64, b2 as f64, eps as f64);
            let x = w - lr * wd * w;
            let (m, v) = ((1.0 - b1) * g, (1.0 - b2) * g * g);
            let (m_hat, v_hat) = (m / (1.0 - b1), v / (1.0 - b2));
            x - lr * m_hat / (v_hat.sqrt() + eps)
        };
        let mut got = vec![0f32; rows * dim];
        emb.gather(&all, &mut got).unwrap();
        let mut powers = vec![0f32; rows * 2];
        emb.gather_state("beta12t", &all, &mut powers).unwrap();
        for r in 0..rows {
            let have = &got[r * dim..(r + 1) * dim];
            match touched.iter().find(|(row, _)| *row == r) {
                Some((_, g)) => {
                    for c in 0..dim {
                        let want = adamw_once(start(r, c), g[c]);
                        let err = (have[c] as f64 - want).abs();
                        assert!(err <= 1e-6 * want.abs().max(1.0), "row {r} col {c}: {} against AdamW's {want}", have[c]);
                    }
                    assert_eq!(&powers[r * 2..r * 2 + 2], &[b1, b2], "row {r} took one step");
                }
                None => {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    assert_eq!(bits(have), bits(&w0[r * dim..(r + 1) * dim]), "row {r} was not touched but moved: {have:?}");
                    assert_eq!(&powers[r * 2..r * 2 + 2], &[1.0, 1.0], "row {r} was not touched but counted a step");
                }
            }
        }
        emb.free().unwrap();
    }

    #[test]
    fn mean_aggregate_averages_the_sampled_rows() {
        let x = Tensor::from_vec(vec![1f32, 10., 2., 20., 3., 30., 4., 40.], (4, 2), &Device::Cpu).unwrap();
        // Output 0 <- inputs 1, 3; output 1 <- nothing.
        let block = Block { targets: 2, inputs: 4, offsets: vec![0, 2, 2], neighbors: vec![1, 3] };
        let m = mean_aggregate(&x, &block).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(m, vec![vec![3.0, 30.0], vec![0.0, 0.0]]);
        let bad = Block { inputs: 5, ..block };
        assert!(mean_aggregate(&x, &bad).unwrap_err().to_string().contains("4 input rows for a block of 5 inputs"));
    }
}
