//! Sampling distributed and hierarchy graphs: each center goes to the rank
//! that owns it, is sampled there from the owner's own rows, and its sample
//! comes back.
//!
//! Replies travel as little-endian 64-bit words, behind a kind word: an
//! answer (for the centers one rank asked, their counts, then the sampled
//! neighbours, then, when asked, the edge ids), or a verdict (an owner that
//! failed tells every rank, not only those that asked it something). What
//! a peer sends is input: every answer is checked (lengths, counts against
//! the fanout, ids against the graph) before it is used.

use wholemem::CommonError;
use wm_comm::{CommExt, Communicator, ExchangePlan};

use crate::collective::bucket;
use crate::csr::CsrGraph;
use crate::sample::{Sample, SampleRequest, sample_local};
use crate::{Error, Result};

/// The answer for the centers one rank asked, borrowed.
#[derive(Debug, Clone, Copy, Default)]
struct AnswerView<'a> {
    counts: &'a [usize],
    neighbors: &'a [i64],
    /// Empty unless the request asks for edge ids.
    edge_ids: &'a [i64],
}

impl AnswerView<'_> {
    /// Words of the reply: its kind, then the answer.
    fn words(&self) -> usize {
        1 + self.counts.len() + self.neighbors.len() + self.edge_ids.len()
    }

    /// Writes the reply into `buf` (exactly [`words`](Self::words) words).
    fn encode_into(&self, buf: &mut [u8]) {
        debug_assert_eq!(buf.len(), 8 * self.words());
        let words = std::iter::once(ANSWER)
            .chain(self.counts.iter().map(|&c| c as u64))
            .chain(self.neighbors.iter().chain(self.edge_ids).map(|&x| x as u64));
        for (b, w) in buf.chunks_exact_mut(8).zip(words) {
            b.copy_from_slice(&w.to_le_bytes());
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 8 * self.words()];
        self.encode_into(&mut buf);
        buf
    }
}

/// An answer received from a peer.
#[derive(Debug, Default)]
struct Answer {
    counts: Vec<usize>,
    neighbors: Vec<i64>,
    edge_ids: Vec<i64>,
}

impl Answer {
    fn view(&self) -> AnswerView<'_> {
        AnswerView { counts: &self.counts, neighbors: &self.neighbors, edge_ids: &self.edge_ids }
    }
}

/// The kind word of a reply that holds an answer.
const ANSWER: u64 = 0;
/// The kind word of a reply that holds a verdict: its length in bytes, then
/// the verdict, padded to whole words.
const VERDICT: u64 = 1;

/// A reply that tells a rank this call failed with `e` instead of
/// answering it. The verdict is [`wholemem::agree::relayed_bytes`]: an
/// error this rank heard from another keeps naming that rank.
fn verdict_reply(e: &Error) -> Vec<u8> {
    let v = wholemem::agree::relayed_bytes(e);
    let mut b: Vec<u8> = [VERDICT, v.len() as u64].iter().flat_map(|w| w.to_le_bytes()).collect();
    b.extend_from_slice(&v);
    b.resize(b.len().next_multiple_of(8), 0);
    b
}

/// The 64-bit word at the start of `b` (8 bytes or more).
fn word(b: &[u8]) -> u64 {
    b.first_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w))
}

/// Node ids (local numbers) as a peer sent them: `None` unless whole words.
fn decode_ids(bytes: &[u8]) -> Option<Vec<u64>> {
    (bytes.len() % 8 == 0).then(|| bytes.chunks_exact(8).map(word).collect())
}

