//! One rank of a multi-process embedding scenario: `wm-test-embedding
//! SCENARIO`. Started by `tests/tests/embedding.rs` through the harness (or
//! by hand under `wm-run`). Every check runs on every rank; the first wrong
//! result exits non-zero naming the rank, the case and what differed.
//!
//! The optimizers are checked against a reference written here, from the
//! formulas, over a plain `Vec<f32>` in one process: it replays every
//! rank's batches (they are derived from a seed, so every rank can), sums
//! repeated ids, and rounds the weights to the table's type after each step
//! as the table does. It shares no code with `wm_embedding`'s optimizer.
//! With the `candle` feature, `candle` trains the table through the candle
//! bridge against the same reference.

use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use half::{bf16, f16};
use wholemem::{Location, MemoryType, query};
use wm_comm::Communicator;
use wm_embedding::{Embedding, EmbeddingElement, Error as EErr, Init, Optimizer};
use wm_gather::DType;
use wm_tests::Rng;

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| match scenario {
        "optimizers" => match rest.first().map(String::as_str) {
            None | Some("host") => optimizers(world, Location::Host),
            Some("device") => optimizers(world, Location::Device),
            Some(other) => bail!("unknown location {other:?}; expected host or device"),
        },
        "bad-input" => bad_input(world),
        "init-digest" => init_digest(world),
        #[cfg(feature = "candle")]
        "candle" => candle::untouched_rows(world),
        other => bail!("unknown scenario {other:?}"),
    });
}

fn host_types(world: &Comm) -> Result<Vec<MemoryType>> {
    types_at(world, Location::Host)
}

/// The memory types `world` can hold at `loc`, printing why for the others
/// (a failure instead under `WM_REQUIRE_GPU=1`: see `wm_tests::skip`).
fn types_at(world: &Comm, loc: Location) -> Result<Vec<MemoryType>> {
    let mut types = Vec::new();
    for ty in MemoryType::ALL {
        match query(world.as_ref(), ty, loc).reason() {
            Some(reason) => wm_tests::skip(world.as_ref(), ty, loc, &format!("{loc} {ty}"), reason).map_err(anyhow::Error::msg)?,
            None => types.push(ty),
        }
    }
    Ok(types)
}

/// A value rounded to the table's element type, through the `half` crate.
fn round_to(dt: DType, x: f32) -> f32 {
    match dt {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::Bf16 => bf16::from_f32(x).to_f32(),
        other => unreachable!("embeddings are float, not {other}"),
    }
}

// ------------------------------------------------------------- the reference

/// The optimizers as the formulas state them (see `docs/embedding.md`).
#[derive(Debug, Clone, Copy)]
enum RefOpt {
    Sgd { wd: f32 },
    Adam { wd: f32, b1: f32, b2: f32, eps: f32, adam_w: bool },
    AdaGrad { wd: f32, eps: f32 },
    RmsProp { wd: f32, eps: f32, alpha: f32 },
}

impl RefOpt {
    fn library(self) -> Optimizer {
        match self {
            RefOpt::Sgd { wd } => Optimizer::Sgd { weight_decay: wd },
            RefOpt::Adam { wd, b1, b2, eps, adam_w } => {
                Optimizer::Adam { weight_decay: wd, beta1: b1, beta2: b2, epsilon: eps, decoupled_weight_decay: adam_w }
            }
            RefOpt::AdaGrad { wd, eps } => Optimizer::AdaGrad { weight_decay: wd, epsilon: eps },
            RefOpt::RmsProp { wd, eps, alpha } => Optimizer::RmsProp { weight_decay: wd, epsilon: eps, alpha },
        }
    }
}

/// The whole table in one process: weights, per-row state, per-row steps.
struct Reference {
    opt: RefOpt,
    dt: DType,
    dim: usize,
    w: Vec<f32>,
    /// m (Adam), the sum of squares (AdaGrad) or the mean square (RMSProp).
    a: Vec<f32>,
    /// v (Adam).
    b: Vec<f32>,
    /// Steps each row has taken (Adam).
    t: Vec<i32>,
}

