//! One rank of a scenario where a peer misbehaves. Started by the harness
//! (`tests/tests/hostile_peer.rs`): `wm-test-peer SCENARIO [ARGS…]`.
//!
//! - `malformed IMPOSTOR`: distributed gather and scatter, where rank
//!   IMPOSTOR follows the exchange's sequence of collectives on the table's
//!   own communicator but sends parts the exchange cannot have produced
//!   (the wrong length, a row the receiver does not own). Every other rank
//!   must fail with `Malformed` naming it — no panic, no hang — and the next
//!   call, on a fresh table, must work on every rank.
//! - `malformed-hierarchy IMPOSTOR`: the same for the hierarchy gather's
//!   node-local step (an id routed to the wrong local rank).
//! - `malformed-gradients IMPOSTOR`: the same for an embedding's gradient
//!   exchange.
//! - `malformed-sample IMPOSTOR`: distributed neighbour sampling, where rank
//!   IMPOSTOR agrees to the honest request, then asks every other rank for
//!   a local node number past its nodes, up to 2^64 - 1 (issue 30, item 6:
//!   it was added to the owner's first node unchecked). Every other rank
//!   must fail naming it and the number, and the next call must work.
//! - `mpi-rounds` (feature `mpi`, under `mpirun`): the MPI backend's
//!   collectives with the bytes per MPI call lowered to a few dozen, so that
//!   every exchange is split into rounds as one past 2 GiB is; the results
//!   must not change, a distributed gather included.
//! - `lock-holder dies|stuck DIR`: rank 1 holds a row lock of a mapped table
//!   and dies (SIGKILL) or stays stuck; rank 0 must take the lock over from
//!   the dead holder (told that the row may be torn), or fail with a
//!   timeout error while the holder lives — never hang.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use wholemem::CommonError;
use wholemem::agree::{Rule, agree};
use wholemem::{Location, MemoryType, WholeTensor};
use wm_comm::{Communicator, ExchangePlan};
use wm_embedding::{Embedding, Optimizer};
use wm_graph::{BuildOptions, CsrGraph, EdgeList};

type Comm = Arc<dyn Communicator>;

fn main() {
    wm_tests::rank_main(|world, scenario, rest| {
        let arg = |i: usize| rest.get(i).with_context(|| format!("argument {} of {scenario}", i + 1));
        match scenario {
            "malformed" => malformed(world, arg(0)?.parse()?),
            "malformed-hierarchy" => malformed_hierarchy(world, arg(0)?.parse()?),
            "malformed-gradients" => malformed_gradients(world, arg(0)?.parse()?),
            "split-rates" => split_rates(world, arg(0)?.parse()?),
            "malformed-sample" => malformed_sample(world, arg(0)?.parse()?),
            "malformed-cache" => malformed_cache(world, arg(0)?.parse()?, arg(1)?.parse()?),
            "cache-false-refusal" => cache_false_refusal(world, arg(0)?.parse()?),
            "hierarchy-success-verdict" => hierarchy_success_verdict(world, arg(0)?.parse()?),
            "lock-holder" => lock_holder(world, arg(0)?, arg(1)?),
            #[cfg(feature = "mpi")]
            "mpi-rounds" => mpi_rounds(world),
            other => bail!("unknown scenario {other:?}"),
        }
    });
}

fn value(row: usize, col: usize) -> f32 {
    row as f32 * 10.0 + col as f32
}

const COLS: usize = 4;
/// Bytes of one f32 row.
const ROW: usize = COLS * 4;

/// A table of `ty` with `rows` rows of `value`s.
fn table(world: &Comm, ty: MemoryType, rows: usize) -> Result<WholeTensor<f32>> {
    let mut t = WholeTensor::<f32>::matrix(world, ty, Location::Host, rows, COLS, None)?;
    let own: Vec<f32> = t.local_rows().flat_map(|r| (0..COLS).map(move |c| value(r, c))).collect();
    t.write_local(&own)?;
    world.barrier()?;
    Ok(t)
}

/// Gathers every row of `t` and checks the values: the call after a
/// malformed one works.
fn gather_works(t: &WholeTensor<f32>) -> Result<()> {
    let ids: Vec<i64> = (0..t.rows() as i64).collect();
    let mut out = vec![0f32; t.rows() * COLS];
    wm_gather::gather_into(t, &ids, &mut out)?;
    for (r, row) in out.chunks(COLS).enumerate() {
        ensure!(row.iter().enumerate().all(|(c, &v)| v == value(r, c)), "row {r} reads {row:?} after a malformed call");
    }
    Ok(())
}

/// What every rank must report: `Malformed` naming `culprit`, with `needle`
/// in the detail (on honest ranks; the impostor only checks the blame).
fn blames(what: &str, e: &wm_gather::Error, culprit: usize, needle: Option<&str>) -> Result<()> {
    let wm_gather::Error::Common(CommonError::Malformed { rank, detail }) = e else { bail!("{what}: not a malformed-peer error: {e}") };
    ensure!(*rank == culprit, "{what}: the error blames rank {rank}, not rank {culprit}: {e}");
    if let Some(n) = needle {
        ensure!(detail.contains(n), "{what}: {e:?} does not say {n:?}");
    }
    println!("{what}: {e}");
    Ok(())
}