/// Checks and decodes the reply of world rank `from` for `asked` centers:
/// its answer, or the error its verdict holds.
fn decode_reply(bytes: &[u8], asked: usize, req: &SampleRequest, graph: &CsrGraph, from: usize) -> Result<Answer> {
    let bad = |detail: String| Error::Common(CommonError::PeerFailed { rank: from, detail });
    if bytes.len() % 8 != 0 {
        return Err(bad(format!("it answered {} bytes, not whole 8-byte words", bytes.len())));
    }
    let bytes = match bytes.split_first_chunk::<8>().map(|(k, rest)| (u64::from_le_bytes(*k), rest)) {
        Some((ANSWER, rest)) => rest,
        Some((VERDICT, rest)) => {
            let len = usize::try_from(word(rest)).unwrap_or(usize::MAX);
            let verdict = rest.get(8..).filter(|v| len <= v.len() && v.len() == len.next_multiple_of(8)).map(|v| &v[..len]);
            return Err(match verdict.map(|v| wholemem::agree::outcome_error::<Error>(from, v)) {
                Some(Some(e)) => e,
                Some(None) => bad("it sent a verdict of success".into()),
                None => bad(format!("it sent a verdict of {len} bytes in a reply of {} bytes", rest.len() + 8)),
            });
        }
        Some((kind, _)) => return Err(bad(format!("it sent a reply of unknown kind {kind}"))),
        None => return Err(bad("it sent an empty reply".into())),
    };
    let words = bytes.len() / 8;
    if words < asked {
        return Err(bad(format!("it answered {words} words for {asked} centers")));
    }
    let (head, rest) = bytes.split_at(8 * asked);
    let mut counts = Vec::with_capacity(asked);
    let mut total = 0usize;
    for c in head.chunks_exact(8).map(word) {
        if c > req.fanout as u64 || c > words as u64 {
            return Err(bad(format!("it answered {c} samples for a center with fanout {}", req.fanout)));
        }
        counts.push(c as usize);
        // Both at most `words`, so the sum fits; past `words` it cannot be
        // a whole answer.
        total += c as usize;
        if total > words {
            return Err(bad(format!("it answered {words} words for {asked} centers and more than {words} samples")));
        }
    }
    let per = if req.edge_ids { 2 } else { 1 };
    if total.checked_mul(per).and_then(|t| t.checked_add(asked)) != Some(words) {
        return Err(bad(format!("it answered {words} words for {asked} centers and {total} samples")));
    }
    let (ids, eids) = rest.split_at(8 * total);
    let (nodes, edges) = (graph.nodes() as u64, graph.edges() as u64);
    let mut neighbors = Vec::with_capacity(total);
    for x in ids.chunks_exact(8).map(word) {
        if x >= nodes {
            return Err(bad(format!("it answered neighbour {x} in a graph of {nodes} nodes")));
        }
        neighbors.push(x as i64);
    }
    let mut edge_ids = Vec::with_capacity(eids.len() / 8);
    for e in eids.chunks_exact(8).map(word) {
        if e >= edges {
            return Err(bad(format!("it answered edge {e} in a graph of {edges} edges")));
        }
        edge_ids.push(e as i64);
    }
    Ok(Answer { counts, neighbors, edge_ids })
}

/// What an owner sampled for the centers every rank asked: one local
/// sample of them all, and where each asker's part starts.
struct Served {
    counts: Vec<usize>,
    neighbors: Vec<i64>,
    edge_ids: Vec<i64>,
    /// `(first center, first sample)` of each asker's part, then the ends.
    starts: Vec<(usize, usize)>,
}

impl Served {
    fn view(&self, r: usize) -> AnswerView<'_> {
        let ((c0, n0), (c1, n1)) = (self.starts[r], self.starts[r + 1]);
        AnswerView {
            counts: &self.counts[c0..c1],
            neighbors: &self.neighbors[n0..n1],
            edge_ids: if self.edge_ids.is_empty() { &[] } else { &self.edge_ids[n0..n1] },
        }
    }
}

/// Serves the centers each rank asked (local node numbers relative to this
/// rank's first node, `first`), all in one local sample. `askers` are the
/// world ranks of the askers, named when one asks for a node this rank
/// does not hold.
fn serve(graph: &CsrGraph, asked: &[Vec<u64>], askers: &[usize], first: usize, req: &SampleRequest, threads: usize) -> Result<Served> {
    let count = graph.local_nodes().len() as u64;
    let me = graph.comm().world_rank();
    let mut all: Vec<u64> = Vec::with_capacity(asked.iter().map(Vec::len).sum());
    let mut problem = None;
    for (a, &asker) in asked.iter().zip(askers) {
        match a.iter().find(|&&x| x >= count) {
            // What a peer sends is input: a number past this rank's nodes
            // (up to 2^64 - 1) is named, never added to `first`.
            Some(&bad) => {
                let detail = format!("it asked rank {me} for its local node {bad}, of {count}");
                problem.get_or_insert(Error::Common(CommonError::PeerFailed { rank: asker, detail }));
            }
            // Each below `count`: `first + x` is one of this rank's nodes.
            None => all.extend(a.iter().map(|&x| x + first as u64)),
        }
    }
    if problem.is_some() {
        // Device graphs still take part in the gathers of this call, with
        // nothing to read.
        all.clear();
    }
    let sampled = sample_local(graph, &all, |v| v, req, threads);
    if let Some(e) = problem {
        return Err(e);
    }
    let (counts, neighbors, edge_ids) = sampled?;
    let mut starts = Vec::with_capacity(asked.len() + 1);
    let (mut c0, mut n0) = (0, 0);
    starts.push((c0, n0));
    for a in asked {
        n0 += counts[c0..c0 + a.len()].iter().sum::<usize>();
        c0 += a.len();
        starts.push((c0, n0));
    }
    Ok(Served { counts, neighbors, edge_ids, starts })
}

