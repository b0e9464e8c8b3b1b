//! TODO: sources (being written)
