//! libfabric RMA reads (feature `fabric`).
