//! The capability query: can this communicator hold this type at this
//! location? Answered before anything is allocated, with a reason when not.
//!
//! The rules, in the order they are checked:
//!
//! | location | type | needs |
//! |---|---|---|
//! | Device | any | a build with CUDA support and a GPU per rank |
//! | Host | Continuous, Chunked | every rank on one node (they map each other's portions) |
//! | Host | Distributed | nothing |
//! | Host | Hierarchy | the same number of ranks on every node (the cross communicators pair them up) |

use std::fmt;

use wm_comm::Communicator;
use wm_topology::TopologyRecord;
use wm_topology::domains::{self, RankPlace};

use crate::CommonError;
use crate::types::{Location, MemoryType};

/// The answer of [`query`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// It can be allocated.
    Supported,
    /// It cannot, and why.
    Unsupported {
        /// One sentence naming ranks, nodes or devices.
        reason: String,
    },
}

impl Support {
    /// Whether the answer is yes.
    pub fn is_supported(&self) -> bool {
        matches!(self, Self::Supported)
    }

    /// The reason, when the answer is no.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Supported => None,
            Self::Unsupported { reason } => Some(reason),
        }
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Supported => f.write_str("supported"),
            Self::Unsupported { reason } => write!(f, "unsupported: {reason}"),
        }
    }
}

/// Why this build has no device memory.
pub const NO_CUDA: &str = "this build of wholemem has no CUDA support (feature `cuda` off), so device memory is unavailable";

/// Whether this process can use device memory at all, and why not.
pub(crate) fn cuda_here() -> Result<(), String> {
    #[cfg(feature = "cuda")]
    return crate::device::status().map(drop);
    #[cfg(not(feature = "cuda"))]
    Err(NO_CUDA.to_owned())
}

/// Whether `comm` can hold memory of type `ty` at `loc`.
///
/// Local and free: it uses what the communicator already knows (every rank's
/// node), so every rank gets the same answer without communicating. The
/// rules are `wm_topology::domains`'.
///
/// For device memory it knows this rank's driver only: it assumes the other
/// ranks' nodes look like this one, and the allocation checks every rank's
/// GPU and P2P access for real (as does [`Capabilities`]).
pub fn query(comm: &dyn Communicator, ty: MemoryType, loc: Location) -> Support {
    let cuda = cuda_here();
    let gpu = cuda.is_ok().then_some(0);
    let places: Vec<RankPlace<'_>> =
        comm.nodes().iter().zip(comm.world_ranks()).map(|(n, &rank)| RankPlace { rank, node: n.id(), record: None, gpu }).collect();
    answer(&places, ty, loc, cuda)
}

/// The capability query over every rank's hardware record: built once,
/// collectively, then asked as often as needed.
///
/// Where [`query`] knows only which node each rank is on, this also knows
/// each rank's GPU (by `WM_DEVICE`, else local rank modulo the node's GPU
/// count) and the P2P matrix between them, so device answers name ranks and
/// GPUs.
#[derive(Debug, Clone)]
pub struct Capabilities {
    records: Vec<TopologyRecord>,
    ranks: Vec<usize>,
    gpus: Vec<Option<u32>>,
    cuda: Result<(), String>,
}

impl Capabilities {
    /// Discovers this rank's hardware and allgathers every rank's record.
    /// Collective.
    ///
    /// # Errors
    /// A lost peer or a timeout; a record that does not parse.
    pub fn gather(comm: &dyn Communicator) -> crate::Result<Self> {
        let mine = TopologyRecord::discover();
        let text = serde_json::to_vec(&mine).map_err(|e| crate::Error::Common(CommonError::InvalidArgument(e.to_string())))?;
        let records = comm
            .allgatherv(&text)?
            .iter()
            .map(|b| {
                serde_json::from_slice(b)
                    .map_err(|e| crate::Error::Common(CommonError::InvalidArgument(format!("a rank's topology record: {e}"))))
            })
            .collect::<crate::Result<Vec<TopologyRecord>>>()?;
        let requested: Vec<Option<u32>> = comm
            .allgatherv(&wm_topology::env::WM_DEVICE.get().unwrap_or_default().into_bytes())?
            .iter()
            .map(|b| std::str::from_utf8(b).ok().and_then(|s| s.trim().parse().ok()))
            .collect();
        let status = match cuda_here() {
            Ok(()) => Vec::new(),
            Err(reason) => reason.into_bytes(),
        };
        let cuda = match comm.allgatherv(&status)?.iter().enumerate().find(|(_, s)| !s.is_empty()) {
            None => Ok(()),
            Some((_, s)) if comm.size() == 1 => Err(String::from_utf8_lossy(s).into_owned()),
            Some((r, s)) => Err(format!("rank {}: {}", comm.world_ranks()[r], String::from_utf8_lossy(s))),
        };
        Ok(Self::from_records(records, comm.world_ranks().to_vec(), &requested, cuda))
    }

