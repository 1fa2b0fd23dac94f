//! MPI RMA reads (feature `mpi`).
