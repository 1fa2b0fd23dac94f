//! Shared pieces of wholemem's command-line tools.
#![forbid(unsafe_code)]