/// How the impostor breaks the distributed exchange.
#[derive(Debug, Clone, Copy)]
enum Break {
    /// A part of the row-id exchange without even its kind byte.
    Empty,
    /// 12 bytes of row ids: not a whole number of ids.
    ShortIds,
    /// A row id past the receiver's rows.
    ForeignId,
    /// A reply three bytes longer than the rows asked for.
    LongReply,
    /// A verdict of success where the rows asked for belong.
    SuccessVerdict,
}

/// The shape of the scenarios' gathers and scatters, as honest ranks send
/// it ahead of their row ids (every rank of a call must pass the same).
const GATHER: &[u8] = b"gather of 4 f32 columns from column 0, converted from f32 to f32";
const SCATTER: &[u8] = b"scatter of 4 f32 columns from column 0, converted from f32 to f32";

/// A part of the row-id exchange: the kind byte (0: row ids follow), the
/// call's shape (its length in a byte, then its text), then `body` (8-byte
/// little-endian ids; the checks' outcomes ride in this exchange).
fn shaped_part(shape: &[u8], body: &[u8]) -> Vec<u8> {
    [&[0u8, shape.len() as u8][..], shape, body].concat()
}

/// [`shaped_part`] of a gather, with row `ids`.
fn id_part(ids: &[u64]) -> Vec<u8> {
    shaped_part(GATHER, &ids.iter().flat_map(|id| id.to_le_bytes()).collect::<Vec<u8>>())
}

/// How many ids an honest part of the row-id exchange holds.
fn ids_in(part: &[u8]) -> usize {
    match part {
        [0, len, rest @ ..] => rest.len().saturating_sub(usize::from(*len)) / 8,
        _ => 0,
    }
}

/// The impostor's side of one distributed gather: the same collectives
/// as `wm_gather::gather`, on the table's communicator, with broken parts.
fn fake_gather(t: &WholeTensor<f32>, how: Break) -> wm_gather::Result<()> {
    let mem = t.memory();
    let comm = mem.comm().as_ref();
    let (n, me) = (comm.size(), comm.rank());
    // 1. Row ids (and, in the kind byte, "my checks passed").
    let ids: Vec<Vec<u8>> = (0..n)
        .map(|r| match how {
            _ if r == me => id_part(&[]),
            Break::Empty => Vec::new(),
            Break::ShortIds => shaped_part(GATHER, &[0; 12]),
            Break::ForeignId => id_part(&[mem.partition().count(r) as u64 + 5]),
            Break::LongReply | Break::SuccessVerdict => id_part(&[]),
        })
        .collect();
    let sizes: Vec<usize> = ids.iter().map(Vec::len).collect();
    let mut asked = vec![0usize; n];
    comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| buf.copy_from_slice(&ids[r])).receive(&mut |r, b| asked[r] = ids_in(b)))?;
    // 2. Rows behind the kind byte "rows follow": as many as asked (zeros),
    //    or three bytes more. The honest owners' verdicts on its requests
    //    come back with their rows.
    let extra = if matches!(how, Break::LongReply) { 3 } else { 0 };
    let ok = wholemem::agree::outcome_bytes::<(), wm_gather::Error>(&Ok(()));
    let success: Vec<u8> = [&[FAILED][..], &ok].concat();
    let sizes: Vec<usize> = (0..n)
        .map(|r| match how {
            _ if r == me => 0,
            Break::SuccessVerdict => success.len(),
            _ => 1 + asked[r] * ROW + extra,
        })
        .collect();
    let mut verdicts = vec![ok.clone(); n];
    let mut reply = |r: usize, buf: &mut [u8]| match how {
        Break::SuccessVerdict if r != me => buf.copy_from_slice(&success),
        _ => rows_part(buf),
    };
    comm.exchange(ExchangePlan::new(&sizes, &mut reply).receive(&mut |r, b| {
        if let Some((&FAILED, v)) = b.split_first() {
            verdicts[r] = v.to_vec();
        }
    }))?;
    wholemem::agree::decide(comm, Ok(()), Rule::Lowest, &verdicts)
}

/// The kind bytes of the distributed gather's rows exchange: rows follow,
/// or the owner's verdict on a malformed request.
const ROWS_FOLLOW: u8 = 2;
const FAILED: u8 = 1;

/// The impostor's side of one distributed scatter (to honest rank `r`:
/// one row id past its rows with its row, or two good ids with a row part
/// five bytes too long).
fn fake_scatter(t: &WholeTensor<f32>, foreign: bool) -> wm_gather::Result<()> {
    let mem = t.memory();
    let comm = mem.comm().as_ref();
    let (n, me) = (comm.size(), comm.rank());
    let ids: Vec<Vec<u64>> = (0..n)
        .map(|r| match foreign {
            _ if r == me => Vec::new(),
            true => vec![mem.partition().count(r) as u64],
            false => vec![0, 1],
        })
        .collect();
    let parts: Vec<Vec<u8>> =
        ids.iter().map(|i| shaped_part(SCATTER, &i.iter().flat_map(|id| id.to_le_bytes()).collect::<Vec<u8>>())).collect();
    let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
    comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| buf.copy_from_slice(&parts[r])))?;
    let sizes: Vec<usize> = ids.iter().map(|i| i.len() * ROW + if foreign || i.is_empty() { 0 } else { 5 }).collect();
    comm.exchange(ExchangePlan::new(&sizes, &mut |_, buf| buf.fill(0)))?;
    agree::<(), wm_gather::Error>(comm, Ok(()), Rule::Lowest)
}

