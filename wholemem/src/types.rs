//! Memory types and locations.

use std::fmt;
use std::str::FromStr;

/// How a table's rows are laid out across ranks and what each rank maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// Every rank maps every portion of its node side by side: one base
    /// pointer reaches every row. One node only.
    Continuous,
    /// Every rank maps every portion of its node, each on its own, with a
    /// table of per-rank pointers. One node only.
    Chunked,
    /// Each rank maps only its own portion; other rows move through the
    /// communicator.
    Distributed,
    /// Distributed storage plus node-local and cross-node communicators, so
    /// row exchanges can be routed (and de-duplicated) per node.
    Hierarchy,
}

/// Where a table's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory.
    Host,
    /// GPU memory.
    Device,
}

impl MemoryType {
    /// Every type, in the order of the support matrix.
    pub const ALL: [MemoryType; 4] = [Self::Continuous, Self::Chunked, Self::Distributed, Self::Hierarchy];

    /// Whether every rank maps every row of its node.
    pub fn is_mapped(self) -> bool {
        matches!(self, Self::Continuous | Self::Chunked)
    }

    /// The lower-case name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Continuous => "continuous",
            Self::Chunked => "chunked",
            Self::Distributed => "distributed",
            Self::Hierarchy => "hierarchy",
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

impl Location {
    /// Both locations.
    pub const ALL: [Location; 2] = [Self::Host, Self::Device];

    /// The lower-case name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Device => "device",
        }
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MemoryType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown memory type {s:?}; expected continuous, chunked, distributed or hierarchy"))
    }
}

impl FromStr for Location {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown location {s:?}; expected host or device"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_are_quoted() {
        for t in MemoryType::ALL {
            assert_eq!(t.name().parse::<MemoryType>().unwrap(), t);
        }
        for l in Location::ALL {
            assert_eq!(l.to_string().parse::<Location>().unwrap(), l);
        }
        assert!("paged".parse::<MemoryType>().unwrap_err().contains("\"paged\""));
        assert!("gpu".parse::<Location>().unwrap_err().contains("\"gpu\""));
    }
}
