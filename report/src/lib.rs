//! afa-report