fn malformed(world: &Comm, impostor: usize) -> Result<()> {
    let me = world.rank();
    ensure!(impostor < world.size() && world.size() >= 2, "an impostor among at least 2 ranks");
    let rows = 10 * world.size();
    let gathers = [
        (Break::Empty, "an empty part of the row-id exchange"),
        (Break::ShortIds, "12 bytes of row ids"),
        (Break::ForeignId, "position 0, past the 10 rows there"),
        (Break::LongReply, "164 bytes for 10 rows of 16 bytes"),
        (Break::SuccessVerdict, "a verdict of success where rows belong"),
    ];
    for (how, needle) in gathers {
        let what = format!("gather with {how:?} from rank {impostor}");
        let t = table(world, MemoryType::Distributed, rows)?;
        let e = if me == impostor {
            match fake_gather(&t, how) {
                // Nobody tells the liar that its rows were too long: the
                // ranks that got them fail.
                Ok(()) if matches!(how, Break::LongReply | Break::SuccessVerdict) => None,
                r => Some(r.err().with_context(|| format!("{what}: rank {me} must fail"))?),
            }
        } else {
            let ids: Vec<i64> = (0..rows as i64).collect();
            let mut out = vec![0f32; rows * COLS];
            Some(wm_gather::gather_into(&t, &ids, &mut out).err().with_context(|| format!("{what}: rank {me} must fail"))?)
        };
        if let Some(e) = e {
            blames(&what, &e, impostor, (me != impostor).then_some(needle))?;
        }
        t.free()?;
        // A fresh table on the same communicator works on every rank.
        let t = table(world, MemoryType::Distributed, rows)?;
        gather_works(&t).with_context(|| format!("the gather after {what}"))?;
        t.free()?;
    }
    for (foreign, needle) in [(true, "row id 10 at position 0, past the 10 rows there"), (false, "37 bytes for 2 rows")] {
        let what = format!("scatter with {} from rank {impostor}", if foreign { "a foreign row" } else { "a long row part" });
        let mut t = table(world, MemoryType::Distributed, rows)?;
        let e = if me == impostor {
            fake_scatter(&t, foreign).err()
        } else {
            let ids: Vec<i64> = (0..rows as i64).collect();
            let src = vec![-1f32; rows * COLS];
            wm_gather::scatter_from(&mut t, &ids, &src).err()
        };
        let e = e.with_context(|| format!("{what}: rank {me} must fail"))?;
        blames(&what, &e, impostor, (me != impostor).then_some(needle))?;
        t.free()?;
        let t = table(world, MemoryType::Distributed, rows)?;
        gather_works(&t).with_context(|| format!("the gather after {what}"))?;
        t.free()?;
    }
    Ok(())
}

/// The impostor's side of a hierarchy gather on two nodes: in the node's
/// exchange it asks its local peer for a row that another local rank
/// serves; then it follows the sequence, answering with zeros.
fn fake_hierarchy_gather(t: &WholeTensor<f32>) -> wm_gather::Result<()> {
    let mem = t.memory();
    let (local, cross) = (mem.local_comm().expect("hierarchy"), mem.cross_comm().expect("hierarchy"));
    // 1. The node's exchange (kind byte 0: ids follow — "my checks
    //    passed"): a row this rank itself owns, whose owner's local rank is
    //    this rank's, not the peer's it is sent to.
    let own = mem.local_rows().start as u64;
    let send: Vec<Vec<u8>> = (0..local.size()).map(|q| if q == local.rank() { id_part(&[]) } else { id_part(&[own]) }).collect();
    let sizes: Vec<usize> = send.iter().map(Vec::len).collect();
    let mut asked_here = vec![0usize; local.size()];
    local
        .exchange(ExchangePlan::new(&sizes, &mut |q, buf| buf.copy_from_slice(&send[q])).receive(&mut |q, b| asked_here[q] = ids_in(b)))?;
    // 2. Across nodes: no ids ("the node passed its checks").
    let none = id_part(&[]);
    let sizes = vec![none.len(); cross.size()];
    let mut asked_across = vec![0usize; cross.size()];
    cross.exchange(ExchangePlan::new(&sizes, &mut |_, buf| buf.copy_from_slice(&none)).receive(&mut |c, b| asked_across[c] = ids_in(b)))?;
    // 3. Rows across nodes, then back within the node: behind the kind byte
    //    "rows follow", zeros, as many as asked. The verdicts of honest
    //    ranks come back instead of rows.
    let ok = wholemem::agree::outcome_bytes::<(), wm_gather::Error>(&Ok(()));
    let mut heard: Option<wm_gather::Error> = None;
    let sizes: Vec<usize> = asked_across.iter().enumerate().map(|(c, &k)| if c == cross.rank() { 0 } else { 1 + k * ROW }).collect();
    cross.exchange(ExchangePlan::new(&sizes, &mut |_, buf| rows_part(buf)).receive(&mut |c, b| {
        if let Some((&FAILED, v)) = b.split_first() {
            heard.get_or_insert(verdict(cross.as_ref(), c, v, &ok));
        }
    }))?;
    let sizes: Vec<usize> = asked_here.iter().enumerate().map(|(q, &k)| if q == local.rank() { 0 } else { 1 + k * ROW }).collect();
    local.exchange(ExchangePlan::new(&sizes, &mut |_, buf| rows_part(buf)).receive(&mut |q, b| {
        if let Some((&FAILED, v)) = b.split_first() {
            heard.get_or_insert(verdict(local.as_ref(), q, v, &ok));
        }
    }))?;
    heard.map_or(Ok(()), Err)
}

