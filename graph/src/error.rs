//! The one error type of the graph layer.

/// What can go wrong building, loading or sampling a graph.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A caller passed something unusable; the message names the value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
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
    /// Another rank of a collective call failed; its error, quoted.
    #[error("rank {rank} failed: {detail}")]
    PeerFailed {
        /// The world rank.
        rank: usize,
        /// Its error.
        detail: String,
    },
    /// The memory layer refused.
    #[error(transparent)]
    Memory(#[from] wholemem::Error),
    /// Gathering or scattering rows failed.
    #[error(transparent)]
    Gather(#[from] wm_gather::Error),
    /// The embedding layer refused.
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

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
