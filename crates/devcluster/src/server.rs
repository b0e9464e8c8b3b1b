//! TODO: server (being written)
