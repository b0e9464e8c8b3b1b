//! TODO: admission (being written)
