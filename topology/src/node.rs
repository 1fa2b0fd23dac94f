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
    fn discovered_identity_contains_hostname() {
        let id = NodeIdentity::discover();
        assert!(!id.hostname().is_empty());
        if !id.overridden() {
            assert!(id.id().starts_with(id.hostname()));
        }
    }
}