impl Reference {
    fn new(opt: RefOpt, dt: DType, rows: usize, dim: usize, start: impl Fn(usize, usize) -> f32) -> Self {
        let w = (0..rows * dim).map(|k| round_to(dt, start(k / dim, k % dim))).collect();
        Self { opt, dt, dim, w, a: vec![0.0; rows * dim], b: vec![0.0; rows * dim], t: vec![0; rows] }
    }

    /// One step: `batches[r]` is rank r's (ids, grads).
    #[allow(clippy::needless_range_loop)] // indices read like the formulas
    fn step(&mut self, batches: &[(Vec<i64>, Vec<f32>)], lr: f32) {
        let dim = self.dim;
        let rows = self.t.len();
        // Per rank, repeats summed in input order; then across ranks in rank order.
        let mut total: Vec<Option<Vec<f32>>> = vec![None; rows];
        for (ids, grads) in batches {
            let mut mine: Vec<Option<Vec<f32>>> = vec![None; rows];
            for (i, &id) in ids.iter().enumerate() {
                let acc = mine[id as usize].get_or_insert_with(|| vec![0.0; dim]);
                for c in 0..dim {
                    acc[c] += grads[i * dim + c];
                }
            }
            for (row, part) in mine.into_iter().enumerate() {
                if let Some(part) = part {
                    let acc = total[row].get_or_insert_with(|| vec![0.0; dim]);
                    for c in 0..dim {
                        acc[c] += part[c];
                    }
                }
            }
        }
        for (row, g) in total.into_iter().enumerate() {
            let Some(g) = g else { continue };
            self.t[row] += 1;
            let t = self.t[row];
            for c in 0..dim {
                let k = row * dim + c;
                let w = self.w[k];
                let new = match self.opt {
                    RefOpt::Sgd { wd } => w - lr * (g[c] + wd * w),
                    RefOpt::Adam { wd, b1, b2, eps, adam_w } => {
                        let (grad, w0) = if adam_w { (g[c], w - lr * wd * w) } else { (g[c] + wd * w, w) };
                        self.a[k] = b1 * self.a[k] + (1.0 - b1) * grad;
                        self.b[k] = b2 * self.b[k] + (1.0 - b2) * grad * grad;
                        let m_hat = self.a[k] / (1.0 - b1.powi(t));
                        let v_hat = self.b[k] / (1.0 - b2.powi(t));
                        w0 - lr * m_hat / (v_hat.sqrt() + eps)
                    }
                    RefOpt::AdaGrad { wd, eps } => {
                        let grad = g[c] + wd * w;
                        self.a[k] += grad * grad;
                        w - lr * grad / (self.a[k].sqrt() + eps)
                    }
                    RefOpt::RmsProp { wd, eps, alpha } => {
                        let grad = g[c] + wd * w;
                        self.a[k] = alpha * self.a[k] + (1.0 - alpha) * grad * grad;
                        w - lr * grad / (self.a[k].sqrt() + eps)
                    }
                };
                self.w[k] = round_to(self.dt, new);
            }
        }
    }
}

/// Whether `held` is `want` up to f32 arithmetic order, and for 16-bit
/// tables up to two units in the last place of the stored type.
fn close(dt: DType, held: f32, want: f32) -> bool {
    let mag = held.abs().max(want.abs());
    let tol = match dt {
        DType::F32 => 2e-5 * mag.max(1.0),
        DType::Bf16 => mag * 2f32.powi(-6) + 1e-5,
        _ => mag * 2f32.powi(-9) + 1e-5,
    };
    (held - want).abs() <= tol
}

// ------------------------------------------------------------ the scenarios

