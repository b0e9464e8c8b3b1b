//! TODO: registry (being written)
