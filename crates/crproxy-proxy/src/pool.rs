//! TODO: pool (being written)