/// Every optimizer × host type × f32/bf16 (and f16 for some), random
/// partitions with zero-row ranks, repeated ids within and across ranks,
/// ranks with empty batches, rows nobody touches: after several steps the
/// table and the optimizer state equal the reference.
fn optimizers(world: &Comm, loc: Location) -> Result<()> {
    let n = world.size();
    let opts = [
        RefOpt::Sgd { wd: 0.0 },
        RefOpt::Sgd { wd: 0.05 },
        RefOpt::Adam { wd: 0.0, b1: 0.9, b2: 0.999, eps: 1e-8, adam_w: false },
        RefOpt::Adam { wd: 0.01, b1: 0.8, b2: 0.95, eps: 1e-6, adam_w: false },
        RefOpt::Adam { wd: 0.1, b1: 0.9, b2: 0.99, eps: 1e-8, adam_w: true },
        RefOpt::AdaGrad { wd: 0.0, eps: 1e-8 },
        RefOpt::AdaGrad { wd: 0.02, eps: 1e-6 },
        RefOpt::RmsProp { wd: 0.0, eps: 1e-8, alpha: 0.99 },
        RefOpt::RmsProp { wd: 0.03, eps: 1e-7, alpha: 0.9 },
    ];
    let mut case = 0u64;
    for ty in types_at(world, loc)? {
        for (k, &opt) in opts.iter().enumerate() {
            let mut dtypes = vec![DType::F32, DType::Bf16];
            if k % 3 == 0 {
                dtypes.push(DType::F16);
            }
            for dt in dtypes {
                case += 1;
                let wide = case % 2 == 0;
                match dt {
                    DType::F32 => one_case::<f32>(world, ty, loc, opt, case, wide),
                    DType::Bf16 => one_case::<bf16>(world, ty, loc, opt, case, wide),
                    _ => one_case::<f16>(world, ty, loc, opt, case, wide),
                }
                .with_context(|| format!("{loc} {ty} {opt:?} {dt} ids {} on {n} ranks", if wide { "i64" } else { "i32" }))?;
            }
        }
    }
    Ok(())
}

/// A random partition of `rows` over `n` ranks in which some ranks own
/// nothing.
fn random_partition(rng: &mut Rng, rows: usize, n: usize) -> Vec<usize> {
    let mut part = vec![0usize; n];
    for _ in 0..rows {
        let r = rng.below(n as u64 + 1) as usize;
        part[r.min(n - 1) * usize::from(r != 0 || n == 1)] += 1;
    }
    part
}

/// The starting weight of every case, by row and column.
fn start(row: usize, col: usize) -> f32 {
    ((row * 13 + col * 7) % 23) as f32 * 0.125 - 1.4 + col as f32 * 0.01
}

/// Writes [`start`] into `emb`: each rank its own rows, then a barrier.
fn load_start<T: EmbeddingElement>(world: &Comm, emb: &mut Embedding<T>) -> Result<()> {
    let dim = emb.dim();
    let mine = emb.table().local_rows();
    let ids: Vec<i64> = mine.clone().map(|r| r as i64).collect();
    let vals: Vec<f32> = mine.flat_map(|r| (0..dim).map(move |c| start(r, c))).collect();
    wm_gather::scatter_from(emb.table_mut(), &ids, &vals)?;
    world.barrier()?;
    Ok(())
}

