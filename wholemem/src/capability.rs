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

/// Whether `comm` can hold memory of type `ty` at `loc`.
///
/// Local and free: it uses what the communicator already knows (every rank's
/// node), so every rank gets the same answer without communicating.
pub fn query(comm: &dyn Communicator, ty: MemoryType, loc: Location) -> Support {
    match loc {
        Location::Device => {
            Support::Unsupported { reason: "this build of wholemem has no CUDA support, so device memory is unavailable".to_owned() }
        }
        Location::Host if ty.is_mapped() => {
            let nodes = comm.nodes();
            match (1..nodes.len()).find(|&r| nodes[r] != nodes[0]) {
                None => Support::Supported,
                Some(r) => Support::Unsupported {
                    reason: format!(
                        "ranks {} and {} are on different nodes ({} and {}); {ty} memory maps every rank's portion into every rank, which needs all ranks on one node (use distributed or hierarchy)",
                        comm.world_ranks()[0],
                        comm.world_ranks()[r],
                        nodes[0],
                        nodes[r],
                    ),
                },
            }
        }
        Location::Host if ty == MemoryType::Hierarchy => {
            let nodes = comm.nodes();
            let count = |n| nodes.iter().filter(|m| *m == n).count();
            match nodes.iter().find(|n| count(*n) != count(&nodes[0])) {
                None => Support::Supported,
                Some(n) => Support::Unsupported {
                    reason: format!(
                        "node {} has {} ranks and node {} has {}; hierarchy memory pairs ranks across nodes by local rank, which needs the same number of ranks on every node",
                        nodes[0],
                        count(&nodes[0]),
                        n,
                        count(n)
                    ),
                },
            }
        }
        Location::Host => Support::Supported,
    }
}
