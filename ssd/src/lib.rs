//! afa-ssd
