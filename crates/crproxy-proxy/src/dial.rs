//! TODO: dial (being written)
