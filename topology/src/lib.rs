//! What the hardware is.
//!
//! This crate is the bottom layer of wholemem. It knows which node a process
//! runs on ([`node::NodeIdentity`]), what that node holds
//! ([`record::TopologyRecord`]: CPUs, NUMA, PCI, NICs, GPUs and their P2P
//! matrix, from sysfs and NVML or from a JSON fixture), which ranks can map
//! each other's memory ([`domains`]), and the table of every `WM_*`
//! environment variable the project reads ([`env`](mod@env)). It knows nothing of CUDA
//! contexts or communicators.
#![forbid(unsafe_code)]

pub mod domains;
pub mod env;
pub mod load;
pub mod node;
pub mod record;

pub use node::{NodeIdentity, NodeLayout};
pub use record::TopologyRecord;
