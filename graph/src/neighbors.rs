//! The sampling calls: check the centers, agree on the request, then
//! sample here (continuous and chunked graphs) or route each center to the
//! rank that owns it (distributed and hierarchy graphs).

use wholemem::CommonError;
use wholemem::MemoryType;

use crate::collective::agree_same_header;
use crate::csr::CsrGraph;
use crate::sample::{ALL, Sample, SampleRequest, sample_local};
use crate::{Error, Result, route};

/// Unweighted sampling without replacement: for each center, every
/// neighbour when its degree is at most `fanout`, else `fanout` distinct
/// neighbours, each subset equally likely. [`sample`] with
/// [`SampleRequest::new`].
///
/// # Errors
/// As [`sample`].
pub fn sample_neighbors(graph: &CsrGraph, centers: &[i64], fanout: usize, seed: u64) -> Result<Sample> {
    sample(graph, centers, &SampleRequest::new(fanout, seed))
}

/// Weighted sampling without replacement: as [`sample_neighbors`], but
/// drawn one after another with probability proportional to the edge
/// weights among the neighbours not drawn yet (each neighbour gets the key
/// `u^(1/w)` for a uniform `u`, and the `fanout` largest keys win). Edges of
/// weight 0 are taken only when the degree is at most `fanout`.
///
/// # Errors
/// As [`sample`]; [`wholemem::CommonError::InvalidArgument`] for a graph without weights.
pub fn sample_weighted_neighbors(graph: &CsrGraph, centers: &[i64], fanout: usize, seed: u64) -> Result<Sample> {
    sample(graph, centers, &SampleRequest::new(fanout, seed).weighted(true))
}

/// Samples neighbours of `centers` as `req` says.
///
/// Continuous and chunked graphs are read through the mapping by this rank
/// alone (not collective). Distributed and hierarchy graphs are collective:
/// every rank calls this with the same request and its own centers (none
/// included); each center goes to the rank that owns it (for hierarchy,
/// through the rank of its node that talks to the owner's node, which asks
/// once for a center several ranks of the node want), is sampled there,
/// and comes back.
///
/// Each center's random stream comes from the seed and the center's id, so
/// the sample does not depend on the threads, the ranks or the memory type
/// — and a center listed twice gets the same sample twice.
///
/// # Errors
/// - [`Error::NodeOutOfRange`] naming the first bad center, before anything
///   is read — on every rank of a collective call, after which the next call
///   works;
/// - [`wholemem::CommonError::InvalidArgument`] for a weighted request on a graph without
///   weights, or requests that differ between ranks (collective calls);
/// - [`Error::Memory`], [`Error::Comm`] when reading or talking fails.
pub fn sample(graph: &CsrGraph, centers: &[i64], req: &SampleRequest) -> Result<Sample> {
    let checked = graph.check_nodes(centers).and_then(|()| {
        if req.weighted && !graph.is_weighted() {
            return Err(Error::Common(CommonError::InvalidArgument("weighted sampling of a graph without edge weights".into())));
        }
        Ok(())
    });
    let threads = req.threads.unwrap_or_else(|| graph.threads()).max(1);
    match graph.memory_type() {
        MemoryType::Continuous | MemoryType::Chunked => {
            checked?;
            // Checked: every center is a node id, so not negative.
            let (counts, neighbors, edge_ids) = sample_local(graph, centers, |v| v as u64, req, threads)?;
            Ok(Sample::from_counts(&counts, neighbors, edge_ids))
        }
        MemoryType::Distributed | MemoryType::Hierarchy => {
            agree_same_header(graph.comm().as_ref(), checked, &req.header(), describe_request)?;
            let comm = graph.comm().clone();
            if graph.memory_type() == MemoryType::Hierarchy && comm.cross().size() > 1 {
                route::hierarchy(graph, centers, req, threads)
            } else {
                route::distributed(graph, comm.as_ref(), centers, req, threads)
            }
        }
    }
}

fn describe_request(h: &[u64]) -> String {
    match h {
        [f, s, w, e] => format!(
            "asked for fanout {}, seed {s}, weighted {}, edge ids {}",
            if *f == ALL as u64 { "all".to_owned() } else { f.to_string() },
            *w != 0,
            *e != 0
        ),
        _ => format!("{h:?}"),
    }
}