fn one_case<T: EmbeddingElement>(world: &Comm, ty: MemoryType, loc: Location, opt: RefOpt, case: u64, wide: bool) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let dt = T::DTYPE;
    let mut rng = Rng::new(&[case, n as u64]);
    let rows = 30 + rng.below(90) as usize;
    let dim = [1usize, 5, 16, 33][case as usize % 4];
    let part = random_partition(&mut rng, rows, n);
    let mut emb = Embedding::<T>::allocate(world, ty, loc, rows, dim, Some(&part), Some(opt.library()))?;
    load_start(world, &mut emb)?;
    let mut reference = Reference::new(opt, dt, rows, dim, start);

    let steps = 6;
    for step in 0..steps {
        // Every rank's batch, so the reference can replay them all. Ids come
        // from the first three quarters of the table: the rest never moves.
        let batches: Vec<(Vec<i64>, Vec<f32>)> = (0..n)
            .map(|r| {
                let mut b = Rng::new(&[case, step, r as u64]);
                let count = if (r as u64 + step) % 3 == 1 { 0 } else { 1 + b.below(rows as u64) as usize };
                let ids: Vec<i64> = (0..count).map(|_| b.below(rows as u64 * 3 / 4) as i64).collect();
                let grads = ids
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &id)| {
                        (0..dim).map(move |c| ((id as usize * 7 + c * 3 + step as usize * 5 + r * 11 + i) % 17) as f32 * 0.05 - 0.4)
                    })
                    .collect();
                (ids, grads)
            })
            .collect();
        let lr = [0.1, 0.05, 0.02][step as usize % 3];
        let (ids, grads) = &batches[me];
        if wide {
            emb.apply_gradients(ids, grads, lr)?;
        } else {
            let narrow: Vec<i32> = ids.iter().map(|&x| x as i32).collect();
            emb.apply_gradients(&narrow, grads, lr)?;
        }
        reference.step(&batches, lr);
    }

    // Every rank reads the whole table (and the state) and compares.
    let all: Vec<i64> = (0..rows as i64).collect();
    let mut held = vec![0f32; rows * dim];
    emb.gather(&all, &mut held)?;
    for (k, (&g, &w)) in held.iter().zip(&reference.w).enumerate() {
        ensure!(close(dt, g, w), "rank {me}: weight row {} col {} = {g}, reference {w}", k / dim, k % dim);
    }
    let untouched = rows * 3 / 4..rows;
    for row in untouched {
        for c in 0..dim {
            ensure!(held[row * dim + c] == round_to(dt, start(row, c)), "rank {me}: row {row} got no gradient but changed");
        }
    }
    let mut state = vec![0f32; rows * dim];
    let slots: Vec<(&str, &Vec<f32>)> = match opt {
        RefOpt::Sgd { .. } => vec![],
        RefOpt::Adam { .. } => vec![("m", &reference.a), ("v", &reference.b)],
        RefOpt::AdaGrad { .. } => vec![("state_sum", &reference.a)],
        RefOpt::RmsProp { .. } => vec![("v", &reference.a)],
    };
    ensure!(emb.state_names().len() == slots.len() + usize::from(matches!(opt, RefOpt::Adam { .. })), "{:?}", emb.state_names());
    for (name, want) in slots {
        emb.gather_state(name, &all, &mut state)?;
        for (k, (&g, &w)) in state.iter().zip(want).enumerate() {
            ensure!(close(DType::F32, g, w), "rank {me}: state {name} row {} col {} = {g}, reference {w}", k / dim, k % dim);
        }
    }
    if let RefOpt::Adam { b1, b2, .. } = opt {
        let mut powers = vec![0f32; rows * 2];
        emb.gather_state("beta12t", &all, &mut powers)?;
        for row in 0..rows {
            let t = reference.t[row];
            let want = [b1.powi(t), b2.powi(t)];
            for j in 0..2 {
                ensure!(
                    close(DType::F32, powers[row * 2 + j], want[j]),
                    "rank {me}: row {row} beta{}^{t} = {}",
                    j + 1,
                    powers[row * 2 + j]
                );
            }
        }
    }
    emb.free()?;
    Ok(())
}

/// Bad input to the collective calls fails on every rank with the error
/// naming the value and the rank, and the next call works.
/// A state name the optimizer does not keep, on the last rank only: every
/// rank fails (the others would gather alone), then a call alike on every
/// rank works.
fn unknown_state_name(world: &Comm, ty: MemoryType) -> Result<()> {
    let (me, last) = (world.rank(), world.size() - 1);
    let (rows, dim) = (40usize, 3usize);
    let adam = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::adam()))?;
    let all: Vec<i64> = (0..rows as i64).collect();
    let mut state = vec![0f32; rows * dim];
    let name = if me == last { "nope" } else { "m" };
    let err = adam.gather_state(name, &all, &mut state).err().context("it must fail")?;
    let want = if me == last { "nope".to_owned() } else { format!("rank {last} failed") };
    ensure!(err.to_string().contains(&want), "{err}");
    adam.gather_state("v", &all, &mut state)?;
    ensure!(state.iter().all(|&v| v == 0.0), "state v before any step");
    adam.free()?;
    Ok(())
}

