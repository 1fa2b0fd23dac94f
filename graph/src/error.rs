//! The one error type of the graph layer, and how its errors travel to the
//! other ranks of a collective call.

use wholemem::CommonError;

/// What can go wrong building, loading or sampling a graph.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An unusable argument, a peer that failed or sent malformed data, a
    /// wait that timed out: the kinds every layer shares.
    #[error(transparent)]
    Common(#[from] wholemem::CommonError),
    /// An edge of an edge list that cannot be in the graph: a node id out of
    /// range, or a weight that is negative or not finite.
    #[error("edge {position} ({src} -> {dst}) on rank {rank}: {problem}")]
    BadEdge {
        /// Where it was in that rank's edge list.
        position: usize,
        /// Its source.
        src: i64,
        /// Its destination.
        dst: i64,
        /// The world rank that passed it.
        rank: usize,
        /// What is wrong with it.
        problem: String,
    },
    /// A node id outside the graph, passed as a center or target.
    #[error("node {node} at position {position} on rank {rank} is out of range for a graph of {nodes} nodes")]
    NodeOutOfRange {
        /// The bad id.
        node: i64,
        /// Where it was in that rank's ids.
        position: usize,
        /// The world rank that passed it.
        rank: usize,
        /// Nodes in the graph.
        nodes: usize,
    },
    /// Files that do not hold a valid CSR graph; the message names the file
    /// set and the first problem.
    #[error("{0}")]
    BadGraph(String),
    /// The memory layer refused.
    #[error(transparent)]
    Memory(#[from] wholemem::Error),
    /// Gathering or scattering rows failed.
    #[error(transparent)]
    Gather(#[from] wm_gather::Error),
    /// The embedding layer refused (the `candle` feature).
    #[cfg(feature = "candle")]
    #[error(transparent)]
    Embedding(#[from] wm_embedding::Error),
    /// Talking to the other ranks failed.
    #[error(transparent)]
    Comm(#[from] wm_comm::Error),
    /// candle refused (the `candle` feature).
    #[cfg(feature = "candle")]
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

const NODE: u8 = 1;
const EDGE: u8 = 2;

/// Bad node ids and edges keep their kind on the way to other ranks; a
/// peer's malformed message is reported as that peer's failure.
impl wholemem::agree::PeerError for Error {
    fn peer_failed(rank: usize, detail: String) -> Self {
        Self::Common(CommonError::PeerFailed { rank, detail })
    }

    fn malformed(rank: usize, detail: String) -> Self {
        Self::Common(CommonError::PeerFailed { rank, detail })
    }

    fn as_malformed(&self) -> Option<(usize, &str)> {
        None
    }

    fn as_peer_failed(&self) -> Option<(usize, &str)> {
        match self {
            Self::Common(CommonError::PeerFailed { rank, detail }) => Some((*rank, detail)),
            _ => None,
        }
    }

    fn encode(&self) -> Option<Vec<u8>> {
        use wholemem::agree::encode_words;
        match self {
            Self::NodeOutOfRange { node, position, nodes, .. } => {
                Some(encode_words(NODE, &[*node as u64, *position as u64, *nodes as u64]))
            }
            Self::BadEdge { position, src, dst, problem, .. } => {
                let mut m = encode_words(EDGE, &[*position as u64, *src as u64, *dst as u64]);
                m.extend_from_slice(problem.as_bytes());
                Some(m)
            }
            _ => None,
        }
    }

    fn decode(rank: usize, m: &[u8]) -> Option<Self> {
        use wholemem::agree::decode_words;
        let size = |w: u64| usize::try_from(w).ok();
        if let Some([node, position, nodes]) = decode_words(m, NODE) {
            return Some(Self::NodeOutOfRange { node: node as i64, position: size(position)?, rank, nodes: size(nodes)? });
        }
        let (words, problem) = m.split_at_checked(25)?;
        let [position, src, dst] = decode_words(words, EDGE)?;
        let problem = String::from_utf8_lossy(problem).into_owned();
        Some(Self::BadEdge { position: size(position)?, src: src as i64, dst: dst as i64, rank, problem })
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
