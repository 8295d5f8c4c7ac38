//! afa-model
