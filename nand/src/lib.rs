//! afa-nand