/// A part of zero rows behind the kind byte "rows follow".
fn rows_part(buf: &mut [u8]) {
    buf.fill(0);
    if let Some(kind) = buf.first_mut() {
        *kind = ROWS_FOLLOW;
    }
}

/// The error of the verdict member `from` of `comm` sent.
fn verdict(comm: &dyn Communicator, from: usize, v: &[u8], ok: &[u8]) -> wm_gather::Error {
    let mut parts = vec![ok; comm.size()];
    parts[from] = v;
    match wholemem::agree::decide(comm, Ok(()), Rule::Lowest, &parts) {
        Err(e) => e,
        Ok(()) => {
            wm_gather::Error::Common(CommonError::InvalidArgument(format!("rank {} sent a verdict of success", comm.world_ranks()[from])))
        }
    }
}

fn malformed_hierarchy(world: &Comm, impostor: usize) -> Result<()> {
    let me = world.rank();
    let rows = 10 * world.size();
    let what = format!("hierarchy gather with a misrouted id from rank {impostor}");
    let t = table(world, MemoryType::Hierarchy, rows)?;
    ensure!(t.memory().cross_comm().is_some_and(|c| c.size() > 1), "the scenario needs two nodes");
    let e = if me == impostor {
        fake_hierarchy_gather(&t).err()
    } else {
        let ids: Vec<i64> = (0..rows as i64).collect();
        let mut out = vec![0f32; rows * COLS];
        wm_gather::gather_into(&t, &ids, &mut out).err()
    };
    let e = e.with_context(|| format!("{what}: rank {me} must fail"))?;
    // Only the impostor's local peer saw the part; every rank reports it.
    let saw = world.local().world_ranks().contains(&impostor) && me != impostor;
    blames(&what, &e, impostor, saw.then_some("which another local rank serves"))?;
    t.free()?;
    let t = table(world, MemoryType::Hierarchy, rows)?;
    gather_works(&t).with_context(|| format!("the gather after {what}"))?;
    t.free()?;
    Ok(())
}

/// The impostor's side of one `sample_neighbors(graph, [], FANOUT, SEED)`
/// of a distributed graph: the agreement (the honest request's header and
/// "my checks passed"), then local node `node` asked of every other rank
/// (of rank `only` alone, when given), then an answer of nothing to every
/// rank.
fn fake_sample(g: &CsrGraph, node: u64, only: Option<usize>) -> Result<()> {
    let comm = g.comm().as_ref();
    let (n, me) = (comm.size(), comm.rank());
    // 1. The agreement: the length of the request (32 bytes), the request as
    //    words (fanout, seed, weighted, edge ids), then the status byte 0,
    //    "passed".
    let mut msg: Vec<u8> = [32, FANOUT as u64, SEED, 0, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
    msg.push(0);
    comm.allgatherv(&msg)?;
    // 2. The centers to their owners: `node`, one 8-byte word, to each.
    let asks = |r: usize| r != me && only.is_none_or(|o| o == r);
    let sizes: Vec<usize> = (0..n).map(|r| if asks(r) { 8 } else { 0 }).collect();
    comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| {
        if asks(r) {
            buf.copy_from_slice(&node.to_le_bytes())
        }
    }))?;
    // 3. The answers: the kind word "answer" and nothing else (nobody
    //    asked it for a center).
    let sizes: Vec<usize> = (0..n).map(|r| if r == me { 0 } else { 8 }).collect();
    comm.exchange(ExchangePlan::new(&sizes, &mut |_, buf| buf.fill(0)))?;
    Ok(())
}

/// The request of [`malformed_sample`].
const FANOUT: usize = 2;
const SEED: u64 = 7;

