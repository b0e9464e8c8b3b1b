//! TODO: schema (being written)