fn bad_input(world: &Comm) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    let last = n - 1;
    for ty in host_types(world)? {
        let (rows, dim) = (40usize, 3usize);
        let mut emb = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::sgd()))?;
        emb.init(Init::Constant(1.0), 0)?;
        let ctx = |what: &str| format!("{ty}: {what} on rank {me} of {n}");

        // An id past the end on the last rank: every rank hears of it.
        let ids: Vec<i64> = if me == last { vec![0, rows as i64] } else { vec![1] };
        let err = emb.apply_gradients(&ids, &vec![0.5; ids.len() * dim], 0.1).err().with_context(|| ctx("an id past the end must fail"))?;
        let want = format!("id {rows} at position 1 on rank {last} is out of range for an embedding of {rows} rows");
        ensure!(matches!(err, EErr::IndexOutOfRange { .. }) && err.to_string() == want, "{}: {err}", ctx("out of range"));

        // A negative i32 id on rank 0 and a bad one on the last: rank 0's is named.
        let ids: Vec<i32> = if me == 0 {
            vec![2, -7]
        } else if me == last {
            vec![rows as i32]
        } else {
            vec![]
        };
        let err = emb.apply_gradients(&ids, &vec![0.5; ids.len() * dim], 0.1).err().with_context(|| ctx("a negative id must fail"))?;
        ensure!(err.to_string().starts_with("id -7 at position 1 on rank 0 "), "{}: {err}", ctx("negative"));

        // Too few gradient values on rank 0.
        let ids = [3i64, 4];
        let grads = vec![0.5; if me == 0 { 5 } else { 6 }];
        let err = emb.apply_gradients(&ids, &grads, 0.1).err().with_context(|| ctx("short gradients must fail"))?;
        ensure!(
            matches!(err, EErr::GradientLength { rank: 0, .. })
                && err.to_string() == "rank 0 passed 5 gradient values for 2 ids of dimension 3; expected 6",
            "{}: {err}",
            ctx("gradient length")
        );

        // A learning rate that is not a number, on the last rank.
        let lr = if me == last { f32::NAN } else { 0.1 };
        let err = emb.apply_gradients(&[5i64], &[1.0; 3], lr).err().with_context(|| ctx("a NaN learning rate must fail"))?;
        ensure!(err.to_string().contains(&format!("learning rate NaN on rank {last}")), "{}: {err}", ctx("NaN rate"));

        if n > 1 {
            let lr = if me == 1 { 0.2 } else { 0.1 };
            let err = emb.apply_gradients(&[5i64], &[1.0; 3], lr).err().with_context(|| ctx("different rates must fail"))?;
            ensure!(
                err.to_string().contains("ranks passed different learning rates: rank 0 0.1 and rank 1 0.2"),
                "{}: {err}",
                ctx("rates")
            );
        }

        unknown_state_name(world, ty).with_context(|| ctx("an unknown state name"))?;

        // Nothing moved, and the next call works: every rank adds one
        // gradient of 1 to row `me`, another of 2 to row 0 (shared by all).
        let ids = [me as i64, 0];
        let grads = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0];
        emb.apply_gradients(&ids, &grads, 0.25)?;
        let all: Vec<i64> = (0..rows as i64).collect();
        let mut held = vec![0f32; rows * dim];
        emb.gather(&all, &mut held)?;
        for row in 0..rows {
            // Row 0 gets 2 from every rank plus 1 from rank 0.
            let g = if row == 0 {
                2.0 * n as f32 + 1.0
            } else if row < n {
                1.0
            } else {
                0.0
            };
            let want = 1.0 - 0.25 * g;
            ensure!(
                held[row * dim..][..dim].iter().all(|&v| v == want),
                "{}: row {row} = {:?}, want {want}",
                ctx("after"),
                &held[row * dim..][..dim]
            );
        }

        // The forward gather: collective types fail everywhere, mapped ones
        // only where the bad id was passed.
        let ids: Vec<i64> = if me == last { vec![-1] } else { vec![0] };
        let r = emb.gather(&ids, &mut [0f32; 3]);
        if ty.is_mapped() && me != last {
            r.with_context(|| ctx("a good gather on a mapped table"))?;
        } else {
            let err = r.err().with_context(|| ctx("a bad gather must fail"))?;
            ensure!(err.to_string().starts_with(&format!("id -1 at position 0 on rank {last} ")), "{}: {err}", ctx("gather"));
        }
        emb.free()?;

        // No optimizer: refused on every rank.
        let mut frozen = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, None)?;
        let err = frozen.apply_gradients(&[0i64], &[0.0; 3], 0.1).err().with_context(|| ctx("no optimizer"))?;
        ensure!(matches!(err, EErr::NoOptimizer), "{}: {err}", ctx("no optimizer"));
        frozen.free()?;

        // A bad parameter on the last rank; different optimizers on rank 1.
        let opt = if me == last {
            Optimizer::Adam { weight_decay: 0.0, beta1: 1.5, beta2: 0.9, epsilon: 1e-8, decoupled_weight_decay: false }
        } else {
            Optimizer::adam()
        };
        let err =
            Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(opt)).err().with_context(|| ctx("beta1 1.5"))?;
        ensure!(err.to_string().contains("adam parameter beta1 = 1.5 is invalid"), "{}: {err}", ctx("beta1"));
        if n > 1 {
            let opt = if me == 1 { Optimizer::rms_prop().with_weight_decay(0.5) } else { Optimizer::rms_prop() };
            let err =
                Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(opt)).err().with_context(|| ctx("mixed"))?;
            ensure!(
                err.to_string().contains("ranks passed different optimizers: rank 0 rmsprop(weight_decay=0,"),
                "{}: {err}",
                ctx("mixed")
            );
        }
        let again = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, Some(Optimizer::rms_prop()))?;
        again.free()?;
    }
    Ok(())
}

