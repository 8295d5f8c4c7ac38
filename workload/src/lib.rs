//! afa-workload