fn malformed_sample(world: &Comm, impostor: usize) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    ensure!(impostor < n && n >= 2, "an impostor among at least 2 ranks");
    // A ring of 4 nodes per rank: every node has degree 1.
    let nodes = 4 * n;
    let src: Vec<i64> = (4 * me as i64..4 * me as i64 + 4).collect();
    let dst: Vec<i64> = src.iter().map(|&v| (v + 1) % nodes as i64).collect();
    let g = wm_graph::build(world, &BuildOptions::new(nodes, MemoryType::Distributed, Location::Host), EdgeList::new(&src, &dst))?;
    let count = g.local_nodes().len() as u64;
    // The bad node asked of every other rank, then of one alone: the ranks
    // it did not ask learn of it from the one it did (that rank's verdict
    // names the impostor).
    let first_honest = usize::from(impostor == 0);
    let cases = [u64::MAX, u64::MAX - 1, i64::MAX as u64, 1 << 63, count].map(|node| (node, None));
    for (node, only) in cases.into_iter().chain([(count, Some(first_honest))]) {
        let what = format!(
            "sampling with local node {node} asked by rank {impostor} of {}",
            only.map_or("every rank".into(), |o| format!("rank {o}"))
        );
        if me == impostor {
            fake_sample(&g, node, only).with_context(|| what.clone())?;
        } else {
            let e = wm_graph::sample_neighbors(&g, &[], FANOUT, SEED).err().with_context(|| format!("{what}: rank {me} must fail"))?;
            let wm_graph::Error::Common(CommonError::PeerFailed { rank, detail }) = &e else {
                bail!("{what}: not an error naming a peer: {e}")
            };
            ensure!(*rank == impostor, "{what}: the error blames rank {rank}, not rank {impostor}: {e}");
            ensure!(detail.contains(&format!("local node {node}, of {count}")), "{what}: {e} does not name the node");
            println!("{what}: {e}");
        }
        // The next call works on every rank: every center's one neighbour.
        let centers: Vec<i64> = (0..nodes as i64).collect();
        let s = wm_graph::sample_neighbors(&g, &centers, FANOUT, SEED).with_context(|| format!("the call after {what}"))?;
        ensure!(centers.iter().enumerate().all(|(i, &v)| s.of(i) == [(v + 1) % nodes as i64]), "the call after {what} gave {s:?}");
    }
    g.free()?;
    Ok(())
}

/// The impostor's side of `apply_gradients`: to each peer either a row id
/// past its rows, or one id with two rows of gradients.
fn fake_gradients(emb: &Embedding<f32>, foreign: bool, lr: f32) -> wm_embedding::Result<()> {
    let comm = emb.comm().as_ref();
    let (n, me) = (comm.size(), comm.rank());
    let p = emb.table().memory().partition();
    // One exchange: kind 0 ("my checks passed"), the rate, one id, and one
    // row of gradients (or two), to every peer.
    let parts: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            let mut part = vec![0u8];
            part.extend_from_slice(&lr.to_le_bytes());
            if r == me {
                part.extend_from_slice(&0u64.to_le_bytes());
                return part;
            }
            part.extend_from_slice(&1u64.to_le_bytes());
            part.extend_from_slice(&(if foreign { p.count(r) as u64 + 1 } else { 0 }).to_le_bytes());
            part.resize(part.len() + if foreign { ROW } else { 2 * ROW }, 0);
            part
        })
        .collect();
    let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
    comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| buf.copy_from_slice(&parts[r])))?;
    agree::<(), wm_embedding::Error>(comm, Ok(()), Rule::Lowest)
}

fn malformed_gradients(world: &Comm, impostor: usize) -> Result<()> {
    let me = world.rank();
    let rows = 10 * world.size();
    let lr = 0.5f32;
    for (foreign, needle) in
        [(true, "row id 11 at position 0, past the 10 rows there"), (false, "32 bytes of gradients for 1 ids of dimension 4")]
    {
        let what = format!("gradients with {} from rank {impostor}", if foreign { "a foreign row" } else { "two rows for one id" });
        let mut emb = Embedding::<f32>::allocate(world, MemoryType::Distributed, Location::Host, rows, COLS, None, Some(Optimizer::sgd()))?;
        let e = if me == impostor {
            fake_gradients(&emb, foreign, lr).err()
        } else {
            let ids: Vec<i64> = (0..rows as i64).collect();
            emb.apply_gradients(&ids, &vec![1.0; rows * COLS], lr).err()
        };
        let e = e.with_context(|| format!("{what}: rank {me} must fail"))?;
        let wm_embedding::Error::Common(CommonError::Malformed { rank, detail }) = &e else {
            bail!("{what}: not a malformed-peer error: {e}")
        };
        ensure!(*rank == impostor, "{what}: blames rank {rank}: {e}");
        ensure!(me == impostor || detail.contains(needle), "{what}: {e:?} does not say {needle:?}");
        println!("{what}: {e}");
        // Nothing was applied anywhere: every rank stopped before updating.
        let mut w = vec![1f32; rows * COLS];
        emb.gather(&(0..rows as i64).collect::<Vec<_>>(), &mut w)?;
        ensure!(w.iter().all(|&v| v == 0.0), "{what}: a row changed although the call failed");
        // The next call works: one step of SGD on row `me` from every rank.
        emb.apply_gradients(&[me as i64], &[1.0; COLS], lr)?;
        emb.gather(&(0..rows as i64).collect::<Vec<_>>(), &mut w)?;
        for (r, row) in w.chunks(COLS).enumerate() {
            let want = if r < world.size() { -lr } else { 0.0 };
            ensure!(row.iter().all(|&v| v == want), "{what}: row {r} is {row:?} after the next step, expected {want}");
        }
        emb.free()?;
    }
    Ok(())
}

