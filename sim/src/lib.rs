//! afa-sim
