//! Which ranks can map each other's memory, decided from every rank's node
//! and (where known) its hardware record. Pure functions: the capability
//! query asks them, and fixtures test them for machines we do not have.
//!
//! | location | type | needs |
//! |---|---|---|
//! | Host | continuous, chunked | every rank on one node |
//! | Host | distributed | nothing |
//! | Host | hierarchy | the same number of ranks on every node |
//! | Device | any | CUDA support, and a GPU for every rank |
//! | Device | continuous, chunked | also one node, and P2P (read and write) between every pair of the ranks' GPUs |
//! | Device | hierarchy | also the same number of ranks on every node |

use crate::record::TopologyRecord;

/// Where one rank runs.
#[derive(Debug, Clone, Copy)]
pub struct RankPlace<'a> {
    /// Its (world) rank, for messages.
    pub rank: usize,
    /// Its node id.
    pub node: &'a str,
    /// Its node's record, when known.
    pub record: Option<&'a TopologyRecord>,
    /// The GPU it is bound to, by NVML index.
    pub gpu: Option<u32>,
}

/// The four memory types, in the order of the support matrix.
pub const TYPES: [&str; 4] = ["continuous", "chunked", "distributed", "hierarchy"];
/// The two locations.
pub const LOCATIONS: [&str; 2] = ["host", "device"];

/// The GPU a rank binds to: `requested` (`WM_DEVICE`) if given, else its
/// local rank modulo the node's GPU count; `None` without GPUs.
pub fn bind_gpu(local_rank: usize, record: &TopologyRecord, requested: Option<u32>) -> Option<u32> {
    if record.gpus.is_empty() {
        return None;
    }
    requested.or_else(|| record.gpus.get(local_rank % record.gpus.len()).map(|g| g.index))
}

/// Names for the nodes of `a` and `b` (two different nodes) that tell them
/// apart: their host names when both are known and differ, else their node
/// ids — which differ by definition, and are what `WM_NODE_ID` set when one
/// machine poses as several nodes (whose host names are all the same).
fn node_labels(a: &RankPlace<'_>, b: &RankPlace<'_>) -> (String, String) {
    match (a.record, b.record) {
        (Some(ra), Some(rb)) if ra.hostname != rb.hostname => (ra.hostname.clone(), rb.hostname.clone()),
        _ => (a.node.to_owned(), b.node.to_owned()),
    }
}

/// Every rank on one node, or the first pair that is not.
pub fn one_node(ranks: &[RankPlace<'_>]) -> Result<(), String> {
    let Some(first) = ranks.first() else { return Ok(()) };
    match ranks.iter().find(|p| p.node != first.node) {
        None => Ok(()),
        Some(p) => {
            let (x, y) = node_labels(first, p);
            Err(format!("ranks {} and {} are on different nodes ({x} and {y})", first.rank, p.rank))
        }
    }
}

/// The same number of ranks on every node.
pub fn equal_nodes(ranks: &[RankPlace<'_>]) -> Result<(), String> {
    let count = |n: &str| ranks.iter().filter(|p| p.node == n).count();
    let Some(first) = ranks.first() else { return Ok(()) };
    match ranks.iter().find(|p| count(p.node) != count(first.node)) {
        None => Ok(()),
        Some(p) => {
            let (x, y) = node_labels(first, p);
            Err(format!(
                "node {x} has {} ranks and node {y} has {}; hierarchy memory pairs ranks across nodes by local rank, which needs the same number on every node",
                count(first.node),
                count(p.node)
            ))
        }
    }
}

/// A GPU for every rank.
pub fn every_rank_has_a_gpu(ranks: &[RankPlace<'_>]) -> Result<(), String> {
    match ranks.iter().find(|p| p.gpu.is_none()) {
        None => Ok(()),
        Some(p) => {
            let why = p.record.and_then(|r| r.gpu_note.clone()).unwrap_or_else(|| "its node reports no GPU".to_owned());
            Err(format!("rank {} has no GPU: {why}", p.rank))
        }
    }
}

/// P2P (read and write) between the GPUs of every pair of ranks on one
/// node; ranks sharing a GPU need nothing.
pub fn peer_access(ranks: &[RankPlace<'_>]) -> Result<(), String> {
    for (i, a) in ranks.iter().enumerate() {
        for b in &ranks[i + 1..] {
            let (Some(ga), Some(gb)) = (a.gpu, b.gpu) else { continue };
            if ga == gb || a.node != b.node {
                continue;
            }
            let Some(rec) = a.record else { continue };
            let link = rec.p2p.get(ga as usize).and_then(|row| row.get(gb as usize));
            match link {
                Some(l) if l.mappable() => {}
                Some(l) => {
                    return Err(format!("rank {} (GPU {ga}) cannot reach rank {} (GPU {gb}): no P2P, {}", a.rank, b.rank, l.path_words()));
                }
                None => {
                    return Err(format!(
                        "rank {} (GPU {ga}) cannot reach rank {} (GPU {gb}): the P2P matrix does not list them",
                        a.rank, b.rank
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The support matrix, `[type][location]` in the order of [`TYPES`] and
/// [`LOCATIONS`]: `Ok` or the reason. `cuda` says whether device memory is
/// available at all in this build and on this machine.
pub fn matrix(ranks: &[RankPlace<'_>], cuda: Result<(), String>) -> [[Result<(), String>; 2]; 4] {
    let host_mapped = one_node(ranks);
    let device_base = cuda.and_then(|()| every_rank_has_a_gpu(ranks));
    let device_mapped = device_base.clone().and_then(|()| one_node(ranks)).and_then(|()| peer_access(ranks));
    let hier = equal_nodes(ranks);
    [
        [host_mapped.clone(), device_mapped.clone()],
        [host_mapped, device_mapped],
        [Ok(()), device_base.clone()],
        [hier.clone(), device_base.and(hier)],
    ]
}
