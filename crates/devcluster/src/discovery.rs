//! TODO: discovery (being written)