/// Places the answers: `parts[r]` answers the centers at positions
/// `positions(r)`.
fn assemble<'a>(n: usize, parts: &[AnswerView<'_>], positions: impl Fn(usize) -> &'a [usize], edge_ids: bool) -> Sample {
    let mut counts = vec![0usize; n];
    for (r, part) in parts.iter().enumerate() {
        for (&i, &c) in positions(r).iter().zip(part.counts) {
            counts[i] = c;
        }
    }
    let total: usize = counts.iter().sum();
    let mut s = Sample::from_counts(&counts, vec![0; total], if edge_ids { vec![0; total] } else { Vec::new() });
    for (r, part) in parts.iter().enumerate() {
        let mut at = 0;
        for (&i, &c) in positions(r).iter().zip(part.counts) {
            let o = s.offsets[i];
            s.neighbors[o..o + c].copy_from_slice(&part.neighbors[at..at + c]);
            if edge_ids {
                s.edge_ids[o..o + c].copy_from_slice(&part.edge_ids[at..at + c]);
            }
            at += c;
        }
    }
    s
}

/// One in-place exchange of words with the other ranks of `comm`:
/// `words(r)` words to rank `r`, written by `fill(r, bytes)`; what rank `r`
/// sent is handed to `take(r, bytes)`. Nothing goes to this rank itself.
fn exchange(
    comm: &dyn Communicator,
    words: impl Fn(usize) -> usize,
    fill: impl Fn(usize, &mut [u8]),
    mut take: impl FnMut(usize, &[u8]),
) -> Result<()> {
    let me = comm.rank();
    let sizes: Vec<usize> = (0..comm.size()).map(|r| if r == me { 0 } else { 8 * words(r) }).collect();
    let mut fill_others = |r: usize, buf: &mut [u8]| {
        if r != me {
            fill(r, buf);
        }
    };
    comm.exchange(ExchangePlan::new(&sizes, &mut fill_others).receive(&mut |r, bytes| {
        if r != me {
            take(r, bytes);
        }
    }))?;
    Ok(())
}

/// Distributed graphs (and hierarchy graphs on one node): one exchange of
/// centers to their owners, one of samples back; this rank's own centers
/// never leave it.
pub(crate) fn distributed(
    graph: &CsrGraph,
    comm: &dyn Communicator,
    centers: &[i64],
    req: &SampleRequest,
    threads: usize,
) -> Result<Sample> {
    let (n, me) = (comm.size(), comm.rank());
    let ranks = comm.world_ranks();
    let p = graph.node_partition();
    let owners: Vec<usize> = centers.iter().map(|&v| p.owner(v as usize)).collect();
    let (order, starts) = bucket(&owners, n);
    let positions = |r: usize| &order[starts[r]..starts[r + 1]];
    let local_id = |r: usize, i: usize| (centers[i] as usize - p.offset(r)) as u64;

    // 1. The centers to their owners.
    let mut asked: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut problem = None;
    exchange(
        comm,
        |r| positions(r).len(),
        |r, buf| {
            for (b, &i) in buf.chunks_exact_mut(8).zip(positions(r)) {
                b.copy_from_slice(&local_id(r, i).to_le_bytes());
            }
        },
        |r, bytes| match decode_ids(bytes) {
            Some(ids) => asked[r] = ids,
            None => {
                let detail = format!("it asked for {} bytes of centers, not whole 8-byte ids", bytes.len());
                problem.get_or_insert(Error::Common(CommonError::PeerFailed { rank: ranks[r], detail }));
            }
        },
    )?;
    asked[me] = positions(me).iter().map(|&i| local_id(me, i)).collect();

    // 2. The samples back. A failure here is kept until the answers are
    //    exchanged, so every rank stays in step; its verdict, sent to every
    //    rank instead of answers, tells the others.
    let served = match problem {
        Some(e) => Err(e),
        None => serve(graph, &asked, ranks, p.offset(me), req, threads),
    };
    let verdict = served.as_ref().err().map(verdict_reply);
    let mut arrived: Vec<Option<Result<Answer>>> = (0..n).map(|_| None).collect();
    exchange(
        comm,
        |r| match (&served, &verdict) {
            (Ok(s), _) => s.view(r).words(),
            (Err(_), v) => v.as_ref().map_or(0, Vec::len) / 8,
        },
        |r, buf| match (&served, &verdict) {
            (Ok(s), _) => s.view(r).encode_into(buf),
            (Err(_), v) => buf.copy_from_slice(v.as_deref().unwrap_or_default()),
        },
        |r, bytes| arrived[r] = Some(decode_reply(bytes, positions(r).len(), req, graph, ranks[r])),
    )?;
    let served = served?;
    let mut answers = Vec::with_capacity(n);
    for (r, a) in arrived.into_iter().enumerate() {
        answers.push(match a {
            _ if r == me => Answer::default(),
            Some(a) => a?,
            None => return Err(Error::Common(CommonError::PeerFailed { rank: ranks[r], detail: "its answer never came".into() })),
        });
    }
    let parts: Vec<AnswerView<'_>> = (0..n).map(|r| if r == me { served.view(me) } else { answers[r].view() }).collect();
    Ok(assemble(centers.len(), &parts, positions, req.edge_ids))
}

