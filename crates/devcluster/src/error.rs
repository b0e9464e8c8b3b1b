//! TODO: error (being written)
