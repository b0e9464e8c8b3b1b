//! TODO: table (being written)