/// Fills tables of every type from one seed and prints a digest of every
/// value, so the test can compare digests across rank counts.
fn init_digest(world: &Comm) -> Result<()> {
    let (rows, dim) = (1000usize, 9usize);
    for ty in host_types(world)? {
        for init in [Init::Normal { mean: 0.5, std: 2.0 }, Init::Uniform { low: -1.0, high: 3.0 }] {
            let mut emb = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, None, None)?;
            emb.init(init, 1234)?;
            let mut narrow = Embedding::<bf16>::allocate(world, ty, Location::Host, rows, dim, None, None)?;
            narrow.init(init, 1234)?;
            let all: Vec<i64> = (0..rows as i64).collect();
            let mut vals = vec![0f32; rows * dim];
            emb.gather(&all, &mut vals)?;
            let mut rounded = vec![0f32; rows * dim];
            narrow.gather(&all, &mut rounded)?;
            for (k, (&v, &r)) in vals.iter().zip(&rounded).enumerate() {
                ensure!(bf16::from_f32(v).to_f32() == r, "{ty}: bf16 value {k} = {r}, f32 {v}");
            }
            let distinct: std::collections::HashSet<u32> = vals.iter().map(|v| v.to_bits()).collect();
            ensure!(distinct.len() > rows * dim * 9 / 10, "{ty} {init:?}: only {} distinct values", distinct.len());
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for v in &vals {
                for b in v.to_le_bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
                }
            }
            if world.rank() == 0 {
                println!("digest {init:?} {h:016x}");
            }
            emb.free()?;
            narrow.free()?;
        }
    }
    Ok(())
}

/// The candle bridge's `EmbeddingVar::apply` under AdamW with weight decay.
#[cfg(feature = "candle")]
mod candle {
    use anyhow::{Result, ensure};
    use candle_core::{Device, Tensor, Var};
    use wholemem::Location;
    use wm_embedding::Embedding;
    use wm_gather::DType;
    use wm_graph::candle_bridge::EmbeddingVar;
    use wm_tests::Rng;

    use super::{Comm, RefOpt, Reference, close, load_start, random_partition, types_at};

    /// One rank's part of a step: the ids its loss reads, their gradients
    /// (the loss is `sum(rows ⊙ grads)`), and ids it looks up but leaves
    /// out of the loss.
    struct RankStep {
        used: Vec<i64>,
        grads: Vec<f32>,
        idle: Vec<i64>,
    }

    fn rank_step(rows: usize, dim: usize, step: u64, r: usize) -> RankStep {
        let mut b = Rng::new(&[0xca4d1e, step, r as u64]);
        // Every third rank-step the loss reads no embedding row at all.
        let count = if (r as u64 + step) % 3 == 1 { 0 } else { 1 + b.below(6) as usize };
        // Used ids from the first half (repeats likely), idle ones anywhere.
        let used: Vec<i64> = (0..count).map(|_| b.below(rows as u64 / 2) as i64).collect();
        let idle: Vec<i64> = (0..1 + b.below(6)).map(|_| b.below(rows as u64) as i64).collect();
        // Never zero, so every read row visibly takes its step.
        let grads = (0..count * dim).map(|k| ((k * 5 + r * 3 + step as usize * 7) % 13) as f32 * 0.05 - 0.32).collect();
        RankStep { used, grads, idle }
    }