    /// From records already at hand (one per rank, in rank order).
    pub fn from_records(records: Vec<TopologyRecord>, ranks: Vec<usize>, requested: &[Option<u32>], cuda: Result<(), String>) -> Self {
        let ids: Vec<&str> = records.iter().map(|r| r.node_id.as_str()).collect();
        let layout = wm_topology::NodeLayout::of(&ids);
        let gpus =
            (0..records.len()).map(|r| domains::bind_gpu(layout.local[r], &records[r], requested.get(r).copied().flatten())).collect();
        Self { records, ranks, gpus, cuda }
    }

    /// Every rank's record, in rank order.
    pub fn records(&self) -> &[TopologyRecord] {
        &self.records
    }

    /// The GPU each rank would use.
    pub fn gpus(&self) -> &[Option<u32>] {
        &self.gpus
    }

    /// Whether the ranks can hold memory of type `ty` at `loc`, and why not.
    pub fn query(&self, ty: MemoryType, loc: Location) -> Support {
        let places: Vec<RankPlace<'_>> = self
            .records
            .iter()
            .zip(&self.ranks)
            .zip(&self.gpus)
            .map(|((rec, &rank), &gpu)| RankPlace { rank, node: &rec.node_id, record: Some(rec), gpu })
            .collect();
        answer(&places, ty, loc, self.cuda.clone())
    }
}

fn answer(places: &[RankPlace<'_>], ty: MemoryType, loc: Location, cuda: Result<(), String>) -> Support {
    let t = MemoryType::ALL.iter().position(|&x| x == ty).expect("every type is listed");
    let l = Location::ALL.iter().position(|&x| x == loc).expect("every location is listed");
    match &domains::matrix(places, cuda)[t][l] {
        Ok(()) => Support::Supported,
        Err(reason) if loc == Location::Host && ty.is_mapped() => Support::Unsupported {
            reason: format!(
                "{reason}; {ty} memory maps every rank's portion into every rank, which needs all ranks on one node (use distributed or hierarchy)"
            ),
        },
        Err(reason) => Support::Unsupported { reason: reason.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcie() -> TopologyRecord {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology/fixtures/pcie-2socket-4gpu.json");
        TopologyRecord::load(&p).unwrap()
    }

    #[test]
    fn device_answers_name_ranks_and_gpus_and_follow_wm_device() {
        let four = vec![pcie(); 4];
        let caps = Capabilities::from_records(four.clone(), vec![0, 1, 2, 3], &[None; 4], Ok(()));
        assert_eq!(caps.gpus(), &[Some(0), Some(1), Some(2), Some(3)]);
        let no = caps.query(MemoryType::Continuous, Location::Device);
        assert!(no.reason().unwrap().contains("rank 0 (GPU 0) cannot reach rank 2 (GPU 2): no P2P"), "{no}");
        assert!(caps.query(MemoryType::Distributed, Location::Device).is_supported());
        // WM_DEVICE puts all four ranks on the first socket's GPUs.
        let caps = Capabilities::from_records(four, vec![0, 1, 2, 3], &[Some(0), Some(1), Some(0), Some(1)], Ok(()));
        assert!(caps.query(MemoryType::Chunked, Location::Device).is_supported());
        let caps = Capabilities::from_records(vec![pcie()], vec![0], &[None], Err(NO_CUDA.to_owned()));
        assert_eq!(caps.query(MemoryType::Chunked, Location::Device).reason(), Some(NO_CUDA));
        assert!(caps.query(MemoryType::Chunked, Location::Host).is_supported());
    }
}
