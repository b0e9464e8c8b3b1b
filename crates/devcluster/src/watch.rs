//! TODO: watch (being written)