/// Hierarchy graphs on several nodes: a center goes to the rank of its node
/// that shares its owner's local rank, which asks the owner's node once for
/// a center several local ranks want, then fans the samples back.
pub(crate) fn hierarchy(graph: &CsrGraph, centers: &[i64], req: &SampleRequest, threads: usize) -> Result<Sample> {
    let comm = graph.comm().clone();
    let (local, cross) = (comm.local(), comm.cross());
    let placement = wm_topology::NodeLayout::of(comm.nodes());
    let p = graph.node_partition();

    // 1. Within the node: each center to the local rank that shares its
    //    owner's local rank (its cross communicator reaches the owner).
    let via: Vec<usize> = centers.iter().map(|&v| placement.local[p.owner(v as usize)]).collect();
    let (order, starts) = bucket(&via, local.size());
    let positions = |q: usize| &order[starts[q]..starts[q + 1]];
    let to_local: Vec<Vec<u64>> = (0..local.size()).map(|q| positions(q).iter().map(|&i| centers[i] as u64).collect()).collect();
    let refs: Vec<&[u64]> = to_local.iter().map(Vec::as_slice).collect();
    let from_local = local.alltoallv_pod(&refs)?;

    // 2. Each center the node asked of this rank once, to the owner's node.
    let nodes = graph.nodes() as u64;
    let mut unique: Vec<u64> = from_local.iter().flatten().copied().filter(|&v| v < nodes).collect();
    unique.sort_unstable();
    unique.dedup();
    let owner_node: Vec<usize> = unique.iter().map(|&v| placement.node[p.owner(v as usize)]).collect();
    let (uorder, ustarts) = bucket(&owner_node, cross.size());
    let upos = |c: usize| &uorder[ustarts[c]..ustarts[c + 1]];
    let to_cross: Vec<Vec<u64>> = (0..cross.size())
        .map(|c| {
            upos(c)
                .iter()
                .map(|&k| {
                    let v = unique[k] as usize;
                    (v - p.offset(p.owner(v))) as u64
                })
                .collect()
        })
        .collect();
    let refs: Vec<&[u64]> = to_cross.iter().map(Vec::as_slice).collect();
    let asked = cross.alltoallv_pod(&refs)?;
    let served = serve(graph, &asked, cross.world_ranks(), p.offset(comm.rank()), req, threads);
    let replies: Vec<Vec<u8>> = match &served {
        Ok(s) => (0..cross.size()).map(|c| s.view(c).encode()).collect(),
        // Every node learns the failure, whether it asked anything or not.
        Err(e) => vec![verdict_reply(e); cross.size()],
    };
    let refs: Vec<&[u8]> = replies.iter().map(Vec::as_slice).collect();
    let replies = cross.alltoallv(&refs)?;

    // 3. The unique centers' samples, then each local rank's in its order.
    let decoded: Result<Sample> = served.and_then(|_| {
        let ranks = cross.world_ranks();
        let answers: Vec<Answer> =
            (0..cross.size()).map(|c| decode_reply(&replies[c], upos(c).len(), req, graph, ranks[c])).collect::<Result<_>>()?;
        let parts: Vec<AnswerView<'_>> = answers.iter().map(Answer::view).collect();
        Ok(assemble(unique.len(), &parts, upos, req.edge_ids))
    });
    let answers: Vec<Vec<u8>> = match &decoded {
        Ok(u) => from_local
            .iter()
            .map(|asked| {
                let mut counts = Vec::with_capacity(asked.len());
                let (mut ids, mut eids) = (Vec::new(), Vec::new());
                for v in asked {
                    let Ok(k) = unique.binary_search(v) else {
                        counts.push(0);
                        continue;
                    };
                    let r = u.offsets[k]..u.offsets[k + 1];
                    counts.push(r.len());
                    ids.extend_from_slice(&u.neighbors[r.clone()]);
                    if req.edge_ids {
                        eids.extend_from_slice(&u.edge_ids[r]);
                    }
                }
                AnswerView { counts: &counts, neighbors: &ids, edge_ids: &eids }.encode()
            })
            .collect(),
        // Every local rank learns the failure, whether it asked this rank
        // anything or not.
        Err(e) => vec![verdict_reply(e); local.size()],
    };
    let refs: Vec<&[u8]> = answers.iter().map(Vec::as_slice).collect();
    let back = local.alltoallv(&refs)?;
    decoded?;
    let ranks = local.world_ranks();
    let answers: Vec<Answer> =
        (0..local.size()).map(|q| decode_reply(&back[q], positions(q).len(), req, graph, ranks[q])).collect::<Result<_>>()?;
    let parts: Vec<AnswerView<'_>> = answers.iter().map(Answer::view).collect();
    Ok(assemble(centers.len(), &parts, positions, req.edge_ids))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use wholemem::{Location, MemoryType};

    use super::*;
    use crate::{BuildOptions, EdgeList, build};

    /// Node numbers a peer may send: just past this rank's, near 2^63 and
    /// near 2^64, or anything.
    fn extreme() -> impl Strategy<Value = u64> {
        prop_oneof![8u64..=64, u64::MAX - 64..=u64::MAX, (1u64 << 63) - 32..=(1u64 << 63) + 32, any::<u64>()]
    }

    /// Issue 30, item 6, one rank: local node numbers past this rank's 8
    /// nodes, among good ones, with the rank's first node anywhere up to
    /// 2^40: an error naming the asker and the number, never a sum that
    /// wraps, never a panic. And answers of arbitrary words with extreme
    /// counts: refused or decoded, never a panic.
    #[test]
    fn peer_numbers_near_2_pow_64_are_named_not_added() {
        let world = wm_comm::init().unwrap();
        let src: Vec<i64> = (0..8).collect();
        let dst: Vec<i64> = src.iter().map(|&v| (v + 1) % 8).collect();
        let g = build(&world, &BuildOptions::new(8, MemoryType::Distributed, Location::Host), EdgeList::new(&src, &dst)).unwrap();
        let req = SampleRequest::new(2, 1);
        let mut runner = TestRunner::new(Config { cases: 256, failure_persistence: None, ..Config::default() });
        let asked =
            (proptest::collection::vec(0u64..8, 0..4), extreme(), proptest::collection::vec(0u64..8, 0..4), 0usize..=1 << 40, 0usize..64);
        runner
            .run(&asked, |(before, bad, after, first, asker)| {
                let asked = vec![before, [vec![bad], after].concat()];
                let e = serve(&g, &asked, &[asker, asker + 1], first, &req, 1).err().expect("a node past this rank's");
                let text = e.to_string();
                prop_assert!(matches!(e, Error::Common(CommonError::PeerFailed { rank, .. }) if rank == asker + 1), "{}", text);
                prop_assert!(text.contains(&format!("local node {bad}, of 8")), "{}", text);
                Ok(())
            })
            .unwrap();
        let answers = (proptest::collection::vec(prop_oneof![extreme(), 0u64..4], 0..12), 0usize..6);
        runner
            .run(&answers, |(words, asked)| {
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                if let Ok(a) = decode_reply(&bytes, asked, &req, &g, 3) {
                    prop_assert!(a.counts.len() == asked && a.counts.iter().all(|&c| c <= 2), "{:?}", a);
                    prop_assert_eq!(a.counts.iter().sum::<usize>(), a.neighbors.len());
                }
                Ok(())
            })
            .unwrap();
        g.free().unwrap();
    }
}
