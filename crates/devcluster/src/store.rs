//! TODO: store (being written)
