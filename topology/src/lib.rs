//! What the hardware is.
//!
//! This crate is the bottom layer of wholemem. It knows which node a process
//! runs on ([`node::NodeIdentity`]) and holds the table of every `WM_*`
//! environment variable the project reads ([`env`]). It knows nothing of CUDA
//! contexts, communicators or memory types.
#![forbid(unsafe_code)]

pub mod env;
pub mod node;

pub use node::NodeIdentity;
