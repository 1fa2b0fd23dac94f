//! Node identity: which ranks share a host and can map each other's memory.

use std::fmt;

use crate::env::WM_NODE_ID;

/// The identity of the node a process runs on.
///
/// Two ranks are on the same node when their ids are equal. By default the id
/// is the host name plus the kernel's boot id (so a rebooted host or a clone
/// with the same name is a different node); `WM_NODE_ID` overrides it, which
/// lets one machine pose as several nodes in tests.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeIdentity {
    id: String,
    hostname: String,
    overridden: bool,
}

impl NodeIdentity {
    /// The identity of this process's node.
    pub fn discover() -> Self {
        let hostname = hostname();
        match WM_NODE_ID.get() {
            Some(id) => Self { id, hostname, overridden: true },
            None => {
                let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default();
                let id = if boot.is_empty() { hostname.clone() } else { format!("{hostname}/{boot}") };
                Self { id, hostname, overridden: false }
            }
        }
    }

    /// An identity from its parts, for records received from other ranks.
    pub fn from_parts(id: String, hostname: String, overridden: bool) -> Self {
        Self { id, hostname, overridden }
    }

    /// The string compared between ranks.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host name (informational; two nodes may share it).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// Whether `WM_NODE_ID` set the id.
    pub fn overridden(&self) -> bool {
        self.overridden
    }
}

impl fmt::Display for NodeIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.overridden { write!(f, "{} (on host {})", self.id, self.hostname) } else { f.write_str(&self.hostname) }
    }
}

/// Where each rank sits among the nodes: nodes numbered in order of their
/// lowest rank, and each rank's position on its node (its local rank). The
/// numbering the local and cross communicators use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLayout {
    /// Node index of each rank.
    pub node: Vec<usize>,
    /// Local rank of each rank.
    pub local: Vec<usize>,
    /// Number of nodes.
    pub nodes: usize,
}

impl NodeLayout {
    /// The layout of ranks whose nodes are `ids` (anything comparable).
    pub fn of<T: PartialEq>(ids: &[T]) -> Self {
        let mut firsts: Vec<&T> = Vec::new();
        let mut per_node: Vec<usize> = Vec::new();
        let (mut node, mut local) = (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
        for id in ids {
            let n = firsts.iter().position(|f| *f == id).unwrap_or_else(|| {
                firsts.push(id);
                per_node.push(0);
                firsts.len() - 1
            });
            node.push(n);
            local.push(per_node[n]);
            per_node[n] += 1;
        }
        Self { node, local, nodes: firsts.len() }
    }

    /// The rank with local rank `l` on node `n`, if that node has one.
    pub fn rank_at(&self, n: usize, l: usize) -> Option<usize> {
        (0..self.node.len()).find(|&r| self.node[r] == n && self.local[r] == l)
    }
}

/// The host name from the kernel, or `localhost` when it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_numbers_nodes_by_lowest_rank() {
        let l = NodeLayout::of(&["b", "a", "b", "a", "c"]);
        assert_eq!(l.node, vec![0, 1, 0, 1, 2]);
        assert_eq!(l.local, vec![0, 0, 1, 1, 0]);
        assert_eq!(l.nodes, 3);
        assert_eq!(l.rank_at(1, 1), Some(3));
        assert_eq!(l.rank_at(2, 1), None);
    }

    #[test]
    fn discovered_identity_contains_hostname() {
        let id = NodeIdentity::discover();
        assert!(!id.hostname().is_empty());
        if !id.overridden() {
            assert!(id.id().starts_with(id.hostname()));
        }
    }
}
