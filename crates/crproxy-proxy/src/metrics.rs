//! TODO: metrics (being written)
