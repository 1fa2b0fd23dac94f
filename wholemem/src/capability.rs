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
use wm_topology::domains::{self, RankPlace};

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
pub const NO_CUDA: &str = "this build of wholemem has no CUDA support, so device memory is unavailable";

/// Whether `comm` can hold memory of type `ty` at `loc`.
///
/// Local and free: it uses what the communicator already knows (every rank's
/// node), so every rank gets the same answer without communicating. The
/// rules are `wm_topology::domains`'.
pub fn query(comm: &dyn Communicator, ty: MemoryType, loc: Location) -> Support {
    let places: Vec<RankPlace<'_>> =
        comm.nodes().iter().zip(comm.world_ranks()).map(|(n, &rank)| RankPlace { rank, node: n.id(), record: None, gpu: None }).collect();
    let t = MemoryType::ALL.iter().position(|&x| x == ty).expect("every type is listed");
    let l = Location::ALL.iter().position(|&x| x == loc).expect("every location is listed");
    match &domains::matrix(&places, Err(NO_CUDA.to_owned()))[t][l] {
        Ok(()) => Support::Supported,
        Err(reason) if loc == Location::Host && ty.is_mapped() => Support::Unsupported {
            reason: format!(
                "{reason}; {ty} memory maps every rank's portion into every rank, which needs all ranks on one node (use distributed or hierarchy)"
            ),
        },
        Err(reason) => Support::Unsupported { reason: reason.clone() },
    }
}