    /// Every host type on any rank count: each step, each rank looks up a
    /// batch its loss reads and one it does not (and every third rank-step
    /// its loss reads neither), then applies both. After every step every
    /// rank reads the whole table: rows no rank's loss read keep their bits,
    /// the others equal the plain AdamW reference of `Reference`, fed only
    /// the read rows' gradients; at the end every row's step count (β^t)
    /// counts only the steps that read it.
    pub(super) fn untouched_rows(world: &Comm) -> Result<()> {
        let (me, n) = (world.rank(), world.size());
        let (rows, dim) = (37usize, 5usize);
        let (b1, b2) = (0.9f32, 0.99f32);
        let opt = RefOpt::Adam { wd: 0.1, b1, b2, eps: 1e-8, adam_w: true };
        for ty in types_at(world, Location::Host)? {
            let mut rng = Rng::new(&[0xca4d1e, n as u64]);
            let part_sizes = random_partition(&mut rng, rows, n);
            let mut emb = Embedding::<f32>::allocate(world, ty, Location::Host, rows, dim, Some(&part_sizes), Some(opt.library()))?;
            load_start(world, &mut emb)?;
            let mut reference = Reference::new(opt, DType::F32, rows, dim, super::start);
            let all: Vec<i64> = (0..rows as i64).collect();
            let mut before = vec![0f32; rows * dim];
            emb.gather(&all, &mut before)?;
            let bias = Var::new(1.5f32, &Device::Cpu)?;
            for step in 0..4u64 {
                let parts: Vec<RankStep> = (0..n).map(|r| rank_step(rows, dim, step, r)).collect();
                let mine = &parts[me];
                // Lookups are collective for some types: both, on every rank.
                let used = EmbeddingVar::lookup(&emb, &mine.used, &Device::Cpu)?;
                let idle = EmbeddingVar::lookup(&emb, &mine.idle, &Device::Cpu)?;
                let loss = if mine.used.is_empty() {
                    bias.as_tensor().sqr()?
                } else {
                    let g = Tensor::from_vec(mine.grads.clone(), (mine.used.len(), dim), &Device::Cpu)?;
                    used.as_tensor().mul(&g)?.sum_all()?
                };
                let grads = loss.backward()?;
                let lr = [0.05, 0.02][step as usize % 2];
                used.apply(&mut emb, &grads, lr)?;
                idle.apply(&mut emb, &grads, lr)?;
                let batches: Vec<(Vec<i64>, Vec<f32>)> = parts.iter().map(|p| (p.used.clone(), p.grads.clone())).collect();
                reference.step(&batches, lr);

                let mut held = vec![0f32; rows * dim];
                emb.gather(&all, &mut held)?;
                let read: std::collections::HashSet<i64> = parts.iter().flat_map(|p| p.used.iter().copied()).collect();
                for row in 0..rows {
                    let span = row * dim..(row + 1) * dim;
                    if read.contains(&(row as i64)) {
                        for c in span {
                            let (g, w) = (held[c], reference.w[c]);
                            ensure!(
                                close(DType::F32, g, w),
                                "rank {me}: {ty} step {step}: row {row} col {} = {g}, AdamW reference {w}",
                                c % dim
                            );
                        }
                    } else {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                        ensure!(
                            bits(&held[span.clone()]) == bits(&before[span.clone()]),
                            "rank {me}: {ty} step {step}: row {row} was read by no loss but moved from {:?} to {:?}",
                            &before[span.clone()],
                            &held[span]
                        );
                    }
                }
                before = held;
            }
            let mut powers = vec![0f32; rows * 2];
            emb.gather_state("beta12t", &all, &mut powers)?;
            for row in 0..rows {
                let t = reference.t[row];
                let want = [b1.powi(t), b2.powi(t)];
                let have = &powers[row * 2..row * 2 + 2];
                ensure!(
                    have.iter().zip(want).all(|(&h, w)| close(DType::F32, h, w)),
                    "rank {me}: {ty}: row {row} was read in {t} steps but its β powers are {have:?}"
                );
            }
            emb.free()?;
            println!("candle {ty}: untouched rows kept their bits");
        }
        Ok(())
    }
}