/// `lock-holder dies|stuck DIR` on 2 ranks.
fn lock_holder(world: &Comm, how: &str, dir: &str) -> Result<()> {
    ensure!(world.size() == 2, "lock-holder runs on 2 ranks");
    let me = world.rank();
    let mut t = table(world, MemoryType::Continuous, 64)?;
    let row = 5;
    let released = std::path::Path::new(dir).join("timed-out");
    let past_barrier = std::path::Path::new(dir).join("past-barrier");
    let wait_for = |f: &std::path::Path| {
        while !f.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    if me == 1 {
        let locks = t.memory().row_locks().context("a continuous table has row locks")?;
        let guard = locks.lock(row)?;
        world.barrier()?;
        if how == "dies" {
            // Once rank 0 is out of the barrier (a death during it would
            // be a lost peer there), die holding the lock.
            wait_for(&past_barrier);
            // SAFETY: raising a signal at this process has no memory effects.
            unsafe { libc::raise(libc::SIGKILL) };
            bail!("still alive after SIGKILL");
        }
        // Stuck: hold the lock until rank 0 has timed out waiting for it.
        wait_for(&released);
        drop(guard);
        world.barrier()?;
        world.barrier()?;
        return t.free().map_err(Into::into);
    }
    world.barrier()?;
    std::fs::write(&past_barrier, b"")?;
    let locks = t.memory().row_locks().context("a continuous table has row locks")?;
    match how {
        "dies" => {
            // The holder dies: the kernel hands the lock over.
            let g = locks.lock(row)?;
            ensure!(g.owner_died(), "the lock of a dead holder must say so");
            drop(g);
            ensure!(!locks.lock(row)?.owner_died(), "recovered once, the lock is plain again");
            // And writes through the mapping take it as usual.
            t.write_row(row, &[7.0; COLS])?;
            let mut back = [0f32; COLS];
            t.read_row(row, &mut back)?;
            ensure!(back == [7.0; COLS], "row {row} reads {back:?}");
            println!("rank 0 took the lock of row {row} from its dead holder");
            // The communicator knows rank 1 is gone: no collective free.
            drop(t);
            Ok(())
        }
        "stuck" => {
            let e = locks.lock(row).err().context("a held lock must time out")?;
            ensure!(matches!(e, wholemem::Error::Common(CommonError::Timeout { .. })), "not a timeout: {e}");
            ensure!(e.to_string().contains(&format!("row {row}")), "{e}");
            // A write of the row times out too, as an error of the call.
            let e = t.write_row(row, &[7.0; COLS]).err().context("a write under a held lock must time out")?;
            ensure!(matches!(e, wholemem::Error::Common(CommonError::Timeout { .. })), "not a timeout: {e}");
            println!("rank 0: {e}");
            std::fs::write(&released, b"")?;
            world.barrier()?;
            t.write_row(row, &[7.0; COLS])?;
            world.barrier()?;
            t.free().map_err(Into::into)
        }
        other => bail!("lock-holder dies|stuck, not {other:?}"),
    }
}

/// Bytes rank `from` sends rank `to` in test exchanges: both named in every
/// byte's value, so a misplaced piece cannot pass.
#[cfg(feature = "mpi")]
fn bytes_for(from: usize, to: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (from * 31 + to * 7 + i * 13 % 251) as u8).collect()
}

#[cfg(feature = "mpi")]
fn mpi_rounds(world: &Comm) -> Result<()> {
    ensure!(world.backend() == "mpi", "mpi-rounds runs under mpirun with the MPI backend, not {}", world.backend());
    let (me, n) = (world.rank(), world.size());
    // A few bytes per rank and call: every exchange below takes many rounds.
    let limit = 8 * n + 3;
    wm_comm::mpi_backend::set_round_limit(limit);
    let checked = (|| -> Result<()> {
        let len = |from: usize, to: usize| (from * 37 + to * 11) % 90 + if to == 0 { 300 } else { 0 };
        let send: Vec<Vec<u8>> = (0..n).map(|to| bytes_for(me, to, len(me, to))).collect();
        let got = world.alltoallv(&send.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        for (from, g) in got.iter().enumerate() {
            ensure!(*g == bytes_for(from, me, len(from, me)), "alltoallv: the part from rank {from} differs");
        }
        let all = world.allgatherv(&bytes_for(me, 99, 150 + me * 41))?;
        for (from, g) in all.iter().enumerate() {
            ensure!(*g == bytes_for(from, 99, 150 + from * 41), "allgatherv: rank {from}'s part differs");
        }
        let mut b = if me == n - 1 { bytes_for(n - 1, 7, 1000) } else { Vec::new() };
        world.broadcast(n - 1, &mut b)?;
        ensure!(b == bytes_for(n - 1, 7, 1000), "broadcast differs");
        // A distributed gather goes through the same calls.
        let t = table(world, MemoryType::Distributed, 25 * n)?;
        gather_works(&t)?;
        t.free()?;
        println!("rank {me}: alltoallv, allgatherv, broadcast and a gather in rounds of at most {limit} bytes per rank");
        Ok(())
    })();
    wm_comm::mpi_backend::set_round_limit(usize::MAX);
    checked
}

/// A distributed table of `rows` rows, and a node cache of all its rows
/// that every gather goes through.
fn cached_table(world: &Comm, rows: usize) -> Result<(WholeTensor<f32>, wm_gather::cache::NodeCache)> {
    let t = table(world, MemoryType::Distributed, rows)?;
    let layout = wm_gather::RowLayout::new(wm_gather::DType::F32, COLS, 0)?;
    let mut cache = wm_gather::cache::NodeCache::new(t.memory(), &layout, 1.0)?;
    cache.set_bypass(wm_gather::cache::Bypass::Off);
    Ok((t, cache))
}

/// A cached gather on nodes of several ranks where the impostor follows
/// the node cache's collectives honestly but sends a reply 3 bytes too
/// long to rank `target` only: `target` alone finds it, yet every honest
/// rank must fail naming the impostor (not wait for `target` in the cache's
/// step 3 and blame an honest rank), and the communicator must stay usable.
fn malformed_cache(world: &Comm, impostor: usize, target: usize) -> Result<()> {
    use wm_comm::CommExt;
    let me = world.rank();
    let rows = 10 * world.size();
    let (t, mut cache) = cached_table(world, rows)?;
    let mem = t.memory();
    let started = std::time::Instant::now();
    let r: std::result::Result<(), wm_gather::Error> = if me == impostor {
        (|| {
            let comm = mem.comm().as_ref();
            let (n, me) = (comm.size(), comm.rank());
            comm.allgather_pod(&[1u64, mem.write_generation(), 0, 0, 0])?;
            let ids: Vec<Vec<u8>> = (0..n).map(|_| id_part(&[])).collect();
            let sizes: Vec<usize> = ids.iter().map(Vec::len).collect();
            let mut asked = vec![0usize; n];
            comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| buf.copy_from_slice(&ids[r])).receive(&mut |r, b| asked[r] = ids_in(b)))?;
            let ok = wholemem::agree::outcome_bytes::<(), wm_gather::Error>(&Ok(()));
            let sizes: Vec<usize> =
                (0..n).map(|r| if r == me { 0 } else { 1 + asked[r] * ROW + if r == target { 3 } else { 0 } }).collect();
            let mut verdicts = vec![ok.clone(); n];
            comm.exchange(ExchangePlan::new(&sizes, &mut |_, buf| rows_part(buf)).receive(&mut |r, b| {
                if let Some((&FAILED, v)) = b.split_first() {
                    verdicts[r] = v.to_vec();
                }
            }))?;
            wholemem::agree::decide::<(), wm_gather::Error, _>(comm, Ok(()), Rule::Lowest, &verdicts)?;
            // Step 3 as an honest follower of its node.
            let local = comm.local();
            let report: Vec<u8> = 0u64.to_le_bytes().to_vec();
            let parts: Vec<&[u8]> = (0..local.size()).map(|q| if q == 0 { &report[..] } else { &[][..] }).collect();
            local.alltoallv(&parts)?;
            let mut b = Vec::new();
            local.broadcast(0, &mut b)?;
            agree::<(), wm_gather::Error>(comm, Ok(()), Rule::Lowest)
        })()
    } else {
        let ids: Vec<i64> = (0..rows as i64).collect();
        let mut out = vec![0u8; rows * ROW];
        cache.gather(mem, wm_gather::Ids::I64(&ids), &mut out, wm_gather::DType::F32)
    };
    println!("rank {me}: cached gather -> {r:?} after {:.1} s", started.elapsed().as_secs_f64());
    let after = world.barrier();
    println!("rank {me}: barrier after -> {after:?}");
    if me != impostor {
        let e = r.err().context("an honest rank must fail")?;
        blames(&format!("rank {me}'s cached gather"), &e, impostor, None)?;
    }
    after.context("the barrier after the failed cached gather")?;
    Ok(())
}

/// A cached gather where the impostor says in the cache's opening
/// allgather that it failed the cache's table check, then takes part in the
/// gather as if it had passed (the table's own gather moves rows as the
/// cached path's fetch does). Every honest rank skipped following the
/// write generations for it, so rows written since might have been served:
/// each must fail naming the impostor, never succeed.
fn cache_false_refusal(world: &Comm, impostor: usize) -> Result<()> {
    use wm_comm::CommExt;
    let me = world.rank();
    let rows = 10 * world.size();
    let (t, mut cache) = cached_table(world, rows)?;
    let mem = t.memory();
    let layout = wm_gather::RowLayout::new(wm_gather::DType::F32, COLS, 0)?;
    let ids: Vec<i64> = (0..rows as i64).collect();
    let mut out = vec![0u8; rows * ROW];
    // An honest call first: the caches hold the other nodes' rows.
    cache.gather(mem, wm_gather::Ids::I64(&ids), &mut out, wm_gather::DType::F32)?;
    let r = if me == impostor {
        mem.comm().as_ref().allgather_pod(&[0u64; 5])?;
        wm_gather::gather(mem, &layout, wm_gather::Ids::I64(&ids), &mut out, wm_gather::DType::F32)
    } else {
        cache.gather(mem, wm_gather::Ids::I64(&ids), &mut out, wm_gather::DType::F32)
    };
    println!("rank {me}: cached gather -> {r:?}");
    if me != impostor {
        let e = r.err().context("an honest rank must fail")?;
        blames(&format!("rank {me}'s cached gather"), &e, impostor, Some("announced a failed cache table check"))?;
    }
    world.barrier()?;
    Ok(())
}

/// The impostor's side of a hierarchy gather on two nodes: no ids of its
/// own, then a verdict of success across nodes where rows belong, then
/// zeros for the rows its node's ranks asked of it.
fn fake_hierarchy_success(t: &WholeTensor<f32>) -> wm_gather::Result<()> {
    let mem = t.memory();
    let (local, cross) = (mem.local_comm().expect("a hierarchy table"), mem.cross_comm().expect("a hierarchy table"));
    let none = id_part(&[]);
    let sizes = vec![none.len(); local.size()];
    let mut asked_here = vec![0usize; local.size()];
    local.exchange(ExchangePlan::new(&sizes, &mut |_, buf| buf.copy_from_slice(&none)).receive(&mut |q, b| asked_here[q] = ids_in(b)))?;
    let sizes = vec![none.len(); cross.size()];
    cross.exchange(ExchangePlan::new(&sizes, &mut |_, buf| buf.copy_from_slice(&none)))?;
    let ok = wholemem::agree::outcome_bytes::<(), wm_gather::Error>(&Ok(()));
    let success: Vec<u8> = [&[FAILED][..], &ok].concat();
    let sizes: Vec<usize> = (0..cross.size()).map(|c| if c == cross.rank() { 0 } else { success.len() }).collect();
    cross.exchange(ExchangePlan::new(&sizes, &mut |_, buf| {
        if !buf.is_empty() {
            buf.copy_from_slice(&success)
        }
    }))?;
    let sizes: Vec<usize> = asked_here.iter().enumerate().map(|(q, &k)| if q == local.rank() { 0 } else { 1 + k * ROW }).collect();
    local.exchange(ExchangePlan::new(&sizes, &mut |_, buf| rows_part(buf)))?;
    Ok(())
}

/// A hierarchy gather on two nodes where the impostor sends the other node
/// a verdict of success where rows belong. Its peer there finds it, and
/// passes it on to its own node's ranks: each rank of the other node must
/// fail naming the impostor, not the rank that passed it on. (The
/// impostor's own node gets zeros from it, which no rank can tell from
/// rows.)
fn hierarchy_success_verdict(world: &Comm, impostor: usize) -> Result<()> {
    let me = world.rank();
    let rows = 10 * world.size();
    let t = table(world, MemoryType::Hierarchy, rows)?;
    ensure!(t.memory().cross_comm().is_some_and(|c| c.size() > 1), "the scenario needs two nodes");
    let r = if me == impostor {
        fake_hierarchy_success(&t)
    } else {
        let ids: Vec<i64> = (0..rows as i64).collect();
        let mut out = vec![0f32; rows * COLS];
        wm_gather::gather_into(&t, &ids, &mut out)
    };
    println!("rank {me}: {r:?}");
    let other_node = !world.local().world_ranks().contains(&impostor);
    match r {
        Err(e) if me != impostor => blames(&format!("rank {me}'s gather"), &e, impostor, Some("a verdict of success where rows belong"))?,
        Ok(()) if other_node => bail!("rank {me}, on the other node, gathered without an error"),
        _ => {}
    }
    t.free()?;
    let t = table(world, MemoryType::Hierarchy, rows)?;
    gather_works(&t).context("the gather after the verdict of success")?;
    t.free()?;
    Ok(())
}

/// `apply_gradients` where the impostor sends rank 0 one learning rate and
/// the other ranks another (no ids). Each rank compares the rates it
/// received, so only some see a difference: every honest rank must still
/// fail saying so (before, the others waited in the closing agreement for
/// the ranks that had returned, until the timeout blamed them), nothing
/// changes, and the next call works.
fn split_rates(world: &Comm, impostor: usize) -> Result<()> {
    let (me, n) = (world.rank(), world.size());
    ensure!(impostor != 0 && n >= 3, "an impostor other than rank 0 among at least 3 ranks");
    let rows = 10 * n;
    let lr = 0.5f32;
    let mut emb = Embedding::<f32>::allocate(world, MemoryType::Distributed, Location::Host, rows, COLS, None, Some(Optimizer::sgd()))?;
    let r = if me == impostor {
        let comm = emb.comm().as_ref();
        let parts: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                let rate = if r == 0 { lr } else { 2.0 * lr };
                [&[0u8][..], &rate.to_le_bytes(), &0u64.to_le_bytes()].concat()
            })
            .collect();
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        comm.exchange(ExchangePlan::new(&sizes, &mut |r, buf| buf.copy_from_slice(&parts[r])))?;
        agree::<(), wm_embedding::Error>(comm, Ok(()), Rule::OwnFirst)
    } else {
        let ids: Vec<i64> = (0..rows as i64).collect();
        emb.apply_gradients(&ids, &vec![1.0; rows * COLS], lr)
    };
    if me != impostor {
        let e = r.err().with_context(|| format!("rank {me} must fail"))?;
        ensure!(e.to_string().contains("ranks passed different learning rates"), "rank {me}: {e}");
        println!("rank {me}: {e}");
    }
    let mut w = vec![1f32; rows * COLS];
    emb.gather(&(0..rows as i64).collect::<Vec<_>>(), &mut w)?;
    ensure!(w.iter().all(|&v| v == 0.0), "a row changed although the call failed");
    emb.apply_gradients(&[me as i64], &[1.0; COLS], lr)?;
    emb.free()?;
    Ok(())
}
